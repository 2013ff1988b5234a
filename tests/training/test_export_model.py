"""Runs as Hugging Face checkpoints: label names in every saved config, a model card generated
from the run's files, and ``kdw export-model`` loading in ``transformers.pipeline``."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import HfApi
from huggingface_hub.errors import OfflineModeIsEnabled
from transformers import PreTrainedModel, PreTrainedTokenizerBase, pipeline

from kd.cli import build_parser, main
from tests.cli.test_cli import _error_line
from tests.conftest import tiny_model, write_run_record
from workbench.analysis.evaluation import predict_logits
from workbench.core.data import TaskSpec, encode, load_task
from workbench.core.models import load_run, set_label_names

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
    distil = f"distill --run-dir {student} --teacher {teacher} --preset kd --epochs 3".split()
    assert _kdw(monkeypatch, *distil, "--num-layers", "2", *common) == 0
    return teacher, student


@pytest.mark.slow
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
    assert f"distilled with the method `kd` from the teacher `{teacher}`" in card
    assert '- `preset`: `"kd"`' in card and "- `temperature`: `null`" in card
    assert f"| train | {manifest['split_sizes']['train']} | " in card
    assert manifest["split_fingerprint"]["test"] in card
    assert f"label_loyalty {results['test']['label_loyalty']:.4f}" in card
    assert f"- test: accuracy {results['test']['accuracy']:.4f}" in card
    assert f"kdw distill --run-dir {student} --teacher {teacher}" in card
    spent = json.loads((student / "status.json").read_text())["seconds"]
    assert f"- time: teacher cache {spent['teacher_cache']:g} s, training " in card
    teacher_card = (teacher / "model" / "README.md").read_text()
    assert "A teacher fine-tuned from" in teacher_card
    assert "- time: training " in teacher_card and "teacher cache" not in teacher_card
    assert "knowledge-distillation" not in teacher_card


def test_the_card_quotes_names_and_labels_as_text(tmp_path):
    """A run named, or with labels and notes, in Markdown or HTML: the card shows them as
    text (code spans or escapes), and nothing in them starts a heading, a tag or a code block."""
    from workbench.core.runs import Run, model_card

    folder = tmp_path / "<b>evil"
    folder.mkdir()
    write_run_record(
        folder,
        method="finetune",
        task={"name": "t", "label_names": ["a`b", "x\n## injected"], "metrics": []},
        configs={"teacher": {"model": "m"}},
    )
    manifest = {"versions": {}, "data_notes": ["<img src=x>"], "command": ["kdw", "```\n# x"]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    card = model_card(Run(folder))
    assert "# \\<b\\>evil\n" in card and "- \\<img src=x\\>" in card
    assert not re.search(r"(?<!\\)[<>]", card)  # every angle bracket escaped: no tag
    assert "- 0: ``a`b``" in card and "- 1: `x ## injected`" in card
    assert not any(line.startswith(("## injected", "# x")) for line in card.splitlines())
    assert "````\nkdw '```\n# x'\n````" not in card  # the command's line break is a space
    assert "````\nkdw '``` # x'\n````" in card


@pytest.mark.slow
def test_exported_folder_answers_like_the_projects_evaluation(runs, tmp_path, monkeypatch, capsys):
    _, student = runs
    out = tmp_path / "export"
    out.mkdir()  # an empty folder is fine
    assert _kdw(monkeypatch, "export-model", str(student), "--out", str(out)) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= {
        p.name for p in out.iterdir()
    }
    assert (out / "README.md").read_text() == (student / "model" / "README.md").read_text()

    classifier = pipeline("text-classification", model=str(out), device="cpu")
    assert tuple(classifier.model.config.id2label.values()) == NAMES
    loaded = load_run(student)
    split = load_task(loaded.data).splits["test"]
    answers = classifier(split.texts, top_k=None)
    assert all({answer["label"] for answer in ranked} == set(NAMES) for ranked in answers)
    predicted = [ranked[0]["label"] for ranked in answers]
    assert len(set(predicted)) > 1  # the student has learnt something to compare

    dataset = encode(split, loaded.tokenizer, loaded.data.max_length)
    logits = predict_logits(loaded.model, dataset, 64, loaded.tokenizer.pad_token_id)
    assert predicted == [NAMES[i] for i in logits.argmax(-1).tolist()]
    top = torch.softmax(logits, -1).max(-1).values
    assert [ranked[0]["score"] for ranked in answers] == pytest.approx(top.tolist(), abs=1e-5)
    accuracy = sum(p == NAMES[y] for p, y in zip(predicted, split.labels, strict=True))
    results = json.loads((student / "results.json").read_text())
    assert accuracy / len(split) == pytest.approx(results["test"]["accuracy"])


@pytest.mark.slow
def test_export_names_the_classes_of_a_run_saved_without_them(runs, tmp_path, monkeypatch):
    teacher, _ = runs
    config_path = teacher / "model" / "config.json"
    config = json.loads(config_path.read_text())
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(3)}  # as runs were saved before
    config["label2id"] = {f"LABEL_{i}": i for i in range(3)}
    config_path.write_text(json.dumps(config))
    assert _kdw(monkeypatch, "export-model", str(teacher), "--out", str(tmp_path / "t")) == 0
    exported = json.loads((tmp_path / "t" / "config.json").read_text())
    assert list(exported["id2label"].values()) == list(NAMES)


def test_regression_keeps_its_single_output():
    model = tiny_model(num_labels=1)
    before = dict(model.config.id2label)
    set_label_names(model, TaskSpec("stsb", (), ("spearman", "pearson"), pair=True))
    assert model.config.num_labels == 1 and model.config.id2label == before


@pytest.mark.slow
def test_export_errors_are_one_line(runs, tmp_path, monkeypatch, capsys):
    teacher, _ = runs
    missing, out = str(tmp_path / "nowhere"), str(tmp_path / "o")
    assert _kdw(monkeypatch, "export-model", missing, "--out", out) == 2
    assert "run folder" in _error_line(capsys) and not (tmp_path / "o").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    assert _kdw(monkeypatch, "export-model", str(teacher), "--out", str(tmp_path / "full")) == 2
    assert "is a folder that is not empty" in _error_line(capsys)
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    (tmp_path / "file").write_text("x")
    assert _kdw(monkeypatch, "export-model", str(teacher), "--out", str(tmp_path / "file")) == 2
    assert "is a file" in _error_line(capsys)


def test_help_says_the_push_needs_the_network(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["export-model", "--help"])
    assert exit_info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "usage: kdw export-model" in help_text
    assert "needs the network and a Hub login" in help_text and "not exercised offline" in help_text


@pytest.mark.slow
def test_push_to_hub_pushes_model_tokenizer_then_the_runs_card(runs, tmp_path, monkeypatch):
    """Offline, the Hub calls are replaced: this checks which calls are made, not an upload."""
    teacher, _ = runs
    calls = []
    monkeypatch.setattr(
        HfApi, "create_repo", lambda self, repo_id, **_: SimpleNamespace(repo_id=f"me/{repo_id}")
    )
    for cls in (PreTrainedModel, PreTrainedTokenizerBase):
        monkeypatch.setattr(
            cls,
            "push_to_hub",
            lambda self, repo_id, **_: calls.append((type(self).__name__, repo_id)),
        )
    monkeypatch.setattr(
        HfApi,
        "upload_file",
        lambda self, **kw: calls.append(
            ("card", kw["repo_id"], kw["path_in_repo"], Path(kw["path_or_fileobj"]).read_text())
        ),
    )
    out = tmp_path / "pushed"
    push = ["--out", str(out), "--push-to-hub", "tiny-teacher"]
    assert _kdw(monkeypatch, "export-model", str(teacher), *push) == 0
    assert calls[0] == ("BertForSequenceClassification", "me/tiny-teacher")
    assert calls[1][1] == "me/tiny-teacher" and "Tokenizer" in calls[1][0]
    assert calls[2] == ("card", "me/tiny-teacher", "README.md", (out / "README.md").read_text())


@pytest.mark.slow
def test_a_failed_push_is_one_line(runs, tmp_path, monkeypatch, capsys):
    teacher, _ = runs

    def offline(*_, **__):
        raise OfflineModeIsEnabled("Cannot reach the Hub: offline mode is enabled.\nSee the docs")

    monkeypatch.setattr(HfApi, "create_repo", offline)
    push = ["--out", str(tmp_path / "o"), "--push-to-hub", "me/tiny"]
    assert _kdw(monkeypatch, "export-model", str(teacher), *push) == 2
    assert _error_line(capsys).endswith(
        "pushing to me/tiny failed: Cannot reach the Hub: offline mode is enabled."
    )
    assert (tmp_path / "o" / "config.json").exists()  # the local export is kept
