"""The first run: the demo job builds the quick demo (teacher, then the vanilla-KD student, then
AD-KD) before the full one, writes every stage's progress (the teacher cache's included) to the
progress file the app reads, and the pages show the quick demo until the full one replaces it.

The demo is built once for the module by the real job (``runner.main``) on a tiny random BERT
(``$KDW_DEMO_SIZES``), one training step per run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import tiny_model, tiny_tokenizer
from workbench.app import first_run, jobs, launch, runner
from workbench.app.catalog import discover_runs
from workbench.app.launch import ENTRY
from workbench.core.cache import ExampleCache
from workbench.core.config import DataConfig
from workbench.core.data import encode, load_task
from workbench.core.errors import WorkbenchError
from workbench.core.files import atomic_write_json

ROOT = Path(__file__).resolve().parents[2]
APP = str(ENTRY)
TRAIN_EXAMPLES = 32
TEACHER_EXAMPLES = 48  # the teacher reads more tweets than its students, as the quick demo's
STAGES = ("demo: teacher", "demo: 3-layer student, kd", "demo: 3-layer student, adkd")


def tiny_sizes(model_dir: Path) -> str:
    """``$KDW_DEMO_SIZES`` for a demo on a tiny model: one step per run."""
    return json.dumps(
        {
            "train_examples": TRAIN_EXAMPLES,
            "teacher_train_examples": TEACHER_EXAMPLES,
            "eval_examples": 16,
            "max_length": 16,
            "teacher_epochs": 1.0,
            "student_epochs": 1.0,
            "teacher_model": str(model_dir),
        }
    )


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory) -> Path:
    """A runs root after a tiny ``KDW_DEMO=default`` build: ``demo-quick`` and ``demo``."""
    work = tmp_path_factory.mktemp("first-run")
    model_dir = work / "tiny-bert"
    tiny_tokenizer(model_dir)
    tiny_model().bert.save_pretrained(model_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(runner.SIZES_ENV, tiny_sizes(model_dir))
        assert runner.main(["demo", str(work / "runs"), "default"]) == 0
    return work / "runs"


def _announcements(folder: Path) -> list[dict]:
    return [r for r in jobs.read_progress(folder) if set(r) == {"stage", "time"}]


@pytest.mark.slow
def test_the_quick_demo_is_built_first_its_kd_student_before_adkd(demo_root):
    quick, full = (demo_root / runner.DEMO_FOLDERS[size] for size in ("quick", "default"))
    for folder in (quick, full):
        stages = [r["stage"] for r in _announcements(folder)]
        assert [s.split(" (")[0] for s in stages] == [*STAGES, runner.READY]
        assert runner.demo_ready(folder)
        assert {e.name for e in discover_runs(folder)} == {
            "teacher",
            "student-kd",
            "student-adkd",
        }
    assert _announcements(quick)[-1]["time"] <= _announcements(full)[0]["time"]
    for name, examples in (("teacher", TEACHER_EXAMPLES), ("student-kd", TRAIN_EXAMPLES)):
        asked = DataConfig(task="tweets", max_train_examples=examples, max_eval_examples=16)
        sampled = len(load_task(asked).splits["train"])  # about the number asked (stratified)
        manifest = json.loads((quick / name / "manifest.json").read_text())
        assert manifest["split_sizes"]["train"] == sampled, name
    assert runner.pending_demos(demo_root, "default") == []


def test_the_teacher_cache_progress_reaches_the_progress_file(demo_root):
    records = jobs.read_progress(demo_root / "demo-quick")
    cache = [r for r in records if "cache" in r and r["stage"] == STAGES[2]]
    train = [r for r in cache if r["cache"] == "teacher cache (train)"]
    assert train and train[-1]["done"] == train[-1]["total"] == TRAIN_EXAMPLES
    assert {r["cache"] for r in cache} == {f"teacher cache ({s})" for s in ("train", "dev", "test")}
    until = records[: records.index(train[-1]) + 1]
    assert jobs.cache_progress(until) == (
        1.0,
        f"teacher cache (train): {TRAIN_EXAMPLES}/{TRAIN_EXAMPLES} examples",
    )
    assert jobs.cache_progress(records[: records.index(train[-1])]) is None  # a step or a stage
    fraction, text = first_run.stage_text(until)
    assert fraction == 1.0
    assert (
        text == f"{STAGES[2]} — teacher cache (train): {TRAIN_EXAMPLES}/{TRAIN_EXAMPLES} examples"
    )


def test_cache_progress_is_reported_after_every_batch(tiny_model_dir, tiny_task_dir):
    data = load_task(DataConfig(task=str(tiny_task_dir), max_length=16))
    train = encode(data.splits["train"], tiny_tokenizer(tiny_model_dir), max_length=16)
    heard = []
    ExampleCache.compute(
        train,
        lambda batch: {"length": batch["attention_mask"].sum(1)},
        batch_size=128,
        description="lengths",
        on_progress=lambda *progress: heard.append(progress),
    )
    n = len(train)
    expected = [min(done, n) for done in range(128, n + 128, 128)]
    assert heard == [("lengths", done, n) for done in expected]


def test_the_build_fraction_counts_runs_and_steps(demo_root):
    records = jobs.read_progress(demo_root / "demo")
    assert first_run.build_fraction(records) == 1.0
    adkd = next(i for i, r in enumerate(records) if r.get("stage") == STAGES[2])
    assert first_run.build_fraction(records[: adkd + 1]) == pytest.approx(2 / 3)
    teacher_steps = [r for r in records[:adkd] if "step" in r and r["stage"].startswith(STAGES[0])]
    first_step = records.index(teacher_steps[0])
    step, total = teacher_steps[0]["step"], teacher_steps[0]["total"]
    assert first_run.build_fraction(records[: first_step + 1]) == pytest.approx(step / total / 3)
    assert first_run.build_fraction([]) == 0.0


def test_demo_modes(monkeypatch, tmp_path, demo_root):
    for mode in ("off", "quick", "default"):
        monkeypatch.setenv(launch.DEMO_ENV, mode)
        assert launch.demo_mode() == mode
    monkeypatch.delenv(launch.DEMO_ENV)
    assert launch.demo_mode() == "default"
    monkeypatch.setenv(launch.DEMO_ENV, "full")
    with pytest.raises(WorkbenchError, match="use default, quick or off"):
        launch.demo_mode()

    calls = []

    def fake_build(root: Path, mode: str) -> jobs.Job:
        calls.append((root, mode))
        return jobs.Job("demo", "demo", str(root), pid=2**22 + 1, started=time.time())

    empty = tmp_path / "runs"
    assert launch.ensure_demo(empty, "off", fake_build) is None
    assert launch.ensure_demo(empty, "quick", fake_build).folder == empty / "demo-quick"
    assert launch.ensure_demo(empty, "default", fake_build).folder == empty / "demo-quick"
    assert calls == [(empty, "quick"), (empty, "default")]
    # the quick demo is ready: KDW_DEMO=quick has nothing to do, default goes on to the full one
    shutil.copytree(demo_root / "demo-quick", empty / "demo-quick")
    assert launch.ensure_demo(empty, "quick", fake_build) is None
    assert launch.ensure_demo(empty, "default", fake_build).folder == empty / "demo"
    # a failed build reports its error instead of retrying; the user's own runs stop the build
    (empty / "demo").mkdir()
    (empty / "demo" / "progress.jsonl").write_text(json.dumps({"error": "out of disk"}) + "\n")
    assert launch.ensure_demo(empty, "default", fake_build).error == "out of disk"
    shutil.copytree(demo_root / "demo" / "teacher", empty / "mine")
    assert launch.ensure_demo(empty, "default", fake_build) is None
    assert len(calls) == 3
    # a full demo made by `kdw demo` (finished runs, no progress file) needs no quick one
    made = tmp_path / "made"
    shutil.copytree(demo_root / "demo", made / "demo")
    (made / "demo" / runner.PROGRESS_FILE).unlink()
    assert runner.demo_ready(made / "demo")
    assert launch.ensure_demo(made, "default", fake_build) is None
    assert launch.ensure_demo(made, "quick", fake_build) is not None  # asked for explicitly
    (made / "demo" / "student-kd" / "status.json").write_text('{"state": "running"}')
    assert not runner.demo_ready(made / "demo")


@pytest.fixture
def building(demo_root):
    """The demo root as it was while the full demo was building (its records up to the AD-KD
    student's teacher cache) by a live demo job; yields the records left out, and restores
    them afterwards."""
    progress = demo_root / "demo" / runner.PROGRESS_FILE
    whole = progress.read_text()
    lines = whole.splitlines(keepends=True)
    cut = 1 + next(
        i for i, line in enumerate(lines) if "teacher cache (train)" in line and STAGES[2] in line
    )
    progress.write_text("".join(lines[:cut]))
    # a live process the app takes for the demo job (its command line names the runner)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", jobs.RUNNER])
    job = jobs.Job("demo", "demo", str(demo_root), sleeper.pid, time.time())
    atomic_write_json(jobs.job_file(demo_root, "demo"), job.__dict__)
    try:
        yield lines[cut:]
    finally:
        sleeper.kill()
        sleeper.wait()
        jobs.job_file(demo_root, "demo").unlink()
        progress.write_text(whole)


def _text(at: AppTest) -> str:
    """The page's messages and progress texts, Markdown escapes removed."""
    messages = [e.value for kind in ("info", "caption", "markdown") for e in at.get(kind)]
    messages += [p.proto.text for p in at.get("progress")]
    return " ".join(map(str, messages)).replace("\\", "")


def test_the_full_demo_replaces_the_quick_one_on_the_pages(demo_root, building, monkeypatch):
    root, rest = demo_root, building
    monkeypatch.setenv("KDW_RUNS", str(root))
    monkeypatch.setenv(launch.DEMO_ENV, "default")
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="case.teacher").options == ["demo-quick/teacher"]
    assert set(at.multiselect(key="case.students").value) == {
        "demo-quick/student-kd",
        "demo-quick/student-adkd",
    }
    text = _text(at)
    assert "Showing the quick demo" in text and "full demo building: 67%" in text, text
    accuracy = json.loads((root / "demo-quick" / "teacher" / "results.json").read_text())
    assert f"Its teacher: {accuracy['test']['accuracy']:.1%} test accuracy." in text, text
    assert f"teacher cache (train): {TRAIN_EXAMPLES}/{TRAIN_EXAMPLES} examples" in text

    with open(root / "demo" / runner.PROGRESS_FILE, "a") as progress:
        progress.write("".join(rest))  # the full demo's build finishes
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="case.teacher").options == ["demo/teacher"]
    assert set(at.multiselect(key="case.students").value) == {
        "demo/student-kd",
        "demo/student-adkd",
    }
    text = _text(at)
    assert "Showing the full demo" in text and "building" not in text, text


def test_a_bad_size_override_fails_the_build_with_its_message(tmp_path, monkeypatch):
    monkeypatch.setenv(runner.SIZES_ENV, json.dumps({"epochs": 1}))
    assert runner.main(["demo", str(tmp_path), "default"]) == 2
    error = jobs.read_progress(tmp_path / "demo-quick")[-1]["error"]
    assert "unknown DemoSize settings ['epochs']" in error
    assert launch.ensure_demo(tmp_path, "default", None).error == error
    monkeypatch.setenv(runner.SIZES_ENV, "[64]")
    assert runner.main(["demo", str(tmp_path), "default"]) == 2
    assert "must be a JSON object" in jobs.read_progress(tmp_path / "demo-quick")[-1]["error"]


def _case_pickers() -> None:
    from workbench.app import common, first_run

    first_run.follow_build(common.runs_root())
    common.pick_models(common.runs(), "case")


def test_a_student_that_finishes_joins_the_pages_choice(demo_root, tmp_path, monkeypatch):
    root = tmp_path / "runs"
    root.mkdir()
    (root / "demo-quick").symlink_to(demo_root / "demo-quick")
    monkeypatch.setenv("KDW_RUNS", str(root))
    model = demo_root / "demo-quick" / "student-kd" / "model"
    aside = tmp_path / "model-being-trained"
    model.rename(aside)  # the KD student is still training
    try:
        at = AppTest.from_function(_case_pickers, default_timeout=60).run()
        assert at.multiselect(key="case.students").value == ["demo-quick/student-adkd"]
        aside.rename(model)
        at.run()
    finally:
        if aside.exists():
            aside.rename(model)
    assert not at.exception, [e.value for e in at.exception]
    assert set(at.multiselect(key="case.students").value) == {
        "demo-quick/student-kd",
        "demo-quick/student-adkd",
    }


def test_the_train_page_follows_a_run_the_demo_build_trains(demo_root, building, monkeypatch):
    """A demo run in training shows the build's live progress and no Resume button (the app's
    own job trains it), whatever its ``status.json`` last recorded; the case study's chooser
    says the same."""
    status = demo_root / "demo" / "student-adkd" / "status.json"
    finished = status.read_text()
    status.write_text('{"state": "running", "step": 0, "total": 47}')
    monkeypatch.setenv("KDW_RUNS", str(demo_root))
    monkeypatch.setenv(launch.DEMO_ENV, "default")
    try:
        at = AppTest.from_file(APP, default_timeout=120).run()
        at.switch_page("train.py")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        runs = at.dataframe[-1].value.set_index("run")
        assert runs.loc["demo/student-adkd", "state"] == "training"
        cache = f"teacher cache (train): {TRAIN_EXAMPLES}/{TRAIN_EXAMPLES} examples"
        assert runs.loc["demo/student-adkd", "step"] == cache
        assert runs.loc["demo/student-kd", "state"] == "finished"
        at.selectbox(key="train.details").set_value("demo/student-adkd")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert not [b for b in at.button if b.key == "train.resume"]
        assert any("demo build trains this run" in c.value for c in at.caption)
        # the pages' choosers say what the progress bar says, not the last checkpoint's step
        entry = next(e for e in discover_runs(demo_root) if e.name == "demo/student-adkd")
        assert entry.label == "demo/student-adkd (unfinished: running at step 0/47)"
        assert jobs.live_label(entry, demo_root) == (
            f"demo/student-adkd (unfinished: running, {cache})"
        )
    finally:
        status.write_text(finished)


# slow: a stand-in app spawns the demo build, which imports torch and trains till the app dies
@pytest.mark.slow
def test_the_demo_build_stops_with_the_app_that_launched_it(tmp_path, tiny_model_dir):
    """The app's process (here a stand-in that launches the build as the app does) is killed:
    the build stops within seconds, before its end, keeping what it trained — also when the
    app was started in the background, with SIGINT ignored (as ``nohup`` or ``&`` leave it)."""
    root = tmp_path / "runs"
    sizes = json.loads(tiny_sizes(tiny_model_dir)) | {"train_examples": 512, "teacher_epochs": 50}
    app = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; from pathlib import Path; from workbench.app import jobs; "
            "signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "root = Path(sys.argv[1]); jobs.launch(root, 'demo', 'demo', root, 'quick', True); "
            "time.sleep(600)",
            str(root),
        ],
        env={**os.environ, runner.SIZES_ENV: json.dumps(sizes), "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    quick = root / runner.DEMO_FOLDERS["quick"]
    deadline = time.time() + 120
    while not any("step" in r for r in jobs.read_progress(quick)) and time.time() < deadline:
        assert app.poll() is None
        time.sleep(0.2)
    build = jobs.read_jobs(root)[0]
    assert build.alive, "the build trains"
    app.kill()
    app.wait()
    deadline = time.time() + 30
    while build.alive and time.time() < deadline:
        time.sleep(0.2)
    assert not build.alive, "the build outlived the app"
    assert not runner.demo_ready(quick)
    assert json.loads((quick / "teacher" / "status.json").read_text())["state"] != "finished"


def test_a_job_is_alive_from_its_start_until_it_ends():
    """A child of this process is alive while it runs, whatever its command line shows (a job
    just launched shows this process's until it starts the runner), and dead once it ends."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert jobs.RUNNER.encode() not in Path(f"/proc/{child.pid}/cmdline").read_bytes()
    assert jobs.process_alive(child.pid)
    child.kill()
    deadline = time.time() + 10
    while jobs.process_alive(child.pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not jobs.process_alive(child.pid)
