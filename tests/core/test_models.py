"""Model loading and the output adaptor, on tiny random BERTs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kd.methods.layer_map import select_layers
from kd.methods.students import cut_student
from tests.conftest import id_batch, tiny_model
from workbench.core.errors import WorkbenchError
from workbench.core.models import (
    embed,
    encoder_layers,
    fingerprint,
    forward,
    load_classifier,
    load_tokenizer,
    resolve_model,
)


def test_adaptor_record_and_embedding_override():
    model = tiny_model()
    batch = id_batch([[2, 7, 8, 3], [2, 9, 3]])
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
