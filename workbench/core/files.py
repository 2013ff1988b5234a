"""Files we write we can read back: atomic writes under unique temporary names, JSON Lines that
survive any text and a kill, exclusive locks that name their holder, and names of files that
must exist.

A JSON Lines file here is split at ``"\\n"`` only, never with :meth:`str.splitlines` (which
also splits at U+0085, U+2028, U+2029 and other characters that JSON leaves raw inside strings).
:func:`json_line` escapes those characters and lone surrogates anyway, so that any reader, and
UTF-8, takes the line whole; every other character stays readable.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workbench.core.errors import WorkbenchError, first_line

# what str.splitlines splits at and json.dumps(ensure_ascii=False) leaves raw, and lone
# surrogates (from undecodable command-line bytes), which UTF-8 cannot encode
_UNSAFE = re.compile("[\u0085\u2028\u2029\ud800-\udfff]")
# endings that make a name a file: data tables and model weights
FILE_SUFFIXES = (
    ".csv",
    ".tsv",
    ".json",
    ".jsonl",
    ".parquet",
    ".txt",
    ".bin",
    ".pt",
    ".pth",
    ".safetensors",
    ".ckpt",
    ".onnx",
    ".h5",
    ".msgpack",
    ".gguf",
)


def looks_like_path(name: str, *, hub_ids: bool = False) -> bool:
    """Whether ``name`` reads as a file or folder rather than a registered name: it starts with
    '.', '~' or '/', ends in a file extension, or holds a path separator — for ``hub_ids``, a
    backslash, a second '/', or a first part that is a local folder (``org/model`` names a hub
    repository, unless ``org`` is a folder here: ``models/nope``)."""
    slashes = 2 if hub_ids else 1
    return (
        name.startswith((".", "~", "/"))
        or name.count("/") >= slashes
        or "\\" in name
        or name.lower().endswith(FILE_SUFFIXES)
        or (hub_ids and "/" in name and Path(name.split("/")[0]).is_dir())
    )


def existing_path(name: str) -> Path:
    """``name`` (``~`` expanded) as a path that exists, else a one-line error."""
    path = Path(name).expanduser()
    if not path.exists():
        raise WorkbenchError(f"no such file or folder: {name}")
    return path


def check_parents(path: Path, option: str) -> None:
    """Refuse a folder to create under a file (``run.json/sub``): the first existing folder
    above ``path`` must be a folder, said in one line naming ``option``."""
    above = next((p for p in path.parents if p.exists() or p.is_symlink()), None)
    if above is not None and not above.is_dir():
        raise WorkbenchError(f"{path}: {above} is a file, not a folder: choose another {option}")


def check_writable(path: Path, option: str) -> None:
    """Refuse a folder to write (``--out``) where nothing can be written, before the work: a file
    above it, or a first existing folder above it where an empty folder cannot be made and removed
    (``/proc/x``, a read-only mount); one line naming ``option``."""
    check_parents(path, option)
    above = next((p for p in path.absolute().parents if p.exists()), None)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".kdw-probe.", dir=above))
    except OSError as error:
        raise WorkbenchError(
            f"{option} {path}: cannot write in {above} ({error.strerror or first_line(error)})"
        ) from None


def local_path(name: str, *, hub_ids: bool = False) -> Path | None:
    """The file or folder ``name`` names, or None for a name that is not one (a task or model
    name); a name that looks like a path (:func:`looks_like_path`) must exist, so that a typo
    fails at once instead of being looked up elsewhere."""
    if looks_like_path(name, hub_ids=hub_ids):
        return existing_path(name)
    path = Path(name)
    return path if path.exists() else None


def _not_regular(mode: int) -> str | None:
    """What a file of ``mode`` is when it is not a regular file (None when it is one)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    kinds = ((stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def regular_file(path: str | Path, what: str, remedy: str = "") -> Path:
    """``path`` (links followed) if it is a regular file, else a one-line error naming ``what`` and
    ending in ``remedy`` where given, found without opening it (a pipe or a device would block)."""
    path = Path(path)
    tail = f": {remedy}" if remedy else ""
    try:
        kind = _not_regular(path.stat().st_mode)
    except OSError as error:
        raise WorkbenchError(f"{what} {path}: cannot read it ({first_line(error)}){tail}") from None
    if kind:
        raise WorkbenchError(f"{what} {path} is {kind}: {remedy or 'give a regular file'}")
    return path


def read_limited(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path`` if it holds at most ``limit`` bytes, else a one-line
    error naming ``what``: opened non-blocking, its kind and size checked before any read, and no
    more than ``limit`` bytes ever read."""
    path = regular_file(path, what)
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise WorkbenchError(f"{what} {path}: cannot read it ({first_line(error)})") from None
    with os.fdopen(descriptor, "rb") as stream:
        status = os.fstat(descriptor)
        kind = _not_regular(status.st_mode)  # replaced since it was checked
        if kind:
            raise WorkbenchError(f"{what} {path} is {kind}: give a regular file")
        if status.st_size > limit:
            raise WorkbenchError(
                f"{what} {path} is {status.st_size:,} bytes: the limit is {limit:,} bytes"
            )
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise WorkbenchError(f"{what} {path} grew past the limit of {limit:,} bytes as it was read")
    return data


# caps of what a reader reads (:func:`read_limited`), by the kind of file
RECORD_LIMIT = 64_000_000  # a record the workbench wrote: run.json, status.json, results…
LOG_LIMIT = 256_000_000  # a JSON Lines log: metrics.jsonl, a job's progress


# the format of every record the workbench writes (run.json, a suite's results.json, a tune
# study's best.json and settings, a faithfulness report, export.json), under FORMAT_KEY; this
# release reads records of this format only (:func:`check_format`)
RECORD_FORMAT = 1
FORMAT_KEY = "record_format"


def with_format(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with the format number (:data:`RECORD_FORMAT`) it is written in."""
    return {FORMAT_KEY: RECORD_FORMAT, **record}


def check_format(record: Any, where: str | Path, remedy: str) -> None:
    """Refuse a record (read from ``where``) of another format than :data:`RECORD_FORMAT`, or
    without one, in one line naming the versions and ending in ``remedy``."""
    found = record.get(FORMAT_KEY) if isinstance(record, dict) else None
    if found != RECORD_FORMAT or isinstance(found, bool):
        written = "no record format" if found is None else f"record format {found!r}"
        raise WorkbenchError(
            f"{where} has {written}, this release reads format {RECORD_FORMAT}: {remedy}"
        )


def parse_json(data: bytes | str, where: str) -> Any:
    """The JSON value of ``data``; a value nested deeper than the parser recurses (about a
    thousand levels, far past any file the workbench reads) is a one-line error naming
    ``where``, not a RecursionError that stops the caller (and the app with it)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise WorkbenchError(f"{where}: JSON nested too deep to read") from None


def read_json_file(path: str | Path, limit: int, what: str) -> Any:
    """The JSON value in the file ``path`` (at most ``limit`` bytes, :func:`read_limited`);
    a missing, unreadable, non-UTF-8 or non-JSON file is a one-line error naming ``what``."""
    path = Path(path)
    if not path.exists():
        raise WorkbenchError(f"{what} {path}: no such file")
    try:
        return parse_json(read_limited(path, limit, what), f"{what} {path}")
    except json.JSONDecodeError as error:
        raise WorkbenchError(f"{what} {path}: not JSON ({error})") from None
    except UnicodeDecodeError:
        raise WorkbenchError(f"{what} {path}: not a JSON text file (not UTF-8)") from None
    except OSError as error:
        raise WorkbenchError(f"{what} {path}: cannot be read ({first_line(error)})") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # what open() would give a new file (read at import: one thread)


TEMPORARY = ".*.tmp"  # the names of atomic writes' temporary files (``.<name>.<random>.tmp``)


def _replaceable(path: Path) -> None:
    """Refuse to rename a file over ``path`` unless it is new, a regular file or a symbolic
    link (which the rename replaces, never its target): a device, a FIFO or a folder stays."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise WorkbenchError(f"{path} is {kind}: it is not replaced; remove it or choose another")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A uniquely named temporary path (absolute) beside ``path`` for the block to write; renamed
    over ``path`` when the block ends, removed when it fails: readers never see half a file, writers
    never share one. Only a regular file or a link is ever replaced (else a one-line error)."""
    path = path.absolute()
    _replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(descriptor)
    temporary = Path(name)
    try:
        os.chmod(temporary, _FILE_MODE)
        yield temporary
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def staging_folder(path: Path) -> Path:
    """A fresh, uniquely named hidden folder ``.<name>.<random>`` beside ``path`` (its parent made
    if missing) to build ``path``'s contents in, by its absolute path (code that works in another
    folder, as ONNX Runtime's int8 pre-processing does, still finds it)."""
    path = path.absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as temporary:
        temporary.write_text(text, encoding="utf-8")


def check_output_file(path: str | Path, option: str) -> Path:
    """A file a user names for a command's output (``--json``), checked before the work: a
    folder, or anything but a regular file, a FIFO or a terminal/character device (followed
    through links), is a one-line error naming ``option``."""
    path = Path(path)
    if path.exists():
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise WorkbenchError(f"{option} {path} is a folder: name a file to write to")
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            raise WorkbenchError(f"{option} {path} is not a regular file, a pipe or a device")
    return path


def write_output_file(path: str | Path, text: str, option: str) -> None:
    """Write a command's output to the file a user named (:func:`check_output_file`): a pipe or
    a device (``>(jq .)``, ``/dev/stdout``) is written to directly, a link's target is replaced
    atomically (the link stays), anything else atomically as itself."""
    path = check_output_file(path, option)
    try:
        if path.exists() and not stat.S_ISREG(path.stat().st_mode):
            path.write_text(text, encoding="utf-8")
        else:
            atomic_write_text(path.resolve() if path.is_symlink() else path, text)
    except OSError as error:  # a full disk or device (/dev/full), a read-only folder
        raise WorkbenchError(f"{option} {path}: cannot write it ({first_line(error)})") from None


def remove_stale_temporaries(folder: Path) -> None:
    """Remove what killed atomic writes left directly in ``folder``, whose lock this process
    holds (no other writer of those files is under way): temporary files (:data:`TEMPORARY`)
    and staging folders of :func:`~workbench.core.runs.replace_directory` (``.<name>.new``,
    ``.<name>.old``)."""
    for path in folder.glob(TEMPORARY):
        if path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
    for pattern in (".*.new", ".*.old"):
        for path in folder.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)


LOCK_LIMIT = 64  # bytes of a lock file: a process id and a newline


def lock_kind(path: Path) -> str | None:
    """What the lock file ``path`` is when it is not a regular file of its own (a link, a pipe,
    a device, a folder), None when it is one or does not exist."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None
    return "a link" if stat.S_ISLNK(mode) else _not_regular(mode)


def lock_holder(path: Path) -> str:
    """The process id written in the lock file ``path`` ("" where there is none or it cannot
    be read: it is read bounded, and only from a regular file of its own)."""
    if lock_kind(path):
        return ""
    try:
        return read_limited(path, LOCK_LIMIT, "the lock").decode("ascii", "replace").strip()
    except WorkbenchError:
        return ""


@contextmanager
def hold(lock_path: Path, what: str) -> Iterator[None]:
    """Hold the lock file ``lock_path`` exclusively (the kernel's ``flock``, which dies with its
    process) while the block runs, this process's id written in it; held by another process, a
    one-line error saying that ``what`` is in use by it."""
    from filelock import FileLock, Timeout

    def write_pid(descriptor: int) -> None:
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    kind = lock_kind(lock_path)
    if kind:
        raise WorkbenchError(
            f"{lock_path} is {kind}, not a lock file: remove it and run the command again"
        )
    lock = FileLock(lock_path, blocking=False, on_acquired=write_pid)
    try:
        acquired = lock.acquire()  # released when the block ends
    except Timeout:
        holder = lock_holder(lock_path) or "?"  # "?": it has not written its id yet
        raise WorkbenchError(
            f"{what} is in use by process {holder}: wait for it to end, or stop it and run "
            "the command again"
        ) from None
    except OSError as error:  # a read-only folder, a file system without locks
        raise WorkbenchError(f"cannot lock {what}: {first_line(error)}") from None
    with acquired:
        yield


def json_text(value: Any) -> str:
    """``value`` as the indented, key-sorted JSON the workbench writes its files in."""
    return json.dumps(value, indent=2, sort_keys=True, default=str) + "\n"


def atomic_write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json_text(value))


def json_line(value: Any) -> str:
    """``value`` as one line of JSON, newline included, whatever text it holds."""
    text = json.dumps(value, ensure_ascii=False)
    return _UNSAFE.sub(lambda match: f"\\u{ord(match.group()):04x}", text) + "\n"


def append_json_line(path: Path, value: Any) -> None:
    """Append ``value`` to the JSON Lines file ``path`` and flush it to disk. A last line that
    a kill cut short (no newline) is ended first, so that it loses only itself."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":
                handle.write(b"\n")
        handle.write(json_line(value).encode())
        handle.flush()
        os.fsync(handle.fileno())


def write_json_lines(path: Path, values: Iterable[Any]) -> None:
    """Write a whole JSON Lines file atomically."""
    atomic_write_text(path, "".join(json_line(value) for value in values))


def parse_json_lines(text: str, source: str | None = None) -> list[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of JSON Lines ``text``. A line that is
    not JSON is an error naming ``source`` and the line; without ``source`` it is skipped, as a
    log's line cut by a kill."""
    values = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            values.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            if source is not None:
                raise WorkbenchError(f"{source}, line {number}: not JSON ({error.msg})") from None
    return values


def read_json_lines(path: Path, numbered: bool = False) -> list[Any]:
    """The values of a JSON Lines log (none while it does not exist), skipping a line cut by a
    kill, even one cut inside a character; ``numbered``: ``(line number, value)`` pairs."""
    if not path.exists():
        return []
    text = read_limited(path, LOG_LIMIT, "the log").decode("utf-8", errors="replace")
    lines = parse_json_lines(text)
    return lines if numbered else [value for _, value in lines]


CACHE_ENV = "KDW_CACHE"


def user_cache() -> Path:
    """The user's cache folder of the workbench: ``$KDW_CACHE``, default
    ``~/.cache/kd-workbench`` (analyses of models it did not train, the app's added folders)."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "kd-workbench"))
