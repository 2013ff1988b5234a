"""A student run pins its teacher: ``run.json`` records the digests of the teacher's weights and
tokenizer files; a rerun or a resume against a teacher that changed since is refused in one
line naming both digests and the way out, before the teacher cache is touched; ``kdw
evaluate`` says so beside the loyalty figures, and the app labels the student "teacher
changed"."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from streamlit.testing.v1 import AppTest

from kd.methods.config import ObjectiveConfig
from kd.training.config import OptimConfig, StudentConfig
from kd.training.pipeline import distill
from tests.app.test_app import APP
from tests.conftest import kdw_here, write_tiny_runs
from workbench.app.catalog import discover_runs
from workbench.core.config import DataConfig
from workbench.core.errors import WorkbenchError
from workbench.core.runs import RESOLVED, Run
from workbench.core.verify import (
    REMEDY,
    check_model_files,
    files_digest,
    model_digest,
    weights_digest,
)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("pinned")
    write_tiny_runs(work)
    return work


def _again(work: Path) -> None:
    """The call that made ``work/student`` (:func:`tests.conftest.write_tiny_runs`)."""
    data = DataConfig(task=str(work / "task"), max_length=16)
    fast = OptimConfig(epochs=0.1, batch_size=16, threads=1)
    student = StudentConfig(teacher=str(work / "teacher"), num_layers=2)
    distill(data, student, ObjectiveConfig(preset="kd"), fast, work / "student")


def _labels_digest(model: Path) -> str:
    labels = json.loads((model / "config.json").read_text())["id2label"]
    return hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_student_pins_its_teacher_and_refuses_another(work, monkeypatch):
    model = work / "teacher" / "model"
    pinned = Run.open(work / "student").info().resolved.teacher
    assert pinned.model_dump() == {
        "source": str(model.resolve()),
        "weights": weights_digest(model),
        "tokenizer": files_digest(
            [model / name for name in ("tokenizer.json", "tokenizer_config.json")]
        ),
        "labels": _labels_digest(model),
    }
    _again(work)  # the same teacher: the finished run is reopened as it is

    path = model / "model.safetensors"
    state = load_file(path)
    state["classifier.bias"] += 1.0  # the teacher trained again: other (finite) weights
    save_file(state, path, metadata={"format": "pt"})
    now = weights_digest(model)
    student = work / "student"
    before = _snapshot(student)
    (student / "status.json").write_text('{"state": "running", "step": 1, "total": 1}')
    refusal = (
        f"{student} was distilled from another teacher: the teacher {model.resolve()} changed "
        f"since (its weights {pinned.weights} → {now}); the student and its teacher cache "
        "learnt from the former one: to distil from the teacher as it is now, choose another "
        "--run-dir"
    )
    with pytest.raises(WorkbenchError) as raised:  # a resume: the run was training
        _again(work)
    assert str(raised.value) == refusal
    (student / "status.json").write_bytes(before["status.json"])
    with pytest.raises(WorkbenchError) as raised:  # a rerun of the finished run
        _again(work)
    assert str(raised.value) == refusal
    after = _snapshot(student)
    after.pop(".lock", None), before.pop(".lock", None)
    assert after == before  # the teacher cache, results and model untouched

    status, err = kdw_here(["evaluate", str(student), "--json", str(work / "rows.json")], work)
    assert status == 0, err
    note = (
        f"kdw: note: student: the teacher {model.resolve()} changed since (its weights "
        f"{pinned.weights} → {now}): its loyalty is measured against the teacher as it is "
        "now, not the one it learnt from"
    )
    assert note in err.splitlines()
    (row,) = json.loads((work / "rows.json").read_text())
    assert row["teacher_changed"] == note.split("student: ")[1].split(": its loyalty")[0]
    assert list(row).index("teacher_changed") == list(row).index("probability_loyalty") + 1

    entries = {entry.name: entry for entry in discover_runs(work)}  # the app's list
    assert entries["student"].label == "student (teacher changed)"
    assert entries["student"].teacher_changed == row["teacher_changed"]
    assert entries["teacher"].label == "teacher" and entries["teacher"].teacher_changed is None

    monkeypatch.setenv("KDW_RUNS", str(work))  # the app lists it, but does not compare it
    monkeypatch.setenv("KDW_DEMO", "off")
    at = AppTest.from_file(APP, default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="case.teacher").value == "teacher"
    assert "student" not in at.multiselect(key="case.students").options
    assert any(c.value.startswith("Not compared: student (teacher changed") for c in at.caption)


def test_a_suite_trains_anew_a_student_whose_teacher_changed(work, tmp_path):
    """``kdw reproduce`` trains again the students of a teacher trained again to other weights:
    their old folders, whose records would refuse the new teacher, are removed first."""
    from kd.experiments.reproduce.runner import forget_other_teacher

    student = tmp_path / "student"
    shutil.copytree(work / "student", student)
    record = json.loads((student / "run.json").read_text())
    for weights, kept in ((weights_digest(work / "teacher" / "model"), True), ("0" * 16, False)):
        record[RESOLVED]["teacher"]["weights"] = weights
        (student / "run.json").write_text(json.dumps(record))
        forget_other_teacher(student, work / "teacher")
        assert student.exists() == kept


def test_a_changed_label_map_is_refused_on_resume(work, tmp_path):
    """A teacher whose config.json now names its classes in another order (its logits mean
    other classes) is another teacher: the student's rerun is refused naming the labels."""
    teacher = tmp_path / "teacher"
    shutil.copytree(work / "teacher", teacher)
    (teacher / ".lock").unlink(missing_ok=True)
    data = DataConfig(task=str(work / "task"), max_length=16)
    fast = OptimConfig(epochs=0.1, batch_size=16, threads=1)
    student = StudentConfig(teacher=str(teacher), num_layers=2)
    distill(data, student, ObjectiveConfig(preset="kd"), fast, tmp_path / "student")
    pinned = Run.open(tmp_path / "student").info().resolved.teacher
    config_path = teacher / "model" / "config.json"
    config = json.loads(config_path.read_text())
    names = list(config["id2label"].values())[::-1]
    config["id2label"] = dict(zip(config["id2label"], names, strict=True))
    config["label2id"] = {name: int(i) for i, name in config["id2label"].items()}
    config_path.write_text(json.dumps(config))
    now = _labels_digest(teacher / "model")
    assert now != pinned.labels
    with pytest.raises(WorkbenchError) as raised:
        distill(data, student, ObjectiveConfig(preset="kd"), fast, tmp_path / "student")
    assert str(raised.value) == (
        f"{tmp_path / 'student'} was distilled from another teacher: the teacher "
        f"{(teacher / 'model').resolve()} changed since (its labels {pinned.labels} → {now}); "
        "the student and its teacher cache learnt from the former one: to distil from the "
        "teacher as it is now, choose another --run-dir"
    )


def _weights_folder(work: Path, folder: Path) -> Path:
    """The teacher's config and tokenizer, without weights, in ``folder``."""
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(work / "teacher" / "model" / name, folder / name)
    return folder


def test_the_pin_covers_weights_of_every_format_and_every_shard(work, tmp_path):
    """A teacher saved as pytorch_model.bin alone is pinned by that file (not the digest of
    nothing), and a sharded one by every shard its index names, whatever their names."""
    folder = _weights_folder(work, tmp_path / "bin")
    (folder / "pytorch_model.bin").write_bytes(b"first")
    first = model_digest(folder)["weights"]
    assert first == files_digest([folder / "pytorch_model.bin"]) != files_digest([])
    (folder / "pytorch_model.bin").write_bytes(b"other")
    assert model_digest(folder)["weights"] != first

    sharded = _weights_folder(work, tmp_path / "sharded")
    index = sharded / "pytorch_model.bin.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "part-1.bin", "b": "part-2.bin"}}))
    for name in ("part-1.bin", "part-2.bin"):
        (sharded / name).write_bytes(name.encode())
    pinned = model_digest(sharded)["weights"]
    assert pinned == files_digest([sharded / "part-1.bin", sharded / "part-2.bin", index])
    (sharded / "part-2.bin").write_bytes(b"replaced")
    assert model_digest(sharded)["weights"] != pinned


@pytest.mark.parametrize(
    ("shard", "problem"),
    [("../outside.bin", "outside the folder {d}"), ("gone.bin", "which is not in {d}")],
)
def test_an_index_naming_a_shard_outside_the_folder_or_missing_is_refused(
    work, tmp_path, shard, problem
):
    folder = _weights_folder(work, tmp_path / "model")
    (tmp_path / "outside.bin").write_bytes(b"weights of another model")
    index = folder / "pytorch_model.bin.index.json"
    index.write_text(json.dumps({"weight_map": {"a": shard}}))
    for check in (check_model_files, model_digest):
        with pytest.raises(WorkbenchError) as raised:
            check(folder)
        assert str(raised.value) == (
            f"{index} names the shard {shard!r}, {problem.format(d=folder)}: {REMEDY}"
        )
