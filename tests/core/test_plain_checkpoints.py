"""Nothing in a run folder runs code: a pickle planted as ``checkpoint.pt`` (a whole file, or a
real checkpoint with one extra entry) is refused in one line naming the file on every path that
resumes a training — ``kdw train-teacher`` and ``kdw distill``, a ``kdw tune`` trial retried, a
reproduction suite reusing a student folder, the app's Resume — and the code it carries never
runs (its marker file is never created); a model whose pickled weights carry one is refused in
one line that does not repeat torch's advice to load it anyway."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kd.cli import main
from kd.experiments.config import TuneConfig
from kd.experiments.reproduce import runner
from kd.experiments.reproduce.suite import Experiment, TaskPlan
from kd.experiments.tune import tune
from kd.methods.config import ObjectiveConfig
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.pipeline import distill, train_teacher
from tests.conftest import write_tiny_workspace
from tests.tiny_families import save_family_model
from workbench.app import runner as app_runner
from workbench.core.config import DataConfig
from workbench.core.errors import WorkbenchError
from workbench.core.runs import Run

FAST = OptimConfig(epochs=0.1, batch_size=16, threads=1)
PLANTS = ("pickle file", "torch file", "extra entry")


class Planted:
    """Unpickling it creates the file ``marker``: the code a planted checkpoint would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def plant(run_dir: Path, how: str, marker: Path) -> Path:
    """Replace the run's checkpoint by a payload that creates ``marker`` when unpickled: a
    plain pickle, a ``torch.save`` of the payload, or the real checkpoint with one extra entry;
    mark the run unfinished, so that rerunning its command resumes from the checkpoint."""
    checkpoint = run_dir / "checkpoint.pt"
    if how == "pickle file":
        checkpoint.write_bytes(pickle.dumps(Planted(marker)))
    elif how == "torch file":
        torch.save(Planted(marker), checkpoint)
    else:
        saved = torch.load(checkpoint, weights_only=True)
        torch.save({**saved, "extra": Planted(marker)}, checkpoint)
    Run(run_dir).set_status("running", step=1, total=2)
    return checkpoint


def assert_refused(text: str, checkpoint: Path, marker: Path) -> None:
    """``text`` is the one-line refusal naming ``checkpoint``; the payload did not run."""
    assert len(text.strip().splitlines()) == 1, text
    assert f"{checkpoint} is not a plain-tensor checkpoint (it would need to run code" in text
    assert "delete it to train this run again from step 0" in text
    assert not marker.exists()


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A tiny model, a task, and a finished teacher and student (absolute paths)."""
    work = tmp_path_factory.mktemp("plain")
    write_tiny_workspace(work)
    train_teacher(_data(work), TeacherConfig(model=str(work / "tiny-bert")), FAST, work / "teacher")
    distill(_data(work), _student(work), ObjectiveConfig(preset="kd"), FAST, work / "student")
    return work


def _data(work: Path) -> DataConfig:
    return DataConfig(task=str(work / "task"), max_length=16)


def _student(work: Path) -> StudentConfig:
    return StudentConfig(teacher=str(work / "teacher"), num_layers=2)


def _copy(work: Path, name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(work / name, target)
    (target / ".lock").unlink(missing_ok=True)
    return target


def _options(work: Path) -> list[str]:
    return [
        "--task",
        str(work / "task"),
        "--max-length",
        "16",
        "--epochs",
        "0.1",
        "--batch-size",
        "16",
        "--threads",
        "1",
    ]


def test_a_written_checkpoint_holds_only_plain_tensors_and_numbers(work):
    saved = torch.load(work / "student" / "checkpoint.pt", weights_only=True)
    assert {"model", "optimizer", "scheduler", "scaler", "rng", "state"} <= set(saved)
    kind, key, *_ = saved["rng"][0]["numpy"]
    assert kind == "MT19937" and key.dtype == torch.int64 and key.shape == (624,)


def test_rng_states_come_back_from_a_weights_only_file(tmp_path):
    """torch's, Python's and numpy's generators (numpy's Gaussian cache included) draw the same
    after their state went through a file that loads with ``weights_only=True``."""
    import random

    import numpy as np

    from kd.training.trainer import _restore_rng, _rng_state

    np.random.standard_normal()  # leaves a cached Gaussian in numpy's state
    torch.save(_rng_state(), tmp_path / "rng.pt")

    def draws() -> tuple:
        return torch.rand(3).tolist(), random.random(), np.random.standard_normal(2).tolist()

    first = draws()
    _restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert draws() == first


@pytest.mark.parametrize("how", PLANTS)
def test_cli_resume_of_a_teacher_refuses_a_planted_checkpoint(work, tmp_path, capsys, how):
    teacher = _copy(work, "teacher", tmp_path)
    marker = tmp_path / "MARKER"
    checkpoint = plant(teacher, how, marker)
    command = ["train-teacher", "--run-dir", str(teacher), "--model", str(work / "tiny-bert")]
    assert main([*command, *_options(work)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdw: error: ")
    assert_refused(err, checkpoint, marker)
    assert Run(teacher).status().state == "running"  # nothing trained or rewritten


@pytest.mark.parametrize("how", PLANTS)
def test_cli_resume_of_a_student_refuses_a_planted_checkpoint(work, tmp_path, capsys, how):
    student = _copy(work, "student", tmp_path)
    marker = tmp_path / "MARKER"
    checkpoint = plant(student, how, marker)
    command = ["distill", "--run-dir", str(student), "--teacher", str(work / "teacher")]
    assert main([*command, "--num-layers", "2", "--preset", "kd", *_options(work)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdw: error: ")
    assert_refused(err, checkpoint, marker)


def test_the_apps_resume_refuses_a_planted_checkpoint(work, tmp_path, capsys):
    """The app's Resume button launches ``workbench.app.runner`` with the run's own configs."""
    for name in ("teacher", "student"):
        folder = _copy(work, name, tmp_path)
        marker = tmp_path / f"MARKER-{name}"
        checkpoint = plant(folder, "extra entry", marker)
        configs = json.dumps(Run(folder).info().configs)
        kind = Run(folder).info().kind
        assert app_runner.main([kind, str(folder), configs]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ")
        assert_refused(err, checkpoint, marker)


class StopAtOnce:
    """The app's stop button, pressed before the first step ends."""

    def should_stop(self) -> bool:
        return True


def test_a_retried_tune_trial_refuses_a_planted_checkpoint(work, tmp_path):
    out = tmp_path / "study"
    settings = (_data(work), _student(work), ObjectiveConfig(preset="kd"), FAST)
    search = TuneConfig(trials=1, space=("alpha=0.5",), prune=False)
    tune(*settings, search, out, callbacks=[StopAtOnce()])  # the trial stops: retried later
    (trial,) = (out / "trials").iterdir()
    assert Run(trial).status().state == "stopped"
    marker = tmp_path / "MARKER"
    checkpoint = plant(trial, "extra entry", marker)
    with pytest.raises(WorkbenchError) as error:
        tune(*settings, search, out)
    assert_refused(str(error.value), checkpoint, marker)


def test_a_reproduction_suite_reusing_a_student_refuses_a_planted_checkpoint(work, tmp_path):
    plan = TaskPlan(
        _data(work),
        student_epochs=0.1,
        student_layers=2,
        batch_size=16,
        explained_examples=4,
    )
    experiment = Experiment("task", "kd", "main", ObjectiveConfig(preset="kd"), seed=1)
    out, teacher = tmp_path / "suite", work / "teacher"
    runner.train_and_score(out, teacher, plan, experiment, "kd@0123abcd", threads=1)
    folder = runner.student_folder(out, experiment, "kd@0123abcd")
    marker = tmp_path / "MARKER"
    checkpoint = plant(folder, "extra entry", marker)
    with pytest.raises(WorkbenchError) as error:
        runner.train_and_score(out, teacher, plan, experiment, "kd@0123abcd", threads=1)
    assert_refused(str(error.value), checkpoint, marker)


def test_a_checkpoint_of_an_older_version_with_numpy_arrays_is_refused(work, tmp_path):
    """Checkpoints written before RNG states were plain held numpy's state as an array."""
    import numpy as np

    teacher = _copy(work, "teacher", tmp_path)
    saved = torch.load(teacher / "checkpoint.pt", weights_only=True)
    saved["rng"][0]["numpy"] = np.random.get_state()
    torch.save(saved, teacher / "checkpoint.pt")
    with pytest.raises(WorkbenchError, match="is not a plain-tensor checkpoint"):
        Run(teacher).load_checkpoint("cpu")


def test_a_models_pickled_weights_are_refused_without_torchs_advice(tmp_path, capsys):
    """A model folder whose ``pytorch_model.bin`` carries an object beyond tensors: one line
    that says why, never torch's advice to load it with ``weights_only=False``; its code never
    runs."""
    folder = save_family_model("bert", tmp_path / "model", ["a", "b"], seed=1)
    marker = tmp_path / "ran"
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save({**weights, "extra": Planted(marker)}, folder / "pytorch_model.bin")
    out = tmp_path / "out.jsonl"
    assert main(["attribute", str(folder), "--text", "a b", "--out", str(out)]) == 2
    text = capsys.readouterr().err.strip().splitlines()[-1]
    assert text == (
        f"kdw: error: cannot load model {str(folder)!r}: its pickled weights hold objects beyond "
        "tensors, which loading would run as code, and are refused; convert them to safetensors "
        "where they were made, from a source you trust"
    )
    assert "weights_only" not in text and not marker.exists() and not out.exists()
