"""Attribution on the bundled MiniLM-L6 (real weights, real WordPiece tokenizer, random
classification head): Captum equivalence, padding invariance and text records on real sentences."""

from __future__ import annotations

import pytest
import torch

from workbench.analysis.attribution import (
    AttributionSettings,
    ExplainerChoice,
    attribute_texts,
    attribution_maps,
    captum_grad_saliency,
    captum_integrated_gradients,
    grad_saliency,
    integrated_gradients,
)
from workbench.core.models import load_classifier, load_tokenizer

pytestmark = pytest.mark.slow

SENTENCES = [
    "What a wonderful, sunny morning!",
    "The service was slow and the food arrived cold.",
    "ok",
    "I am not sure whether the new phone is worth the price, the battery seems fine though.",
]


@pytest.fixture(scope="module")
def minilm():
    torch.manual_seed(0)
    return load_classifier("minilm-l6", 3).eval(), load_tokenizer("minilm-l6")


def encode(tokenizer, texts, pairs=None):
    args = (texts,) if pairs is None else (texts, pairs)
    return dict(tokenizer(*args, padding=True, return_tensors="pt"))


def inputs(batch):
    return batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]


def relative_error(actual, expected):
    return float((actual - expected).abs().max() / expected.abs().max())


@pytest.mark.parametrize(
    ("baseline", "layer"), [("pad", None), ("pad-keep-special", None), ("zero", None), ("pad", 2)]
)
def test_ig_equals_captum_on_sentences(minilm, baseline, layer):
    model, tokenizer = minilm
    batch = encode(tokenizer, SENTENCES[:3])
    options = {"target": "pred", "steps": 4, "baseline": baseline, "layer": layer}
    ours = integrated_gradients(model, *inputs(batch), **options, max_batch_tokens=100)
    theirs = captum_integrated_gradients(
        model,
        *inputs(batch),
        **options,
        special_ids={tokenizer.cls_token_id, tokenizer.sep_token_id},
    )
    assert relative_error(ours, theirs) < 1e-5


def test_grad_saliency_equals_captum_on_pairs(minilm):
    model, tokenizer = minilm
    batch = encode(tokenizer, SENTENCES[:2], ["Really?", "Never again, I promise you that."])
    ours = grad_saliency(model, *inputs(batch), target=1)
    assert relative_error(ours, captum_grad_saliency(model, *inputs(batch), target=1)) < 1e-5


def test_maps_do_not_depend_on_padding(minilm):
    model, tokenizer = minilm
    batch = encode(tokenizer, SENTENCES)
    together = attribution_maps(model, *inputs(batch), steps=3, top_k=192, max_batch_tokens=90)
    for row, text in enumerate(SENTENCES):
        alone = encode(tokenizer, [text])
        single = attribution_maps(model, *inputs(alone), steps=3, top_k=192)
        n = single.shape[-1]
        torch.testing.assert_close(together[row : row + 1, :, :n], single, atol=1e-5, rtol=0)
        assert (together[row, :, n:] == 0).all()


def test_attribute_texts_on_real_tokens(minilm):
    model, tokenizer = minilm
    long_text = " ".join(["wonderful"] * 40)
    records = attribute_texts(
        model,
        tokenizer,
        [SENTENCES[0], long_text],
        settings=AttributionSettings(max_length=16),
        explainer=ExplainerChoice("ig", {"top_k": 128}),
    )
    assert records[0].tokens[:3] == ["[CLS]", "what", "a"] and records[0].tokens[-1] == "[SEP]"
    assert not records[0].truncated and records[1].truncated and len(records[1].tokens) == 16
    maps = torch.tensor(records[0].maps)
    assert maps.shape == (3, len(records[0].tokens))
    torch.testing.assert_close(maps.norm(dim=-1), torch.ones(3))
