"""Every file a run, a search or a suite leaves behind, damaged or edited by hand into the wrong
shape, is refused by its reader in one line: ``kdw: error: <the file> …what is wrong…: what to
do``, exit status 2, no traceback, and no file that existed changed. The app lists such a run
with its one-line reason and goes on drawing every page and the other runs."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kd.cli import main
from tests.conftest import write_tiny_runs
from workbench.app.catalog import discover_runs
from workbench.app.launch import ENTRY
from workbench.core.runs import Run

ROOT = Path(__file__).resolve().parents[2]
SIZES = ["--max-length", "16", "--epochs", "0.1", "--batch-size", "16", "--threads", "1"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A tiny model folder, a task, a teacher, a student distilled from it, and a ``kdw tune``
    study (``study/study.db``, made by Optuna as ``kdw tune`` makes it)."""
    import optuna

    from kd.experiments.tune import STUDY_NAME

    work = tmp_path_factory.mktemp("damaged")
    write_tiny_runs(work)
    (work / "study").mkdir()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=STUDY_NAME, storage=f"sqlite:///{work / 'study' / 'study.db'}"
    )
    study.set_user_attr("preset", "kd")
    return work


# --------------------------------------------------------------------------- damages


def _truncate(path: Path, keep: float = 0.5) -> None:
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


def _json(path: Path, change: Callable[[object], object]) -> None:
    """Rewrite the JSON file ``path`` as ``change`` makes its value (in place or returned)."""
    value = json.loads(path.read_text())
    changed = change(value)
    path.write_text(json.dumps(value if changed is None else changed))


def _running(run: Path) -> None:
    """The run's status says it is training: rerunning its command resumes it."""
    (run / "status.json").write_text('{"state": "running", "step": 1, "total": 1}')


def _checkpoint(run: Path, change: Callable[[dict], None]) -> None:
    saved = torch.load(run / "checkpoint.pt", weights_only=True)
    change(saved)
    torch.save(saved, run / "checkpoint.pt")
    _running(run)


def _cache(run: Path, split: str) -> Path:
    return next((run / "teacher_cache").glob(f"teacher-{split}-*.safetensors"))


def _sqlite_without_study(path: Path) -> None:
    path.unlink()
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    connection.close()


def _suite(folder: Path, text: str | bytes) -> None:
    folder.mkdir()
    path = folder / "results.json"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)


def _config(folder: Path, value: object) -> None:
    path = folder / "cfg.json"
    path.write_bytes(value) if isinstance(value, bytes) else path.write_text(json.dumps(value))


def _metrics_line(run: Path, line: str) -> None:
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write(line + "\n")


def _set(*keys: str, value: object) -> Callable[[dict], None]:
    """A change of a JSON object: its value at ``keys`` set to ``value``."""

    def change(record: dict) -> None:
        for key in keys[:-1]:
            record = record[key]
        record[keys[-1]] = value

    return change


def _drop(*keys: str) -> Callable[[dict], None]:
    def change(record: dict) -> None:
        for key in keys[:-1]:
            record = record[key]
        del record[keys[-1]]

    return change


def _no_model(run: Path, status: str) -> None:
    shutil.rmtree(run / "model")
    (run / "status.json").write_text(status)


# --------------------------------------------------------------------------- commands

# {t}: the test's folder (copies of the runs, the damaged files), {w}: the module's workspace
TEACH = ["train-teacher", "--run-dir", "{t}/teacher", "--task", "{w}/task"]
TEACH += ["--model", "{w}/tiny-bert", *SIZES]
DISTIL = ["distill", "--run-dir", "{t}/student", "--task", "{w}/task", "--teacher", "{w}/teacher"]
DISTIL += ["--num-layers", "2", "--preset", "kd", *SIZES]
TUNE = ["tune", "--out", "{t}/study", "--task", "{w}/task", "--teacher", "{w}/teacher"]
TUNE += ["--num-layers", "2", "--preset", "kd", "--trials", "1", "--space", "alpha=0.5", *SIZES]
REPORT = ["reproduce", "--out", "{t}/suite", "--report-only"]
EVALUATE = ["evaluate", "{t}/teacher", "--split", "dev"]
TERMS = ["evaluate", "{t}/student", "--split", "dev", "--terms"]
CONFIGURED = ["distill", "--config", "{t}/cfg.json", "--run-dir", "{t}/new", "--task", "{w}/task"]
CONFIGURED += ["--teacher", "{w}/teacher", "--num-layers", "2", *SIZES]

RUN_JSON = "teacher/run.json"
CASES = [  # (id, damage of the test's folder, command, the file the error names)
    (
        "checkpoint from another run",
        lambda t: (
            shutil.copy(t / "student/checkpoint.pt", t / "teacher"),
            _running(t / "teacher"),
        ),
        TEACH,
        "teacher/checkpoint.pt",
    ),
    (
        "checkpoint without its RNG state",
        lambda t: _checkpoint(t / "teacher", _drop("rng")),
        TEACH,
        "teacher/checkpoint.pt",
    ),
    (
        "checkpoint with a damaged RNG state",
        lambda t: _checkpoint(t / "teacher", lambda saved: saved["rng"][0].update(python=[1, 2])),
        TEACH,
        "teacher/checkpoint.pt",
    ),
    (
        "checkpoint without its step",
        lambda t: _checkpoint(t / "teacher", _drop("state", "step")),
        TEACH,
        "teacher/checkpoint.pt",
    ),
    (
        "checkpoint that is a folder",
        lambda t: (
            (t / "teacher/checkpoint.pt").unlink(),
            (t / "teacher/checkpoint.pt").mkdir(),
            _running(t / "teacher"),
        ),
        TEACH,
        "teacher/checkpoint.pt",
    ),
    (
        "truncated teacher cache",
        lambda t: (_truncate(_cache(t / "student", "train")), _running(t / "student")),
        DISTIL,
        "student/teacher_cache/teacher-train-",
    ),
    (
        "teacher cache of another split",
        lambda t: (
            shutil.copy(_cache(t / "student", "dev"), _cache(t / "student", "train")),
            _running(t / "student"),
        ),
        DISTIL,
        "student/teacher_cache/teacher-train-",
    ),
    (
        "study.db of random bytes",
        lambda t: (t / "study/study.db").write_bytes(os.urandom(8192)),
        TUNE,
        "study/study.db",
    ),
    ("truncated study.db", lambda t: _truncate(t / "study/study.db", 0.4), TUNE, "study/study.db"),
    (
        "study.db of another program",
        lambda t: _sqlite_without_study(t / "study/study.db"),
        TUNE,
        "study/study.db",
    ),
    (
        "suite results not JSON",
        lambda t: _suite(t / "suite", "{ not json"),
        REPORT,
        "suite/results.json",
    ),
    (
        "suite results not JSON, resumed",
        lambda t: _suite(t / "suite", "{ not json"),
        ["reproduce", "--out", "{t}/suite"],
        "suite/results.json",
    ),
    (
        "suite results binary",
        lambda t: _suite(t / "suite", b"\xff\xfe\x00"),
        REPORT,
        "suite/results.json",
    ),
    ("suite results a list", lambda t: _suite(t / "suite", "[]"), REPORT, "suite/results.json"),
    (
        "suite results' students not a list",
        lambda t: _suite(t / "suite", '{"suite": "s", "teachers": {}, "students": {}}'),
        REPORT,
        "suite/results.json",
    ),
    (
        "suite results without teachers",
        lambda t: _suite(t / "suite", '{"suite": "s", "students": []}'),
        REPORT,
        "suite/results.json",
    ),
    (
        "suite results' student row without test",
        lambda t: _suite(
            t / "suite",
            json.dumps(
                {
                    "suite": "s",
                    "teachers": {},
                    "students": [
                        {"task": "t", "name": "kd", "group": "main", "seed": 1, "run": "r"}
                    ],
                }
            ),
        ),
        REPORT,
        "suite/results.json",
    ),
    ("run.json a list", lambda t: (t / RUN_JSON).write_text("[]"), EVALUATE, RUN_JSON),
    ("run.json a string", lambda t: (t / RUN_JSON).write_text('"run"'), EVALUATE, RUN_JSON),
    ("run.json binary", lambda t: (t / RUN_JSON).write_bytes(b"\xff\x00"), EVALUATE, RUN_JSON),
    (
        "run.json configs a list",
        lambda t: _json(t / RUN_JSON, _set("configs", value=[])),
        EVALUATE,
        RUN_JSON,
    ),
    (
        "run.json configs a list, resumed",
        lambda t: _json(t / RUN_JSON, _set("configs", value=[])),
        TEACH,
        RUN_JSON,
    ),
    (
        "run.json data section a list",
        lambda t: _json(t / RUN_JSON, _set("configs", "data", value=[1])),
        EVALUATE,
        RUN_JSON,
    ),
    ("run.json without kind", lambda t: _json(t / RUN_JSON, _drop("kind")), EVALUATE, RUN_JSON),
    ("run.json without task", lambda t: _json(t / RUN_JSON, _drop("task")), EVALUATE, RUN_JSON),
    (
        "run.json kind a number",
        lambda t: _json(t / RUN_JSON, _set("kind", value=5)),
        EVALUATE,
        RUN_JSON,
    ),
    (
        "run.json label names a string",
        lambda t: _json(t / RUN_JSON, _set("task", "label_names", value="abc")),
        EVALUATE,
        RUN_JSON,
    ),
    (
        "run.json max length a string",
        lambda t: _json(t / RUN_JSON, _set("configs", "data", "max_length", value="16")),
        EVALUATE,
        RUN_JSON,
    ),
    (
        "run.json unknown setting",
        lambda t: _json(t / RUN_JSON, _set("configs", "optim", "epoch", value=1)),
        EVALUATE,
        RUN_JSON,
    ),
    (
        "student's run.json teacher a number",
        lambda t: _json(t / "student/run.json", _set("configs", "student", "teacher", value=5)),
        TERMS,
        "student/run.json",
    ),
    (
        "status.json a list, no model",
        lambda t: _no_model(t / "teacher", "[1, 2]"),
        EVALUATE,
        "teacher/status.json",
    ),
    (
        "status.json state a number, no model",
        lambda t: _no_model(t / "teacher", '{"state": 5}'),
        EVALUATE,
        "teacher/status.json",
    ),
    (
        "status.json step a string, no model",
        lambda t: _no_model(t / "teacher", '{"state": "running", "step": "x"}'),
        EVALUATE,
        "teacher/status.json",
    ),
    (
        "metrics line a list",
        lambda t: _metrics_line(t / "student", "[1, 2]"),
        TERMS,
        "student/metrics.jsonl, line 3",
    ),
    (
        "metrics line of a string step",
        lambda t: _metrics_line(t / "student", '{"step": "x", "split": "train"}'),
        TERMS,
        "student/metrics.jsonl, line 3",
    ),
    (
        "metrics line of a string step, resumed",
        lambda t: (_metrics_line(t / "teacher", '{"step": "x"}'), _running(t / "teacher")),
        TEACH,
        "teacher/metrics.jsonl, line",
    ),
    (
        "results.json a list",
        lambda t: (t / "teacher/results.json").write_text("[1]"),
        TEACH,
        "teacher/results.json",
    ),
    (
        "results.json a metric a string",
        lambda t: _json(t / "teacher/results.json", _set("dev", "accuracy", value="high")),
        TEACH,
        "teacher/results.json",
    ),
    ("--config binary", lambda t: _config(t, bytes(range(256))), CONFIGURED, "cfg.json"),
    ("--config a list", lambda t: _config(t, []), CONFIGURED, "cfg.json"),
    (
        "--config weights a list",
        lambda t: _config(t, {"objective": {"weights": [0.5, 0.5]}}),
        CONFIGURED,
        "cfg.json",
    ),
    (
        "--config epochs a string",
        lambda t: _config(t, {"optim": {"epochs": "x"}}),
        CONFIGURED,
        "cfg.json",
    ),
    ("--config seed a string", lambda t: _config(t, {"optim": {"seed": "x"}}), CONFIGURED, "cfg"),
    ("--config task a number", lambda t: _config(t, {"data": {"task": 5}}), CONFIGURED, "cfg"),
    (
        "--config layers a fraction",
        lambda t: _config(t, {"student": {"num_layers": 2.5}}),
        CONFIGURED,
        "cfg.json",
    ),
    (
        "--config unknown setting",
        lambda t: _config(t, {"optim": {"epoch": 1}}),
        CONFIGURED,
        "cfg.json",
    ),
    ("--config section a list", lambda t: _config(t, {"data": []}), CONFIGURED, "cfg.json"),
]


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes, but lock files a refused command takes."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not p.name.endswith(".lock")
    }


@pytest.fixture
def copies(work, tmp_path) -> Path:
    """The module's teacher, student and study, copied into the test's folder."""
    for name in ("teacher", "student", "study"):
        shutil.copytree(work / name, tmp_path / name)
        (tmp_path / name / ".lock").unlink(missing_ok=True)
    return tmp_path


@pytest.mark.parametrize(
    ("damage", "command", "named"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_damaged_file_is_one_line_naming_it(work, copies, capsys, damage, command, named):
    damage(copies)
    before = _files(copies)
    arguments = [part.format(t=copies, w=work) for part in command]
    capsys.readouterr()
    assert main(arguments) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kdw: error: "), err
    assert str(copies / named) in lines[0], err
    assert "Traceback" not in err
    after = _files(copies)
    assert {name: after.get(name) for name in before} == before  # nothing that existed changed
    assert not (copies / "new").exists()


def test_a_status_of_the_wrong_shape_is_rewritten_when_the_run_resumes(work, copies, capsys):
    """Like a corrupt one: it only records progress, so the training resumes and rewrites it."""
    (copies / "teacher" / "status.json").write_text("[1, 2]")
    assert main([part.format(t=copies, w=work) for part in TEACH]) == 0
    assert Run(copies / "teacher").status().state == "finished"


# --------------------------------------------------------------------------- the app

APP_CASES = {  # a run folder beside the good ones, with one of its files damaged
    "runjson-list": lambda run: (run / "run.json").write_text("[]"),
    "runjson-task-string": lambda run: _json(run / "run.json", _set("task", value="tweets")),
    "runjson-configs-list": lambda run: _json(run / "run.json", _set("configs", value=[])),
    "runjson-max-length": lambda run: _json(
        run / "run.json", _set("configs", "data", "max_length", value="x")
    ),
    "status-list": lambda run: (run / "status.json").write_text("[1, 2]"),
    "status-step": lambda run: (run / "status.json").write_text('{"state": "x", "step": "y"}'),
    "metrics-list": lambda run: _metrics_line(run, "[1, 2]"),
    "metrics-step": lambda run: _metrics_line(run, '{"step": "x", "split": "dev"}'),
    "results-list": lambda run: (run / "results.json").write_text("[1]"),
    "results-string": lambda run: (run / "results.json").write_text('{"dev": "x"}'),
}
FILES = {"runjson": "run.json", "status": "status.json", "metrics": "metrics.jsonl"}
FILES["results"] = "results.json"


@pytest.fixture(scope="module")
def damaged_root(work, tmp_path_factory) -> Path:
    """A runs root: the good teacher and student, and a damaged copy of the teacher per case."""
    root = tmp_path_factory.mktemp("root")
    for name in ("teacher", "student"):
        shutil.copytree(work / name, root / name)
    for name, damage in APP_CASES.items():
        shutil.copytree(work / "teacher", root / name)
        damage(root / name)
    for lock in root.glob("*/.lock"):
        lock.unlink()
    return root


def test_the_catalog_lists_each_damaged_run_with_its_reason(damaged_root):
    entries = {e.name: e for e in discover_runs(damaged_root)}
    assert set(entries) == {"teacher", "student", *APP_CASES}
    assert entries["teacher"].usable and entries["student"].usable
    assert not entries["teacher"].notes and not entries["student"].notes
    for name in APP_CASES:
        entry = entries[name]
        reasons = [entry.problem] if entry.problem else entry.notes
        assert len(reasons) == 1, (name, reasons)
        path = damaged_root / name / FILES[name.split("-")[0]]
        assert str(path) in reasons[0] and "\n" not in reasons[0], (name, reasons)
        assert entry.usable == (not name.startswith("runjson")), name  # the model is intact


@pytest.mark.slow
def test_every_page_draws_beside_damaged_runs(damaged_root, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("KDW_RUNS", str(damaged_root))
    at = AppTest.from_file(str(ENTRY), default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "8 ready, 4 not" in captions.replace("\\", "")
    for name in APP_CASES:
        assert f"{name}: " in captions.replace("\\", ""), name
    for page in ("geometry", "loyalty", "divergence", "exports", "train"):
        at.switch_page(f"{page}.py")
        at.run()
        assert not at.exception, (page, [e.value for e in at.exception])
    table = at.dataframe[0].value  # the train page's runs, every one listed
    assert set(table["run"]) == {"teacher", "student", *APP_CASES}
    for name in APP_CASES:
        row = table[table["run"] == name].iloc[0]
        assert FILES[name.split("-")[0]] in row["problem"], (name, row["problem"])
        at.selectbox(key="train.details").set_value(name).run()
        assert not at.exception, (name, [e.value for e in at.exception])
        shown = [m.value.replace("\\", "") for m in (*at.error, *at.warning)]  # unescaped
        assert any(FILES[name.split("-")[0]] in m for m in shown), (name, shown)


def test_a_cache_holding_nan_is_refused_by_its_cause(tmp_path):
    """A teacher cache whose logits hold NaN is refused when it is read, naming the file and
    the field, instead of a training stopping as if it diverged (lower --learning-rate)."""
    from workbench.core.cache import CACHE_REMEDY, ExampleCache, Layout
    from workbench.core.errors import WorkbenchError

    logits = torch.zeros(2, 3)
    logits[1, 2] = float("nan")
    path = tmp_path / "train.safetensors"
    ExampleCache({"logits": logits}, {}, torch.tensor([0, 0, 0])).save(path, {})
    with pytest.raises(WorkbenchError) as raised:
        ExampleCache.load(path, Layout(2))
    assert str(raised.value) == (
        f"{path} holds NaN or infinite values (example.logits): {CACHE_REMEDY}"
    )
