"""Files we write we can read: JSON Lines survive any text and a kill."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import LEAST_RESOLVED
from workbench.core.errors import WorkbenchError
from workbench.core.files import (
    append_json_line,
    atomic_path,
    atomic_write_text,
    check_output_file,
    hold,
    json_line,
    parse_json_lines,
    read_json_lines,
    write_json_lines,
    write_output_file,
)

ROOT = Path(__file__).resolve().parents[2]
# characters that str.splitlines or UTF-8 trip over, mixed into generated text
AWKWARD = '\u2028\u2029\u0085\r\n\x0b\x0c\x1c\x1d\x1e\udcff\ufeff"\\'
texts = st.text() | st.text(alphabet=st.sampled_from(AWKWARD) | st.characters(), min_size=1)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(values, min_size=1, max_size=4))
def test_any_record_round_trips(tmp_path: Path, records: list):
    assert all(
        json_line(r).count("\n") == 1 and len(json_line(r).splitlines()) == 1 for r in records
    )
    whole, appended = tmp_path / "whole.jsonl", tmp_path / "appended.jsonl"
    appended.unlink(missing_ok=True)
    write_json_lines(whole, records)
    for record in records:
        append_json_line(appended, record)
    assert whole.read_bytes() == appended.read_bytes()
    whole.read_bytes().decode("utf-8")  # lone surrogates escaped: the file is valid UTF-8
    assert read_json_lines(whole) == records
    text = whole.read_text(encoding="utf-8")
    assert [value for _, value in parse_json_lines(text, "whole.jsonl")] == records


def test_a_line_cut_by_a_kill_loses_only_itself(tmp_path: Path):
    path = tmp_path / "log.jsonl"
    append_json_line(path, {"step": 1, "text": "première"})
    append_json_line(path, {"step": 2, "text": "deuxième"})
    data = path.read_bytes()
    path.write_bytes(data[: data.index("è".encode(), data.index(b'"step": 2')) + 1])  # mid-"è"
    assert read_json_lines(path) == [{"step": 1, "text": "première"}]
    append_json_line(path, {"step": 3})
    assert read_json_lines(path) == [{"step": 1, "text": "première"}, {"step": 3}]
    assert read_json_lines(tmp_path / "missing.jsonl") == []


def test_a_bad_line_of_a_file_given_to_us_is_named():
    text = '{"a": 1}\n\n{"a": "x\u2028y"}\r\nnot json\n'  # U+2028 raw, as others write it
    with pytest.raises(WorkbenchError, match=r"^in\.jsonl, line 4: not JSON"):
        parse_json_lines(text, "in.jsonl")
    assert parse_json_lines(text) == [(1, {"a": 1}), (3, {"a": "x\u2028y"})]


def test_atomic_writes_use_their_own_temporary_files(tmp_path: Path):
    target = tmp_path / "results.json"
    atomic_write_text(target, "old")
    with atomic_path(target) as first, atomic_path(target) as second:
        assert first != second and first.parent == second.parent == tmp_path
        first.write_text("first")
        second.write_text("second")
    assert target.read_text() == "first"  # whole, from the writer that ended last
    with pytest.raises(RuntimeError), atomic_path(target) as failed:
        failed.write_text("half")
        raise RuntimeError
    assert target.read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
    plain = tmp_path / "plain"
    plain.write_text("")
    assert target.stat().st_mode == plain.stat().st_mode


HOLDER = """
import sys, time
from pathlib import Path
from workbench.core.files import hold
with hold(Path(sys.argv[1]), "the folder"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_lock_names_its_holder_and_dies_with_it(tmp_path: Path):
    lock = tmp_path / "run" / ".lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with (
            pytest.raises(
                WorkbenchError,
                match=rf"^the folder is in use by process "
                rf"{holder.pid}: wait for it to end",
            ),
            hold(lock, "the folder"),
        ):
            pass
    finally:
        holder.kill()  # SIGKILL: no clean-up, the lock file stays with its id in it
        holder.wait()
    assert lock.read_text() == f"{holder.pid}\n"
    with hold(lock, "the folder"):
        assert lock.read_text() == f"{os.getpid()}\n"


def test_atomic_writes_replace_only_regular_files_and_links(tmp_path):
    fifo, folder = tmp_path / "pipe", tmp_path / "folder"
    os.mkfifo(fifo)
    folder.mkdir()
    for path, kind in ((fifo, "not a regular file"), (folder, "a folder")):
        with pytest.raises(WorkbenchError, match=f"{path} is {kind}: it is not replaced"):
            atomic_write_text(path, "x")
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and folder.is_dir()
    assert not list(tmp_path.glob(".*.tmp"))


def test_an_output_file_may_be_a_pipe_a_device_or_a_link(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    write_output_file(fifo, '{"rows": 1}\n', "--json")  # a pipe: written to directly
    reader.join(timeout=10)
    assert received == ['{"rows": 1}\n'] and stat.S_ISFIFO(fifo.lstat().st_mode)
    write_output_file("/dev/null", "discarded", "--json")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)  # still the device, not a file
    target, link = tmp_path / "rows.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    write_output_file(link, "new", "--json")
    assert link.is_symlink() and target.read_text() == "new"
    with pytest.raises(WorkbenchError, match=r"--json .* is a folder: name a file to write to"):
        check_output_file(tmp_path, "--json")


def test_a_reopened_run_folder_loses_what_killed_writes_left(tmp_path):
    from workbench.core.runs import Run

    info = {"kind": "teacher", "configs": {}, **LEAST_RESOLVED}
    with Run.writing(tmp_path / "run", info, {}):
        pass
    stale = tmp_path / "run" / ".checkpoint.pt.x1y2.tmp"
    stale.write_bytes(b"half a checkpoint")
    staging = tmp_path / "run" / ".model.new"
    staging.mkdir()
    (staging / "config.json").write_text("{}")
    kept = tmp_path / "run" / "analysis_cache" / ".maps.z.tmp"  # another writer's, not this run's
    kept.parent.mkdir()
    kept.write_text("in progress")
    with Run.writing(tmp_path / "run", info, {}):
        assert not stale.exists() and not staging.exists() and kept.exists()


def test_a_folder_where_nothing_can_be_written_is_refused_before_the_work(tmp_path):
    from workbench.core.files import check_writable

    with pytest.raises(WorkbenchError) as raised:
        check_writable(Path("/proc/x/y"), "--out")
    assert str(raised.value) == (
        "--out /proc/x/y: cannot write in /proc (No such file or directory)"
    )
    check_writable(tmp_path / "new" / "deeper", "--out")  # writable: nothing is left behind
    assert list(tmp_path.iterdir()) == []
