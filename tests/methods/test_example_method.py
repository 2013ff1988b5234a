"""The worked example of docs/adding-a-method.md: one file registers a method, which then
resolves, records itself and trains a step like the built-in ones, and has a tune space, an
ablation in the reproduction suite and a verdict in its report."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch

import kd.methods.objective as registry
from kd.experiments.reproduce.report import write_report
from kd.experiments.reproduce.runner import compact
from kd.experiments.reproduce.suite import TaskPlan, ablations
from kd.experiments.tune import apply, search_space
from kd.methods.objective import Objective
from kd.training.pipeline import check_tokens
from tests.conftest import tiny_model, tiny_tokenizer
from workbench.core.config import DataConfig, ObjectiveConfig, OptimConfig
from workbench.core.data import batches, encode, load_task
from workbench.core.errors import WorkbenchError
from workbench.core.models import cut_student, forward

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hidden_mse.py"


@pytest.fixture
def example():
    """The example module's names, registered for this test only: the registry's tables (which
    the tuner, the suite and the report read) are restored in place afterwards."""
    tables = [registry.TERMS, registry.TEACHER_FIELDS, registry.PRESETS]
    saved = [dict(table) for table in tables]
    methods = list(registry.METHODS)
    yield runpy.run_path(str(EXAMPLE))
    for table, entries in zip(tables, saved, strict=True):
        table.clear()
        table.update(entries)
    registry.METHODS[:] = methods


def test_example_method_registers_resolves_and_trains_a_step(example, tiny_task_dir, tmp_path):
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    train = encode(load_task(DataConfig(task=str(tiny_task_dir))).splits["train"], tokenizer, 16)
    batch = next(batches(train, list(range(8)), 8, 0))
    teacher = tiny_model(layers=4)
    student = cut_student(teacher, [1, 3]).eval()  # no dropout: the direct formula below
    objective = Objective.resolve(ObjectiveConfig(preset="hidden-mse"), 4, 2, num_labels=3)

    assert objective.weights == {"ce": 0.5, "kd": 0.5, "hidden": 1.0}
    assert objective.hidden_pairs == [(0, 0), (1, 2), (2, 4)]
    assert objective.record()["hidden_pairs"] == [[0, 0], [1, 2], [2, 4]]
    assert objective.teacher_fields() == ["logits", "hidden_states"]
    assert objective.teacher_settings(["hidden_states"])["hidden_pairs"] == [(0, 0), (1, 2), (2, 4)]

    with torch.no_grad():
        teacher_values = objective.teacher_batch(teacher, batch)
    values = objective(student, batch, teacher_values)
    student_states = forward(student, batch, hidden_states=True).hidden_states
    teacher_states = forward(teacher, batch, hidden_states=True).hidden_states
    mask = batch["attention_mask"].bool()
    expected = torch.stack(
        [
            (student_states[s] - teacher_states[t])[mask].pow(2).mean()
            for s, t in [(0, 0), (1, 2), (2, 4)]
        ]
    ).mean()
    torch.testing.assert_close(values["hidden"], expected)

    before = [p.detach().clone() for p in student.parameters()]
    optimizer = torch.optim.SGD(student.parameters(), lr=0.01)
    values["loss"].backward()
    optimizer.step()
    changed = [not torch.equal(a, b) for a, b in zip(before, student.parameters(), strict=True)]
    assert any(changed)
    with torch.no_grad():
        after = objective(student, batch, teacher_values)["loss"]
    assert after < values["loss"]


def test_example_loss_refuses_other_widths(example):
    hidden_mse_loss = example["hidden_mse_loss"]
    with pytest.raises(ValueError, match="equal hidden sizes"):
        hidden_mse_loss(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 8), torch.ones(1, 2))


def test_registering_the_example_gives_it_a_tune_space_an_ablation_and_a_verdict(example, tmp_path):
    weights = {"ce": 0.5, "kd": 0.5, "hidden": 1.0}
    space = search_space("hidden-mse", (), weights)
    assert {name: d.choices for name, d in space.items()} == {
        "beta": (0.1, 1.0, 10.0),
        "alpha": (0.1, 0.5, 0.9),
    }
    objective, _ = apply(
        {"beta": 10.0, "alpha": 0.9},
        weights,
        ObjectiveConfig(preset="hidden-mse"),
        OptimConfig(),
    )
    assert objective.weights == {"ce": 0.1, "kd": 0.9, "hidden": 10}  # 1 − 0.9 is 0.1, exactly

    rows = ablations("t", TaskPlan(DataConfig(task="t")), (1, 2))
    ours = [e for e in rows if e.name.startswith("hidden-mse")]
    assert [(e.name, e.group, e.seed) for e in ours] == [
        ("hidden-mse w/o ce", "hidden-terms", 1),
        ("hidden-mse w/o ce", "hidden-terms", 2),
    ]
    resolved = Objective.resolve(ours[0].objective, 4, 2)
    assert resolved.weights == {"kd": 0.5, "hidden": 1.0}  # the preset's, CE dropped

    # a hand-made record: over 2 seeds of 50 test examples, vanilla KD right on 25 of each,
    # the example right on 40: + 30 points, an interval that excludes 0
    labels = [i % 2 for i in range(50)]
    right = {"kd": 25, "hidden-mse": 40}
    students = [
        {
            "task": "t",
            "name": name,
            "group": "main",
            "seed": seed,
            "sweep": None,
            "run": "",
            "test": {"accuracy": count / 50, "macro_f1": count / 50},
            "examples": {
                "test_set": "t",
                "predictions": compact(labels[:count] + [1 - y for y in labels[count:]]),
            },
        }
        for name, count in right.items()
        for seed in (1, 2)
    ]
    results = {
        "suite": "hand-written",
        "teachers": {"t": {"run": "", "test": {"accuracy": 0.9, "macro_f1": 0.9}}},
        "test_sets": {"t": {"uids": [f"u{i}" for i in range(50)], "labels": compact(labels)}},
        "students": students,
    }
    report = write_report(tmp_path, results, {}).read_text()
    assert "| hidden-mse | 80.0 ± 0.0 | 80.0 ± 0.0 | +30.0 [" in report
    verdict = next(line for line in report.splitlines() if "Hidden MSE ≥ vanilla KD" in line)
    assert verdict.startswith(
        "- **Hidden MSE ≥ vanilla KD (accuracy)?** Hidden MSE − vanilla KD on t +30.0 points"
    )
    assert verdict.endswith(": yes, significantly higher.")


def test_a_token_term_that_declares_no_word_form_is_refused_across_tokenizers(
    example, two_tokenizers
):
    """The example's hidden-state MSE compares token by token and declares no way to compare
    words (``on_words``): a student of another tokenizer is refused in one line naming it."""
    teacher, student = two_tokenizers
    config = ObjectiveConfig(preset="hidden-mse")
    check_tokens(Objective.resolve(config, 4, 2, 3), teacher.tokenizer, teacher.tokenizer)
    across = Objective.resolve(config, 4, 2, 3, words=True)
    with pytest.raises(WorkbenchError, match="the terms hidden compare tokens") as error:
        check_tokens(across, teacher.tokenizer, student.tokenizer)
    assert "\n" not in str(error.value)
