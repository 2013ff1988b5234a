"""Attribution-Driven KD (Wu et al. 2023, AD-KD; docs/methods.md §4): the student's multi-view
attribution maps learn the teacher's, besides vanilla KD's two terms.

    a_i^c = ‖ IG_i(x, F_c) ‖₂ (student), ‖ TopK(|IG_i(x, F_c)|) ‖₂ (teacher)    (Eqs. 5–7)
    ã^c = a^c / ‖a^c‖₂ over the real tokens of the sequence, pads exactly 0        (Eq. 8)
    L_attr = mean_b ‖ Ã_t[b] − Ã_s[b] ‖₂, Ã concatenating the C views          (Eq. 9)
    L = (1 − α) CE + α KD + β L_attr                                             (Eq. 10)

The maps come from :mod:`workbench.analysis.attribution` (IG on the embeddings with [PAD] baselines,
top-K embedding dimensions); this module only chooses the views and the sites and compares:

- ``reduction="paper"`` (Eq. 9) as above;
- ``reduction="squared"``: Eq. 9 squared, ``mean_b ‖Ã_t[b] − Ã_s[b]‖₂²`` — linear in the views'
  squared distances, so a uniformly sampled view weighted by ``C`` estimates it without bias
  (view sampling, beyond the paper);
- ``reduction="official"`` (released code): ``Σ_c MSE_sum(ã_s^c, ã_t^c) / #real tokens`` — squared
  errors summed over views, tokens and the batch, divided by the number of real tokens. The
  preset's β grid (Table 5: 1, 10, 50, 100) was tuned on it, so the preset computes it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from kd.methods.objective import (
    TOKENS,
    WORDED,
    Ablation,
    Claim,
    Method,
    Objective,
    Preset,
    StepInputs,
    Sweep,
    TeacherField,
    Term,
    register_method,
    setting_parameter,
)
from workbench.analysis.attribution.registry import BASELINES
from workbench.core.config import (
    VIEWS,
    Checked,
    Views,
    ig_steps,
    option,
    positive,
    spell_views,
    views_option,
)
from workbench.core.errors import WorkbenchError
from workbench.core.lazy import lazy_module

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedModel

torch = lazy_module("torch")
attribution = lazy_module("workbench.analysis.attribution")
alignment = lazy_module("workbench.core.data.alignment")
geometry = lazy_module("workbench.analysis.relation_geometry")
models = lazy_module("workbench.core.models")


@dataclass
class ADKDSettings(Checked):
    """AD-KD: the teacher's and the student's attribution maps, and their distance."""

    attr_steps: int = option(1, "AD-KD integrated-gradients steps m", domain=ig_steps)
    attr_top_k: int | None = option(
        None,
        "AD-KD teacher map: keep the K largest |IG| dimensions per token (default: all)",
        domain=positive,
    )
    attr_baseline: str | None = option(
        None,
        "AD-KD IG baseline: pad, pad-keep-special, zero or mean-keep-first (default: pad, for "
        "teacher and student alike; official: zero)",
        choices=(None, *BASELINES),
    )
    attr_views: Views | None = views_option(
        None,
        "AD-KD views (default: all; official parity: gold for 2 classes): all "
        "(multi-view), pred (teacher's prediction), gold, class indices such as 0 or 0,2, "
        "or sample (one class per example and step, drawn uniformly, its squared distance "
        "weighted by the number of classes: an unbiased estimate of the multi-view squared "
        "loss at the cost of one view; beyond the paper)",
        (*VIEWS, "sample"),
    )
    attr_reduction: str | None = option(
        None,
        "AD-KD attribution distance: paper (Eq. 9, ‖Ã_t − Ã_s‖₂ per example), squared "
        "(its square), official (the authors' MSE(sum)/#real tokens, which the papers' β "
        "values belong to); default: the preset's (adkd: official)",
        choices=(None, "paper", "squared", "official"),
    )
    attr_layer: str = option(
        "input",
        "AD-KD attribution layer: input, first, penultimate, or uniform:M (M mapped "
        "layers from the input)",
    )


def attribution_loss(
    student_maps: Tensor,
    teacher_maps: Tensor,
    attention_mask: Tensor | None = None,
    *,
    reduction: Literal["paper", "squared", "official"] = "paper",
    examples: Tensor | None = None,
) -> Tensor:
    """Distance between normalised multi-view attribution maps (the module docstring's
    reductions; an all-pad example counts as 0, and ``"official"`` without a real token is 0).

    Args:
        student_maps: ``[B, C, L]`` student maps (differentiable), one row per view.
        teacher_maps: ``[B, C, L]`` teacher maps; used detached.
        attention_mask: ``[B, L]`` real-token mask; pads it marks are ignored whatever they
            hold. Optional except for ``"official"``, whose denominator is ``Σ mask``.
        examples: ``[B]`` bool, the examples that ``"paper"`` and ``"squared"`` average over
            (across tokenizers, those that share a word; each left out counts as 0 in the sum);
            ``None``: the mean over all ``B``.

    Raises:
        ValueError: on mismatched or non-``[B, C, L]`` shapes, a mask that is not ``[B, L]``,
            a missing mask for ``"official"``, or an unknown reduction.
    """
    if student_maps.dim() != 3 or student_maps.shape != teacher_maps.shape:
        raise ValueError(
            "maps must both be [B, C, L] with equal shapes, got student "
            f"{tuple(student_maps.shape)} and teacher {tuple(teacher_maps.shape)}"
        )
    if reduction not in ("paper", "squared", "official"):
        raise ValueError(f"reduction must be 'paper', 'squared' or 'official', got {reduction!r}")
    if attention_mask is None and reduction == "official":
        raise ValueError("reduction='official' needs attention_mask to count real tokens")
    batch, _, length = student_maps.shape
    mask = geometry.real_mask(attention_mask, batch, length, student_maps.device)
    diff = torch.where(mask[:, None, :], student_maps - teacher_maps.detach(), 0.0)
    if reduction == "official":
        return diff.pow(2).sum() / mask.sum().clamp_min(1)
    if reduction == "paper":
        # vector_norm's backward is 0 (not NaN) where the difference is exactly zero.
        per_example = torch.linalg.vector_norm(diff.flatten(1), dim=1)
    else:
        per_example = diff.pow(2).flatten(1).sum(1)
    if examples is None:
        return per_example.mean()
    return torch.where(examples, per_example, 0.0).sum() / examples.sum().clamp_min(1)


def attribution_layers(num_layers: int, which: str) -> list[int | None]:
    """Sites of the AD-KD layer ablation (Table 3) for an ``N``-layer model: ``"input"`` →
    ``[None]`` (the embedding output); ``"first"`` → ``[0]``; ``"penultimate"`` → ``[N − 2]``
    (the second-to-last layer's output; the last layer's output reaches the classifier through
    [CLS] only); ``"uniform:M"`` → ``M`` sites evenly spaced from the input:
    ``hidden_states[j·N/M]`` for ``j = 0..M−1`` (rounded), i.e. ``None`` then layer
    ``j·N/M − 1`` (6 layers, M = 3: input, 1, 3)."""
    if which in ("input", "first"):
        return [None] if which == "input" else [0]
    if which == "penultimate":
        if num_layers < 2:
            raise WorkbenchError("'penultimate' needs a model with at least 2 layers")
        return [num_layers - 2]
    if which.startswith("uniform:"):
        count = which.split(":", 1)[1]
        if not count.isdigit() or not 1 <= int(count) <= num_layers:
            raise WorkbenchError(f"{which!r}: use uniform:M with 1 <= M <= {num_layers}")
        m = int(count)
        return [None if j == 0 else round(j * num_layers / m) - 1 for j in range(m)]
    raise WorkbenchError(
        f"unknown attribution layers {which!r}: use input, first, penultimate or uniform:M"
    )


def attribution_views(
    settings: ADKDSettings,
    model: PreTrainedModel,
    batch: dict[str, Tensor],
    classes: Tensor | None,
    teacher: bool,
) -> tuple[Tensor, Tensor]:
    """AD-KD maps ``[B, S·V, L]`` — the views at each attribution site, concatenated — and the
    model's logits ``[B, C]`` from the first site's forward pass, under the resolved
    ``settings`` (:meth:`Objective.of`): the teacher's maps keep its top-K dimensions and carry
    no graph, the student's keep every dimension and carry one.

    ``classes``: with view ``pred``, the teacher's predicted class per example, so that student
    and teacher attribute the same class; with view ``sample``, the drawn class per example
    (the student's maps are then ``[B, S, L]``)."""
    views, labels = settings.attr_views, batch.get("labels")
    if views == "sample":  # the teacher's maps cover every class; the student's the drawn ones
        views, labels = ("all", labels) if classes is None else ("gold", classes)
    elif views == "pred" and classes is not None:
        views, labels = "gold", classes
    sites = attribution_layers(models.layer_count(model), settings.attr_layer)
    results = [
        attribution.attribution_maps(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            batch.get("token_type_ids"),
            views=views,
            labels=labels,
            steps=settings.attr_steps,
            baseline=settings.attr_baseline,
            top_k=settings.attr_top_k if teacher else None,
            create_graph=not teacher,
            layer=site,
            return_logits=True,
        )
        for site in sites
    ]
    return torch.cat([maps for maps, _ in results], dim=1), results[0][1]


def sampled_view_loss(
    student_maps: Tensor,
    teacher_maps: Tensor,
    classes: Tensor,
    attention_mask: Tensor,
    num_classes: int,
    reduction: str = "squared",
    examples: Tensor | None = None,
) -> Tensor:
    """View sampling (beyond the paper): each example attributes one class ``classes[b]``
    drawn uniformly; its squared distance is weighted by ``C`` so that the expectation over the
    draws equals the multi-view squared loss (``reduction`` ``"squared"``, or ``"official"``,
    also linear in the views' squared distances; never Eq. 9's unsquared norm).

    Args:
        student_maps: ``[B, S, L]`` the drawn class's map at each of ``S`` attribution sites.
        teacher_maps: ``[B, S·C, L]`` every class's map at each site (site-major).
        classes: ``[B]`` the drawn classes.
        attention_mask: ``[B, L]``.
        examples: ``[B]`` bool, the examples averaged over (:func:`attribution_loss`).
    """
    sites, length = student_maps.shape[1], student_maps.shape[2]
    index = torch.arange(sites, device=classes.device)[None, :] * num_classes + classes[:, None]
    chosen = teacher_maps.gather(1, index[..., None].expand(-1, -1, length))
    return num_classes * attribution_loss(
        student_maps, chosen, attention_mask, reduction=reduction, examples=examples
    )


def _map_settings(objective: Objective) -> dict:
    """The settings that change the maps (the teacher cache's key)."""
    c = objective.of(ADKDSettings)
    return {
        "steps": c.attr_steps,
        "top_k": c.attr_top_k,
        "baseline": c.attr_baseline,
        "views": c.attr_views,
        "layer": c.attr_layer,
    }


def _check_models(objective: Objective, c: ADKDSettings) -> None:
    """What the options ``c`` ask of the two models, checked before anything runs: sites both
    have, classes the task has, dimensions the teacher's embeddings have."""
    try:
        for layers in (objective.teacher_layers, objective.student_layers):
            attribution_layers(layers, c.attr_layer)
    except WorkbenchError as error:
        raise WorkbenchError(f"--attr-layer {c.attr_layer}: {error}") from None
    views = c.attr_views if isinstance(c.attr_views, tuple) else ()
    if outside := [v for v in views if v >= objective.num_labels]:
        raise WorkbenchError(
            f"--attr-views {spell_views(views)}: {outside[0]} is not a class of this task (its "
            f"classes are 0..{objective.num_labels - 1})"
        )
    width = objective.teacher_width
    if width is not None and c.attr_top_k is not None and c.attr_top_k > width:
        raise WorkbenchError(
            f"--attr-top-k {c.attr_top_k} exceeds the teacher's {width} embedding dimensions: "
            f"use 1..{width}, or leave it unset for all"
        )


def _resolve(objective: Objective) -> ADKDSettings:
    """Official parity: zero baselines, the authors' distance and, with two classes, the gold
    view (their code's); explicit options win."""
    c, official = objective.config.of(ADKDSettings), objective.config.parity == "official"
    _check_models(objective, c)
    return replace(
        c,
        attr_baseline=c.attr_baseline or ("zero" if official else "pad"),
        attr_views=c.attr_views or ("gold" if official and objective.num_labels == 2 else "all"),
        attr_reduction=c.attr_reduction or ("official" if official else "paper"),
    )


def _teacher_maps(objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    maps, _ = attribution_views(objective.of(ADKDSettings), teacher, batch, None, True)
    maps = maps.transpose(1, 2)  # [B, L, S·V]: per token
    if "word_ids" in batch:  # another tokenizer's student: per word, in the first W rows
        return alignment.pad_words(alignment.word_maps(maps, batch["word_ids"]), maps.shape[1])
    return maps


def _attr(objective: Objective, inputs: StepInputs) -> Tensor:
    settings = objective.of(ADKDSettings)
    teacher_maps = inputs.teacher["maps"].transpose(1, 2)
    mask = inputs.batch["attention_mask"]
    if settings.attr_views == "sample":
        classes = torch.randint(objective.num_labels, (mask.shape[0],), device=mask.device)
    else:
        classes = inputs.teacher["logits"].argmax(-1) if "logits" in inputs.teacher else None
    student_maps, logits = attribution_views(settings, inputs.model, inputs.batch, classes, False)
    inputs.share(logits)
    examples = None  # every example
    if "word_ids" in inputs.batch:  # another tokenizer's teacher: compared on shared words
        ids = inputs.batch["word_ids"]
        student_maps = alignment.word_maps(student_maps.transpose(1, 2), ids).transpose(1, 2)
        teacher_maps = teacher_maps[..., : student_maps.shape[-1]]
        mask = alignment.word_mask(ids)
        examples = mask.any(1)  # those that share a word
    if settings.attr_views == "sample":
        reduction = "official" if settings.attr_reduction == "official" else "squared"
        return sampled_view_loss(
            student_maps, teacher_maps, classes, mask, objective.num_labels, reduction, examples
        )
    return attribution_loss(
        student_maps, teacher_maps, mask, reduction=settings.attr_reduction, examples=examples
    )


register_method(
    "adkd",
    settings=ADKDSettings,
    teacher_fields={
        "maps": TeacherField(
            _teacher_maps,
            per_token=True,
            key=lambda o: {"maps": _map_settings(o)},
            gradients=True,
        )
    },
    terms={
        "attr": Term(
            _attr,
            teacher_fields=("maps",),
            runs_student=True,
            unit=lambda o: TOKENS if o.of(ADKDSettings).attr_reduction == "official" else WORDED,
            on_words="each view's token maps summed over the word's tokens, L2-normalised over "
            "the words",
            labels=lambda o: (
                "AD-KD's gold view maps the gold class (use --attr-views pred or all)"
                if o.of(ADKDSettings).attr_views == "gold"
                else ""
            ),
        )
    },
    method=Method(
        frozenset({"attr"}),
        _resolve,
        record=lambda o: {
            "attribution": {"reduction": o.of(ADKDSettings).attr_reduction, **_map_settings(o)}
        },
        describe=lambda r: (
            f"{r['attribution']['reduction']} distance" if "attribution" in r else ""
        ),
    ),
    parameters={
        "attr_top_k": setting_parameter(
            "AD-KD: K largest |IG| dimensions of the teacher's map",
            ADKDSettings,
            "attr_top_k",
            "attr",
            low=1,
        )
    },
    presets={
        # β = 1, the grid's lowest value: at β = 10 the attribution term held 68–93 % of the
        # gradient on the bundled tweets and the minority class fell to 30 % recall
        # (docs/results.md, "Choosing the AD-KD and GKD-CLS presets").
        "adkd": Preset(
            {"ce": 0.1, "kd": 0.9, "attr": 1.0},
            {"ce": 0.1, "kd": 0.9, "attr": 10.0},
            temperature=2.0,
            official_kd_form="soft-ce",
            defaults={"attr_reduction": "official"},
            own=("attr",),
            name="AD-KD",
            reference="Wu et al. 2023",
            # Table 5 / §4.1: β ∈ {1, 10, 50, 100}, α ∈ {0.8, 0.9, 1.0}, τ ∈ {1, 2, 3, 4}
            space={
                "beta": "1,10,50,100",
                "alpha": "0.8,0.9,1.0",
                "tau": "1,2,3,4",
                "lr": "5e-5,1e-4,2e-4",
            },
            beta="attr",
            tuned=("beta", "tau"),
            # the sweeps first: an interrupted suite then still has its figures
            ablations=(
                Sweep(  # of MiniLM's 384 dimensions
                    "K",
                    "adkd-k",
                    "attr_top_k",
                    "top_k_sweep",
                    (48, 96, 192),
                    "top-K dimensions of the teacher map",
                    unset="all dimensions",
                    quick=(96, 192),
                ),
                Sweep(
                    "m",
                    "adkd-m",
                    "attr_steps",
                    "steps_sweep",
                    (2, 4, 8),
                    "IG steps m",
                    quick=(2, 4),
                ),
                Ablation("w/o attr", "adkd-terms", weights={"attr": 0.0}),
                Ablation("w/o ce", "adkd-terms", weights={"ce": 0.0}),
                Ablation("w/o kd", "adkd-terms", weights={"kd": 0.0}),
                Ablation("view pred", "adkd-views", settings={"attr_views": "pred"}),
                Ablation("view gold", "adkd-views", settings={"attr_views": "gold"}),
                Ablation("view class 0", "adkd-views", settings={"attr_views": (0,)}),
                Ablation("view sampled", "adkd-views", settings={"attr_views": "sample"}),
                Ablation("layer first", "adkd-layer", settings={"attr_layer": "first"}),
                Ablation("layer penultimate", "adkd-layer", settings={"attr_layer": "penultimate"}),
            ),
            claims=(Claim("accuracy", ">"), Claim("attribution_gap", "lowest")),
            gallery=True,
        )
    },
)
