"""A student's record describes the model saved: every initialisation honours the layer count
it is given (a pretrained checkpoint cut to ``--num-layers`` as ``--init cut`` cuts the
teacher, its kept layers recorded), and a setting that cannot apply to the initialisation is
one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kd.cli import main
from tests.conftest import write_tiny_workspace
from tests.tiny_families import LAYERS, save_family_model

pytestmark = pytest.mark.slow  # each distils a student: seconds

LABELS = ["negative", "neutral", "positive"]
PRETRAINED = ["--init", "pretrained", "--pretrained", "CHECKPOINT"]  # the work folder's


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A task, a tiny BERT classifier as the teacher and another as the pretrained checkpoint
    (both of :data:`LAYERS` layers)."""
    work = tmp_path_factory.mktemp("student-init")
    write_tiny_workspace(work)
    save_family_model("bert", work / "teacher", LABELS, seed=1)
    save_family_model("bert", work / "checkpoint", LABELS, seed=2)
    return work


def _distill(work: Path, run: Path, *student: str) -> int:
    return main(
        [
            "distill",
            "--teacher",
            str(work / "teacher"),
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
            "--run-dir",
            str(run),
            *student,
        ]
    )


@pytest.mark.parametrize(
    ("student", "layers", "kept"),
    [
        (["--init", "cut", "--num-layers", "2"], 2, [1, 3]),
        (["--init", "cut"], 3, [0, 2, 3]),
        (
            ["--init", "random", "--num-layers", "2", "--hidden-size", "16", "--num-heads", "2"],
            2,
            None,
        ),
        (PRETRAINED, LAYERS, None),
        ([*PRETRAINED, "--num-layers", "2"], 2, [1, 3]),
        (["--num-layers", "2", "--layers", "first", *PRETRAINED], 2, [0, 1]),
    ],
)
def test_the_record_describes_the_saved_student(work, tmp_path, capsys, student, layers, kept):
    student = [str(work / "checkpoint") if a == "CHECKPOINT" else a for a in student]
    assert _distill(work, tmp_path / "run", *student) == 0
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    saved = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    recorded = record["configs"]["student"]
    assert saved["num_hidden_layers"] == layers
    assert recorded["num_layers"] in (layers, None)
    assert record["resolved"]["student_layers"] == kept
    for name, key in (("hidden_size", "hidden_size"), ("num_heads", "num_attention_heads")):
        if recorded[name] is not None:
            assert saved[key] == recorded[name]
    if kept is not None and "pretrained" in student:
        assert f"the student keeps layers {','.join(map(str, kept))} of the {LAYERS}" in (
            capsys.readouterr().err
        )


@pytest.mark.parametrize(
    ("student", "message"),
    [
        (
            ["--init", "cut", "--hidden-size", "16"],
            "kdw: error: --hidden-size: only a random student's width is chosen; a student of "
            "--init cut has its source's width (use --init random, or leave it out)",
        ),
        (
            [*PRETRAINED, "--num-heads", "2"],
            "kdw: error: --num-heads: only a random student's width is chosen",
        ),
        (
            [*PRETRAINED, "--num-layers", "9"],
            f"kdw: error: a student of 9 layers cannot be cut from a model of {LAYERS} layers",
        ),
    ],
)
def test_a_setting_that_cannot_apply_is_refused(work, tmp_path, capsys, student, message):
    student = [str(work / "checkpoint") if a == "CHECKPOINT" else a for a in student]
    assert _distill(work, tmp_path / "run", *student) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(message)
    assert not (tmp_path / "run").exists()
