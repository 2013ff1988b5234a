"""Attribution engine on tiny random BERTs: values against Captum, direct formulas and finite
differences; shapes; invariances (batched = single, padding, chunking); the 2-class shortcut;
caches, saved records, faithfulness, agreement and errors on bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from captum.attr import LayerIntegratedGradients
from scipy.stats import pearsonr, spearmanr
from transformers import AutoModelForSequenceClassification, BertConfig, BertTokenizerFast

from kd.methods.students import set_embeddings_trainable
from tests.tolerances import assert_close_to_scale, float32_floor
from workbench.analysis.agreement import (
    attribution_gap,
    compare_models,
    pearson_per_example,
    rank_correlation,
    saliency_loyalty,
)
from workbench.analysis.attribution import (
    AttributionSettings,
    ExplainerChoice,
    attribute_texts,
    attribution_map,
    attribution_maps,
    captum_grad_saliency,
    captum_integrated_gradients,
    grad_saliency,
    ig_completeness,
    input_gradients,
    integrated_gradients,
    load_attributions,
    save_attributions,
)
from workbench.analysis.attribution.baselines import baseline_ids
from workbench.analysis.attribution.targets import as_batch
from workbench.analysis.faithfulness import aopc
from workbench.core.errors import WorkbenchError
from workbench.core.models import embed, embeddings_module, forward, output_replaced

PAD, UNK, CLS, SEP = 0, 1, 2, 3
WORDS = [f"w{i}" for i in range(95)]


def tiny(
    num_labels: int = 3, seed: int = 0, attention: str = "eager", dtype: torch.dtype = torch.float32
):
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=100,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=num_labels,
    )
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation=attention)
    return model.to(dtype).eval()


def make_batch(
    lengths: list[int], seed: int = 0, width: int | None = None, pair_at: int | None = None
) -> dict[str, torch.Tensor]:
    """[CLS] w… [SEP] rows of the given lengths, padded to ``width`` (default: the longest)."""
    generator = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    ids = torch.full((len(lengths), width), PAD)
    types = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(5, 100, (n,), generator=generator)
        ids[row, 0], ids[row, n - 1] = CLS, SEP
        if pair_at is not None and pair_at < n - 1:
            ids[row, pair_at] = SEP
            types[row, pair_at + 1 : n] = 1
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def inputs(batch):
    return batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]


def probability_gradient(model, batch, embedding, target):
    """∂ Σ_b p_target(b) / ∂E for the embedding output ``embedding`` (direct autograd)."""
    x = embedding.detach().requires_grad_()
    probabilities = forward(model, batch, embedding_output=x).logits.softmax(-1)
    chosen = probabilities.gather(1, torch.as_tensor(target).expand(len(x))[:, None])
    return torch.autograd.grad(chosen.sum(), x)[0]


# ------------------------------------------------------------------------- IG values


@pytest.mark.parametrize("baseline", ["pad", "pad-keep-special", "zero"])
@pytest.mark.parametrize("layer", [None, 0])
@pytest.mark.parametrize("steps", [2, 5])
def test_ig_equals_captum(baseline, layer, steps):
    model, batch = tiny(), make_batch([7, 5, 3], pair_at=3)
    target = torch.tensor([0, 1, 2])
    ours = integrated_gradients(
        model,
        *inputs(batch),
        target=target,
        steps=steps,
        baseline=baseline,
        layer=layer,
        max_batch_tokens=13,
    )
    theirs = captum_integrated_gradients(
        model, *inputs(batch), target=target, steps=steps, baseline=baseline, layer=layer
    )
    assert ours.shape == (3, 7, 16) and not ours.requires_grad
    assert_close_to_scale(ours, theirs)
    assert ours.abs().max() > 0


@pytest.mark.parametrize("baseline", ["pad", "pad-keep-special"])
def test_ig_completeness_is_captums_convergence_delta(baseline):
    """Σ IG − (F(E) − F(E')) is Captum's convergence delta, F(E) − F(E') the probabilities of
    the text and of its baseline ids through the model, and more steps close the gap."""
    model, batch = tiny(), make_batch([7, 5, 3], pair_at=3)
    target = torch.tensor([0, 1, 2])
    ids = baseline_ids(model, as_batch(*inputs(batch)), baseline)
    mask, types = batch["attention_mask"], batch["token_type_ids"]

    def scores(input_ids, attention_mask, token_type_ids):
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).logits
        return logits.softmax(-1)

    with torch.no_grad():
        end = scores(*inputs(batch)).gather(1, target[:, None])[:, 0]
        start = scores(ids, mask, types).gather(1, target[:, None])[:, 0]
    # F(E) − F(E') is a difference of nearly equal probabilities: it carries their rounding
    gaps = []
    for steps in (2, 50):
        attributed, ours = ig_completeness(
            model, *inputs(batch), target=target, steps=steps, baseline=baseline
        )
        _, delta = LayerIntegratedGradients(scores, embeddings_module(model)).attribute(
            batch["input_ids"],
            baselines=ids,
            additional_forward_args=(mask, types),
            target=target,
            n_steps=steps,
            method="riemann_right",
            return_convergence_delta=True,
        )
        assert_close_to_scale(ours, end - start, operands=(end, start))
        assert_close_to_scale(attributed - ours, delta, 1e-4, operands=(end, start))
        gaps.append((attributed - ours).abs().max())
    assert gaps[1] < gaps[0]


def test_one_step_ig_is_difference_times_gradient():
    model, batch = tiny(), make_batch([6, 4])
    embedding = embed(model, batch)
    pad_embedding = embeddings_module(model)(
        input_ids=torch.full_like(batch["input_ids"], PAD), token_type_ids=batch["token_type_ids"]
    )
    direct = (embedding - pad_embedding) * probability_gradient(model, batch, embedding, 1)
    ours = integrated_gradients(model, *inputs(batch), target=1, steps=1)
    assert_close_to_scale(ours, direct * batch["attention_mask"][..., None])


def test_special_tokens_kept_in_baseline():
    model, batch = tiny(), make_batch([6], pair_at=2)
    default = integrated_gradients(model, *inputs(batch), target=0, baseline="pad-keep-special")
    explicit = integrated_gradients(
        model, *inputs(batch), target=0, baseline="pad-keep-special", special_ids={CLS, SEP}
    )
    torch.testing.assert_close(default, explicit)
    # [CLS] and both [SEP] keep their own embedding in the baseline: (E − E') is 0 there
    assert default[0, [0, 2, 5]].abs().max() == 0 and default[0, [1, 3, 4]].abs().min() > 0


@pytest.mark.parametrize("baseline", ["pad", "zero"])
def test_create_graph_gradient_matches_finite_differences(baseline):
    # (the [PAD] row of the word embeddings gets no gradient by nn.Embedding's padding_idx rule)
    model, batch = tiny(dtype=torch.float64), make_batch([6, 4])
    weights = torch.rand(2, 3, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def loss() -> torch.Tensor:
        maps = attribution_maps(
            model, *inputs(batch), steps=2, baseline=baseline, create_graph=True
        )
        return (maps * weights).sum()

    parameters = [
        (model.bert.encoder.layer[0].attention.self.query.weight, (1, 2)),
        (model.bert.encoder.layer[1].output.dense.weight, (3, 5)),
        (model.bert.embeddings.word_embeddings.weight, (int(batch["input_ids"][0, 1]), 4)),
        (model.bert.embeddings.position_embeddings.weight, (2, 9)),
        (model.classifier.weight, (2, 7)),
    ]
    analytic = torch.autograd.grad(loss(), [p for p, _ in parameters])
    step = 1e-6
    for (parameter, index), gradient in zip(parameters, analytic, strict=True):
        with torch.no_grad():
            parameter[index] += step
            up = loss()
            parameter[index] -= 2 * step
            down = loss()
            parameter[index] += step
        numeric = (up - down) / (2 * step)
        assert gradient[index] == pytest.approx(float(numeric), rel=1e-5, abs=1e-9)


def test_sdpa_model_refuses_double_backward():
    model, batch = tiny(attention="sdpa"), make_batch([5])
    with pytest.raises(WorkbenchError, match="eager"):
        attribution_maps(model, *inputs(batch), create_graph=True)
    with pytest.raises(WorkbenchError, match="eager"):
        input_gradients(model, batch, create_graph=True)
    assert attribution_maps(model, *inputs(batch)).shape == (1, 3, 5)


def test_regression_model_attributes_its_output():
    model, batch = tiny(num_labels=1), make_batch([6, 4])
    ours = integrated_gradients(model, *inputs(batch), target=0, steps=3)
    theirs = captum_integrated_gradients(model, *inputs(batch), target=0, steps=3)
    assert_close_to_scale(ours, theirs)
    ignored = integrated_gradients(model, *inputs(batch), target=5, steps=3)
    torch.testing.assert_close(ignored, ours)
    maps = attribution_maps(model, *inputs(batch), views="all")
    assert maps.shape == (2, 1, 6)


# ---------------------------------------------------------------------- invariances


@pytest.mark.parametrize("layer", [None, 1])
def test_map_is_the_same_alone_or_in_a_padded_batch(layer):
    model = tiny()
    batch = make_batch([9, 4, 6, 2, 7], width=12)
    together = attribution_maps(model, *inputs(batch), steps=3, layer=layer, max_batch_tokens=40)
    for row, n in enumerate([9, 4, 6, 2, 7]):
        alone = {k: v[row : row + 1, :n] for k, v in batch.items()}
        single = attribution_maps(model, *inputs(alone), steps=3, layer=layer)
        torch.testing.assert_close(together[row : row + 1, :, :n], single, atol=1e-5, rtol=0)
        assert (together[row, :, n:] == 0).all()


def test_chunking_does_not_change_ig():
    model, batch = tiny(), make_batch([8, 5, 3])
    whole = integrated_gradients(
        model, *inputs(batch), target="pred", steps=4, max_batch_tokens=10**6
    )
    for limit in (1, 17, 50):
        chunked = integrated_gradients(
            model, *inputs(batch), target="pred", steps=4, max_batch_tokens=limit
        )
        torch.testing.assert_close(chunked, whole, atol=1e-7, rtol=1e-5)
    tight = integrated_gradients(model, *inputs(batch), target="pred", steps=4, memory_mib=0.01)
    torch.testing.assert_close(tight, whole, atol=1e-7, rtol=1e-5)


def test_all_views_equal_one_class_at_a_time():
    model, batch = tiny(), make_batch([7, 5, 6])
    options = {"steps": 3, "top_k": 5}
    together = attribution_maps(model, *inputs(batch), views="all", **options)
    for c in range(3):
        alone = attribution_maps(model, *inputs(batch), views=c, **options)
        torch.testing.assert_close(together[:, c : c + 1], alone, atol=1e-6, rtol=1e-5)
    predicted = forward(model, batch).logits.argmax(-1)
    pred = attribution_maps(model, *inputs(batch), views="pred", **options)
    torch.testing.assert_close(pred[:, 0], together[torch.arange(3), predicted])
    gold = attribution_maps(
        model, *inputs(batch), views="gold", labels=torch.tensor([2, 0, 1]), **options
    )
    torch.testing.assert_close(gold[:, 0], together[torch.arange(3), torch.tensor([2, 0, 1])])
    listed = attribution_maps(model, *inputs(batch), views=[2, 0], **options)
    torch.testing.assert_close(listed, together[:, [2, 0]])


def test_two_class_shortcut_equals_full_computation():
    model, batch = tiny(num_labels=2), make_batch([7, 5])
    shortcut = attribution_maps(model, *inputs(batch), views="all", steps=3, top_k=4)
    full = torch.cat(
        [attribution_maps(model, *inputs(batch), views=c, steps=3, top_k=4) for c in (0, 1)], dim=1
    )
    assert shortcut.shape == (2, 2, 7)
    torch.testing.assert_close(shortcut, full, atol=1e-6, rtol=1e-5)
    ig0 = integrated_gradients(model, *inputs(batch), target=0, steps=3)
    ig1 = integrated_gradients(model, *inputs(batch), target=1, steps=3)
    torch.testing.assert_close(ig1, -ig0, atol=float32_floor(ig0), rtol=1e-5)


# ------------------------------------------------------------------------------ maps


def test_attribution_map_top_k_norm_and_padding():
    ig = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    maps = attribution_map(ig, mask, top_k=2)
    expected = ig.abs().sort(-1, descending=True).values[..., :2].norm(dim=-1) * mask
    expected = expected / expected.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(maps, expected)
    assert maps.norm(dim=-1).sub(1).abs().max() < 1e-6 and maps[mask == 0].abs().max() == 0
    torch.testing.assert_close(attribution_map(ig, mask, top_k=6), attribution_map(ig, mask))


def test_all_zero_map_stays_zero_with_finite_gradient():
    ig = torch.zeros(1, 3, 4, requires_grad=True)
    maps = attribution_map(ig, torch.ones(1, 3, dtype=torch.long))
    assert maps.abs().max() == 0
    (gradient,) = torch.autograd.grad(maps.sum(), ig)
    assert torch.isfinite(gradient).all()


# ----------------------------------------------------------------- gradient methods


def test_grad_saliency_is_gradient_times_input_and_matches_captum():
    model, batch = tiny(), make_batch([7, 4, 5])
    predicted = forward(model, batch).logits.argmax(-1)
    embedding = embed(model, batch)
    direct = (
        torch.stack(
            [
                (
                    embedding[b]
                    * probability_gradient(model, batch, embedding, int(predicted[b]))[b]
                ).sum(-1)
                for b in range(3)
            ]
        )
        * batch["attention_mask"]
    )
    ours = grad_saliency(model, *inputs(batch), target="pred")
    assert ours.shape == (3, 7)
    assert_close_to_scale(ours, direct)
    assert_close_to_scale(ours, captum_grad_saliency(model, *inputs(batch), target="pred"))


def test_input_gradients_are_those_of_the_summed_max_probability():
    model, batch = tiny(), make_batch([6, 3])
    embedding = embed(model, batch).detach().requires_grad_()
    probabilities = forward(model, batch, embedding_output=embedding).logits.softmax(-1)
    (direct,) = torch.autograd.grad(probabilities.max(-1).values.sum(), embedding)
    ours = input_gradients(model, batch)
    assert_close_to_scale(ours, direct * batch["attention_mask"][..., None])
    set_embeddings_trainable(model, False)
    trained = input_gradients(model, batch, create_graph=True)
    assert trained.requires_grad
    (gradient,) = torch.autograd.grad(trained.pow(2).sum(), model.classifier.weight)
    assert gradient.abs().max() > 0


def test_output_replacement_keeps_the_rest_of_a_tuple():
    class Pair(torch.nn.Module):
        def forward(self, x):
            return x + 1, "extra"

    module, replacement = Pair(), torch.zeros(2)
    with output_replaced(module, replacement):
        assert module(torch.ones(2)) == (replacement, "extra")
    assert module(torch.ones(2))[0].tolist() == [2.0, 2.0]


def test_attribution_layers():
    from kd.methods.adkd import attribution_layers

    assert attribution_layers(6, "input") == [None]
    assert attribution_layers(6, "first") == [0]
    assert attribution_layers(6, "penultimate") == [4]
    assert attribution_layers(6, "uniform:3") == [None, 1, 3]
    assert attribution_layers(12, "uniform:6") == [None, 1, 3, 5, 7, 9]
    for bad in ("uniform:0", "uniform:7", "uniform:x", "middle"):
        with pytest.raises(WorkbenchError):
            attribution_layers(6, bad)


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"steps": 0}, "steps"),
        ({"steps": 1.5}, "steps"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 17}, "top_k"),
        ({"baseline": "mask"}, "baseline"),
        ({"views": "best"}, "views"),
        ({"views": 3}, "outside"),
        ({"views": "gold"}, "labels"),
        ({"views": "gold", "labels": torch.tensor([0, 5])}, "outside"),
        ({"layer": 2}, "layer"),
        ({"max_batch_tokens": 0}, "max_batch_tokens"),
    ],
)
def test_bad_map_settings_raise(options, message):
    model, batch = tiny(), make_batch([5, 4])
    with pytest.raises(WorkbenchError, match=message):
        attribution_maps(model, *inputs(batch), **options)


@pytest.mark.parametrize("target", [3, -1, torch.tensor([0, 1, 2]), "worst"])
def test_bad_targets_raise(target):
    model, batch = tiny(), make_batch([5, 4])
    with pytest.raises(WorkbenchError, match="target"):
        integrated_gradients(model, *inputs(batch), target=target)


def test_captum_needs_two_steps():
    model, batch = tiny(), make_batch([5])
    with pytest.raises(WorkbenchError, match="steps >= 2"):
        captum_integrated_gradients(model, *inputs(batch), target=0, steps=1)


def test_config_validates_its_fields():
    assert AttributionSettings(views=[0, 2]).views == (0, 2)  # a list of class indices, as a tuple
    for bad in (
        {"views": "most"},
        {"views": "0,2"},  # the command line's text, not the API's value
        {"views": ()},
        {"views": (-1,)},
        {"layer": -1},
    ):
        with pytest.raises(WorkbenchError):
            AttributionSettings(**bad)
    for bad in ({"steps": 0}, {"baseline": "noise"}, {"top_k": 0}):
        with pytest.raises(WorkbenchError):
            ExplainerChoice("ig", bad)
    for gone in ("method", "steps", "baseline", "top_k"):  # the explainer's, and only there
        with pytest.raises(TypeError):
            AttributionSettings(**{gone: None})


# --------------------------------------------------------------- texts and records


@pytest.fixture
def tokenizer() -> BertTokenizerFast:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    return BertTokenizerFast(vocab={token: i for i, token in enumerate(tokens)})


def test_attribute_texts_save_and_load(tokenizer, tmp_path: Path):
    model = tiny()
    texts = ["w1 w2 w3", "w4 " * 40, "w9 w8"]
    settings = AttributionSettings(max_length=16, batch_size=2)
    two = ExplainerChoice("ig", {"steps": 2})
    records = attribute_texts(
        model, tokenizer, texts, settings=settings, labels=[0, 1, 2], explainer=two
    )
    assert [r.truncated for r in records] == [False, True, False]
    assert records[1].warnings and len(records[1].tokens) == 16
    assert records[0].tokens == ["[CLS]", "w1", "w2", "w3", "[SEP]"]
    assert records[0].views == ["LABEL_0", "LABEL_1", "LABEL_2"]
    assert math.isclose(sum(records[2].probabilities), 1, rel_tol=1e-6)
    batch = {k: torch.tensor([v]) for k, v in tokenizer("w1 w2 w3").items()}
    expected = attribution_maps(model, *inputs(batch), steps=2, special_ids={CLS, SEP})
    torch.testing.assert_close(torch.tensor(records[0].maps), expected[0], atol=1e-6, rtol=0)
    path = save_attributions(records, tmp_path / "out" / "maps.jsonl")
    assert load_attributions(path) == records
    pairs = attribute_texts(
        model,
        tokenizer,
        ["w1 w2"],
        ["w3"],
        settings=AttributionSettings(views="pred"),
        explainer="grad",
    )
    assert pairs[0].tokens == ["[CLS]", "w1", "w2", "[SEP]", "w3", "[SEP]"]
    assert pairs[0].views == ["pred"] and pairs[0].settings["explainer"] == "grad"
    assert records[0].settings["explainer_settings"] == {
        "steps": 2,
        "baseline": "pad",
        "top_k": None,
    }
    assert not {"method", "steps", "baseline", "top_k"} & set(records[0].settings)


def test_attribute_texts_rejects_bad_input(tokenizer, tmp_path: Path):
    model = tiny()
    with pytest.raises(WorkbenchError, match="empty"):
        attribute_texts(model, tokenizer, ["w1", "  "])
    with pytest.raises(WorkbenchError, match="labels"):
        attribute_texts(model, tokenizer, ["w1"], settings=AttributionSettings(views="gold"))
    (tmp_path / "bad.jsonl").write_text('{"text": 1}\n')
    with pytest.raises(WorkbenchError, match="line 1"):
        load_attributions(tmp_path / "bad.jsonl")


# ------------------------------------------------------- faithfulness and agreement


def test_aopc_matches_a_direct_computation():
    model, batch = tiny(), make_batch([8, 5])
    scores = torch.rand(2, 8, generator=torch.Generator().manual_seed(2))
    result = aopc(model, *inputs(batch), scores=scores, fractions=(0.2, 0.5))
    predicted = forward(model, batch).logits.argmax(-1)

    def probability(ids: list[int], row: int) -> float:
        single = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids))}
        with torch.no_grad():
            return float(forward(model, single).logits.softmax(-1)[0, predicted[row]])

    for row, n in enumerate([8, 5]):
        ids = batch["input_ids"][row, :n].tolist()
        ranked = sorted(range(1, n - 1), key=lambda i: -float(scores[row, i]))
        full = probability(ids, row)
        drops = []
        for q in (0.2, 0.5):
            top = set(ranked[: math.ceil(q * (n - 2))])
            without = [t for i, t in enumerate(ids) if i not in top]
            only = [t for i, t in enumerate(ids) if i in top or i in (0, n - 1)]
            drops.append((full - probability(without, row), full - probability(only, row)))
        assert result.comprehensiveness[row] == pytest.approx(
            sum(d[0] for d in drops) / 2, abs=1e-6
        )
        assert result.sufficiency[row] == pytest.approx(sum(d[1] for d in drops) / 2, abs=1e-6)
    padded = aopc(model, *inputs(batch), scores=scores, removal="pad")
    assert padded.comprehensiveness_drops.shape == (2, 5)
    with pytest.raises(WorkbenchError, match="removal"):
        aopc(model, *inputs(batch), scores=scores, removal="blur")


def test_agreement_metrics_against_scipy():
    generator = torch.Generator().manual_seed(5)
    a, b = torch.rand(3, 2, 6, generator=generator), torch.rand(3, 2, 6, generator=generator)
    mask = make_batch([6, 4, 5])["attention_mask"]
    pearson, spearman = pearson_per_example(a, b, mask), rank_correlation(a, b, mask)
    for row, n in enumerate([6, 4, 5]):
        for view in range(2):
            x, y = a[row, view, :n].numpy(), b[row, view, :n].numpy()
            assert pearson[row, view] == pytest.approx(pearsonr(x, y).statistic, abs=1e-6)
            assert spearman[row, view] == pytest.approx(spearmanr(x, y).statistic, abs=1e-6)
    gap = attribution_gap(a, b, mask)
    direct = ((a - b) * mask[:, None]).flatten(1).norm(dim=1)
    torch.testing.assert_close(gap, direct)
    constant = torch.ones(3, 6)
    assert pearson_per_example(constant, a[:, 0], mask).isnan().all()


def test_a_model_agrees_with_itself():
    model, other, batch = tiny(), tiny(seed=1), make_batch([7, 5, 6])
    loyalty = saliency_loyalty(model, model, batch)
    torch.testing.assert_close(loyalty, torch.ones(3))
    same = compare_models(model, model, batch)
    assert same["saliency_loyalty"] == pytest.approx(100)
    assert same["attribution_gap"] == pytest.approx(0, abs=1e-7)
    assert same["spearman"] == pytest.approx(1)
    different = compare_models(model, other, batch)
    assert different["attribution_gap"] > 0 and different["saliency_loyalty"] < 100
