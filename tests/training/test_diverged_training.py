"""A diverged training never passes for a result: a step whose loss, a term, the gradient norm
or a weight goes NaN or infinite stops the training in one line naming the step and what went
non-finite, the run's status says ``diverged``, its last finite checkpoint stays, and it gets no
results and no best model; a ``kdw tune`` trial that diverges fails and the search goes on.
Weights and temperatures that make the objective non-finite by themselves are refused before
anything is written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
import torch
from safetensors.torch import load_file

from kd.cli import main
from kd.experiments.config import TuneConfig
from kd.experiments.tune import parse_dimension, trials_table, tune
from kd.methods.config import ObjectiveConfig
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.pipeline import train_teacher
from kd.training.trainer import _non_finite_values, _non_finite_weights
from tests.conftest import write_tiny_workspace
from tests.tiny_families import save_family_model
from workbench.app.catalog import discover_runs
from workbench.core.config import DataConfig
from workbench.core.errors import WorkbenchError
from workbench.core.runs import Run

FAST = OptimConfig(epochs=0.2, batch_size=16, threads=1)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A tiny model, a task of 120 training examples, and a finished teacher."""
    work = tmp_path_factory.mktemp("diverged")
    write_tiny_workspace(work)
    train_teacher(_data(work), TeacherConfig(model=str(work / "tiny-bert")), FAST, work / "teacher")
    return work


def _data(work: Path) -> DataConfig:
    return DataConfig(task=str(work / "task"), max_length=16)


def _errors(capsys) -> list[str]:
    """The ``kdw:`` lines on stderr (the rest is the training's progress bar)."""
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("kdw:")]


def _huge_learning_rate(work: Path, run_dir: Path) -> list[str]:
    """``kdw train-teacher`` at learning rate 1e10, 8 steps, a checkpoint after every step:
    step 1 takes every weight to about ±1e10 (Adam's first step is ±lr), so the loss of step 2
    is NaN."""
    return [
        "train-teacher",
        "--run-dir",
        str(run_dir),
        "--model",
        str(work / "tiny-bert"),
        "--task",
        str(work / "task"),
        "--max-length",
        "16",
        "--batch-size",
        "16",
        "--epochs",
        "1",
        "--threads",
        "1",
        "--checkpoint-every",
        "1",
        "--learning-rate",
        "1e10",
    ]


def test_a_huge_learning_rate_stops_the_training_where_it_diverges(work, tmp_path, capsys):
    """The training stops at step 2, keeping the checkpoint of step 1, with no model and no
    results; rerunning the command resumes from step 1 and diverges again."""
    run_dir = tmp_path / "teacher"
    command = _huge_learning_rate(work, run_dir)
    expected = (
        "kdw: error: training diverged at step 2: the term ce is nan (lr 8.75e+09): the "
        "checkpoint of step 1 is kept; lower --learning-rate or check --weights and --temperature"
    )
    assert main(command) == 2
    assert _errors(capsys) == [expected]
    run = Run(run_dir)
    status = run.status()
    assert status.seconds.keys() == {"training"}  # a teacher: no teacher cache
    assert status.model_dump(exclude={"seconds"}, exclude_unset=True) == {
        "state": "diverged",
        "step": 2,
        "total": 8,
        "reason": "the term ce is nan",
    }
    assert run.results() is None and not (run_dir / "results.json").exists()
    assert not run.model_dir.exists()  # no evaluation came before the divergence
    saved = run.load_checkpoint("cpu")
    assert saved["state"]["step"] == 1
    assert all(torch.isfinite(value).all() for value in saved["model"].values())
    assert [r["step"] for r in run.metrics()] == [1]  # step 2 logged nothing
    (entry,) = [e for e in discover_runs(tmp_path) if e.name == "teacher"]
    assert entry.state == "diverged"  # the app's run table
    assert main(command) == 2  # rerun: resumes from step 1 and diverges at the same step
    assert _errors(capsys) == [expected]


def test_a_best_model_of_an_earlier_evaluation_is_kept(work, tmp_path, capsys):
    """Evaluated after step 1, the run keeps that best model (finite weights) when step 2
    diverges, but gets no results: its status says diverged."""
    run_dir = tmp_path / "teacher"
    assert main([*_huge_learning_rate(work, run_dir), "--eval-every", "1"]) == 2
    assert _errors(capsys)[0].startswith("kdw: error: training diverged at step 2: ")
    best = load_file(str(run_dir / "model" / "model.safetensors"))
    assert all(torch.isfinite(value).all() for value in best.values())
    assert [r["step"] for r in Run(run_dir).metrics("dev")] == [1]
    assert not (run_dir / "results.json").exists()
    assert Run(run_dir).status().state == "diverged"


def test_weights_that_are_not_finite_are_named():
    layer = torch.nn.Linear(2, 2)
    assert _non_finite_weights(list(layer.named_parameters())) == []
    with torch.no_grad():
        layer.bias[1] = math.inf
    assert _non_finite_weights(list(layer.named_parameters())) == [
        "1 weight tensor(s) are not finite after the update (first bias)"
    ]


def test_a_weighted_sum_that_overflows_is_named_as_the_loss():
    assert _non_finite_values({"ce": 1.0, "kd": math.inf}, math.inf) == ["the term kd is inf"]
    assert _non_finite_values({"ce": 1e308, "kd": 1e308}, math.inf) == ["the loss is inf"]
    assert _non_finite_values({"ce": 1.0, "kd": 2.0}, 3.0) == []


def _weight(value: str) -> str:
    return (
        f"kdw: error: argument --weights: weight of 'kd' must be a finite number ≥ 0, got "
        f"'{value}' (see kdw distill --help)"
    )


def _outside(option: str, shown: str, expected: str) -> str:
    return f"kdw: error: {option}: {shown} is not allowed (expected {expected})"


@pytest.mark.parametrize(
    ("option", "value", "line"),
    [
        ("--weights", "kd=nan", _weight("nan")),
        ("--weights", "kd=inf", _weight("inf")),
        ("--weights", "ce=1,kd=-1", _weight("-1")),
        ("--temperature", "1e30", _outside("--temperature", "1e+30", "a number in [0.01, 1000]")),
        ("--temperature", "nan", _outside("--temperature", "nan", "a number in [0.01, 1000]")),
    ],
)
def test_weights_and_temperatures_outside_their_domain_are_refused_before_any_write(
    work, tmp_path, capsys, option, value, line
):
    run_dir = tmp_path / "student"
    command = ["distill", "--run-dir", str(run_dir), "--teacher", str(work / "teacher")]
    try:
        code = main([*command, "--task", str(work / "task"), option, value])
    except SystemExit as stop:  # argparse reads --weights' text: it stops there
        code = stop.code
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [line]
    assert not run_dir.exists()


def test_the_temperature_bound_and_finite_values_hold_in_the_config_and_the_search_space():
    assert ObjectiveConfig(temperature=1000.0).temperature == 1000.0
    with pytest.raises(WorkbenchError, match=r"--temperature: 1000\.5 is not allowed"):
        ObjectiveConfig(temperature=1000.5)
    with pytest.raises(WorkbenchError, match=r"--weights: \{'attr': -0\.5\} is not allowed"):
        ObjectiveConfig(weights={"attr": -0.5})
    with pytest.raises(WorkbenchError, match=r"--space tau: 2000 must lie in \[0\.01, 1000\]"):
        parse_dimension("tau", "1,2000")
    with pytest.raises(WorkbenchError, match=r"--space beta: inf must lie in \[0, inf\)"):
        parse_dimension("beta", "1,inf")


def test_a_diverging_tune_trial_fails_and_the_search_goes_on(work, tmp_path):
    out = tmp_path / "study"
    tune(
        _data(work),
        StudentConfig(teacher=str(work / "teacher"), num_layers=2),
        ObjectiveConfig(preset="kd"),
        FAST,
        TuneConfig(trials=3, space=("alpha=0.5", "tau=2", "lr=1e-3,1e10"), prune=False),
        out,
    )
    study = optuna.load_study(study_name="kdw-tune", storage=f"sqlite:///{out / 'study.db'}")
    states = {t.params["lr"]: t.state for t in study.trials}
    assert states == {1e-3: optuna.trial.TrialState.COMPLETE, 1e10: optuna.trial.TrialState.FAIL}
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert all(t.value is None for t in failed)  # not scored
    message = failed[0].user_attrs["diverged"]
    assert message.startswith("training diverged at step 2: the term ce is nan; the term kd is")
    assert len(study.trials) == 2  # a grid of two settings: each tried once
    assert sorted(row["state"] for row in trials_table(study)) == ["complete", "diverged"]
    trial = Run(out / "trials" / "alpha0.5-lr1e+10-tau2")
    assert trial.status().state == "diverged" and trial.results() is None
    best = json.loads((out / "best.json").read_text())
    complete = next(t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
    assert best["optim"]["learning_rate"] == 1e-3 and best["tuned"]["trial"] == complete.number


@pytest.mark.parametrize("preset", ["adkd", "gkd", "ckd"])
def test_batches_whose_texts_share_no_word_train_to_the_end(preset, tmp_path, capsys):
    """Across tokenizers, 4 of the 6 training texts are long words that each side's truncation
    cuts elsewhere, so they share no word: in batches of 2, every epoch has a batch of such
    texts alone, and the others mix them with texts that share words. The word terms leave
    them out; the training ends finished, never "diverged", and they are counted."""
    labels = ["negative", "neutral", "positive"]
    teacher = save_family_model("roberta", tmp_path / "roberta", labels, seed=1)
    student = save_family_model("bert", tmp_path / "bert", labels, seed=2)
    long = "supercalifragilisticexpialidocious" * 3
    splits = {
        "train": [*(long + letter for letter in "abcd"), "good movie today", "bad day"],
        "dev": ["the crew was great", "never again"],
        "test": ["a fine flight", "late again"],
    }
    (tmp_path / "task").mkdir()
    for split, texts in splits.items():
        rows = [f"{text},{labels[i % 3]}" for i, text in enumerate(texts)]
        (tmp_path / "task" / f"{split}.csv").write_text("\n".join(["text,label", *rows]) + "\n")
    run = tmp_path / "student"
    method = ["--preset", preset, *(["--attr-reduction", "paper"] if preset == "adkd" else [])]
    arguments = [
        *("distill", "--teacher", str(teacher), "--task", str(tmp_path / "task")),
        *("--init", "pretrained", "--pretrained", str(student), "--num-layers", "2"),
        *("--max-length", "8", "--epochs", "2", "--batch-size", "2", "--threads", "1"),
        *method,
        *("--run-dir", str(run)),
    ]
    assert main(arguments) == 0, _errors(capsys)
    assert "diverged" not in capsys.readouterr().err
    assert Run.open(run).status().state == "finished"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["word_alignment"]["train"]["examples_without_words"] == 4
    evaluations = Run.open(run).metrics("dev")
    assert len(evaluations) == 2 and all(math.isfinite(r["loss"]) for r in evaluations)
