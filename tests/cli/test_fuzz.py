"""Property-based tests (Hypothesis) of what a user or a shared run folder can hand ``kdw``: a
hostile value for any option of the commands that write, and a mangled copy of any file of a
run. Each command either succeeds or ends in one line on stderr (``kdw: error: ...``), exit
status 2, no traceback, and nothing new on disk and nothing changed. The examples are drawn
deterministically (``derandomize``), so that a failure in CI reproduces here. An example of the
options' test gives every option of a command a value (the first example the simplest, "", the
others drawn); an example of the files' test mangles one file one way. ``KDW_FUZZ_EXAMPLES``
multiplies how many each test draws (1 in the test command: 2 sweeps of the options, 60 files
mangled)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kd.cli import build_parser
from tests.conftest import kdw_here, write_tiny_runs

# slow: each kdw command an example runs takes 0.1–0.4 s; the test command runs about 550
SCALE = int(os.environ.get("KDW_FUZZ_EXAMPLES", "1"))  # 10 for a longer search


def fuzz(examples: int):
    """Hypothesis' settings for a test of ``examples`` examples (times :data:`SCALE`), on the
    suite's profile (``tests/conftest.py``: no deadline, derandomized)."""
    return settings(
        max_examples=examples * SCALE,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# values that break a number, a path, a name or a list: each option meets all of them
HOSTILE = [
    "", " ", "-1", "-0", "0", "nan", "NaN", "inf", "-inf", "1e309", "1e30", "-1e30",
    "18446744073709551616", "0x10", "abc", "é", "a=b", "ce=nan", "kd=-1", ",", "=",
    "../nowhere", "/dev/zero", "/dev/null", "none", "true", "2.5e-324", "\x00", "1;rm -rf /",
]  # fmt: skip
VALUES = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A tiny model folder and task, a teacher run and a student run (max length 16)."""
    work = tmp_path_factory.mktemp("fuzz")
    write_tiny_runs(work)
    return work


def _commands(work: Path) -> dict[str, list[str]]:
    """A valid, quick command line per command that writes, its output named ``new``."""
    data = ["--task", str(work / "task"), "--max-length", "16"]
    optim = ["--epochs", "0.05", "--batch-size", "16", "--threads", "1"]
    return {
        "train-teacher": [
            *["train-teacher", "--run-dir", "new", *data, "--model", str(work / "tiny-bert")],
            *optim,
        ],
        "distill": [
            *["distill", "--run-dir", "new", *data, "--teacher", str(work / "teacher")],
            *["--num-layers", "2", *optim],
        ],
        "export": ["export", str(work / "student"), "--out", "new", "--text", "good and bad"],
        "attribute": ["attribute", str(work / "student"), "--out", "new", "--text", "good"],
        "evaluate": ["evaluate", str(work / "student"), "--json", "new"],
    }


def _options(command: str) -> list[str]:
    """The options of ``kdw COMMAND`` that take a value (the output's name and --config
    aside)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return sorted(
        action.option_strings[-1]
        for action in sub._actions
        if action.option_strings
        and action.nargs != 0
        and action.dest not in ("run_dir", "out", "json", "config", "help")
    )


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def _assert_clean(status: int, stderr: str, cwd: Path, before: dict[str, bytes], what) -> None:
    assert status in (0, 2), (what, status, stderr)
    if status == 2:
        lines = [line for line in stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("kdw: error: ")]
        assert len(errors) == 1 and lines[-1] == errors[0], (what, stderr)
        assert "Traceback" not in stderr, (what, stderr)
        assert not (cwd / "new").exists(), (what, "wrote before refusing", stderr)
    assert _snapshot(cwd) == before or status == 0, (what, "changed what it read")


@pytest.mark.parametrize("command", ["train-teacher", "distill", "export", "attribute"])
@pytest.mark.slow
# slow: each option's value runs a kdw command (in this process) in an empty folder
def test_any_option_value_succeeds_or_is_refused_in_one_line_before_writing(work, command):
    options = _options(command)
    base = _commands(work)[command]

    @fuzz(2)
    @given(data=st.data())
    def case(data) -> None:
        for option in options:  # every option, each a value of its own
            value = data.draw(VALUES, label=option)
            with tempfile.TemporaryDirectory() as folder:
                cwd = Path(folder)
                status, stderr = kdw_here([*base, f"{option}={value}"], cwd)
                _assert_clean(status, stderr, cwd, {}, (option, value))

    case()


# ----------------------------------------------------------------------------- mangled files

MANGLES = ["truncate", "bytes", "wrong type", "missing key", "delete"]


def _mangle(path: Path, how: str, cut: float, junk: bytes) -> None:
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(path.read_bytes()[: int(path.stat().st_size * cut)])
    elif how == "bytes":
        path.write_bytes(junk)
    elif how == "wrong type":
        path.write_text(json.dumps([["not", "this"], 1]))
    else:  # a key of a JSON object, or a line of a JSON-lines file, dropped
        text = path.read_text(errors="replace")
        try:
            record = json.loads(text)
        except ValueError:
            path.write_text("\n".join(text.splitlines()[1:]))
            return
        if isinstance(record, dict) and record:
            record.pop(sorted(record)[int(cut * (len(record) - 1))])
        path.write_text(json.dumps(record))


def _run_files(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())


def _made_by(work: Path, run: str) -> list[str]:
    """The command that made the fixture's run ``run`` into ``run`` (in the working folder)."""
    data = ["--task", str(work / "task"), "--max-length", "16"]
    optim = ["--epochs", "0.1", "--batch-size", "16", "--threads", "1"]
    if run == "teacher":
        return [
            "train-teacher",
            "--run-dir",
            "run",
            *data,
            "--model",
            str(work / "tiny-bert"),
            *optim,
        ]
    teacher = ["--teacher", str(work / "teacher"), "--num-layers", "2"]
    return ["distill", "--run-dir", "run", *data, *teacher, *optim]


@pytest.mark.parametrize(
    ("run", "reader"),
    [
        ("teacher", "evaluate"),
        ("student", "evaluate"),
        ("teacher", "teacher of distill"),
        ("teacher", "rerun"),
        ("student", "rerun"),
    ],
)
@pytest.mark.slow
# slow: every mangled file is read by a kdw command (in this process), as a user's reads it
def test_a_mangled_run_file_is_read_or_refused_in_one_line(work, run, reader):
    """Each file of a finished run, mangled one way, then read: by ``kdw evaluate``, as the
    teacher of a new student, or by rerunning the command that made the run (which may also
    mend it and train on: then it may write)."""
    files = _run_files(work / run)
    commands = _commands(work)

    @fuzz(60)
    @given(
        name=st.sampled_from(files),
        how=st.sampled_from(MANGLES),
        cut=st.floats(0, 1),
        junk=st.binary(max_size=64),
    )
    def case(name: str, how: str, cut: float, junk: bytes) -> None:
        with tempfile.TemporaryDirectory() as folder:
            cwd = Path(folder)
            shutil.copytree(work / run, cwd / "run")
            _mangle(cwd / "run" / name, how, cut, junk)
            before = _snapshot(cwd)
            if reader == "evaluate":
                arguments = ["evaluate", "run", "--json", "new"]
            elif reader == "teacher of distill":
                arguments = [*commands["distill"]]
                arguments[arguments.index(str(work / "teacher"))] = "run"
            else:
                arguments = _made_by(work, run)
            status, stderr = kdw_here(arguments, cwd)
            if reader == "rerun" and status == 0:
                return
            _assert_clean(status, stderr, cwd, before, (name, how))

    case()
