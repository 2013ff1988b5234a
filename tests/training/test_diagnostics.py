"""Objective diagnostics: values and gradient shares against direct computations; logging them
changes no weight; per-class recall in every evaluation."""

from __future__ import annotations

import pytest
import torch

from kd.methods.config import ObjectiveConfig
from kd.methods.objective import Objective
from kd.methods.students import cut_student
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.diagnostics import summarise, term_diagnostics
from kd.training.evaluate import evaluate_runs
from kd.training.pipeline import distill, train_teacher
from kd.training.trainer import logged_terms
from tests.conftest import tiny_model
from tests.methods.test_objective_methods import _dataset
from tests.tolerances import float32_floor
from workbench.analysis.metrics import task_metrics
from workbench.core.config import DataConfig
from workbench.core.data import TaskSpec, batches
from workbench.core.runs import Run


def test_term_diagnostics_match_separate_backward_passes():
    teacher = tiny_model(layers=4).requires_grad_(False)
    student = cut_student(teacher, [1, 3]).eval()
    objective = Objective.resolve(ObjectiveConfig(preset="adkd"), 4, 2, num_labels=3)
    batch = next(batches(_dataset(), list(range(6)), 6, 0))
    values = objective(student, batch, objective.teacher_batch(teacher, batch))
    params = [p for p in student.parameters() if p.requires_grad]
    diagnostics = term_diagnostics(values, objective.weights, params)

    grads = {}
    for name, weight in objective.weights.items():
        student.zero_grad()
        (weight * values[name]).backward(retain_graph=True)
        grads[name] = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double()
                for p in params
            ]
        )
        assert diagnostics[f"value/{name}"] == float(weight * values[name].detach())
    total = sum(grads.values())
    for name, g in grads.items():
        assert abs(diagnostics[f"grad_norm/{name}"] - float(g.norm())) < 1e-6 * float(g.norm())
        assert abs(diagnostics[f"grad_share/{name}"] - float(g @ total / (total @ total))) < 1e-6
    assert abs(sum(diagnostics[f"grad_share/{n}"] for n in grads) - 1) < 1e-9
    # the joint backward of the objective is the sum of the terms' gradients
    student.zero_grad()
    values["loss"].backward()
    joint = torch.cat([p.grad.reshape(-1).double() for p in params])
    # an entry where the terms' gradients cancel carries their rounding, not the sum's
    torch.testing.assert_close(joint, total, rtol=1e-5, atol=float32_floor(*grads.values()))
    assert abs(diagnostics["grad_norm/total"] - float(joint.norm())) < 1e-5 * float(joint.norm())


def test_per_class_recall_shows_a_neglected_class():
    spec = TaskSpec("t", ("neg", "neu", "pos"), ("accuracy",))
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    logits = torch.nn.functional.one_hot(torch.tensor([0, 0, 0, 1, 2, 0]), 3).float()
    metrics = task_metrics(spec, logits, labels)
    assert metrics["recall/neg"] == 1.0
    assert metrics["recall/neu"] == 0.5
    assert metrics["recall/pos"] == 0.5


def test_logging_diagnostics_changes_no_weight(tiny_model_dir, tiny_task_dir, tmp_path):
    data = DataConfig(task=str(tiny_task_dir), max_length=16, max_train_examples=48)
    optim = OptimConfig(epochs=1, batch_size=8, learning_rate=2e-3, threads=1)
    teacher = train_teacher(
        data, TeacherConfig(model=str(tiny_model_dir)), optim, tmp_path / "teacher"
    )
    students = {}
    for log_every in (0, 2):
        students[log_every] = distill(
            data,
            StudentConfig(teacher=str(teacher.path), num_layers=2),
            ObjectiveConfig(preset="adkd"),
            OptimConfig(epochs=1, batch_size=8, learning_rate=2e-3, threads=1, log_every=log_every),
            tmp_path / f"student-{log_every}",
        )
    quiet, logged = students[0], students[2]
    assert quiet.metrics("train") == []
    records = logged.metrics("train")
    assert [r["step"] for r in records] == [1, 2, 4, 6, 7]  # first, every 2nd, last
    assert {"value/attr", "grad_share/kd", "grad_norm/total"} <= set(records[0])
    measured = [sorted(k.split("/")[1] for k in r if k.startswith("grad_share/")) for r in records]
    assert measured == [["attr", "ce", "kd"], ["kd"], ["attr"], ["ce"], ["attr", "ce", "kd"]]
    for record in (records[0], records[-1]):  # every term against the whole gradient
        assert sum(v for k, v in record.items() if k.startswith("grad_share/")) == pytest.approx(
            1, abs=1e-5
        )
    assert all(len([k for k in r if k.startswith("value/")]) == 3 for r in records)
    summary = summarise(logged.metrics())
    assert summary["start"]["step"] == 1 and summary["end"]["step"] == 7
    assert "recall/positive" in logged.results()["test"]
    row = evaluate_runs([str(logged.path)], terms=True)[0]  # kdw evaluate --terms
    assert (row["start step"], row["end step"]) == (1, 7)  # columns of no step: any run's
    shares = row["grad share, end"]
    assert shares.startswith(("attr", "kd", "ce")) and shares.count("%") == 3
    a = torch.load(quiet.checkpoint, weights_only=True)["model"]
    b = torch.load(logged.checkpoint, weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_one_term_in_turn_is_measured_between_the_first_and_last_step():
    names = ["ce", "kd", "attr"]
    assert logged_terms(names, 1, 100, 20) == names == logged_terms(names, 100, 100, 20)
    turns = [logged_terms(names, step, 100, 20) for step in (20, 40, 60, 80)]
    assert turns == [["kd"], ["attr"], ["ce"], ["kd"]]
    assert logged_terms(names, 21, 100, 20) == [] and logged_terms(names, 1, 100, 0) == []


def test_term_summaries_of_runs_of_any_length_share_their_columns():
    from kd.training.evaluate import term_summary

    def logged(last: int) -> list[dict]:
        return [
            {"step": step, "grad_share/kd": kd, "grad_share/ce": 1 - kd, "value/kd": kd}
            for step, kd in ((1, 0.25), (last, 0.75))
        ]

    short, long = term_summary(logged(19)), term_summary(logged(38))
    assert short.keys() == long.keys()
    assert (short["end step"], long["end step"]) == (19, 38)
    assert long["grad share, start"] == "ce 75% · kd 25%"
    assert long["grad share, end"] == "kd 75% · ce 25%"


def test_an_interrupted_training_is_marked_stopped_not_running(
    tiny_model_dir, tiny_task_dir, tmp_path
):
    class CtrlC:
        def on_step(self, step, total, losses):
            if step == 3:
                raise KeyboardInterrupt

    optim = OptimConfig(epochs=1, batch_size=16, threads=1, checkpoint_every=2)
    with pytest.raises(KeyboardInterrupt):
        train_teacher(
            DataConfig(task=str(tiny_task_dir), max_length=16),
            TeacherConfig(model=str(tiny_model_dir)),
            optim,
            tmp_path / "teacher",
            callbacks=[CtrlC()],
        )
    run = Run.open(tmp_path / "teacher")
    status = run.status()
    assert (status.state, status.step) == ("stopped", 2)  # at the checkpoint it resumes from
    assert "interrupted" in status.reason
    assert run.unfinished().startswith("stopped at step 2/")
