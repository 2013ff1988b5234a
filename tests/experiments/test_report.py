"""The reproduction report: rendered from its packaged template; the committed record redrawn
with the same numbers; control verdicts on every measure with per-example values, on a record
whose answer is known; the students' size and speed measured beside the teacher, kept in the
record, redrawn by ``--report-only`` and measured on resume without retraining."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from kd.cli import main
from kd.experiments.reproduce import Suite, TaskPlan, reproduce, write_report
from kd.experiments.reproduce.record import SuiteRecord, Trial
from kd.experiments.reproduce.report import Intervals, control_rows, report, searched_points
from kd.experiments.reproduce.runner import compact
from tests.conftest import ROOT
from workbench.analysis.stats import pair_scores, two_level_bootstrap
from workbench.core.errors import WorkbenchError
from workbench.core.files import with_format
from workbench.core.models import load_run
from workbench.core.records import checked

RECORD = ROOT / "reports" / "reproduce"
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def _tables(report: str) -> list[list[str]]:
    """The numbers of each table row, in order."""
    return [NUMBER.findall(line) for line in report.splitlines() if line.startswith("|")]


def _verdicts(report: str) -> dict[str, list[str]]:
    """Each verdict's question → the numbers of its answer."""
    lines = [line for line in report.splitlines() if line.startswith("- **")]
    return {line.split("?**")[0]: NUMBER.findall(line.split("?**")[1]) for line in lines}


# slow: the committed record's intervals and figures are redrawn whole (it is the fixture)
@pytest.mark.slow
def test_report_only_redraws_the_committed_record_with_its_numbers(tmp_path: Path):
    shutil.copy(RECORD / "results.json", tmp_path / "results.json")
    assert main(["reproduce", "--out", str(tmp_path), "--report-only"]) == 0
    new, old = (tmp_path / "report.md").read_text(), (RECORD / "report.md").read_text()
    assert _tables(new) == _tables(old)
    assert _verdicts(new) == _verdicts(old) and len(_verdicts(new)) == 6
    for heading in ("## Verdicts", "## Main table", "## Loyalty to the teacher"):
        assert heading in new
    assert "{{" not in new and "{%" not in new


SEEDS, N = (1, 2), 400


def _row(name: str, seed: int, correct: int, same_class: int, probability: float) -> dict:
    """A main-table row of ``N`` test examples (gold class 0): the first ``correct`` predicted
    right, the first ``same_class`` given the teacher's class, probability loyalty alike."""
    predictions = [0] * correct + [1] * (N - correct)
    label = [1] * same_class + [0] * (N - same_class)
    return {
        "task": "t",
        "name": name,
        "group": "main",
        "seed": seed,
        "sweep": None,
        "run": "",
        "test": {
            "accuracy": correct / N,
            "macro_f1": correct / N,
            "label_loyalty": same_class / N,
            "probability_loyalty": probability,
        },
        "examples": {
            "test_set": "s",
            "predictions": compact(predictions),
            "label_loyalty": compact(label),
            "probability_loyalty": [probability] * N,
        },
    }


def _controlled_record() -> dict:
    """GKD's term raises label and probability loyalty over its control and leaves accuracy
    as its control's; its regime (the control) raises accuracy over vanilla KD and leaves
    loyalty as vanilla KD's."""
    rows = []
    for seed in SEEDS:
        rows += [
            _row("kd", seed, correct=200, same_class=280, probability=0.8),
            _row("gkd", seed, correct=300, same_class=380, probability=0.9),
            _row("gkd control", seed, correct=300, same_class=280, probability=0.8),
        ]
    return with_format(
        {
            "suite": "hand-written",
            "teachers": {"t": {"run": "", "test": {"accuracy": 0.9, "macro_f1": 0.9}}},
            "test_sets": {"s": {"uids": [f"u{i}" for i in range(N)], "labels": "0" * N}},
            "students": rows,
        }
    )


def test_control_verdicts_credit_loyalty_to_the_term_and_accuracy_to_the_regime(tmp_path: Path):
    results = _controlled_record()
    record = checked(results, SuiteRecord)
    intervals = Intervals(record)
    rows = {row["measure"].label: row for row in control_rows(record, ["t"], intervals)}
    assert set(rows) == {"accuracy", "label loyalty", "probability loyalty"}
    assert rows["label loyalty"]["credit"] == {"total": "higher", "regime": None, "term": "higher"}
    assert rows["probability loyalty"]["credit"] == rows["label loyalty"]["credit"]
    assert rows["accuracy"]["credit"] == {"total": "higher", "regime": "higher", "term": None}
    # the term's interval is the two-level bootstrap of the per-example values, called directly
    by_name = {(r["name"], r["seed"]): r for r in results["students"]}
    units = [
        [
            {"uids": results["test_sets"]["s"]["uids"], "scores": [int(c) for c in loyal]}
            for loyal in [by_name[name, seed]["examples"]["label_loyalty"] for seed in SEEDS]
        ]
        for name in ("gkd", "gkd control")
    ]
    direct = two_level_bootstrap(pair_scores(*units, by_seed=True))
    assert rows["label loyalty"]["term"] == direct
    assert direct.difference == pytest.approx(0.25)
    assert rows["accuracy"]["term"].difference == 0 == rows["label loyalty"]["regime"].difference

    section = write_report(tmp_path, record, {}).read_text().split("## Controls")[1]
    table = section.split("## ")[0]
    assert "| t | gkd | label loyalty | +25.0 [+" in table
    assert "| its term: the method is above its control; its regime shows no real" in table
    assert "| t | gkd | accuracy | +25.0 [+" in table
    assert "| its regime: the control is above vanilla KD; its term shows no real" in table


def test_a_call_and_report_only_draw_the_same_report_whatever_the_order_of_tasks(
    tmp_path: Path,
):
    """A call draws from the record it holds (tasks in the suite's order), ``--report-only``
    from ``results.json`` (keys sorted): both give one report, tasks in one order."""
    record = _controlled_record()
    other = [{**row, "task": "a"} for row in record["students"]]
    held = {
        **record,
        "teachers": {"t": record["teachers"]["t"], "a": record["teachers"]["t"]},
        "students": record["students"] + other,
    }
    drawn, stored = tmp_path / "drawn", tmp_path / "stored"
    drawn.mkdir()
    stored.mkdir()
    first = report(drawn, checked(held, SuiteRecord)).read_text()
    (stored / "results.json").write_text(json.dumps(held, sort_keys=True))
    assert reproduce(stored, report_only=True).read_text() == first
    controls = first.split("## Controls")[1].split("## ")[0]
    rows = [line for line in controls.splitlines() if line.startswith("| ")]
    assert rows[2].startswith("| a | gkd |") and rows[-1].startswith("| t | gkd |")


def test_a_record_without_controls_or_per_example_loyalty_has_no_control_rows():
    results = _controlled_record()
    for row in results["students"]:
        del row["examples"]["label_loyalty"], row["examples"]["probability_loyalty"]
    record = checked(results, SuiteRecord)
    rows = control_rows(record, ["t"], Intervals(record))
    assert [row["measure"].label for row in rows] == ["accuracy"]
    results["students"] = [r for r in results["students"] if r["name"] != "gkd control"]
    record = checked(results, SuiteRecord)
    assert control_rows(record, ["t"], Intervals(record)) == []


# slow: a suite trained and its students timed (the timing is what it tests)
@pytest.mark.slow
def test_students_are_timed_beside_the_teacher_kept_and_timed_again_on_resume(
    one_seed_plan: TaskPlan, tmp_path: Path
):
    plan = one_seed_plan
    suite = Suite(
        plans={"tiny": plan},
        ablation_task="tiny",
        methods=("kd", "gkd"),
        controls=False,
        ablation_groups=(),
        speed_examples=20,
    )
    out = tmp_path / "suite"
    report = reproduce(out, suite, announce=lambda _: None).read_text()
    results = json.loads((out / "results.json").read_text())
    speed = results["speed"]["tiny"]
    assert speed["settings"]["examples"] == 20 and speed["settings"]["batch_sizes"] == [1, 32]
    assert [row["name"] for row in speed["rows"]] == ["teacher", "kd", "gkd"]
    runs = [results["teachers"]["tiny"]["run"]] + [r["run"] for r in results["students"]]
    sizes = [sum(p.numel() for p in load_run(out / run).model.parameters()) for run in runs]
    assert [row["parameters"] for row in speed["rows"]] == sizes
    assert speed["rows"][1]["parameters_ratio"] == pytest.approx(sizes[1] / sizes[0])
    assert all(row["latency_ms_median"] > 0 and row["throughput_b32"] > 0 for row in speed["rows"])
    assert "## What a student buys" in report and "under its load" in report
    accuracy = results["students"][0]["test"]["accuracy"] * 100
    assert re.search(rf"\| tiny \| kd \| .* \| {accuracy:.1f} \|", report)

    # the per-example loyalty the record carries averages to the run's own loyalty
    for row in results["students"]:
        test = row["test"]
        same = [int(c) for c in row["examples"]["label_loyalty"]]
        assert np.mean(same) == pytest.approx(test["label_loyalty"])
        probability = row["examples"]["probability_loyalty"]
        assert np.mean(probability) == pytest.approx(test["probability_loyalty"], abs=1e-4)

    # a record without the timing gets it on the next call, training nothing
    (out / "results.json").write_text(
        json.dumps({k: v for k, v in results.items() if k != "speed"})
    )
    said: list[str] = []
    reproduce(out, suite, announce=said.append)
    again = json.loads((out / "results.json").read_text())
    assert again["calls"][-1]["students"] == 0 and again["calls"][-1]["teachers"] == 0
    assert [row["name"] for row in again["speed"]["tiny"]["rows"]] == ["teacher", "kd", "gkd"]
    assert any("timing the seed-1 students" in line for line in said)

    # --report-only redraws it from the record alone
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(out / "results.json", moved / "results.json")
    table = reproduce(moved, report_only=True).read_text().split("## What a student buys")[1]
    assert (
        table.split("## ")[0]
        == (out / "report.md").read_text().split("## What a student buys")[1].split("## ")[0]
    )


def test_a_damaged_timing_in_the_record_is_a_one_line_error(tmp_path: Path):
    record = {**_controlled_record(), "speed": {"t": {"key": "k", "rows": "not a list"}}}
    (tmp_path / "results.json").write_text(json.dumps(record))
    with pytest.raises(WorkbenchError, match=r"is not the record of a suite: .*speed") as error:
        reproduce(tmp_path, report_only=True)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "report.md").exists()


def test_the_report_lists_each_searched_setting_once_with_its_outcome():
    """A setting tried again after an interrupted trial shows the later outcome; a setting
    the sampler repeated (its earlier outcome reused) is listed once."""
    trials = [
        {"tau": 1.0, "alpha": 0.5, "dev": None, "state": "fail"},
        {"tau": 2.0, "alpha": 0.5, "dev": 0.69, "state": "complete"},
        {"tau": 2.0, "alpha": 0.5, "dev": 0.69, "state": "complete"},
        {"tau": 4.0, "alpha": 0.5, "dev": None, "state": "pruned"},
        {"tau": 1.0, "alpha": 0.5, "dev": 0.70, "state": "complete"},
        {"tau": 8.0, "alpha": 0.5, "dev": None, "state": "fail"},
    ]
    points = searched_points(["tau"], checked(trials, list[Trial]))
    assert [(p["settings"], p["dev"], p["failed"]) for p in points] == [
        ({"tau": 1.0}, 0.70, False),
        ({"tau": 2.0}, 0.69, False),
        ({"tau": 4.0}, None, False),
        ({"tau": 8.0}, None, True),
    ]
