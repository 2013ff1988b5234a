"""An instruction LLM as a teacher through a prompt, from the command line: ``kdw evaluate`` scores
a language model without a head, and ``kdw distill`` trains a student from it on a transfer set
with no labelled example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kd.cli import main
from tests.conftest import make_sentences, write_tiny_workspace
from tests.tiny_families import save_causal_lm
from workbench.app.catalog import added_entries, changed_teacher
from workbench.core.config import DataConfig
from workbench.core.data import encode, load_task
from workbench.core.models import forward, load_model
from workbench.core.runs import Run

pytestmark = pytest.mark.slow  # trains a student: seconds

VERBALIZER = "negative=bad,neutral=okay,positive=good"
PROMPT = ["--prompt", "Tweet: {text}\nSentiment:", "--verbalizer", VERBALIZER]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("prompted-teacher")
    write_tiny_workspace(work)
    save_causal_lm(work / "lm")
    return work


def _data(work: Path) -> list[str]:
    return ["--task", str(work / "task"), "--max-length", "16"]


def test_evaluate_scores_a_language_model_through_a_prompt(work, tmp_path, capsys):
    rows = tmp_path / "rows.json"
    assert main(["evaluate", str(work / "lm"), *_data(work), *PROMPT, "--json", str(rows)]) == 0
    err = capsys.readouterr().err
    folder = err.split("prompted as a classifier of task: ")[1].split(" (a model folder)")[0]
    (row,) = json.loads(rows.read_text())
    # the accuracy kdw evaluate reports, against the prompted model's answers computed here
    data = DataConfig(task=str(work / "task"), max_length=16)
    test = load_task(data).splits["test"]
    loaded = load_model(folder)
    encoded = encode(test, loaded.tokenizer, 16)
    answers = []
    for ids in encoded.input_ids:
        batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids))}
        with torch.no_grad():
            answers.append(int(forward(loaded.model, batch).logits.argmax()))
    accuracy = sum(a == label for a, label in zip(answers, test.labels, strict=True)) / len(test)
    assert row["accuracy"] == pytest.approx(accuracy)

    assert main(["evaluate", str(work / "lm"), *_data(work)]) == 2  # no head, no prompt
    assert "or prompt it (--prompt … --verbalizer …)" in capsys.readouterr().err
    assert main(["evaluate", str(work / "tiny-bert"), *_data(work), *PROMPT]) == 2
    assert "is a causal language model (…ForCausalLM)" in capsys.readouterr().err


def test_a_student_learns_from_a_prompted_teacher_with_no_label(work, tmp_path, capsys):
    texts = tmp_path / "transfer.txt"
    texts.write_text("\n".join(make_sentences(80, seed=5).text))
    run = tmp_path / "student"
    command = [
        "distill",
        "--teacher",
        str(work / "lm"),
        *PROMPT,
        *_data(work),
        "--preset",
        "kd",
        "--init",
        "pretrained",
        "--pretrained",
        str(work / "tiny-bert"),
        "--transfer",
        str(texts),
        "--no-labels",
        *["--epochs", "0.5", "--batch-size", "16", "--threads", "1", "--run-dir"],
        str(run),
    ]
    assert main(command) == 0
    err = capsys.readouterr().err
    assert "--no-labels: ce read the labels, which no training text has" in err
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["split_sizes"]["train"] == manifest["transfer"]["used"] > 0
    info = Run.open(run).info()
    assert info.configs["student"]["labels"] is False
    teacher = info.resolved.teacher
    assert (Path(teacher.source) / "prompt.json").is_file()
    # the app lists the prompted folder as a model and the student's teacher as unchanged
    (entry,) = added_entries(teacher.source)
    assert (entry.origin, entry.problem) == ("model folder", None)
    assert changed_teacher(info) is None
    assert main(command) == 0  # finished: the same prompt is the same teacher
    alone = [*command[: command.index("--transfer")], *command[command.index("--no-labels") :]]
    assert main([*alone[:-1], str(tmp_path / "other")]) == 2
    assert "--no-labels goes with a transfer set: add --transfer" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
