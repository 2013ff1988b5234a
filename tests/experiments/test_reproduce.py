"""``kdw reproduce`` on a tiny suite: weights chosen on dev by a 2-trial search, every method
and ablation trained (in two worker processes) and scored, the report's intervals, verdicts and
figures; then the record resumes: without run folders, in a moved folder, with run folders that
recorded another location."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from kd.experiments.reproduce import (
    MAIN_METHODS,
    ExampleScores,
    Shard,
    Suite,
    TaskPlan,
    experiments,
    gallery_indices,
    merge,
    reproduce,
    run_suite,
    write_report,
)
from kd.experiments.reproduce.record import SuiteRecord
from kd.experiments.reproduce.runner import weights_digest
from kd.experiments.reproduce.suite import (
    DEFAULT,
    Experiment,
    ablations,
    identity,
    quick_sweeps,
)
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import PRESETS, Ablation, Claim, Preset, Sweep, ablated
from kd.training.config import TeacherConfig
from workbench.core.config import DataConfig
from workbench.core.data import load_task
from workbench.core.errors import WorkbenchError
from workbench.core.files import with_format
from workbench.core.models import load_run
from workbench.core.records import checked

# the test texts a suite times its students on (200 by default): 8 here, where the timing is
# only carried along; test_report.py tests the timing itself
TIMED = 8


def _timing_free(report: str) -> str:
    """The report without its timings: the wall clock of the calls that wrote it, and the
    students' speed (timed by the call that trained a task's first seed whole)."""
    report = re.sub(r"Wall clock: .*\n\n(\|.*\n)+", "", report)
    return re.sub(r"\n## What a student buys.*?(?=\n## |\Z)", "", report, flags=re.S)


def _kd_alone(plan: TaskPlan) -> Suite:
    """A suite of one student: vanilla KD on ``plan``, without ablations."""
    return Suite(
        plans={"tiny": plan},
        ablation_task="tiny",
        methods=("kd",),
        ablation_groups=(),
        speed_examples=TIMED,
    )


def _trained(out: Path) -> int:
    """What the last call of the suite trained: searches, teachers and students."""
    last = json.loads((out / "results.json").read_text())["calls"][-1]
    return last["searches"] + last["teachers"] + last["students"]


# slow: 15 students and 2 searches trained (the suite's every kind of row), in 2 processes
@pytest.mark.slow
def test_tiny_suite_report_and_resume(tiny_model_dir: Path, tiny_task_dir: Path, tmp_path: Path):
    plan = TaskPlan(
        DataConfig(task=str(tiny_task_dir), max_length=16),
        TeacherConfig(model=str(tiny_model_dir)),
        student_train_examples=200,  # of the teacher's 300
        teacher_epochs=2,
        student_epochs=0.2,
        student_layers=2,
        seeds=(1, 2),
        batch_size=16,
        teacher_learning_rate=2e-3,
        student_learning_rate=1e-3,
        sweeps={"top_k_sweep": (4, 8), "steps_sweep": (2,)},
        explained_examples=20,
    )
    suite = Suite(
        plans={"tiny": plan},
        ablation_task="tiny",
        description="tiny test suite",
        cuts="everything (a tiny model).",
        methods=("kd", "pkd-skip", "ckd", "adkd", "gkd"),  # those the verdicts name
        controls=False,  # tested on their own below
        ablation_groups=("adkd-k",),
        ablation_data=replace(plan.data, max_train_examples=150, max_eval_examples=30),
        tuned={"adkd": ("beta",), "kd": ("tau",)},
        tune_trials=2,
        speed_examples=TIMED,
    )
    assert len(experiments(suite)) == 2 * 5 + 3 + 2  # 3 references, K=4 and K=8
    everything = experiments(Suite(plans={"tiny": plan}, ablation_task="tiny", controls=False))
    assert len(everything) == 2 * len(MAIN_METHODS) + 3 + 4 + 2 + 1 + 2 + 2 + 1
    without = replace(suite, ablation_groups=())  # no ablation, so no reference either
    assert [e.group for e in experiments(without)] == ["main"] * 2 * 5
    ablated = [e for e in experiments(without.with_ablations()) if e.group != "main"]
    assert len(ablated) == 3 + len(everything) - 2 * len(MAIN_METHODS)  # 3 references
    out = tmp_path / "report"
    report = reproduce(out, suite, announce=lambda _: None, jobs=2).read_text()  # 2 processes
    results = json.loads((out / "results.json").read_text())
    assert len(results["students"]) == results["planned_students"] == 2 * 5 + 5
    assert not any(Path(r["run"]).is_absolute() for r in results["students"])

    # the weights chosen on dev: a 2-trial search per tuned method, its choice trained
    tuning = results["tuning"]
    assert sorted(tuning) == ["adkd", "kd"] and len(tuning["adkd"]["trials"]) == 2
    beta = tuning["adkd"]["chosen"]["beta"]
    assert beta in (1, 10, 50, 100)
    assert tuning["adkd"]["objective"]["temperature"] == 2  # not searched: the preset's τ held
    main_adkd = next(r for r in results["students"] if r["name"] == "adkd" and r["group"] == "main")
    objective = json.loads((out / main_adkd["run"] / "run.json").read_text())["configs"]
    assert objective["objective"]["weights"]["attr"] == beta
    # the main table's students on 200 of the teacher's 300 examples, the ablations on 150
    teacher = json.loads((out / results["teachers"]["tiny"]["run"] / "run.json").read_text())
    assert teacher["configs"]["data"]["max_train_examples"] is None
    assert objective["data"]["max_train_examples"] == 200
    reference = next(r for r in results["students"] if r["group"] == "reference")
    ablation = json.loads((out / reference["run"] / "run.json").read_text())["configs"]
    assert ablation["data"]["max_train_examples"] == 150
    assert "| tiny | " in report and " | all | ≤ 200 | all | 16 | " in report
    assert "## Weights chosen on dev" in report and f"beta={beta:g}" in report

    # every student scored on its test split, per example
    for record in results["students"]:
        examples, test = record["examples"], record["test"]
        uids = results["test_sets"][examples["test_set"]]["uids"]
        assert len(examples["predictions"]) == len(uids)
        explained = min(20, len(uids))  # the explanations of the first 20 examples
        assert len(examples["aopc_comprehensiveness"]) == explained
        assert len(examples["attribution_gap"]) == len(examples["saliency_loyalty"]) == explained
        assert -1 <= test["aopc_comprehensiveness"] <= 1 and -1 <= test["aopc_sufficiency"] <= 1
        assert 0 <= test["attribution_gap"] <= 2 * 3**0.5
        assert test["attribution_gap"] == pytest.approx(np.mean(examples["attribution_gap"]))
        predicted = json.loads((out / record["run"] / "predictions.json").read_text())["test"]
        assert [int(c) for c in examples["predictions"]] == predicted["predictions"]

    # Δ kd: the pooled paired difference is the mean of the per-seed accuracy differences
    accuracy = {
        (r["name"], r["seed"]): r["test"]["accuracy"]
        for r in results["students"]
        if r["group"] == "main"
    }
    gain = np.mean([accuracy["adkd", seed] - accuracy["kd", seed] for seed in (1, 2)]) * 100
    table = report.split("## Main table")[1]
    adkd_row = next(line for line in table.splitlines() if line.startswith("| adkd | "))
    cell = adkd_row.split("|")[-2]  # "+1.2 [-0.3, +2.6]"
    difference, low, high = (float(v) for v in re.findall(r"[-+]?\d+\.\d", cell))
    assert difference == pytest.approx(gain, abs=0.051) and low <= difference <= high
    for heading in ("## Verdicts", "## Main table", "## Loyalty to the teacher", "## Ablations"):
        assert heading in report
    assert "- **AD-KD > vanilla KD (accuracy)?** AD-KD − vanilla KD on tiny " in report
    assert "AD-KD's attribution gap the smallest?** on tiny " in report
    assert "ferret-xai differs" in report
    assert (out / "figures" / "deltas.svg").read_text().lstrip().startswith("<?xml")
    gallery = list((out / "figures" / "gallery" / "tiny").glob("*.png"))
    assert len(gallery) == len(set(load_task(plan.data).splits["test"].labels))  # one per class

    # a fresh clone: results.json and figures, no run folders, no searches → nothing retrained
    shutil.rmtree(out / "runs")
    shutil.rmtree(out / "tune")
    again = reproduce(out, suite, announce=lambda _: None).read_text()
    assert _trained(out) == 0 and not (out / "runs").exists() and not (out / "tune").exists()
    assert _timing_free(again) == _timing_free(report)
    assert "in 2 calls of `kdw reproduce`" in again
    calls = json.loads((out / "results.json").read_text())["calls"]
    assert len(calls) == 2 and calls[0]["students"] == 15 and calls[0]["searches"] == 2
    resumed = reproduce(out, without, announce=lambda _: None).read_text()  # no --ablations
    assert _trained(out) == 0 and "## Ablations" in resumed  # the ablations' rows kept
    assert json.loads((out / "results.json").read_text())["students"] == json.loads(
        json.dumps(results["students"])
    )
    moved = tmp_path / "elsewhere" / "suite"  # the suite folder moved
    shutil.move(out, moved)
    assert _timing_free(reproduce(moved, suite, announce=lambda _: None).read_text()) == (
        _timing_free(report)
    )
    assert _trained(moved) == 0 and json.loads((moved / "results.json").read_text())[
        "students"
    ] == json.loads(json.dumps(results["students"]))
    assert reproduce(moved, report_only=True).read_text() == (moved / "report.md").read_text()

    assert (moved / "figures" / "adkd-k.png").exists()
    partial = {**results, "students": results["students"][:5]}  # main-table rows only
    (moved / "results.json").write_text(json.dumps(partial))
    assert (
        f"**Incomplete:** 5 of the {results['planned_students']} planned"
        in reproduce(moved, report_only=True).read_text()
    )
    assert not (moved / "figures" / "adkd-k.png").exists()  # no sweep left to draw
    with pytest.raises(WorkbenchError, match="run the suite first"):
        reproduce(tmp_path / "empty", report_only=True)


# slow: a suite call trains KD, GKD, their controls and a student of the user's
@pytest.mark.slow
def test_each_method_trains_beside_its_control(one_seed_plan: TaskPlan, tmp_path: Path):
    """GKD's control: the same objective and student set-up (the teacher's embeddings, frozen;
    dropout off) with its gradient term at 0, on the same data and seed; its resolved record
    differs from GKD's in that weight alone, and the report credits the gain."""
    plan = one_seed_plan
    suite = Suite(
        plans={"tiny": plan},
        ablation_task="tiny",
        methods=("kd", "gkd"),
        ablation_groups=(),
        ablation_data=replace(plan.data, max_train_examples=20),
        speed_examples=TIMED,
    ).with_students(  # a student of the user's, on the main table's data (not the ablations')
        [{"name": "gkd grad 2", "task": "tiny", "group": "mine", "objective": GKD_GRAD_2}]
    )
    report = reproduce(tmp_path, suite, announce=lambda _: None).read_text()
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {r["name"]: r for r in results["students"]}
    assert list(rows) == ["kd", "gkd", "gkd control", "gkd grad 2"]
    assert rows["gkd grad 2"]["group"] == "mine"
    mine = json.loads((tmp_path / rows["gkd grad 2"]["run"] / "run.json").read_text())
    gkd = json.loads((tmp_path / rows["gkd"]["run"] / "run.json").read_text())
    assert mine["configs"]["data"] == gkd["configs"]["data"]
    assert mine["resolved"]["objective"]["weights"]["grad"] == 2.0
    records = {
        name: json.loads((tmp_path / rows[name]["run"] / "run.json").read_text())
        for name in ("gkd", "gkd control")
    }
    method, ours = (records[n]["resolved"]["objective"] for n in ("gkd", "gkd control"))
    assert ours == {**method, "weights": {"ce": 0.5, "kd": 0.5}}
    assert records["gkd control"]["configs"]["objective"]["gradient_regime"] is True
    assert records["gkd control"]["configs"]["data"] == records["gkd"]["configs"]["data"]
    teacher = load_run(tmp_path / results["teachers"]["tiny"]["run"]).model
    student = load_run(tmp_path / rows["gkd control"]["run"]).model
    torch.testing.assert_close(
        student.bert.embeddings.word_embeddings.weight,
        teacher.bert.embeddings.word_embeddings.weight,
    )  # copied from the teacher and frozen, as under GKD
    section = report.split("## Controls")[1].split("##")[0]
    assert "| tiny | gkd | accuracy | " in section and "| tiny | gkd | label loyalty | " in section
    assert "the difference from vanilla KD belongs to" in section


GKD_GRAD_2 = {"preset": "gkd", "weights": {"ce": 0.5, "kd": 0.5, "grad": 2}}


def test_students_of_a_file_join_the_suite_on_the_data_they_name():
    plan = TaskPlan(DataConfig(task="tweets", max_train_examples=300))
    suite = Suite(
        plans={"tweets": plan},
        ablation_task="tweets",
        methods=("kd",),
        ablation_data=DataConfig(task="tweets", max_train_examples=100),
    )
    extended = suite.with_students(
        [
            {"name": "main", "task": "tweets", "objective": GKD_GRAD_2, "seeds": [1, 7]},
            {"name": "small", "task": "tweets", "objective": GKD_GRAD_2, "sample": "ablation"},
        ]
    )
    before, after = experiments(suite), experiments(extended)
    assert after[: len(before)] == before  # the suite's own students, unchanged
    added = after[len(before) :]
    assert [(e.name, e.group, e.seed) for e in added] == [
        ("main", "extra", 1),
        ("main", "extra", 7),
        *(("small", "extra", seed) for seed in plan.seeds),
    ]
    assert extended.plan_of(added[0]).data.max_train_examples == 300
    assert extended.plan_of(added[-1]).data.max_train_examples == 100


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"name": "x"}, "expected a JSON list of students"),
        ([{"name": "x", "task": "tweets"}], "student 1: missing ['objective']"),
        ([{"name": "x", "task": "tweets", "objective": {}, "seed": 1}], "unknown keys ['seed']"),
        ([{"name": "x", "task": "mnli", "objective": {}}], "student 'x': task 'mnli'"),
        ([{"name": "x", "task": "tweets", "objective": {"preset": "nope"}}], "'x': preset 'nope'"),
        ([{"name": "kd", "task": "tweets", "objective": {}, "group": "main"}], "already name"),
        ([{"name": "x", "task": "tweets", "objective": {}, "sample": "dev"}], "sample 'dev'"),
        ([{"name": "x", "task": "tweets", "objective": {}, "seeds": [-1]}], "seeds must be"),
    ],
)
def test_bad_students_files_are_one_line_errors(entries, message, tmp_path: Path, capsys):
    from kd.cli import main

    students, out = tmp_path / "students.json", tmp_path / "suite"
    students.write_text(json.dumps(entries))
    assert main(["reproduce", "--out", str(out), "--students", str(students)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and message in error, error
    assert not out.exists()  # refused before anything is written


@pytest.mark.slow
def test_a_given_classifier_teaches_the_suite_as_it_is(one_seed_plan: TaskPlan, tmp_path: Path):
    """``--teacher tiny=FOLDER``: no teacher is trained; the folder is the students' teacher,
    its test metrics recorded, and the report written."""
    from tests.tiny_families import save_family_model

    folder = save_family_model("bert", tmp_path / "given", ["Positive", "neutral", "negative"])
    plan = one_seed_plan
    suite = _kd_alone(plan).with_teachers({"tiny": str(folder)})
    out = tmp_path / "suite"
    report = reproduce(out, suite, announce=lambda _: None).read_text()
    results = json.loads((out / "results.json").read_text())
    assert results["teachers"]["tiny"]["run"] == str(folder.resolve())
    assert 0 <= results["teachers"]["tiny"]["test"]["accuracy"] <= 1
    assert not (out / "runs" / "tiny" / "teacher").exists()
    student = json.loads((out / results["students"][0]["run"] / "run.json").read_text())
    assert student["configs"]["student"]["teacher"] == str(folder.resolve())
    assert "## Main table" in report
    with pytest.raises(WorkbenchError, match=r"--teacher names the task\(s\) \['nope'\]"):
        suite.with_teachers({"nope": str(folder)})


# slow: two suite calls: a teacher and a KD student trained and scored, then scored again
@pytest.mark.slow
def test_moved_run_folders_are_used(one_seed_plan: TaskPlan, tmp_path: Path):
    """Run folders written elsewhere (their record names the teacher's old path) are used when
    present: a finished student missing from results.json is scored again, not retrained."""
    plan = one_seed_plan
    suite = _kd_alone(plan)
    out = tmp_path / "a"
    reproduce(out, suite, announce=lambda _: None)
    first = json.loads((out / "results.json").read_text())
    moved = tmp_path / "b"
    shutil.move(out, moved)
    checkpoint = moved / first["students"][0]["run"] / "checkpoint.pt"
    written = checkpoint.stat().st_mtime
    for stored in moved.glob(f"runs/**/{ExampleScores.STORED}"):
        stored.unlink()  # so that the student is scored again from its folder
    (moved / "results.json").write_text(json.dumps({**first, "students": []}))
    reproduce(moved, suite, announce=lambda _: None)
    again = json.loads((moved / "results.json").read_text())
    assert checkpoint.stat().st_mtime == written  # reused, not retrained
    assert again["students"][0]["test"] == pytest.approx(first["students"][0]["test"], abs=1e-6)
    assert again["students"][0]["examples"] == first["students"][0]["examples"]


# slow: the teacher trained again in each of the four calls (what it tests)
@pytest.mark.slow
def test_students_of_a_teacher_trained_again_to_other_weights_are_trained_again(
    kd_and_ckd: Suite, tmp_path: Path
):
    """A call that trains the teacher again (its folder gone, a student left to train) keeps
    the students recorded with the former teacher only when the new one has the same weights
    (a record without the teacher's digest, as a given classifier's: the same test metrics)."""
    suite = kd_and_ckd
    out = tmp_path / "suite"
    reproduce(out, suite, announce=lambda _: None)
    first = json.loads((out / "results.json").read_text())
    teacher = first["teachers"]["tiny"]
    assert [r["teacher"] for r in first["students"]] == [teacher["weights"]] * 2
    assert teacher["weights"] == weights_digest(out / "runs/tiny/teacher/model")

    def trained(teacher: dict, rows: list[dict]) -> list[str]:
        """The students a call trains on a record of ``teacher`` and the kd student's
        ``rows``, without the teacher's folder (ckd is left to train)."""
        shutil.rmtree(out / "runs/tiny/teacher")
        (out / "results.json").write_text(
            json.dumps({**first, "teachers": {"tiny": teacher}, "students": rows[:1]})
        )
        said: list[str] = []
        reproduce(out, suite, announce=said.append)
        return re.findall(r"\] tiny: (\w+), seed 1", "\n".join(said))

    gallery = out / "figures/gallery/tiny"
    drawn = {path.name: path.stat().st_mtime_ns for path in gallery.glob("*.png")}
    recorded = json.loads((gallery / ".drawn.json").read_text())
    assert drawn and set(recorded["files"]) == {p.name for p in gallery.iterdir()} - {".drawn.json"}
    kd_row = first["students"][:1]
    assert trained(teacher, kd_row) == ["ckd"]  # trained again to the same weights: kept
    # the gallery's models are the same weights: not drawn again
    assert {path.name: path.stat().st_mtime_ns for path in gallery.glob("*.png")} == drawn
    (gallery / next(iter(drawn))).unlink()  # a figure lost: the gallery is drawn again
    other = [{**kd_row[0], "teacher": "0" * 16}]  # learnt from another teacher's weights
    assert trained(teacher, other) == ["kd", "ckd"]
    assert set(p.name for p in gallery.glob("*.png")) == set(drawn)
    undigested = {k: v for k, v in teacher.items() if k != "weights"}  # compared by metrics
    rows = [{k: v for k, v in r.items() if k != "teacher"} for r in kd_row]
    assert trained(undigested, rows) == ["ckd"]
    worse = {**undigested, "test": {**undigested["test"], "accuracy": 0.0}}
    assert trained(worse, rows) == ["kd", "ckd"]


# slow: a teacher and two students trained and scored over two suite calls
@pytest.mark.slow
def test_an_interrupted_call_keeps_what_finished(kd_and_ckd: Suite, tmp_path: Path, monkeypatch):
    """Ctrl-C during the second student: the record keeps the teacher, the first student and
    the call's wall clock; the next call trains only the second student."""
    import kd.experiments.reproduce.runner as runner

    suite = kd_and_ckd
    train = runner.train_and_score

    def interrupted(*call):
        if call[3].name == "ckd":
            raise KeyboardInterrupt
        return train(*call)

    monkeypatch.setattr(runner, "train_and_score", interrupted)
    with pytest.raises(KeyboardInterrupt):
        reproduce(tmp_path, suite, announce=lambda _: None)
    first = json.loads((tmp_path / "results.json").read_text())
    assert [r["name"] for r in first["students"]] == ["kd"] and list(first["teachers"]) == ["tiny"]
    assert len(first["calls"]) == 1 and first["calls"][0]["students"] == 1
    monkeypatch.undo()
    reproduce(tmp_path, suite, announce=lambda _: None)
    second = json.loads((tmp_path / "results.json").read_text())
    assert [r["name"] for r in second["students"]] == ["kd", "ckd"]
    assert second["students"][0] == first["students"][0]
    assert [c["students"] for c in second["calls"]] == [1, 1]


def test_the_ablations_are_derived_from_their_presets_weights(monkeypatch):
    plan = TaskPlan(DataConfig(task="tweets"), sweeps={"top_k_sweep": (8,), "steps_sweep": (2,)})

    def weights() -> dict[str, dict[str, float]]:
        rows = ablations("tweets", plan, (1,))
        return {e.name: e.objective.weights for e in rows if e.objective.weights}

    assert weights() == {
        "adkd w/o attr": {"ce": 0.1, "kd": 0.9},
        "adkd w/o ce": {"kd": 0.9, "attr": 1.0},  # the preset's β, 1
        "adkd w/o kd": {"ce": 0.1, "attr": 1.0},
        "ckd w/o wr": {"ce": 0.5, "kd": 0.5, "ltr": 1.0},
        "ckd w/o ltr": {"ce": 0.5, "kd": 0.5, "wr": 1.0},
    }
    adkd = PRESETS["adkd"]
    without_ce = next(a for a in adkd.ablations if isinstance(a, Ablation) and a.name == "w/o ce")
    official = ablated(ObjectiveConfig(preset="adkd", parity="official"), without_ce)
    assert official.weights == {"kd": 0.9, "attr": 10.0}  # that parity's weights
    monkeypatch.setitem(PRESETS, "adkd", replace(adkd, paper={"ce": 0.2, "kd": 0.8, "attr": 7.0}))
    changed = weights()
    assert changed["adkd w/o ce"] == {"kd": 0.8, "attr": 7.0}
    assert changed["adkd w/o kd"] == {"ce": 0.2, "attr": 7.0}
    assert changed["adkd w/o attr"] == {"ce": 0.2, "kd": 0.8}


def test_identities_hash_weights_as_text_so_recorded_rows_keep_their_keys():
    """The key of AD-KD's BBC News row as the default suite recorded it when weights were
    stored as text: the typed weights hash to it, so the suite does not train the row again."""
    weights = {"ce": 0.1, "kd": 0.9, "attr": 10.0}
    experiment = Experiment(
        "bbc-news", "adkd", "main", ObjectiveConfig("adkd", weights, temperature=4.0), 1
    )
    plan = DEFAULT.plan_of(experiment)
    key = identity(experiment, plan, DEFAULT.plans["bbc-news"])
    assert key == "bbc-news/main/adkd/seed1@1c0a806235b14e47"


def test_a_claim_of_an_unknown_relation_is_refused_when_registered():
    with pytest.raises(ValueError, match="claim relation '>>'"):
        Claim("accuracy", ">>")


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

    def write(record: dict) -> Path:
        return write_report(tmp_path, checked(with_format(record), SuiteRecord), {})

    report = write(results).read_text()
    assert "| kd | 60.0 ± 14.1 | 60.0 ± 14.1 | – |" in report  # two seeds: mean ± sample std
    assert "| ckd | 60.0 | 60.0 | 10.0 |" in report  # one seed: no ±; Δ kd at seed 1
    assert "## Verdicts" in report and "not measured (no per-example values recorded)" in report
    assert "no longer in the record" not in report
    call = {"started": "", "seconds": 60, "searches": 0, "teachers": 1, "jobs": 1, "load_before": 0}
    calls = [{**call, "students": 4}, {**call, "students": 1}]  # 2 under settings since changed
    rerun = write({**results, "calls": calls}).read_text()
    assert "Wall clock: 2 min in 2 calls" in rerun
    assert "2 of the students these calls trained are no longer in the record" in rerun
    fixed = write({**results, "tuning": {}, "tuned": False}).read_text()
    assert "`--fixed`: every method ran its preset's defaults." in fixed


WORKER_SCRIPT = """
import multiprocessing, os, time
from concurrent.futures import ProcessPoolExecutor
from kd.experiments.reproduce import exit_with_parent

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


# slow: two real Python processes (the suite and its spawned worker) import the package
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.slow
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


def _compared(record: dict) -> list[dict]:
    """A record's student rows without where their run folders lie and how long they took."""
    return [{k: v for k, v in r.items() if k not in ("run", "seconds")} for r in record["students"]]


# slow: the same suite trained three times, whole and as two shards (what it compares)
@pytest.mark.slow
def test_shards_merge_into_the_record_of_one_call(one_seed_plan: TaskPlan, tmp_path: Path):
    """``--shard 1/2`` and ``--shard 2/2`` (each its own folder, teacher and searches), then
    ``--merge``: the same rows, teacher and chosen weights as the whole suite in one call (CPU
    training is deterministic under the same seeds); run folders referenced, not copied."""
    plan = one_seed_plan
    suite = Suite(
        plans={"tiny": plan},
        ablation_task="tiny",
        methods=("kd", "pkd-skip"),  # kd, pkd-skip, its control (kd's control is kd itself)
        ablation_groups=(),
        tuned={"kd": ("tau",)},
        tune_trials=2,
        speed_examples=TIMED,
    )
    single = tmp_path / "single"
    report = reproduce(single, suite, announce=lambda _: None).read_text()
    whole = json.loads((single / "results.json").read_text())
    shards = [tmp_path / "shard1", tmp_path / "shard2"]
    for index, folder in enumerate(shards, 1):
        run_suite(folder, suite, announce=lambda _: None, shard=Shard(index, 2))  # no report
    first, second = (json.loads((f / "results.json").read_text()) for f in shards)
    assert [r["name"] for r in first["students"]] == ["kd", "pkd-skip control"]
    assert [r["name"] for r in second["students"]] == ["pkd-skip"]
    assert first["shard"] == {"index": 1, "count": 2} and first["planned_students"] == 2
    # shard 2 trains no kd student, so it searches no kd weights
    assert first["calls"][0]["searches"] == 1 and second["calls"][0]["searches"] == 0
    assert second["tuning"] == {}

    merged = tmp_path / "merged"
    said: list[str] = []
    merged_report = merge(merged, shards, suite, announce=said.append).read_text()
    record = json.loads((merged / "results.json").read_text())
    assert _compared(record) == _compared(whole)
    assert record["teachers"]["tiny"]["test"] == whole["teachers"]["tiny"]["test"]
    assert record["tuning"]["kd"]["chosen"] == whole["tuning"]["kd"]["chosen"]
    assert record["planned_students"] == 3 and "shard" not in record
    assert record["suite_key"] == whole["suite_key"] == first["suite_key"]
    assert [c["students"] for c in record["calls"]] == [2, 1]
    assert not (merged / "runs").exists()  # referenced: paths into the shards' folders
    for row in record["students"]:
        assert row["run"].startswith("../shard") and (merged / row["run"] / "run.json").exists()
    assert _timing_free(merged_report) == _timing_free(report)
    assert not any("missing" in line for line in said)

    # a shard missing: its students listed, the report incomplete
    half = merge(tmp_path / "half", shards[:1], suite, announce=said.append).read_text()
    assert "**Incomplete:** 2 of the 3 planned" in half
    assert "missing 1 of the 3 students (train their shards): tiny/main/pkd-skip/seed1" in said
    # a row recorded by two shards alike is kept once; recorded differently, a conflict
    again = tmp_path / "again"
    again.mkdir()
    (again / "results.json").write_text(json.dumps({**second, "students": first["students"][:1]}))
    merge(tmp_path / "twice", [*shards, again], suite, announce=lambda _: None)
    assert _compared(json.loads((tmp_path / "twice" / "results.json").read_text())) == (
        _compared(whole)
    )
    changed = {**first["students"][0], "test": {**first["students"][0]["test"], "accuracy": 0.0}}
    (again / "results.json").write_text(json.dumps({**second, "students": [changed]}))
    with pytest.raises(WorkbenchError, match=r"^conflict: the student tiny/main/kd/seed1@\w+ "):
        merge(tmp_path / "conflict", [*shards, again], suite, announce=lambda _: None)
    other = replace(suite, tune_trials=3)  # another suite: other settings, another key
    with pytest.raises(
        WorkbenchError, match=r"shard1/results\.json is the record of another suite"
    ):
        merge(tmp_path / "other", shards, other, announce=lambda _: None)
    with pytest.raises(WorkbenchError, match="does not exist: nothing to merge"):
        merge(tmp_path / "none", [tmp_path / "nowhere"], suite, announce=lambda _: None)
    assert not any((tmp_path / name).exists() for name in ("conflict", "other", "none"))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--shard", "0/2"], "--shard 0/2: I must be between 1 and N (2)"),
        (["--shard", "3/2"], "--shard 3/2: I must be between 1 and N (2)"),
        (["--shard", "2"], "--shard '2': write I/N, e.g. 2/4"),
        (["--shard", "a/b"], "--shard 'a/b': write I/N"),
        (["--shard", "1/100000"], "--shard 1/100000: the suite has "),
        (["--merge", "x", "--shard", "1/2"], "--merge writes the merged record and report"),
        (["--shard", "1/2", "--report-only"], "--shard trains a part of the suite"),
    ],
)
def test_bad_shard_options_are_one_line_errors(arguments, message, tmp_path: Path, capsys):
    from kd.cli import main

    out = tmp_path / "suite"
    assert main(["reproduce", "--out", str(out), *arguments]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and message in error
    assert not out.exists()  # refused before anything is written


def test_the_default_suite_takes_each_sweeps_quick_values_from_its_method(monkeypatch):
    """The 2-core default suite's sweep values are the methods' declarations (``Sweep.quick``),
    not a list of its own: a newly registered sweep with quick values joins them."""
    sweep = Sweep("F", "f-group", "hidden_from", "f_sweep", (1, 2, 3), "first state F", quick=(2,))
    monkeypatch.setitem(PRESETS, "swept", Preset({"ce": 1.0}, {"ce": 1.0}, ablations=(sweep,)))
    adkd = {"top_k_sweep": (96, 192), "steps_sweep": (2, 4)}
    assert quick_sweeps() == adkd | {"f_sweep": (2,)}
    assert DEFAULT.plans["tweets"].sweeps == adkd
