"""Every record the workbench reads back is read bounded: a regular file only (a link is
followed only to a regular file; a device or a pipe is refused without being opened for
reading), at most a cap per kind of file, with the cap in the message. A run's ``status.json``
linked to ``/dev/zero`` costs seconds, not gigabytes."""

from __future__ import annotations

import os
import resource
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import kdw_here, write_tiny_runs
from workbench.app.catalog import discover_runs
from workbench.core.errors import WorkbenchError
from workbench.core.files import LOG_LIMIT, RECORD_LIMIT, hold
from workbench.core.runs import RUN_REMEDY, STATUS_REMEDY, Run


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("bounded")
    write_tiny_runs(work)
    return work


def _copy(work: Path, tmp_path: Path) -> Path:
    run = tmp_path / "teacher"
    shutil.copytree(work / "teacher", run)
    (run / ".lock").unlink(missing_ok=True)
    return run


@contextmanager
def bounded_memory(headroom: int = 1 << 30) -> Iterator[None]:
    """At most ``headroom`` more bytes of address space while the block runs: a reader that
    reads ``/dev/zero`` fails with MemoryError in a second instead of filling the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    used = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (used + headroom, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_status_linked_to_dev_zero_is_refused_at_once(work, tmp_path):
    run = _copy(work, tmp_path)
    (run / "status.json").unlink()
    (run / "status.json").symlink_to("/dev/zero")
    with bounded_memory(), pytest.raises(WorkbenchError) as raised:
        Run(run).status()
    assert str(raised.value) == (
        f"run file {run / 'status.json'} is a device: give a regular file: {STATUS_REMEDY}"
    )
    start = time.perf_counter()
    with bounded_memory():
        status, err = kdw_here(["evaluate", str(run)], tmp_path)
    assert status == 0, err  # the model is scored; the progress record is said to be unreadable
    assert time.perf_counter() - start < 30
    (run / "run.json").unlink()
    (run / "run.json").symlink_to("/dev/zero")
    with bounded_memory():
        status, err = kdw_here(["evaluate", str(run)], tmp_path)
    assert (status, err) == (
        2,
        f"kdw: error: run file {run / 'run.json'} is a device: give a regular file: {RUN_REMEDY}\n",
    )


def test_a_pipe_or_a_file_past_the_cap_is_refused_without_reading_it(work, tmp_path):
    run = _copy(work, tmp_path)
    (run / "status.json").unlink()
    os.mkfifo(run / "status.json")  # a reader would wait for a writer forever
    with bounded_memory(), pytest.raises(WorkbenchError, match=r"status.json is a pipe: give a"):
        Run(run).status()
    (run / "status.json").unlink()
    with open(run / "status.json", "wb") as sparse:  # no disk used: a hole
        sparse.truncate(RECORD_LIMIT + 1)
    with pytest.raises(WorkbenchError) as raised:
        Run(run).status()
    assert str(raised.value) == (
        f"run file {run / 'status.json'} is {RECORD_LIMIT + 1:,} bytes: the limit is "
        f"{RECORD_LIMIT:,} bytes: {STATUS_REMEDY}"
    )
    (run / "metrics.jsonl").unlink()
    with open(run / "metrics.jsonl", "wb") as sparse:
        sparse.truncate(LOG_LIMIT + 1)
    with pytest.raises(WorkbenchError, match=f"the limit is {LOG_LIMIT:,} bytes"):
        Run(run).metrics()


def test_the_catalog_lists_a_run_whose_records_link_to_devices(work, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    run = _copy(work, root)
    for name in ("status.json", "metrics.jsonl", "results.json"):
        (run / name).unlink()
        (run / name).symlink_to("/dev/zero")
    shutil.copytree(work / "student", root / "student")
    (root / "student" / ".lock").unlink(missing_ok=True)
    start = time.perf_counter()
    with bounded_memory():
        entries = {entry.name: entry for entry in discover_runs(root)}
    assert time.perf_counter() - start < 10
    assert sorted(entries) == ["student", "teacher"]
    assert entries["teacher"].usable and entries["student"].usable  # the model stays usable
    assert len(entries["teacher"].notes) == 3
    assert all("is a device: give a regular file" in note for note in entries["teacher"].notes)


DEEP = "[" * 100_000 + "]" * 100_000  # JSON that Python's parser cannot recurse into


def test_records_nested_too_deep_are_one_line_and_listed_beside_the_runs(work, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    run = _copy(work, root)
    (run / "status.json").write_text(DEEP)
    deep = root / "deep"
    deep.mkdir()
    (deep / "run.json").write_text(DEEP)
    with pytest.raises(WorkbenchError) as raised:
        Run(run).status()
    assert str(raised.value) == (
        f"run file {run / 'status.json'}: JSON nested too deep to read: {STATUS_REMEDY}"
    )
    entries = {entry.name: entry for entry in discover_runs(root)}
    assert entries["deep"].problem == (
        f"run file {deep / 'run.json'}: JSON nested too deep to read: {RUN_REMEDY}"
    )
    assert entries["teacher"].usable
    assert entries["teacher"].notes == [str(raised.value)]


def test_a_lock_linked_to_dev_zero_is_never_read(work, tmp_path):
    run = _copy(work, tmp_path)
    (run / ".lock").symlink_to("/dev/zero")
    start = time.perf_counter()
    with bounded_memory():
        assert Run(run).writer() is None
        with pytest.raises(WorkbenchError) as raised, hold(run / ".lock", "the run"):
            pass
    assert time.perf_counter() - start < 5
    assert str(raised.value) == (
        f"{run / '.lock'} is a link, not a lock file: remove it and run the command again"
    )


def test_a_checkpoint_or_a_cache_file_that_is_a_pipe_is_refused_without_opening_it(tmp_path):
    from workbench.core.cache import CACHE_REMEDY, ExampleCache

    run = Run(tmp_path / "run")
    run.path.mkdir()
    os.mkfifo(run.checkpoint)  # torch.load would wait for a writer forever
    with pytest.raises(WorkbenchError) as raised:
        run.load_checkpoint("cpu")
    assert str(raised.value) == (
        f"the checkpoint {run.checkpoint} is a pipe: delete it to train this run again from "
        "step 0 (the same command), or choose another --run-dir"
    )
    os.mkfifo(tmp_path / "train.safetensors")
    with pytest.raises(WorkbenchError) as raised:
        ExampleCache.load(tmp_path / "train.safetensors")
    assert str(raised.value) == (
        f"the cache file {tmp_path / 'train.safetensors'} is a pipe: {CACHE_REMEDY}"
    )
