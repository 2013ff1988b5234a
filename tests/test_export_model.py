"""Runs as Hugging Face checkpoints: label names in every saved config, a model card generated
from the run's files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kd.cli import main
from tests.conftest import tiny_model
from workbench.data import TaskSpec
from workbench.models import set_label_names

NAMES = ("negative", "neutral", "positive")


def _kdw(monkeypatch, *args: str) -> int:
    """``main`` as the installed ``kdw`` script calls it: with the command line in ``sys.argv``
    (the run's manifest records it)."""
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/kdw", *args])
    return main(list(args))


@pytest.fixture
def runs(tmp_path, tiny_task_dir, tiny_model_dir, monkeypatch) -> tuple[Path, Path]:
    """A tiny teacher run and a student distilled from it with vanilla KD."""
    teacher, student = tmp_path / "teacher", tmp_path / "student"
    common = f"--task {tiny_task_dir} --max-length 16 --threads 1 --batch-size 8".split()
    common += ["--learning-rate", "2e-3", "--checkpoint-every", "1000"]
    teach = f"train-teacher --run-dir {teacher} --model {tiny_model_dir} --epochs 6".split()
    assert _kdw(monkeypatch, *teach, *common) == 0
    distil = f"distill --run-dir {student} --teacher-run {teacher} --preset kd --epochs 3".split()
    assert _kdw(monkeypatch, *distil, "--num-layers", "2", *common) == 0
    return teacher, student


def test_saved_models_name_their_classes_and_carry_a_card(runs):
    teacher, student = runs
    for run in runs:
        config = json.loads((run / "model" / "config.json").read_text())
        assert config["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
        assert config["label2id"] == {"negative": 0, "neutral": 1, "positive": 2}
    card = (student / "model" / "README.md").read_text()
    manifest = json.loads((student / "manifest.json").read_text())
    results = json.loads((student / "results.json").read_text())
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: text-classification\n")
    assert f"distilled with the method `kd` from the teacher run `{teacher}`" in card
    assert '- `preset`: "kd"' in card and "- `temperature`: null" in card
    assert f"| train | {manifest['split_sizes']['train']} | " in card
    assert manifest["split_fingerprint"]["test"] in card
    assert f"label_loyalty {results['test']['label_loyalty']:.4f}" in card
    assert f"- test: accuracy {results['test']['accuracy']:.4f}" in card
    assert f"kdw distill --run-dir {student} --teacher-run {teacher}" in card
    teacher_card = (teacher / "model" / "README.md").read_text()
    assert "A teacher fine-tuned from" in teacher_card
    assert "knowledge-distillation" not in teacher_card


def test_regression_keeps_its_single_output():
    model = tiny_model(num_labels=1)
    before = dict(model.config.id2label)
    set_label_names(model, TaskSpec("stsb", (), ("spearman", "pearson"), pair=True))
    assert model.config.num_labels == 1 and model.config.id2label == before
