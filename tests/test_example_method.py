"""The worked example of docs/adding-a-method.md: one file registers a method, which then
resolves, records itself and trains a step like the built-in ones."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch

import kd.objective as registry
from kd.objective import Objective
from tests.conftest import tiny_model, tiny_tokenizer
from workbench.config import DataConfig, ObjectiveConfig
from workbench.data import batches, encode, load_task
from workbench.models import cut_student, forward

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hidden_mse.py"


@pytest.fixture
def example(monkeypatch) -> dict:
    """The example module's names, registered for this test only."""
    for name in ("TERMS", "TEACHER_FIELDS", "PRESETS"):
        monkeypatch.setattr(registry, name, dict(getattr(registry, name)))
    monkeypatch.setattr(registry, "METHODS", list(registry.METHODS))
    return runpy.run_path(str(EXAMPLE))


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
