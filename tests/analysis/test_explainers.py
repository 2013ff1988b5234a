"""The explainer registry against Captum called directly on the tiny BERT of conftest.py (same
model, input, baseline and settings: equal to 1e-6 of the scale for the deterministic
explainers, equal under the same seed for the sampling ones), invariances (a text alone or in a
padded batch), another family (DistilBERT: no token types), word-level maps against a hand
computation, and one-line errors on bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from captum._utils.models.linear_model import SkLearnRidge
from captum.attr import (
    FeatureAblation,
    GradientShap,
    KernelShap,
    LayerDeepLift,
    LayerGradientXActivation,
    LayerIntegratedGradients,
    Lime,
    Occlusion,
)
from torch import nn
from transformers import AutoModelForSequenceClassification as Classifier
from transformers import BertConfig, BertTokenizerFast, DistilBertConfig

from tests.conftest import tiny_model
from tests.tolerances import assert_close_to_scale, float32_floor
from workbench.analysis.attribution import (
    EXPLAINERS,
    AttributionSettings,
    ExplainerChoice,
    attribute_texts,
    explain_batch,
    to_words,
    word_groups,
)
from workbench.analysis.attribution.explainers import text_kernel
from workbench.core.errors import WorkbenchError
from workbench.core.models import embed, embeddings_module

PAD, CLS, SEP = 0, 2, 3


def batch_of(rows: list[list[int]]) -> dict[str, torch.Tensor]:
    """[CLS] ids [SEP] rows, padded with [PAD]."""
    width = max(len(r) for r in rows) + 2
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, : len(row) + 2] = torch.tensor([CLS, *row, SEP])
        mask[b, : len(row) + 2] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


ROWS = [[5, 9, 14, 20, 7, 11], [30, 6, 12, 8, 25, 19]]  # equal lengths: Captum's windows alike


class Probabilities(nn.Module):
    """The class probabilities of ``model``, written here apart from the workbench's."""

    def __init__(self, model, from_embeddings: bool = False):
        super().__init__()
        self.model, self.from_embeddings = model, from_embeddings

    def forward(self, *args):
        if self.from_embeddings:
            value, ids, mask, types = args
            hook = embeddings_module(self.model).register_forward_hook(lambda *_: value)
            try:
                logits = self.model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
            finally:
                hook.remove()
        else:
            ids, mask, types = args
            logits = self.model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        return logits.softmax(-1)


# Scores of removals are differences of probabilities (≤ 1): they carry those probabilities'
# rounding, however small the difference.
PROBABILITY = (1.0,)


def setting(model=None):
    model = model or tiny_model(num_labels=3)
    batch = batch_of(ROWS)
    with torch.no_grad():
        target = model(**batch).logits.argmax(-1)
    extra = (batch["attention_mask"], batch["token_type_ids"])
    return model, batch, target, extra


def removal(batch):
    ids = batch["input_ids"]
    keep = (ids == CLS) | (ids == SEP) | (batch["attention_mask"] == 0)
    return torch.where(keep, ids, PAD)


# ------------------------------------------------------------------ deterministic explainers


def test_ig_equals_captums_layer_integrated_gradients():
    model, batch, target, extra = setting()
    ig = LayerIntegratedGradients(Probabilities(model), embeddings_module(model)).attribute(
        batch["input_ids"],
        baselines=torch.full_like(batch["input_ids"], PAD),
        target=target,
        additional_forward_args=extra,
        n_steps=4,
        method="riemann_right",
    )
    per_token = ig.norm(dim=-1) * batch["attention_mask"]
    theirs = per_token / per_token.norm(dim=-1, keepdim=True)
    ours = explain_batch(model, batch, ExplainerChoice("ig", {"steps": 4}))
    assert_close_to_scale(ours, theirs, 1e-6)


@pytest.mark.parametrize("layer", ["embeddings", "words"])
def test_grad_and_gradient_times_input_equal_captum(layer):
    model, batch, target, extra = setting()
    module = embeddings_module(model) if layer == "embeddings" else model.get_input_embeddings()
    theirs = LayerGradientXActivation(Probabilities(model), module).attribute(
        batch["input_ids"], target=target, additional_forward_args=extra
    )
    ours = explain_batch(model, batch, "grad" if layer == "embeddings" else "gxi")
    assert_close_to_scale(ours, theirs.sum(-1), 1e-6)
    assert not torch.equal(explain_batch(model, batch, "grad"), explain_batch(model, batch, "gxi"))


def test_deeplift_equals_captums_layer_deeplift():
    model, batch, target, extra = setting()
    theirs = LayerDeepLift(Probabilities(model), embeddings_module(model)).attribute(
        batch["input_ids"],
        baselines=torch.full_like(batch["input_ids"], PAD),
        target=target,
        additional_forward_args=extra,
    )
    assert_close_to_scale(explain_batch(model, batch, "deeplift"), theirs.sum(-1), 1e-6)


@pytest.mark.parametrize(("window", "stride"), [(1, 1), (3, 1), (2, 2)])
def test_occlusion_equals_captums_on_token_ids(window, stride):
    model, batch, target, extra = setting()
    theirs = Occlusion(Probabilities(model)).attribute(
        batch["input_ids"],
        sliding_window_shapes=(window,),
        strides=(stride,),
        baselines=removal(batch),
        target=target,
        additional_forward_args=extra,
    )
    theirs[:, [0, -1]] = 0  # [CLS] and [SEP] are never removed: they score 0
    choice = ExplainerChoice("occlusion", {"window": window, "stride": stride})
    assert_close_to_scale(explain_batch(model, batch, choice), theirs, 1e-6, PROBABILITY)


def test_ablation_equals_captums_feature_ablation_and_a_direct_removal():
    model, batch, target, extra = setting()
    theirs = FeatureAblation(Probabilities(model)).attribute(
        batch["input_ids"], baselines=removal(batch), target=target, additional_forward_args=extra
    )
    ours = explain_batch(model, batch, "ablation")
    assert_close_to_scale(ours, theirs, 1e-6, PROBABILITY)
    # the drop of the predicted class's probability when token 3 of text 0 alone is [PAD]
    probabilities = Probabilities(model)
    removed = batch["input_ids"].clone()
    removed[0, 3] = PAD
    with torch.no_grad():
        full = probabilities(batch["input_ids"][:1], *(e[:1] for e in extra))[0, target[0]]
        less = probabilities(removed[:1], *(e[:1] for e in extra))[0, target[0]]
    assert float(ours[0, 3]) == pytest.approx(
        float(full - less), rel=1e-5, abs=float32_floor(full, less)
    )


# ------------------------------------------------------------------ sampling explainers


def seeded(seed: int):
    torch.manual_seed(seed)
    np.random.seed(seed)


def test_gradientshap_equals_captum_under_the_same_seed():
    model, batch, target, _ = setting()
    settings = {"n_samples": 6, "stdevs": 0.2, "seed": 7}
    ours = explain_batch(model, batch, ExplainerChoice("gradshap", settings))
    for b in range(2):
        row = {k: v[b : b + 1] for k, v in batch.items()}
        with torch.no_grad():
            end = embed(model, row)
            start = embed(model, {**row, "input_ids": torch.full_like(row["input_ids"], PAD)})
        seeded(7)
        theirs = GradientShap(Probabilities(model, from_embeddings=True)).attribute(
            end,
            baselines=start,
            n_samples=6,
            stdevs=0.2,
            target=target[b : b + 1],
            additional_forward_args=(
                row["input_ids"],
                row["attention_mask"],
                row["token_type_ids"],
            ),
        )
        assert_close_to_scale(ours[b], theirs[0].sum(-1), 1e-6)
    other = explain_batch(model, batch, ExplainerChoice("gradshap", {**settings, "seed": 8}))
    assert not torch.allclose(ours, other)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lime", "kernelshap"])
def test_lime_and_kernelshap_equal_captum_under_the_same_seed(name):
    model, batch, target, extra = setting()
    ours = explain_batch(model, batch, ExplainerChoice(name, {"n_samples": 20, "seed": 3}))
    if name == "lime":
        captum = Lime(Probabilities(model), SkLearnRidge(alpha=1.0), similarity_func=text_kernel)
    else:
        captum = KernelShap(Probabilities(model))
    words = len(ROWS[0])
    features = torch.tensor([[words, *range(words), words]])  # [CLS]/[SEP]: one kept feature
    for b in range(2):
        seeded(3)
        theirs = captum.attribute(
            batch["input_ids"][b : b + 1],
            baselines=removal(batch)[b : b + 1],
            target=target[b : b + 1],
            additional_forward_args=tuple(e[b : b + 1] for e in extra),
            feature_mask=features,
            n_samples=20,
        )[0]
        theirs[[0, -1]] = 0
        assert_close_to_scale(ours[b], theirs, 1e-6, PROBABILITY)
    state = torch.random.get_rng_state()
    again = explain_batch(model, batch, ExplainerChoice(name, {"n_samples": 20, "seed": 3}))
    assert torch.equal(ours, again) and torch.equal(state, torch.random.get_rng_state())


# ------------------------------------------------------------------ invariances, families


@pytest.mark.parametrize("name", list(EXPLAINERS))
def test_a_text_scores_the_same_alone_or_in_a_padded_batch(name):
    model = tiny_model(num_labels=3)
    choice = ExplainerChoice(name, {"n_samples": 8} if "n_samples" in _fields(name) else None)
    batch = batch_of([[5, 9, 14, 20, 7], [30, 6, 12]])
    together = explain_batch(model, batch, choice)
    alone = explain_batch(model, batch_of([[30, 6, 12]]), choice)
    removals = PROBABILITY if name in ("occlusion", "ablation", "lime", "kernelshap") else ()
    atol = float32_floor(alone, *removals)
    torch.testing.assert_close(together[1, :5], alone[0], rtol=1e-4, atol=atol)
    assert together.shape == (2, 7) and (together[1, 5:] == 0).all()


def _fields(name: str) -> set[str]:
    from dataclasses import fields

    return {f.name for f in fields(EXPLAINERS[name].settings)}


@pytest.mark.parametrize("name", ["ablation", "occlusion", "kernelshap", "gxi"])
def test_a_family_without_token_types_is_explained(name):
    torch.manual_seed(0)
    config = DistilBertConfig(
        vocab_size=40, dim=16, n_layers=2, n_heads=2, hidden_dim=32, num_labels=2
    )
    model = Classifier.from_config(config).eval()
    batch = batch_of(ROWS)
    choice = ExplainerChoice(name, {"n_samples": 8} if name == "kernelshap" else None)
    scores = explain_batch(model, batch, choice)
    assert scores.shape == (2, 8) and scores.abs().sum() > 0


# ------------------------------------------------------------------ errors


def shared_relu_model():
    """A BERT whose layers share one ReLU module: Captum's DeepLift needs one per use."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        hidden_act="relu",
        num_labels=2,
    )
    model = Classifier.from_config(config).eval()
    relu = nn.ReLU()
    for layer in model.bert.encoder.layer:
        layer.intermediate.intermediate_act_fn = relu
    return model


def test_bad_input_is_a_one_line_error():
    model, batch, _, _ = setting()
    with pytest.raises(WorkbenchError, match="deeplift cannot explain this model") as error:
        explain_batch(shared_relu_model(), batch, "deeplift")
    assert "\n" not in str(error.value)
    with pytest.raises(WorkbenchError, match="window of 7 tokens is longer than a text of 6"):
        explain_batch(model, batch, ExplainerChoice("occlusion", {"window": 7}))
    for name in ("lime", "kernelshap", "gradshap"):
        with pytest.raises(WorkbenchError, match="--n-samples: 0 is not allowed"):
            ExplainerChoice(name, {"n_samples": 0})
    with pytest.raises(WorkbenchError, match="unknown explainer 'shap'"):
        ExplainerChoice("shap")
    with pytest.raises(WorkbenchError, match="no setting 'window'"):
        ExplainerChoice("lime", {"window": 2})
    with pytest.raises(WorkbenchError, match="--layer sets the ig and grad maps"):
        attribute_texts(
            model, _tokenizer(), ["good"], settings=AttributionSettings(layer=0), explainer="lime"
        )


# ------------------------------------------------------------------ words


def _tokenizer() -> BertTokenizerFast:
    pieces = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "play",
        "##ing",
        "the",
        "un",
        "##believ",
        "##able",
        "good",
        "movie",
    ]
    return BertTokenizerFast(vocab={token: i for i, token in enumerate(pieces)})


def test_words_aggregate_their_pieces_as_computed_by_hand():
    tokenizer = _tokenizer()
    encoding = tokenizer(["playing the unbelievable movie"], ["good"])
    assert encoding.tokens(0) == [
        "[CLS]",
        "play",
        "##ing",
        "the",
        "un",
        "##believ",
        "##able",
        "movie",
        "[SEP]",
        "good",
        "[SEP]",
    ]
    words, groups = word_groups(encoding, 0, ["playing the unbelievable movie", "good"], 11)
    assert words == ["[CLS]", "playing", "the", "unbelievable", "movie", "[SEP]", "good", "[SEP]"]
    scores = torch.tensor([[0.5, 1.0, -3.0, 2.0, 0.25, -1.0, 0.5, 4.0, 0.0, -2.0, 0.0]])
    assert to_words(scores, groups, "sum").tolist() == [[0.5, -2.0, 2.0, -0.25, 4.0, 0, -2.0, 0]]
    assert to_words(scores, groups, "mean")[0].tolist() == pytest.approx(
        [0.5, -1.0, 2.0, -0.25 / 3, 4.0, 0, -2.0, 0]
    )
    assert to_words(scores, groups, "max-abs").tolist() == [[0.5, 3.0, 2.0, 1.0, 4.0, 0, 2.0, 0]]


def test_attribute_texts_per_word_sums_the_sub_token_record():
    model, tokenizer = tiny_model(num_labels=3), _tokenizer()
    settings = AttributionSettings(views="pred")
    text = "playing the unbelievable movie"
    tokens = attribute_texts(model, tokenizer, [text], settings=settings, explainer="ablation")[0]
    words = attribute_texts(
        model, tokenizer, [text], settings=settings, explainer="ablation", words="sum"
    )[0]
    assert words.tokens == ["[CLS]", "playing", "the", "unbelievable", "movie", "[SEP]"]
    s = tokens.maps[0]
    expected = [s[0], s[1] + s[2], s[3], s[4] + s[5] + s[6], s[7], s[8]]
    assert words.maps[0] == pytest.approx(expected, abs=1e-7)
    assert words.settings["words"] == "sum" and tokens.settings["words"] == "tokens"
    assert words.settings["explainer"] == "ablation" and "steps" not in words.settings


def test_kdw_attribute_records_the_explainer_and_refuses_bad_settings_in_one_line(tmp_path, capsys):
    from kd.cli import main
    from tests.conftest import tiny_tokenizer
    from workbench.analysis.attribution import load_attributions

    folder = tmp_path / "classifier"
    tiny_tokenizer(folder)
    tiny_model(num_labels=3).save_pretrained(folder)
    out = tmp_path / "out"
    common = ["attribute", str(folder), "--out", str(out), "--text", "good movie", "--text", "bad"]
    assert main([*common, "--explainer", "occlusion", "--window", "2"]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("kdw: error: occlusion window of 2 tokens is longer than a text of 1")
    assert not out.exists()
    assert main([*common, "--explainer", "lime", "--window", "1"]) == 2
    assert "--window is a setting of occlusion" in capsys.readouterr().err
    assert main([*common, "--explainer", "occlusion", "--window", "1", "--words", "max-abs"]) == 0
    record = load_attributions(out / "classifier.jsonl")[0]
    assert record.settings["explainer"] == "occlusion" and record.settings["words"] == "max-abs"
    assert record.settings["explainer_settings"] == {"window": 1, "stride": 1}
    assert record.tokens == ["[CLS]", "good", "movie", "[SEP]"] and len(record.maps) == 3


def test_kdw_export_draws_words_and_records_the_explainer(tmp_path, capsys):
    import json
    import xml.etree.ElementTree as ET

    from kd.cli import main

    folder = tmp_path / "classifier"
    _tokenizer().save_pretrained(folder)
    tiny_model(num_labels=3).save_pretrained(folder)
    out = tmp_path / "out"
    text = "playing the unbelievable movie"
    options = ["--explainer", "ablation", "--words", "sum", "--formats", "svg"]
    assert main(["export", str(folder), "--out", str(out), "--text", text, *options]) == 0
    svg = ET.parse(out / "heatmap-000.svg").getroot()
    space = "{http://www.w3.org/2000/svg}"
    meta = json.loads(svg.find(f"{space}metadata").text)
    assert meta["settings.explainer"] == "ablation" and meta["settings.words"] == "sum"
    assert "settings.steps" not in meta  # ig's settings: not this explainer's
    drawn = [t.text for t in svg.iter(f"{space}text")]
    assert "unbelievable" in drawn and "##able" not in drawn
    assert (
        main(
            [
                "export",
                str(folder),
                "--out",
                str(out),
                "--text",
                text,
                "--steps",
                "3",
                "--explainer",
                "lime",
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.splitlines()[-1] == (
        "kdw: error: --steps is a setting of ig, not of lime"
    )
