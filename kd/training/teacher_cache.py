"""A teacher cache folder (``kdw cache``): what a frozen teacher says about every example of a
task — the fields the chosen methods read, on the words both tokenisations share where the
student reads another tokenizer — built once, resumably and in shards, so that students train
from it without the teacher (``kdw distill --teacher-cache``).

The folder holds ``cache.json`` (:class:`CacheRecord`: the teacher pinned by the digests of its
weights and tokenizer and by its fingerprint, the sha256 of each file of ``teacher/``, the task
and the fingerprints of its splits, and one entry per file built: its key, its examples, its
sha256 and what each field cost), ``teacher/`` (the teacher's config and tokenizer, and of its
weights only its embedding stage) and the fields' files, one per key
(:func:`workbench.core.cache.cache_path`, as a run's own ``teacher_cache/`` keeps them).

A cache travels, so everything in it is read as input from someone else: a file whose sha256
is not the recorded one is refused naming it, every field is checked against the split it
claims to be of (:class:`~workbench.core.cache.Layout`) when it is merged and when it is read,
and ``teacher/config.json`` is checked as a model folder's is before anything is built from it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock
from pydantic import Field

from workbench.core.assembly import sha256
from workbench.core.config import (
    Checked,
    DataConfig,
    between,
    from_dict,
    option,
    option_name,
    positive,
    to_dict,
)
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import (
    RECORD_LIMIT,
    atomic_path,
    atomic_write_json,
    read_json_file,
    regular_file,
)
from workbench.core.records import Record, checked
from workbench.core.runs import ResolvedTeacher
from workbench.core.verify import (
    EMBEDDINGS_FILE,  # in TEACHER_FOLDER: the embedding stage
    check_config_file,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from workbench.core.data import TaskData
    from workbench.core.models import LoadedModel

CACHE_FILE = "cache.json"
TEACHER_FOLDER = "teacher"  # the teacher's config, tokenizer and embedding stage
CACHE_PRECISIONS = ("fp32", "bf16")


@dataclasses.dataclass
class CacheConfig(Checked):
    """How ``kdw cache`` computes: batch size, device, precision and threads (none of them
    changes which examples or fields a cache holds; the precision is part of its key)."""

    batch_size: int = option(
        64,
        "examples per teacher batch (as kdw distill's --eval-batch-size: the same batches, so "
        "that a cache equals the one a distillation with the teacher computes)",
        domain=positive,
    )
    precision: str = option(
        "fp32",
        "fp32, or bf16 (autocast: on a GPU, about twice as fast; the values differ from "
        "float32's, and the cache's key says which)",
        choices=CACHE_PRECISIONS,
    )
    device: str = option("auto", "cpu, cuda, cuda:N, or auto (cuda when available)")
    threads: int = option(
        0, "torch CPU threads (0: torch's default), at most 1024", domain=between(0, 1024)
    )


class CachedFile(Record):
    """One file of the folder: the key its values were computed for, the split's example
    count, the file's sha256 and the teacher-seconds each field took over the whole split."""

    file: str
    key: dict
    examples: int
    sha256: str
    seconds: dict[str, float]


class CacheRecord(Record):
    """``cache.json``: whose and which data a teacher cache holds, and its files."""

    teacher: ResolvedTeacher | None
    fingerprint: str
    task: dict
    data: dict
    split_fingerprint: dict[str, str]
    transfer: dict | None = None  # the transfer set in its train split (TaskData.transfer)
    teacher_files: dict[str, str] = Field(default_factory=dict)  # teacher/'s files: sha256
    files: list[CachedFile] = Field(default_factory=list)


def _record_path(folder: Path) -> Path:
    return Path(folder) / CACHE_FILE


def read_record(folder: str | Path) -> CacheRecord:
    """The record of the teacher cache ``folder``; a folder that is none is one line."""
    folder = Path(folder)
    if not folder.is_dir():
        raise WorkbenchError(f"--teacher-cache {folder}: no such folder (build one with kdw cache)")
    if not os.path.lexists(_record_path(folder)):  # a pipe there: refused by name below
        raise WorkbenchError(
            f"--teacher-cache {folder} has no {CACHE_FILE}: not a folder kdw cache built"
        )
    value = read_json_file(_record_path(folder), RECORD_LIMIT, "the teacher cache's record")
    try:
        return checked(value, CacheRecord, CACHE_FILE)
    except ValueError as error:
        raise WorkbenchError(
            f"{_record_path(folder)}: {error}: not the record kdw cache writes; build the cache "
            "again in a new folder (kdw cache)"
        ) from None


def start_record(
    folder: Path,
    teacher: LoadedModel,
    pin: ResolvedTeacher | None,
    fingerprint: str,
    data: TaskData,
    data_config: DataConfig,
) -> None:
    """Write the folder's record and ``teacher/`` for a cache of ``teacher`` on ``data``, or check
    that the folder already holds the caches of this teacher on this data (one teacher and one
    task per folder; the objectives and students may differ, each file keyed by them)."""
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / ".cache.lock")):
        if _record_path(folder).exists():
            record = read_record(folder)
            check_same(record, folder, fingerprint, data, data_config)
            if (folder / TEACHER_FOLDER / EMBEDDINGS_FILE).exists():
                return
            check_teacher_files(folder, record)
        else:
            teacher.model.config.save_pretrained(folder / TEACHER_FOLDER)
            teacher.tokenizer.save_pretrained(folder / TEACHER_FOLDER)
            record = CacheRecord(
                teacher=pin,
                fingerprint=fingerprint,
                task=dataclasses.asdict(data.spec),
                data=to_dict(data_config),
                split_fingerprint=data.fingerprint(),
                transfer=data.transfer,
                files=[],
            )
        save_embeddings(folder, teacher.model)
        files = {"teacher_files": teacher_digests(folder)}
        atomic_write_json(_record_path(folder), record.plain() | files)


def file_digest(path: Path, what: str) -> str:
    """The sha256 of the regular file ``path`` (a pipe is never opened), once per process while
    it keeps its size and time."""
    regular_file(path, what, CHANGED_REMEDY)
    return sha256([path], what)


CHANGED_REMEDY = "delete it, and kdw cache with the teacher computes it again"


def teacher_digests(folder: Path) -> dict[str, str]:
    """The sha256 of each file of the cache ``folder``'s ``teacher/``, by name."""
    return {
        path.name: file_digest(path, "the cache's teacher file")
        for path in sorted((folder / TEACHER_FOLDER).iterdir())
    }


def check_teacher_files(folder: Path, record: CacheRecord) -> None:
    """Refuse, in one line naming it, a file of ``teacher/`` that ``record`` does not list or
    whose sha256 is not the recorded one, and a listed file that is gone but the embedding
    stage (optional: a student that needs it says so, and kdw cache adds it)."""
    found = teacher_digests(folder)
    changed = sorted(
        name
        for name in found.keys() | record.teacher_files.keys()
        if found.get(name) != record.teacher_files.get(name)
        and (name in found or name != EMBEDDINGS_FILE)
    )
    if changed:
        path, remedy = folder / TEACHER_FOLDER / changed[0], "build it again (kdw cache)"
        if changed[0] not in found:
            raise WorkbenchError(f"{path} is missing, though {CACHE_FILE} lists it: {remedy}")
        raise WorkbenchError(
            f"{path} is not the file kdw cache wrote (its sha256 is not the one {CACHE_FILE} "
            f"records): {remedy}"
        )


def checked_file(folder: Path, record: CacheRecord, name: str) -> CachedFile:
    """The entry of the field file ``name`` in ``record``, once the file's sha256 is the one it
    records; a file the record lacks or that changed is one line naming it."""
    path = folder / name
    entry = next((f for f in record.files if f.file == name), None)
    if entry is None:
        raise WorkbenchError(
            f"{path} is not listed in {folder / CACHE_FILE}: run kdw cache with the teacher "
            "again, which checks and lists it"
        )
    if file_digest(path, "the teacher cache file") != entry.sha256:
        raise WorkbenchError(
            f"{path} is not the file kdw cache wrote (its sha256 is not the one "
            f"{CACHE_FILE} records): {CHANGED_REMEDY}"
        )
    return entry


def save_embeddings(folder: Path, model: PreTrainedModel) -> None:
    """Keep the teacher's embedding stage in ``teacher/`` (GKD's student set-up copies it into a
    student of the teacher's tokenizer): each tensor of its state named by its module's path."""
    from safetensors.torch import save_file

    from workbench.core.parts import parts_of

    stage = parts_of(model).stage
    tensors = {
        f"{path}.{name}": tensor.detach().contiguous().clone()
        for path in stage
        for name, tensor in model.get_submodule(path).state_dict().items()
    }
    if tensors:
        with atomic_path(folder / TEACHER_FOLDER / EMBEDDINGS_FILE) as path:
            save_file(tensors, str(path), metadata={"stage": json.dumps(stage)})


def load_embeddings(folder: Path, model: PreTrainedModel) -> None:
    """Give the embedding stage of a cache's teacher on the ``meta`` device the weights the cache
    kept (:func:`save_embeddings`); a cache without them leaves it on ``meta``."""
    from safetensors import SafetensorError, safe_open

    from workbench.core.parts import set_stage

    path = folder / TEACHER_FOLDER / EMBEDDINGS_FILE
    if not path.exists():
        return
    remedy = "delete it, and kdw cache with the teacher writes it again"
    regular_file(path, "the teacher's embeddings", remedy)
    try:
        with safe_open(str(path), "pt") as file:  # one read: the stage's paths and tensors
            stage = tuple(json.loads((file.metadata() or {})["stage"]))
            tensors = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118 (no __iter__)
        for module in stage:
            prefix = f"{module}."
            state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            model.get_submodule(module).to_empty(device="cpu").load_state_dict(state)
    except (SafetensorError, OSError, RuntimeError, KeyError, ValueError, AttributeError) as error:
        raise WorkbenchError(f"{path} is damaged ({first_line(error)}): {remedy}") from None
    set_stage(model, stage)


def add_file(folder: Path, entry: CachedFile) -> None:
    """Record a finished file in ``cache.json`` (under a lock: shards finish alike)."""
    with FileLock(str(folder / ".cache.lock")):
        record = read_record(folder)
        files = [f for f in record.files if f.file != entry.file] + [entry]
        atomic_write_json(
            _record_path(folder),
            record.plain() | {"files": [f.plain() for f in files]},
        )


def check_same(
    record: CacheRecord,
    folder: Path,
    fingerprint: str | None,
    data: TaskData,
    data_config: DataConfig,
) -> None:
    """Refuse, in one line, a cache of another teacher (``fingerprint``; None: not known here)
    or of other data than ``data`` (its splits' fingerprints), naming the options that differ."""
    if list(record.task.get("label_names", ())) != list(data.spec.label_names):
        raise WorkbenchError(
            f"{folder / CACHE_FILE} names the classes {record.task.get('label_names')}, but the "
            f"task's are {list(data.spec.label_names)} (in this order): the cache's logits are "
            "not in the task's classes; build it again with kdw cache"
        )
    if fingerprint is not None and record.fingerprint != fingerprint:
        raise WorkbenchError(
            f"{folder} caches another teacher (weights {record.fingerprint}, this one "
            f"{fingerprint}): choose another folder, or the teacher it was built with"
        )
    if record.split_fingerprint != data.fingerprint():
        given = to_dict(data_config)
        differ = [
            f"{option_name(name)} {value}" if value is not None else f"no {option_name(name)}"
            for name, value in record.data.items()
            if given.get(name) != value
        ]
        ours, theirs = data.transfer or {}, record.transfer or {}
        if ours.get("fingerprint") != theirs.get("fingerprint"):
            differ.append(
                f"--transfer {theirs['source']} ({theirs['used']:,} texts)"
                if theirs
                else "no --transfer"
            )
        raise WorkbenchError(
            f"{folder} was built on other data than these options give (its splits differ): "
            + (f"it was built with {', '.join(differ)}" if differ else "the data files changed")
        )


def cached_teacher(folder: Path, record: CacheRecord, data: DataConfig) -> LoadedModel:
    """The teacher a cache stands for: its config and tokenizer, and a model on the ``meta``
    device (its shape, no weights: whatever would need them fails rather than computes) but for
    its embedding stage, whose weights the cache keeps (:func:`load_embeddings`)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from workbench.core.data import TaskSpec
    from workbench.core.models import ATTENTION, LoadedModel

    check_teacher_files(folder, record)
    check_config_file(folder / TEACHER_FOLDER)  # its bounds, before a model is built from it
    config = AutoConfig.from_pretrained(folder / TEACHER_FOLDER)
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(
            config, attn_implementation=ATTENTION
        )
    load_embeddings(folder, model)
    tokenizer = AutoTokenizer.from_pretrained(folder / TEACHER_FOLDER)
    task = record.task | {k: tuple(record.task[k]) for k in ("label_names", "metrics")}
    spec = TaskSpec(**task)
    name = Path(record.teacher.source).name if record.teacher else folder.name
    return LoadedModel(model.eval(), tokenizer, spec, data, name, str(folder), "teacher cache")


def open_cache(folder: str | Path) -> LoadedModel:
    """The teacher the cache ``folder`` stands for (:func:`cached_teacher`), on the task's data
    it was built on; a folder that is no cache is one line."""
    folder = Path(folder)
    record = read_record(folder)
    return cached_teacher(folder, record, from_dict(DataConfig, record.data))


def is_cache(source: str | Path) -> bool:
    """Whether ``source`` names a teacher cache folder (one with ``cache.json``, whatever kind
    of file: one that is not a regular file is refused by name when the record is read)."""
    return bool(source) and os.path.lexists(Path(source) / CACHE_FILE)


def cached_logits(folder: str | Path, split: str, data: TaskData):
    """The teacher's logits ``[N, C]`` on ``data``'s ``split`` as the cache ``folder`` holds them;
    a cache without them (another task or subsample, a split it was not built on) is one line."""
    from workbench.core.cache import ExampleCache, Layout

    folder, record = Path(folder), read_record(folder)
    wanted = {"split": split, "fields": ["logits"], "data": data.fingerprint().get(split)}
    entry = next(
        (f for f in record.files if all(f.key.get(k) == v for k, v in wanted.items())), None
    )
    if entry is None:
        raise WorkbenchError(
            f"{folder} holds no teacher logits of this {split} split (it was built on "
            f"{record.data.get('task')}; kdw cache builds them)"
        )
    entry = checked_file(folder, record, entry.file)
    layout = Layout(entry.examples, fields=("logits",), classes=data.spec.num_labels)
    return ExampleCache.load(folder / entry.file, layout).per_example["logits"]
