"""Model loading, student construction and the output adaptor, on tiny random BERTs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_model
from workbench.core.errors import WorkbenchError
from workbench.core.models import (
    cut_student,
    embed,
    embeddings_module,
    encoder_layers,
    fingerprint,
    forward,
    load_classifier,
    load_tokenizer,
    random_student,
    resolve_model,
    select_layers,
)


@pytest.mark.parametrize(
    ("n", "m", "strategy", "expected"),
    [
        (12, 6, "skip", [1, 3, 5, 7, 9, 11]),
        (6, 3, "skip", [1, 3, 5]),
        (6, 3, "first", [0, 1, 2]),
        (6, 3, "last", [3, 4, 5]),
        (6, 2, "0,5", [0, 5]),
    ],
)
def test_select_layers(n, m, strategy, expected):
    assert select_layers(n, m, strategy) == expected


@pytest.mark.parametrize("strategy", ["1,1", "0,9", "x,y"])
def test_select_layers_rejects_bad_lists(strategy):
    with pytest.raises(WorkbenchError):
        select_layers(6, 2, strategy)


def _batch(rows: list[list[int]], pad: int = 0) -> dict[str, torch.Tensor]:
    length = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (length - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (length - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def test_cut_student_copies_the_chosen_layers_and_runs_like_them():
    teacher = tiny_model(layers=4)
    student = cut_student(teacher, [1, 3]).eval()
    assert len(encoder_layers(student)) == 2
    for s_index, t_index in enumerate([1, 3]):
        for (name, p_s), (_, p_t) in zip(
            encoder_layers(student)[s_index].named_parameters(),
            encoder_layers(teacher)[t_index].named_parameters(),
            strict=True,
        ):
            assert torch.equal(p_s, p_t), name
    batch = _batch([[2, 7, 8, 9, 3], [2, 10, 3]])
    # run the teacher's embeddings → layer 1 → layer 3 → pooler → classifier by hand
    keep = batch["attention_mask"][:, None, None, :].bool()
    mask = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    with torch.no_grad():
        hidden = embed(teacher, batch)
        for index in (1, 3):
            hidden = encoder_layers(teacher)[index](hidden, attention_mask=mask)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        expected = teacher.classifier(teacher.bert.pooler(hidden))
        got = forward(student, batch).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert student.config.num_hidden_layers == 2 and teacher.config.num_hidden_layers == 4


def test_frozen_embeddings_get_no_gradient():
    student = cut_student(tiny_model(), [0, 2], freeze_embeddings=True)
    out = forward(student, _batch([[2, 7, 8, 3]]))
    out.logits.sum().backward()
    assert all(p.grad is None for p in embeddings_module(student).parameters())
    assert all(p.grad is not None for p in encoder_layers(student).parameters())


def test_random_student_can_be_narrower():
    teacher = tiny_model(hidden=16)
    student = random_student(teacher.config, num_layers=2, hidden_size=8, num_heads=2)
    out = forward(student, _batch([[2, 7, 3]]), hidden_states=True)
    assert out.hidden_states[0].shape == (1, 3, 8) and len(out.hidden_states) == 3
    assert student.config.vocab_size == teacher.config.vocab_size
    with pytest.raises(WorkbenchError, match="not divisible"):
        random_student(teacher.config, 2, hidden_size=9, num_heads=2)


def test_adaptor_record_and_embedding_override():
    model = tiny_model()
    batch = _batch([[2, 7, 8, 3], [2, 9, 3]])
    out = forward(model, batch, hidden_states=True, attentions=True)
    assert out.logits.shape == (2, 3)
    assert len(out.hidden_states) == 5 and out.hidden_states[0].shape == (2, 4, 16)
    assert len(out.attentions) == 4 and out.attentions[0].shape == (2, 2, 4, 4)
    with torch.no_grad():
        embedded = embed(model, batch)
        torch.testing.assert_close(embedded, out.hidden_states[0])
        same = forward(model, batch, embedding_output=embedded).logits
        zeroed = forward(model, batch, embedding_output=torch.zeros_like(embedded)).logits
    torch.testing.assert_close(same, out.logits)
    assert not torch.allclose(zeroed, out.logits)


def test_load_from_directory_and_errors(tiny_model_dir: Path, tmp_path: Path):
    model = load_classifier(str(tiny_model_dir), 5)  # an encoder gets a fresh head
    assert model.config.num_labels == 5 and model.config._attn_implementation == "eager"
    assert load_tokenizer(str(tiny_model_dir)).pad_token_id == 0
    with pytest.raises(WorkbenchError, match=r"no such file or folder: \./no/such/model"):
        resolve_model("./no/such/model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkbenchError, match=r"no config\.json"):
        resolve_model(str(tmp_path / "empty"))


def test_fingerprint_changes_with_any_weight():
    model = tiny_model()
    before = fingerprint(model)
    assert fingerprint(tiny_model()) == before
    with torch.no_grad():
        model.classifier.bias[0] += 1e-3
    assert fingerprint(model) != before


@pytest.mark.slow
def test_builtin_minilm_loads_and_cuts():
    teacher = load_classifier("minilm-l6", 3).eval()
    tokenizer = load_tokenizer("minilm-l6")
    assert len(encoder_layers(teacher)) == 6 and teacher.config.hidden_size == 384
    student = cut_student(teacher, select_layers(6, 3, "skip")).eval()
    batch = tokenizer(
        ["a great film", "not good at all, really"], padding=True, return_tensors="pt"
    )
    out = forward(student, dict(batch), hidden_states=True)
    assert out.logits.shape == (2, 3) and len(out.hidden_states) == 4
    teacher_out = forward(teacher, dict(batch), hidden_states=True)
    torch.testing.assert_close(out.hidden_states[0], teacher_out.hidden_states[0])
