"""IG of decoder classifiers (tiny random Llama, Qwen2 and GPT-2 whose pad token is their
end-of-text token, as SmolLM2's): the engine against Captum's LayerIntegratedGradients given a
forward function that reads the logits at each text's last real token of the *input* (the
baseline is all [PAD] = end-of-text ids, where Hugging Face's last-non-pad rule would find
another position), for batches padded on either side and cut into chunks; the decoder
baseline mean-keep-first (its rows, IG against Captum's IntegratedGradients from it, the
default a decoder gets and an encoder does not); completeness, whose gap shrinks as the steps
grow; the app's explanations of a left-padding decoder and the advice of its gap warning."""

from __future__ import annotations

import pytest
import torch
from captum.attr import IntegratedGradients, LayerIntegratedGradients
from transformers import AutoModelForSequenceClassification

from tests.tiny_families import (
    decoder_tokenizer,
    family_config,
    family_tokenizer,
    save_family_model,
)
from workbench.analysis.attribution import (
    AttributionSettings,
    ExplainerChoice,
    attribute_texts,
    completeness_warning,
    ig_completeness,
    integrated_gradients,
)
from workbench.analysis.attribution.baselines import baseline_output, resolve_baseline
from workbench.analysis.examples import Example
from workbench.analysis.explanations import explain
from workbench.core.errors import WorkbenchError
from workbench.core.models import load_model

TEXTS = ["good morning to you all my friends", "bad day", "what a lovely evening it was"]
FAMILIES = ("llama", "qwen2", "gpt2")


def decoder(model_type: str, padding_side: str):
    """A tiny random decoder classifier (pad = end-of-text) and a padded batch of ``TEXTS``.

    The pad embedding is drawn like the other rows, as in a trained model: a fresh model's
    padding row is zero, and the all-zero embedding output is where a pre-norm decoder's
    first RMSNorm/LayerNorm turns over within ``α ≈ sqrt(eps)/rms(E)`` of the baseline, a path
    no Riemann sum of a few hundred steps follows."""
    tokenizer = decoder_tokenizer()
    torch.manual_seed(0)
    config = family_config(model_type, tokenizer, ["a", "b", "c"])
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")
    weight = model.get_input_embeddings().weight
    with torch.no_grad():
        weight[config.pad_token_id] = torch.randn(weight.shape[1]) * weight.std()
    batch = tokenizer(TEXTS, padding=True, padding_side=padding_side, return_tensors="pt")
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == config.pad_token_id
    return model.eval(), batch["input_ids"], batch["attention_mask"]


def captum_ig(model, input_ids, attention_mask, target, steps):
    """Captum's IG on the word embeddings against all-[PAD] ids, the head applied to the final
    state at each text's last real token as the attention mask of the input places it (the
    same position at every point of the path, the baseline's included)."""
    last = (attention_mask * torch.arange(1, attention_mask.shape[1] + 1)).argmax(1)

    def probabilities(ids, mask):
        hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        at = last.repeat(len(ids) // len(last))
        return model.score(hidden[torch.arange(len(ids)), at]).softmax(-1)

    layer = LayerIntegratedGradients(probabilities, model.get_input_embeddings())
    ig = layer.attribute(
        input_ids,
        baselines=torch.full_like(input_ids, model.config.pad_token_id),
        target=target,
        additional_forward_args=(attention_mask,),
        n_steps=steps,
        method="riemann_right",
    )
    return ig.detach() * attention_mask[:, :, None]


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_decoder_ig_equals_captum_at_the_inputs_last_token(model_type, padding_side):
    model, ids, mask = decoder(model_type, padding_side)
    target = torch.tensor([0, 1, 2])
    expected = captum_ig(model, ids, mask, target, steps=8)
    assert expected.abs().amax() > 1e-3
    # one chunk, and chunks of one step row each (trimmed after their last real token)
    for max_batch_tokens in (None, ids.shape[1]):
        ours = integrated_gradients(
            model,
            ids,
            mask,
            target=target,
            steps=8,
            baseline="pad",
            max_batch_tokens=max_batch_tokens,
        )
        torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("baseline", ["pad", "mean-keep-first"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_decoder_ig_completeness_closes_as_the_steps_grow(model_type, padding_side, baseline):
    model, ids, mask = decoder(model_type, padding_side)

    def gap(steps: int) -> torch.Tensor:
        attributed, change = ig_completeness(
            model, ids, mask, target="pred", steps=steps, baseline=baseline
        )
        return (attributed - change).abs() / change.abs()

    few, many = gap(16), gap(256)
    # the right Riemann sum's error falls as 1/steps on a smooth path: 16× here, 4× asked
    assert torch.all(many < few / 4), (few, many)
    assert torch.all(many < 0.1), many  # relative to F(x) − F(x'), small for some texts


def first_real(mask: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` bool: each row's first attended position, found by a loop."""
    first = torch.zeros_like(mask, dtype=torch.bool)
    for b, row in enumerate(mask.tolist()):
        first[b, row.index(1)] = True
    return first


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_mean_keep_first_keeps_each_texts_first_token_and_puts_the_mean_row_elsewhere(
    padding_side,
):
    model, ids, mask = decoder("llama", padding_side)
    table = model.get_input_embeddings().weight.detach()
    start = baseline_output(model, {"input_ids": ids, "attention_mask": mask}, "mean-keep-first")
    first = first_real(mask)
    assert first[:, 0].tolist() != first[:, -1].tolist() or padding_side == "right"
    torch.testing.assert_close(start[first], table[ids[first]])
    mean = table.double().mean(0).float()  # the mean row, summed independently
    torch.testing.assert_close(start[~first], mean.expand(int((~first).sum()), -1))
    assert not torch.allclose(mean, table[model.config.pad_token_id])


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_mean_keep_first_ig_equals_captums_from_the_same_word_embeddings(model_type, padding_side):
    model, ids, mask = decoder(model_type, padding_side)
    target = torch.tensor([2, 0, 1])
    table = model.get_input_embeddings().weight.detach()
    words = table[ids]
    start = torch.where(first_real(mask)[..., None], words, table.mean(0))
    last = (mask * torch.arange(1, mask.shape[1] + 1)).argmax(1)

    def probabilities(embeds, attention_mask):
        hidden = model.base_model(inputs_embeds=embeds, attention_mask=attention_mask)
        at = last.repeat(len(embeds) // len(last))
        return model.score(hidden.last_hidden_state[torch.arange(len(embeds)), at]).softmax(-1)

    expected = IntegratedGradients(probabilities).attribute(
        words,
        baselines=start,
        target=target,
        additional_forward_args=(mask,),
        n_steps=8,
        method="riemann_right",
    )
    ours = integrated_gradients(
        model, ids, mask, target=target, steps=8, baseline="mean-keep-first"
    )
    assert expected.abs().amax() > 1e-3
    torch.testing.assert_close(ours, expected * mask[:, :, None], rtol=1e-4, atol=1e-6)
    assert ours[first_real(mask)].abs().amax() == 0  # the kept token: no path, no attribution


def test_the_default_baseline_is_mean_keep_first_for_a_decoder_and_pad_for_an_encoder():
    model, ids, mask = decoder("llama", "right")
    tokenizer = family_tokenizer("bert")
    torch.manual_seed(0)
    encoder = AutoModelForSequenceClassification.from_config(
        family_config("bert", tokenizer, ["a", "b", "c"])
    ).eval()
    encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")
    cases = [
        (model, (ids, mask), "mean-keep-first"),
        (encoder, (encoded["input_ids"], encoded["attention_mask"]), "pad"),
    ]
    for classifier, inputs, expected in cases:
        assert resolve_baseline(classifier, None) == expected
        assert resolve_baseline(classifier, "zero") == "zero"
        default = integrated_gradients(classifier, *inputs, target=1, steps=3)
        named = integrated_gradients(classifier, *inputs, target=1, steps=3, baseline=expected)
        torch.testing.assert_close(default, named, rtol=0, atol=0)
    with pytest.raises(WorkbenchError, match="unknown baseline 'mean'"):
        resolve_baseline(model, "mean")


def test_a_decoders_records_say_the_baseline_it_got():
    model, _, _ = decoder("llama", "right")
    settings, two = AttributionSettings(views="pred"), ExplainerChoice("ig", {"steps": 2})
    (record,) = attribute_texts(
        model, decoder_tokenizer(), TEXTS[:1], settings=settings, explainer=two
    )
    assert record.settings["explainer_settings"]["baseline"] == "mean-keep-first"


def test_the_gap_warning_advises_the_decoder_baseline_only_to_a_decoder_on_another():
    def warning(decoder: bool, baseline: str) -> str:
        line = completeness_warning(0.9, 0.1, baseline, decoder, steps=50)
        assert "a gap of 800% at 50 steps" in line and f"baseline ({baseline})" in line
        return line

    for decoder, baseline in ((True, "pad"), (True, "zero")):
        line = warning(decoder, baseline)
        assert "use the baseline mean-keep-first" in line and "can widen the gap" in line
        assert "try twice as many" not in line
    for decoder, baseline in ((True, "mean-keep-first"), (False, "pad"), (False, "zero")):
        line = warning(decoder, baseline)
        assert "try twice as many" in line and "if the gap does not fall" in line
        assert "mean-keep-first (a decoder" not in line
    assert completeness_warning(0.104, 0.1, "pad", True, steps=50) is None  # a 4 % gap


@pytest.mark.slow
def test_explain_reads_a_left_padding_decoders_rows_and_their_completeness(tmp_path):
    folder = save_family_model("llama", tmp_path / "llama", ["a", "b", "c"])
    loaded = load_model(str(folder))
    loaded.tokenizer.padding_side = "left"
    examples = [Example(text) for text in TEXTS]
    explanations = explain(loaded, examples, explainer=ExplainerChoice("ig", {"steps": 8}))
    for text, explanation in zip(TEXTS, explanations, strict=True):
        alone = loaded.tokenizer(text, return_tensors="pt")
        ids = alone["input_ids"][0].tolist()
        assert explanation.tokens == [loaded.tokenizer.decode([i]).strip() or "␣" for i in ids]
        expected = ig_completeness(loaded.model, **alone, target=explanation.predicted, steps=8)
        assert (explanation.baseline, explanation.decoder) == ("mean-keep-first", True)
        assert explanation.completeness == pytest.approx(
            [float(v) for v in expected], rel=1e-4, abs=1e-6
        )
