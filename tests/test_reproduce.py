"""``kdw reproduce`` on a tiny suite: every method and ablation trains (in two worker
processes), the report has its tables and figures, and a second call in one process reuses the
finished runs and scores them the same."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kd.reproduce import (
    MAIN_METHODS,
    ExplanationAgreement,
    Suite,
    TaskPlan,
    experiments,
    gallery_indices,
    reproduce,
    write_report,
)
from workbench.config import DataConfig, TeacherConfig
from workbench.data import load_task
from workbench.errors import WorkbenchError


def test_tiny_suite_report(tiny_model_dir: Path, tiny_task_dir: Path, tmp_path: Path):
    plan = TaskPlan(
        DataConfig(task=str(tiny_task_dir), max_length=16),
        TeacherConfig(model=str(tiny_model_dir)),
        teacher_epochs=2,
        student_epochs=0.2,
        student_layers=2,
        seeds=(1, 2),
        batch_size=16,
        teacher_learning_rate=2e-3,
        student_learning_rate=1e-3,
        top_k_sweep=(4, 8),
        steps_sweep=(2,),
    )
    suite = Suite(
        plans={"tiny": plan},
        ablation_task="tiny",
        description="tiny test suite",
        cuts="everything (a tiny model).",
        ablation_groups=("adkd-k", "adkd-terms"),
        ablation_data=replace(plan.data, max_train_examples=150, max_eval_examples=30),
    )
    todo = experiments(suite)
    assert len(todo) == 2 * len(MAIN_METHODS) + 3 + 5  # the 3 references retrained for ablations
    everything = experiments(Suite(plans={"tiny": plan}, ablation_task="tiny"))
    assert len(everything) == 2 * len(MAIN_METHODS) + 3 + 4 + 2 + 1 + 2 + 2 + 1
    out = tmp_path / "report"
    report = reproduce(out, suite, announce=lambda _: None, jobs=2).read_text()  # 2 processes
    results = json.loads((out / "results.json").read_text())
    assert len(results["students"]) == len(todo)
    assert all(0 <= r["test"]["label_loyalty"] <= 1 for r in results["students"])
    assert all(-1 <= r["test"]["saliency_loyalty"] <= 1 for r in results["students"])
    assert all(0 <= r["test"]["attribution_gap"] <= 2 * 3**0.5 for r in results["students"])
    assert results["setup"]["tiny"]["seeds"] == [1, 2]
    assert "What this suite cuts: everything (a tiny model)." in report
    assert "minutes with `--jobs 2`, reusing any run" in report
    accuracy = {
        (r["name"], r["seed"]): r["test"]["accuracy"]
        for r in results["students"]
        if r["group"] == "main"
    }
    references = {r["name"]: r for r in results["students"] if r["group"] == "reference"}
    assert sorted(references) == ["adkd", "ckd", "gkd"]
    for record in results["students"]:
        assert ("/ablations/" in record["run"]) == (record["group"] != "main")
        data = json.loads((Path(record["run"]) / "run.json").read_text())["configs"]["data"]
        assert data["max_train_examples"] == (None if record["group"] == "main" else 150)
        assert data["max_eval_examples"] == (None if record["group"] == "main" else 30)
    gains = np.array([accuracy["adkd", seed] - accuracy["kd", seed] for seed in (1, 2)]) * 100
    adkd_row = next(line for line in report.splitlines() if line.startswith("| adkd | "))
    reported = [float(v) for v in adkd_row.split("|")[-2].split("±")]  # the "Δ kd" column
    assert reported == pytest.approx([gains.mean(), gains.std(ddof=1)], abs=0.051)
    for heading in (
        "## Set-up and what was cut",
        "## Main table",
        "## Loyalty to the teacher",
        "## Ablations (tiny, seed 1)",
    ):
        assert heading in report
    for method in MAIN_METHODS:
        assert f"| {method} | " in report
    assert "adkd K=8" in report and "adkd w/o kd" in report
    reference = references["adkd"]["test"]["accuracy"] * 100  # retrained on the ablations' data
    assert f"| full method | adkd | {reference:.1f} | " in report
    assert (out / "figures" / "methods.png").stat().st_size > 0
    assert (out / "figures" / "adkd-k.png").exists()
    gallery = list((out / "figures" / "gallery" / "tiny").glob("*.png"))
    assert len(gallery) == len(set(load_task(plan.data).splits["test"].labels))  # one per class
    finished = {
        r["run"]: (Path(r["run"]) / "checkpoint.pt").stat().st_mtime for r in results["students"]
    }
    stored = [Path(r["run"]) / ExplanationAgreement.STORED for r in results["students"]]
    assert all(path.exists() for path in stored)  # kept for a resumed suite ...
    for path in stored:  # ... and removed here, so that this process scores every run again
        path.unlink()
    reproduce(out, suite, announce=lambda _: None)  # in this process, reusing every finished run
    assert all(
        (Path(run) / "checkpoint.pt").stat().st_mtime == mtime for run, mtime in finished.items()
    )
    again = json.loads((out / "results.json").read_text())
    for first, second in zip(results["students"], again["students"], strict=True):
        assert first["run"] == second["run"]
        assert first["test"] == pytest.approx(second["test"], abs=1e-6)
    assert all(path.exists() for path in stored)
    score = json.loads(stored[0].read_text())
    stored[0].write_text(json.dumps({**score, "saliency_loyalty": 0.123}))
    reproduce(out, suite, announce=lambda _: None)  # a stored score is reused, not recomputed
    reused = json.loads((out / "results.json").read_text())["students"][0]["test"]
    assert reused["saliency_loyalty"] == 0.123
    report = (out / "report.md").read_text()
    assert reproduce(out, report_only=True).read_text() == report  # from results.json alone
    partial = {**again, "students": again["students"][:5]}
    (out / "results.json").write_text(json.dumps(partial))
    planned = len(todo)
    assert (
        f"**Incomplete:** 5 of the {planned} planned"
        in reproduce(out, report_only=True).read_text()
    )
    with pytest.raises(WorkbenchError, match="run the suite first"):
        reproduce(tmp_path / "empty", report_only=True)


def test_gallery_takes_the_first_example_of_each_class():
    assert gallery_indices([2, 0, 0, 1, 2]) == "1,3,0"


def test_report_cells_one_seed_and_two(tmp_path: Path):
    records = [
        {
            "task": "t",
            "name": name,
            "group": "main",
            "seed": seed,
            "sweep": None,
            "run": "",
            "test": {"accuracy": accuracy, "macro_f1": accuracy},
        }
        for name, seed, accuracy in (("kd", 1, 0.5), ("kd", 2, 0.7), ("ckd", 1, 0.6))
    ]
    results = {
        "suite": "hand-written",
        "teachers": {"t": {"run": "", "test": {"accuracy": 0.8, "macro_f1": 0.8}}},
        "students": records,
    }
    report = write_report(tmp_path, results, {}).read_text()
    assert "| kd | 60.0 ± 14.1 | 60.0 ± 14.1 | – |" in report  # two seeds: mean ± sample std
    assert "| ckd | 60.0 | 60.0 | 10.0 |" in report  # one seed: no ±; Δ kd at seed 1


WORKER_SCRIPT = """
import multiprocessing, os, time
from concurrent.futures import ProcessPoolExecutor
from kd.reproduce import exit_with_parent

if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=exit_with_parent, initargs=(os.getpid(), 0.1))
    worker = pool.submit(os.getpid).result()
    pool.submit(time.sleep, 120)  # the worker is busy, as with a student
    print(worker, flush=True)
    time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie left for init to reap does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_busy_worker_exits_when_the_suite_process_is_killed(tmp_path: Path):
    script = tmp_path / "suite.py"
    script.write_text(WORKER_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        assert _running(worker)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.time() + 20
    while _running(worker) and time.time() < deadline:
        time.sleep(0.1)
    assert not _running(worker)
