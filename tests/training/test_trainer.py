"""The training loop: learning, the run folder, and resuming after a real kill."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel

from kd.methods.config import ObjectiveConfig
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.pipeline import distill, train_teacher
from kd.training.trainer import TrainingLoop
from tests.conftest import kdw_here, kill_at_step, tiny_model, tiny_tokenizer
from workbench.core.config import DataConfig
from workbench.core.errors import WorkbenchError
from workbench.core.files import atomic_write_json
from workbench.core.models import load_run
from workbench.core.runs import Run


def _teacher_arguments(run_dir: Path, model_dir: Path, task_dir: Path) -> list[str]:
    """A teacher of 225 steps that checkpoints every 3 and evaluates every 50."""
    return [
        "train-teacher",
        "--run-dir",
        str(run_dir),
        "--task",
        str(task_dir),
        "--model",
        str(model_dir),
        "--epochs",
        "3",
        "--batch-size",
        "4",
        "--checkpoint-every",
        "3",
        "--eval-every",
        "50",
        "--threads",
        "1",
        "--max-length",
        "16",
        "--learning-rate",
        "1e-3",
    ]


# slow: a kdw process killed mid-run, then the run resumed and a clean one trained
@pytest.mark.slow
def test_resume_after_kill_ends_with_the_same_weights(tiny_model_dir, tiny_task_dir, tmp_path):
    killed_dir, clean_dir = tmp_path / "killed", tmp_path / "clean"
    state = kill_at_step(
        _teacher_arguments(killed_dir, tiny_model_dir, tiny_task_dir), killed_dir, 100
    )
    assert state.get("state") == "running" and state["step"] < state["total"], state
    saved = torch.load(killed_dir / "checkpoint.pt", weights_only=True)
    assert 0 < saved["state"]["step"] < state["total"]

    for run_dir in (killed_dir, clean_dir):  # the killed run resumes; the clean one runs whole
        status, stderr = kdw_here(
            _teacher_arguments(run_dir, tiny_model_dir, tiny_task_dir), tmp_path
        )
        assert status == 0, stderr

    final_killed = torch.load(killed_dir / "checkpoint.pt", weights_only=True)
    final_clean = torch.load(clean_dir / "checkpoint.pt", weights_only=True)
    assert final_killed["state"] == final_clean["state"]
    for name, value in final_clean["model"].items():
        assert torch.equal(final_killed["model"][name], value), name
    best_killed = load_file(str(killed_dir / "model" / "model.safetensors"))
    best_clean = load_file(str(clean_dir / "model" / "model.safetensors"))
    assert all(torch.equal(best_killed[k], v) for k, v in best_clean.items())
    steps = [r["step"] for r in Run.open(killed_dir).metrics("dev")]
    assert steps == sorted(set(steps)), "evaluations logged twice after the resume"
    assert Run.open(killed_dir).status().state == "finished"


# slow: a teacher trained 8 epochs (a dev record each, test accuracy over 0.6), then 2 students
@pytest.mark.slow
def test_teacher_learns_and_students_distil(tiny_model_dir, tiny_task_dir, tmp_path):
    data = DataConfig(task=str(tiny_task_dir), max_length=16)
    optim = OptimConfig(
        epochs=8, batch_size=8, learning_rate=2e-3, threads=1, checkpoint_every=1000
    )
    teacher_run = train_teacher(
        data, TeacherConfig(model=str(tiny_model_dir)), optim, tmp_path / "teacher"
    )
    results = teacher_run.results()
    assert results["test"]["accuracy"] > 0.6  # chance is ~0.45 for the majority class
    records = teacher_run.metrics("dev")
    assert [r["step"] for r in records] == [38 * (i + 1) for i in range(8)]
    manifest = json.loads((teacher_run.path / "manifest.json").read_text())
    assert manifest["versions"]["torch"] and manifest["split_fingerprint"]["train"]

    for preset in ("kd", "pkd-skip"):
        student_run = distill(
            data,
            StudentConfig(teacher=str(teacher_run.path), num_layers=2),
            ObjectiveConfig(preset=preset),
            OptimConfig(epochs=4, batch_size=8, learning_rate=2e-3, threads=1),
            tmp_path / f"student-{preset}",
        )
        test = student_run.results()["test"]
        assert 0 <= test["label_loyalty"] <= 1 and 0 < test["probability_loyalty"] <= 1
        assert list((student_run.path / "teacher_cache").glob("teacher-train-*.safetensors"))
        loaded = load_run(student_run.path)
        assert loaded.model.config.num_hidden_layers == 2
    # the same call again finds the finished run and trains nothing
    again = distill(
        data,
        StudentConfig(teacher=str(teacher_run.path), num_layers=2),
        ObjectiveConfig(preset="pkd-skip"),
        OptimConfig(epochs=4, batch_size=8, learning_rate=2e-3, threads=1),
        tmp_path / "student-pkd-skip",
    )
    assert again.results() == student_run.results()


class StopAfter:
    """The app's stop button, pressed once ``steps`` steps have run."""

    def __init__(self, steps: int) -> None:
        self.steps, self.seen = steps, 0

    def on_step(self, step: int, _total: int, _losses: dict) -> None:
        self.seen = step

    def should_stop(self) -> bool:
        return self.seen >= self.steps


def test_a_narrower_student_learns_patient_kd_through_a_projection_that_resumes(
    tiny_task_dir, tmp_path
):
    """PKD from a 16-wide teacher into an 8-wide student: the projection between the widths
    trains with the student, resumes from the checkpoint with it (a stopped and resumed run ends
    as an uninterrupted one), is recorded, and stays out of the saved student."""
    teacher = tmp_path / "teacher"
    model = tiny_model()
    model.config.id2label = dict(enumerate(["negative", "neutral", "positive"]))
    model.config.label2id = {name: i for i, name in model.config.id2label.items()}
    model.save_pretrained(teacher)
    tiny_tokenizer(teacher)
    settings = (
        DataConfig(task=str(tiny_task_dir), max_length=16),
        StudentConfig(
            teacher=str(teacher), init="random", num_layers=2, hidden_size=8, num_heads=2
        ),
        ObjectiveConfig(preset="pkd-skip"),
        OptimConfig(epochs=1, batch_size=16, learning_rate=1e-3, threads=1),
    )
    stopped = distill(*settings, tmp_path / "stopped", callbacks=[StopAfter(5)])
    status = stopped.status()
    assert status.state == "stopped" and status.seconds.keys() == {
        "teacher_cache",
        "training",
    }
    saved = torch.load(stopped.checkpoint, weights_only=True)
    early = saved["objective"]["pkd.weight"]
    assert early.shape == (16, 8)
    # the resumed run adds its seconds to those recorded: made large here to tell them apart
    torch.save(saved | {"seconds": 1000.0}, stopped.checkpoint)
    spent = {"seconds": {"teacher_cache": 500.0}}
    atomic_write_json(stopped.path / "status.json", status.model_dump() | spent)
    for name in ("stopped", "clean"):
        distill(*settings, tmp_path / name)
    final = [
        torch.load(tmp_path / n / "checkpoint.pt", weights_only=True) for n in ("stopped", "clean")
    ]
    assert final[0]["state"] == final[1]["state"]
    spent = [Run(tmp_path / name).status().seconds for name in ("stopped", "clean")]
    assert spent[0]["training"] > 1000 and spent[0]["teacher_cache"] >= 500  # files read: ~0 s
    assert 0 < spent[1]["training"] < 1000 and 0 < spent[1]["teacher_cache"] < 500
    for part in ("model", "objective"):
        for name, value in final[1][part].items():
            assert torch.equal(final[0][part][name], value), name
    assert not torch.equal(early, final[1]["objective"]["pkd.weight"])  # trained
    record = Run.open(tmp_path / "clean").info().resolved.objective
    assert record.pkd_projection == {"student": 8, "teacher": 16}
    saved = load_file(str(tmp_path / "clean" / "model" / "model.safetensors"))
    assert not [key for key in saved if "pkd" in key]
    assert load_run(tmp_path / "clean").model.config.hidden_size == 8


@pytest.mark.slow
def test_the_learning_rate_warms_up_then_decays_linearly(tiny_model_dir, tiny_task_dir, tmp_path):
    """Step k (from 0) of T trains at k/W of the rate during the W = ⌊0.25·T⌋ warm-up steps,
    then at (T − k)/(T − W): the linear schedule of Hugging Face's Trainer."""
    optim = OptimConfig(
        epochs=1, batch_size=4, learning_rate=1e-3, warmup_ratio=0.25, log_every=1, threads=1
    )
    data = DataConfig(task=str(tiny_task_dir), max_length=16)
    run = train_teacher(data, TeacherConfig(model=str(tiny_model_dir)), optim, tmp_path / "t")
    rates = [r["lr"] for r in Run(run.path).metrics() if r.get("split") == "train"]
    total = len(rates)
    warmup = total // 4
    assert total >= 8 and warmup >= 2
    expected = [k / warmup if k < warmup else (total - k) / (total - warmup) for k in range(total)]
    assert rates == pytest.approx([1e-3 * f for f in expected], rel=1e-9, abs=1e-15)


def test_a_run_whose_model_fails_to_save_keeps_it_and_a_rerun_saves_it(
    tiny_model_dir, tiny_task_dir, tmp_path, monkeypatch
):
    """``save_pretrained`` raising after the last step leaves the trained weights in the
    checkpoint and says so; a rerun saves them without a training step, and one whose results
    fail to be written is finished by the next rerun, again without training."""
    data = DataConfig(task=str(tiny_task_dir), max_length=16)
    teacher, optim = TeacherConfig(model=str(tiny_model_dir)), OptimConfig(epochs=0.25, threads=1)
    run_dir = tmp_path / "teacher"
    checkpoint, model_file = run_dir / "checkpoint.pt", run_dir / "model" / "model.safetensors"

    def refuse(*_args, **_kwargs):
        raise ValueError("the hidden size is not a multiple of the number of heads")

    with monkeypatch.context() as patched:
        patched.setattr(PreTrainedModel, "save_pretrained", refuse)
        with pytest.raises(WorkbenchError) as caught:
            train_teacher(data, teacher, optim, run_dir)
    total = round(0.25 * math.ceil(300 / optim.batch_size))  # 300 training examples
    assert str(caught.value) == (
        f"the model of step {total} could not be saved (ValueError: the hidden size is not a "
        f"multiple of the number of heads): training finished; the trained weights are in "
        f"{checkpoint}; rerun the same command to save them"
    )
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["state"]["step"] == saved["state"]["best_step"] == total
    assert saved["state"]["unsaved"] is True
    assert not model_file.exists() and Run.open(run_dir).status().state == "stopped"

    def no_step(*_args):
        raise AssertionError("a training step on rerun")

    def full(*_args):
        raise OSError("no space left on device")

    monkeypatch.setattr(TrainingLoop, "step", no_step)
    with monkeypatch.context() as patched:
        patched.setattr("kd.training.pipeline.predict_logits", full)
        with pytest.raises(WorkbenchError) as caught:
            train_teacher(data, teacher, optim, run_dir)
    assert str(caught.value) == (
        "training finished, but its results could not be written (OSError: no space left on "
        f"device): the trained model is in {run_dir / 'model'}; rerun the same command to "
        "write them"
    )
    best = load_file(str(model_file))
    assert best.keys() == saved["model"].keys()
    assert all(torch.equal(best[name], value) for name, value in saved["model"].items())
    assert Run.open(run_dir).status().state == "stopped"
    run = train_teacher(data, teacher, optim, run_dir)
    assert run.status().state == "finished" and (run_dir / "results.json").exists()
