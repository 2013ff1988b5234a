"""Runs record what their configs resolved to: a new run's run.json holds the resolved
objective; a preset that changed under a finished run is refused, not silently reused; a run
record without it is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import kd.methods.objective
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import Preset
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.evaluate import objective_description
from kd.training.pipeline import distill, train_teacher
from workbench.core.config import DataConfig
from workbench.core.errors import WorkbenchError


# slow: a teacher and two students trained, and a fresh Python process imports the package
def test_runs_record_their_resolved_objective(tiny_model_dir, tiny_task_dir, tmp_path, monkeypatch):
    data = DataConfig(task=str(tiny_task_dir), max_length=16, max_train_examples=48)
    optim = OptimConfig(epochs=1, batch_size=8, threads=1, log_every=0)
    teacher = train_teacher(
        data, TeacherConfig(model=str(tiny_model_dir)), optim, tmp_path / "teacher"
    )
    assert teacher.info().resolved.objective.weights == {"ce": 1.0}

    def student(preset: str):
        return distill(
            data,
            StudentConfig(teacher=str(teacher.path), num_layers=2),
            ObjectiveConfig(preset=preset),
            optim,
            tmp_path / preset,
        )

    record = student("adkd").info().resolved
    assert record.package_version
    objective = record.objective
    assert objective.weights == {"ce": 0.1, "kd": 0.9, "attr": 1.0}
    assert objective.temperature == 2.0 and objective.kd_form == "kl"
    assert objective.attribution == {
        "reduction": "official",
        "views": "all",
        "baseline": "pad",
        "steps": 1,
        "top_k": None,
        "layer": "input",
    }
    assert student("pkd-skip").info().resolved.objective.patient_pairs == [[1, 2]]

    # a process that imports no method module by name (the Python API, the app's jobs) reads a
    # student's record: the methods register with the objective's config, settings come back typed
    read = (
        "from kd.methods.config import ObjectiveConfig\n"
        "from workbench.core.models import load_run\n"
        f"loaded = load_run({str(tmp_path / 'adkd')!r})\n"
        "settings = loaded.run.config(ObjectiveConfig, 'objective').methods['adkd']\n"
        "print(type(settings).__module__, settings.attr_steps)"
    )
    printed = subprocess.run(
        [sys.executable, "-c", read], capture_output=True, text=True, check=False
    )
    assert printed.stdout.split() == ["kd.methods.adkd", "1"], printed.stderr
    info = student("adkd").info()  # the same call reopens the finished run
    assert objective_description(info) == "attr 1 · ce 0.1 · kd 0.9 (official distance), τ 2"

    # a preset whose defaults changed under a finished run: refused, naming what changed
    changed = Preset(
        {"ce": 0.1, "kd": 0.9, "attr": 5.0},
        {},
        temperature=2.0,
        defaults={"attr_reduction": "official"},
    )
    monkeypatch.setitem(kd.methods.objective.PRESETS, "adkd", changed)
    with pytest.raises(WorkbenchError, match=r"no longer resolve to \(changed: weights"):
        student("adkd")
    monkeypatch.undo()

    # a record without what its configs resolved to: refused in one line
    path = tmp_path / "adkd" / "run.json"
    record = {k: v for k, v in json.loads(path.read_text()).items() if k != "resolved"}
    path.write_text(json.dumps(record))
    with pytest.raises(WorkbenchError, match=r'run\.json is not a run record: "resolved" is'):
        student("adkd")


def test_a_run_whose_data_changed_is_refused(tiny_model_dir, tiny_task_dir, tmp_path, capsys):
    from kd.cli import main

    arguments = [
        "train-teacher",
        "--run-dir",
        str(tmp_path / "run"),
        "--task",
        str(tiny_task_dir),
        "--model",
        str(tiny_model_dir),
        "--epochs",
        "0.1",
        "--threads",
        "1",
    ]
    assert main(arguments) == 0
    run_json = (tmp_path / "run" / "run.json").read_text()
    assert main(arguments) == 0  # unchanged data: the finished run is reopened
    train = tiny_task_dir / "train.csv"
    lines = train.read_text().splitlines()
    text, label = lines[5].rsplit(",", 1)
    lines[5] = f"{text},{'neutral' if label != 'neutral' else 'positive'}"  # one label edited
    train.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(arguments) == 2
    error = capsys.readouterr().err.strip()
    assert "was trained on other data: the train split(s) changed since" in error, error
    assert len(error.splitlines()) == 1
    assert (tmp_path / "run" / "run.json").read_text() == run_json
