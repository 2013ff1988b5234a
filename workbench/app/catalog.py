"""The run folders under the runs root, as the app lists them: every run, every Hugging Face
classifier folder the workbench did not train (a model folder), every teacher cache (``kdw
cache``: a teacher's logits without its weights), and every folder that cannot be used with its
problem in one line, so one broken folder never hides the others."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kd.training.teacher_cache import CACHE_FILE, TEACHER_FOLDER, is_cache, read_record
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import (
    RECORD_LIMIT,
    atomic_write_json,
    looks_like_path,
    read_json_file,
    user_cache,
)
from workbench.core.names import PROMPT_FILE
from workbench.core.runs import RUN_FILE, ResolvedTeacher, Run, RunRecord, RunStatus, teacher_change

RUNS_ENV = "KDW_RUNS"
ADDED_FILE = "app-added.json"  # under the user's cache: the folders and hub ids added
CACHE = "teacher cache"  # the kind (and origin) of a teacher cache folder


def runs_roots() -> list[Path]:
    """Where runs live: the folders ``$KDW_RUNS`` names (several separated by ``os.pathsep``,
    as ``kdw app --runs A B`` sets it), default ``runs/`` in the working directory."""
    return [Path(p) for p in os.environ.get(RUNS_ENV, "").split(os.pathsep) if p] or [Path("runs")]


def runs_root() -> Path:
    """Where the app writes runs (the demo build, the Train page): the first runs root."""
    return runs_roots()[0]


# --------------------------------------------------------------------------- run folders


@dataclass
class RunEntry:
    """A folder under the runs root (or a model added by its path or hub id): a usable run or
    model folder or teacher cache, or one with a problem to show on its row. A model folder's
    ``kind`` is ``"model"``, a teacher cache's :data:`CACHE`; ``task_of``, set where a model
    folder is compared with students, is the student run whose task it is applied to (its data,
    classes and label map)."""

    path: Path
    name: str
    info: RunRecord | None = None  # a run's record (None: a model folder, a broken run)
    status: RunStatus = field(default_factory=lambda: RunStatus(state="unknown"))
    origin: str = ""  # a model folder's: "model folder" or "hub"; a teacher cache's: CACHE
    problem: str | None = None
    task_of: Path | None = None
    notes: list[str] = field(default_factory=list)  # damaged records beside a usable model
    teacher_changed: str | None = None  # a student's teacher changed since (what changed)

    @property
    def kind(self) -> str | None:
        if self.origin:
            return CACHE if self.origin == CACHE else "model"
        return self.info.kind if self.info else None

    @property
    def method(self) -> str:
        return self.info.method if self.info else ""

    @property
    def task(self) -> str:
        return self.info.task.name if self.info and self.info.task else ""

    @property
    def state(self) -> str:
        return self.status.state

    @property
    def usable(self) -> bool:
        return self.problem is None

    @property
    def teacher(self) -> str:
        """What a student learnt from: its teacher cache, else its teacher ("" for others)."""
        student = self.info.configs.get("student", {}) if self.info else {}
        return student.get("teacher_cache") or student.get("teacher", "")

    def results(self) -> dict[str, Any]:
        """Final dev/test metrics, ``{}`` while there are none (or they cannot be read)."""
        try:
            return Run(self.path).results() or {}
        except WorkbenchError:
            return {}

    def stamp(self) -> int:
        """Changes when the run's best model is replaced, or a teacher cache's record (the cache
        key of the model)."""
        files = {"model": "model.safetensors", CACHE: CACHE_FILE}
        weights = self.path / files.get(self.kind, "model/model.safetensors")
        return weights.stat().st_mtime_ns if weights.exists() else 0

    @property
    def unfinished(self) -> str | None:
        """Where a run that has not finished training stands (``stopped at step 3/8``), None
        for a finished run and a model folder."""
        if self.kind not in ("teacher", "student") or self.state == "finished":
            return None
        step, total = self.status.step, self.status.total or "?"
        return self.state + (f" at step {step}/{total}" if step is not None else "")

    @property
    def label(self) -> str:
        """The entry's name, with where a model the workbench did not train came from, or how
        far an unfinished run got (its model is the best dev model so far)."""
        if self.origin:
            return f"{self.name} ({self.origin})"
        name = f"{self.name} (teacher changed)" if self.teacher_changed else self.name
        return f"{name} (unfinished: {self.unfinished})" if self.unfinished else name

    def key(self) -> tuple[str, int, str]:
        """What loads this entry's model (:func:`workbench.app.common.load_cached`): its path,
        :meth:`stamp`, and the run whose task a model folder is applied to."""
        return str(self.path), self.stamp(), str(self.task_of or "")


NAME_SHOWN = 80  # characters of an entry's name the pages show (a longer one is cut)


def shown_name(name: str) -> str:
    """``name`` as the pages show it: cut to :data:`NAME_SHOWN` characters, marked with '…'."""
    return name if len(name) <= NAME_SHOWN else name[: NAME_SHOWN - 1] + "…"


def _modified(path: Path) -> int:
    """When ``path`` (a link: its target, else the link itself) last changed, in ns."""
    try:
        return path.stat().st_mtime_ns
    except OSError:  # a link in a loop or to nothing: its problem is said by the checks
        return path.lstat().st_mtime_ns


def model_entry(source: str, name: str | None = None) -> RunEntry:
    """A classifier the workbench did not train (a folder or a hub id) as the pages list it, with
    its problem in one line; its weights are read only when a page loads it, its folder once per
    change."""
    folder = Path(source)
    shown = shown_name(name or folder.name)
    return _guarded(folder, shown, lambda: [_model_entry(source, shown)])[0]


def _model_entry(source: str, name: str) -> RunEntry:
    folder = Path(source)
    files = (folder, *folder.glob("*")) if folder.is_dir() else ()
    stamp = max((_modified(p) for p in files), default=0)
    origin = "model folder" if folder.exists() else "hub"
    return RunEntry(folder, name, origin=origin, problem=_checked_model(source, stamp))


def _guarded(path: Path, name: str, entries: Callable[[], list[RunEntry]]) -> list[RunEntry]:
    """``entries()``, or one entry of ``path`` named ``name`` with the problem that stopped it in
    one line: a folder or name the catalog cannot read never stops the pages that list it."""
    try:
        return entries()
    except WorkbenchError as error:
        problem = str(error)
    except OSError as error:
        problem = f"cannot be read ({error.strerror or first_line(error)})"
    except (ValueError, RecursionError) as error:
        problem = f"cannot be read ({first_line(error)})"
    return [RunEntry(path, name, problem=problem)]


def cache_entry(folder: Path, name: str) -> RunEntry:
    """A teacher cache folder (``kdw cache``) as the pages list it: a teacher without weights,
    with its problem (a damaged record, a teacher config or tokenizer it lacks) in one line."""
    record = folder / CACHE_FILE
    stamp = record.stat().st_mtime_ns if record.is_file() else 0
    return RunEntry(folder, name, origin=CACHE, problem=_checked_cache(str(folder), stamp))


@functools.lru_cache(maxsize=64)
def _checked_cache(folder: str, stamp: int) -> str | None:
    """The problem of a teacher cache folder, None if it has none (``stamp``: its record's
    modification time, so that a rebuilt cache is checked again)."""
    try:
        read_record(folder)
    except WorkbenchError as error:
        return str(error)
    return _checked_model(str(Path(folder) / TEACHER_FOLDER), stamp)


@functools.lru_cache(maxsize=64)
def _checked_model(source: str, stamp: int) -> str | None:
    """The problem of a model, None if it has none (``stamp``: the latest modification time
    in its folder, so that a changed folder is checked again): the pages re-list it at every
    rerun."""
    from workbench.core.models import check_classifier, check_tokenizer_files, load_config

    try:
        check_classifier(load_config(source), source)
        check_tokenizer_files(source)
    except WorkbenchError as error:
        return str(error)
    return None


def changed_teacher(info: RunRecord) -> str | None:
    """What changed in the teacher a student run pinned since it was distilled, in words (None when
    nothing did or nothing was pinned), its files hashed once per change; a cache's student is
    compared with the teacher the cache holds now."""
    pinned = info.resolved.teacher
    if pinned is None:
        return None
    cache = info.configs.get("student", {}).get("teacher_cache")
    if cache:
        try:
            return teacher_change(pinned, read_record(cache).teacher if is_cache(cache) else None)
        except WorkbenchError:
            return None
    from workbench.core.verify import weight_files

    folder = Path(pinned.source)
    try:
        if (folder / PROMPT_FILE).is_file():  # a prompted teacher: its record pins its base
            files = [folder / PROMPT_FILE]
        else:
            files = [*weight_files(folder), folder / "config.json"] if folder.is_dir() else []
        stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files)
        return teacher_change(pinned, _digest(str(folder), stamp))
    except (WorkbenchError, OSError) as error:  # a damaged teacher: its own row says why
        return f"the teacher {folder} cannot be compared with its pin ({first_line(error)})"


@functools.lru_cache(maxsize=64)
def _digest(folder: str, stamp: tuple) -> ResolvedTeacher | None:
    """The digests of the model folder ``folder`` (``stamp``: its weights' names, times and
    sizes, so that a changed folder is hashed again), None where it is gone."""
    from workbench.core.verify import model_digest

    return ResolvedTeacher(source=folder, **model_digest(folder)) if Path(folder).is_dir() else None


def _entry(root: Path, folder: Path) -> RunEntry:
    entry = RunEntry(folder, folder.relative_to(root).as_posix())
    try:
        run = Run.open(folder)
        entry.info = run.info()
    except WorkbenchError as error:
        entry.problem = str(error)
        return entry
    try:
        entry.status = run.status()
    except WorkbenchError as error:  # it only records progress: a model beside it is usable
        entry.status = RunStatus(state="unknown (status.json unreadable)")
        entry.notes.append(str(error))
    for record in (run.results, run.metrics):  # records of the training, shown beside it
        try:
            record()
        except WorkbenchError as error:
            entry.notes.append(str(error))
    changed = changed_teacher(entry.info)
    if changed:  # its loyalty would be measured against a teacher it did not learn from
        entry.teacher_changed = changed
        entry.notes.append(f"teacher changed: {changed}")
    if not (run.model_dir / "config.json").exists():
        entry.problem = f"no trained model yet (status: {entry.state})"
        return entry
    try:
        run.check_model()
    except WorkbenchError as error:
        entry.problem = str(error)
    return entry


def is_model_folder(folder: Path) -> bool:
    """A Hugging Face checkpoint folder that is no run (``config.json`` and no ``run.json``),
    or a prompted model's (``prompt.json``)."""
    config = folder / "config.json"  # a pipe, a device or a loop too: listed with its problem
    described = os.path.lexists(config) or os.path.lexists(folder / PROMPT_FILE)
    return described and not (folder / RUN_FILE).exists()


def _listable(folder: Path) -> bool:
    """A run folder, a model folder or a teacher cache folder."""
    return (folder / RUN_FILE).exists() or is_model_folder(folder) or is_cache(folder)


def _folder_entry(root: Path, folder: Path) -> RunEntry:
    """The entry of a folder under ``root``, named by its path there."""
    name = shown_name(folder.relative_to(root).as_posix())

    def entry() -> list[RunEntry]:
        if is_cache(folder):
            return [cache_entry(folder, name)]
        if is_model_folder(folder):
            return [model_entry(str(folder), name)]
        return [_entry(root, folder)]

    return _guarded(folder, name, entry)[0]


def _subfolders(folder: Path) -> list[Path]:
    """Sub-folders that may hold runs (dot folders are the app's, studies are listed apart)."""
    return sorted(
        p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and not is_study(p)
    )


STUDY_FILE = "study.db"


def is_study(folder: Path) -> bool:
    """Whether ``folder`` holds a ``kdw tune`` study (its trials are runs of their own)."""
    return (folder / STUDY_FILE).exists()


def discover_studies(root: Path) -> list[Path]:
    """The ``kdw tune`` study folders directly under ``root``."""
    return sorted(p for p in root.iterdir() if is_study(p)) if root.is_dir() else []


def discover_runs(root: Path) -> list[RunEntry]:
    """Every run, model and teacher cache folder under ``root`` and one level deeper
    (``runs/demo/teacher``); folders whose names start with a dot are the app's own."""
    if not root.is_dir():
        return []
    entries = []
    for folder in _subfolders(root):

        def level(folder: Path = folder) -> list[RunEntry]:
            inner = _subfolders(folder)
            if _listable(folder) or not any(_listable(p) for p in inner):
                return [_folder_entry(root, folder)]
            return [_folder_entry(root, p) for p in inner]

        entries += _guarded(folder, shown_name(folder.name), level)
    return entries


def named_under(entries: list[RunEntry], folder: Path) -> list[RunEntry]:
    """``entries`` of a runs root other than the first, named under its folder's name
    (``other/student``) so that they stand apart from the first root's."""
    for entry in entries:
        entry.name = f"{folder.name}/{entry.name}"
    return entries


def added_sources() -> list[str]:
    """The folders and hub ids added in the sidebar, kept across page reloads and launches in
    :data:`ADDED_FILE` under the user's cache (never in the user's own folders)."""
    path = user_cache() / ADDED_FILE
    try:
        value = read_json_file(path, RECORD_LIMIT, "the app's added folders")
    except WorkbenchError:  # none added yet, or a damaged file: start again
        return []
    return [s for s in value if isinstance(s, str)] if isinstance(value, list) else []


def forget_missing() -> list[str]:
    """Forget the added folders that no longer exist (another session's, a deleted one): each
    would list only its problem. Returns those forgotten; a hub id is kept."""
    added = added_sources()
    gone = [
        s for s in added if looks_like_path(s, hub_ids=True) and not Path(s).expanduser().exists()
    ]
    if gone:
        atomic_write_json(user_cache() / ADDED_FILE, [s for s in added if s not in gone])
    return gone


def remove_added(source: str) -> None:
    """Forget ``source``, added in the sidebar (whatever its problem: it is never opened)."""
    kept = [s for s in added_sources() if s != source]
    atomic_write_json(user_cache() / ADDED_FILE, kept)


def added_entries(source: str) -> list[RunEntry]:
    """What a folder or hub id added in the app gives: a run, the runs and model folders of a folder
    of runs (:func:`discover_runs`), a teacher cache, or a classifier; then the teacher of each
    student among them that is not, wherever it lives. A folder that is none of these or cannot be
    read is one entry with its problem."""
    return _guarded(Path(source), shown_name(source), lambda: _added_entries(source))


def _added_entries(source: str) -> list[RunEntry]:
    path = Path(source).expanduser()
    if (path / RUN_FILE).is_file():
        entries = [_entry(path.parent, path)]
    elif is_cache(path):
        entries = [cache_entry(path, shown_name(source))]
    elif path.is_dir() and not is_model_folder(path):
        entries = named_under(discover_runs(path), path)
        if not entries:
            problem = (
                f"{source} holds no run folder (run.json) and no model folder (config.json), "
                "nor any one level down: add a run folder, a folder of runs or a model folder"
            )
            return [RunEntry(path, shown_name(source), problem=problem)]
    else:
        return [model_entry(source, source)]
    listed = {e.path.resolve() for e in entries}
    for entry in list(entries):
        teacher = Path(entry.teacher) if entry.kind == "student" and entry.teacher else None
        if teacher is None or not teacher.is_dir() or teacher.resolve() in listed:
            continue
        listed.add(teacher.resolve())
        if (teacher / RUN_FILE).is_file():
            entries.append(_entry(teacher.parent, teacher))
        elif is_cache(teacher):
            entries.append(cache_entry(teacher, str(teacher)))
        else:
            entries.append(model_entry(str(teacher), str(teacher)))
    return entries


def same_folder(given: str, folder: Path) -> bool:
    """Whether a path recorded in a config (relative to where the command ran) names
    ``folder``; paths that no longer resolve are compared by their last two parts."""
    path = Path(given)
    if path.exists():
        return path.resolve() == folder.resolve()
    return path.parts[-2:] == folder.resolve().parts[-2:]
