"""The explainer registry: every way the workbench scores tokens, each added by :func:`register`
(docs/explainers.md). This module imports no torch, so that ``kdw``'s parser takes its
``--explainer`` choices, help and options from here; the functions
(:mod:`workbench.analysis.attribution.explainers`: ``(model, batch, targets [B], settings,
special [B, L] bool) -> scores [B, L]``) are imported when an explainer first runs. The settings
of an attribution whatever its explainer (:class:`AttributionSettings`) are here too.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from workbench.core.config import (
    VIEWS,
    Checked,
    Views,
    at_least,
    between,
    ig_steps,
    non_negative_int,
    non_negative_number,
    option,
    positive,
    positive_number,
    seed_range,
    to_dict,
    views_option,
)
from workbench.core.errors import WorkbenchError

__all__ = [
    "BASELINES",
    "EXPLAINERS",
    "WORD_AGGREGATIONS",
    "AttributionSettings",
    "Explainer",
    "ExplainerChoice",
    "get_explainer",
    "register",
]

MAX_WINDOW = 64  # the longest occlusion window and stride
# how sub-token scores become a word's (workbench.analysis.attribution.words); None: sub-tokens
WORD_AGGREGATIONS = ("sum", "mean", "max-abs")
SAMPLES_HELP = "samples per text (GradientShap: random points; LIME, KernelSHAP: masked copies)"


# --------------------------------------------------------------------------- settings


BASELINES = ("pad", "pad-keep-special", "zero", "mean-keep-first")
DECODER_BASELINE = "mean-keep-first"  # the default of a decoder classifier (its head reads the
# last token); every other classifier's is "pad"
BASELINE_HELP = (
    "IG baseline: pad (embedding output of an all-[PAD] sequence), pad-keep-special "
    "([CLS]/[SEP] kept), zero (the AD-KD authors' code), mean-keep-first (each text's first "
    "token kept, the mean word embedding elsewhere: a decoder's attention sink stays where it "
    "is, so its path is smooth; the first token gets no attribution); default: mean-keep-first "
    "for a decoder classifier, pad otherwise"
)


def check_steps(steps: int) -> None:
    if not ig_steps.accepts(steps):
        raise WorkbenchError(f"steps: {steps!r} is not allowed (expected {ig_steps.expected})")


def check_baseline(baseline: str) -> None:
    if baseline not in BASELINES:
        raise WorkbenchError(f"unknown baseline {baseline!r}: use one of {', '.join(BASELINES)}")


@dataclass
class AttributionSettings(Checked):
    """Which classes are attributed, at which layer, in what batches, whatever the explainer.

    The map itself and its settings are the explainer's (:class:`ExplainerChoice`)."""

    views: Views = views_option(
        "all",
        "classes attributed: all, pred, gold (needs labels), or class indices such as 0,2",
        VIEWS,
    )
    layer: int | None = option(
        None,
        "attribute w.r.t. this encoder layer's output (0-based; None: embedding output; the ig "
        "and grad explainers only)",
        domain=non_negative_int,
    )
    max_length: int = option(
        128, "maximum tokens per text; longer texts are truncated (flagged)", domain=at_least(4)
    )
    batch_size: int = option(
        16, "texts per batch (padded per batch to its longest text)", domain=positive
    )
    memory_mib: float = option(
        1024.0,
        "memory budget for one chunk of the step × example batch, in MiB (estimated)",
        domain=positive_number,
    )


@dataclass
class NoSettings(Checked):
    """This explainer has no settings."""


@dataclass
class IGSettings(Checked):
    """Integrated Gradients: path steps, baseline, top-K dimensions (the workbench's engine)."""

    steps: int = option(
        50,
        "IG interpolation steps m (right Riemann sum; 1 = (E − E')⊙∇F(E), AD-KD's training "
        "signal); 50, Captum's default, keeps the completeness gap under 5 percent on the demo's "
        "teacher (docs/results.md)",
        domain=ig_steps,
    )
    baseline: str | None = option(None, BASELINE_HELP, choices=(None, *BASELINES))
    top_k: int | None = option(
        None,
        "keep the K largest |IG| dimensions per token before the norm (None: all)",
        domain=positive,
    )


@dataclass
class DeepLiftSettings(Checked):
    """DeepLift: the reference input."""

    baseline: str = option(
        "pad",
        "reference: pad (an all-[PAD] text) or pad-keep-special ([CLS]/[SEP] kept)",
        choices=("pad", "pad-keep-special"),
    )


@dataclass
class GradientShapSettings(Checked):
    """GradientShap: the baseline, samples, input noise and seed."""

    baseline: str = option(
        "pad",
        "baseline: pad, pad-keep-special, zero or mean-keep-first (embedding output)",
        choices=BASELINES,
    )
    n_samples: int = option(20, SAMPLES_HELP, domain=positive)
    stdevs: float = option(
        0.1,
        "standard deviation of the Gaussian noise added to the input embeddings",
        domain=non_negative_number,
    )
    seed: int = option(0, "seed of the random draws (torch and NumPy)", domain=seed_range)


@dataclass
class OcclusionSettings(Checked):
    """Occlusion: the sliding window of tokens and its stride."""

    window: int = option(3, "tokens replaced by [PAD] at once", domain=between(1, MAX_WINDOW))
    stride: int = option(1, "tokens the window moves each step", domain=between(1, MAX_WINDOW))


@dataclass
class SamplingSettings(Checked):
    """LIME / KernelSHAP: how many masked copies of each text, and their seed."""

    n_samples: int = option(200, SAMPLES_HELP, domain=positive)
    seed: int = option(0, "seed of the random draws (torch)", domain=seed_range)


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Explainer:
    """One explainer: its name (the CLI's ``--explainer`` value), a title, a one-line
    description, its settings dataclass, its function (a callable, or ``"module:name"``
    imported when first run) and whether it attributes at an encoder layer's output as well
    as the embeddings' (``AttributionSettings.layer``)."""

    name: str
    title: str
    description: str
    settings: type
    function: Callable[..., Any] | str
    layered: bool = False

    @property
    def explain(self) -> Callable[..., Any]:
        """The function ``(model, batch, targets, settings, special) -> [B, L]``."""
        if callable(self.function):
            return self.function
        module, _, name = self.function.partition(":")
        return getattr(importlib.import_module(module), name)


EXPLAINERS: dict[str, Explainer] = {}


def register(explainer: Explainer) -> Explainer:
    """Add ``explainer`` to :data:`EXPLAINERS` (a name registered twice is an error)."""
    if explainer.name in EXPLAINERS:
        raise ValueError(f"explainer {explainer.name!r} is registered twice")
    EXPLAINERS[explainer.name] = explainer
    return explainer


def get_explainer(name: str) -> Explainer:
    """The registered explainer ``name``; an unknown name is a one-line error."""
    if name not in EXPLAINERS:
        raise WorkbenchError(f"unknown explainer {name!r}: use one of {', '.join(EXPLAINERS)}")
    return EXPLAINERS[name]


@dataclass(frozen=True)
class ExplainerChoice:
    """An explainer and its settings: a dict of them or the settings dataclass (default: the
    explainer's defaults), checked when built."""

    name: str = "ig"
    settings: Any = field(default=None)

    def __post_init__(self) -> None:
        cls = get_explainer(self.name).settings
        values = self.settings
        if values is None:
            values = cls()
        elif isinstance(values, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(values) - known)
            if unknown:
                raise WorkbenchError(
                    f"explainer {self.name} has no setting {unknown[0]!r} (its settings: "
                    f"{', '.join(sorted(known)) or 'none'})"
                )
            values = cls(**values)
        elif not (is_dataclass(values) and isinstance(values, cls)):
            raise WorkbenchError(f"explainer {self.name} takes {cls.__name__} settings")
        object.__setattr__(self, "settings", values)

    @property
    def explainer(self) -> Explainer:
        return get_explainer(self.name)

    def record(self) -> dict:
        """What an output records: ``{"explainer": name, "explainer_settings": {...}}``."""
        return {"explainer": self.name, "explainer_settings": to_dict(self.settings)}

    def describe(self) -> str:
        """Its title and settings, for a caption: ``"Occlusion (window 3, stride 1)"``."""
        values = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in to_dict(self.settings).items())
        return f"{self.explainer.title} ({values})" if values else self.explainer.title


# --------------------------------------------------------------------------- registrations

FUNCTIONS = "workbench.analysis.attribution.explainers"
for name, title, description, settings, layered in (
    (
        "ig",
        "Integrated Gradients",
        "Integrated Gradients on the embedding output, the workbench's own map: "
        "‖TopK(|IG|)‖₂ per token, unit norm (non-negative)",
        IGSettings,
        True,
    ),
    (
        "grad",
        "Grad saliency",
        "Grad saliency: Σ_d E ⊙ ∂p/∂E on the embedding output (signed)",
        NoSettings,
        True,
    ),
    (
        "gxi",
        "Gradient × Input",
        "Gradient × Input on the word embeddings (before positions and LayerNorm), Σ_d (signed)",
        NoSettings,
        False,
    ),
    (
        "deeplift",
        "DeepLift",
        "Captum's LayerDeepLift on the embedding output against a [PAD] reference, Σ_d "
        "(signed; GELU, LayerNorm and attention's softmax get plain gradients, not DeepLift's "
        "rules)",
        DeepLiftSettings,
        False,
    ),
    (
        "gradshap",
        "GradientShap",
        "GradientShap on the embedding output: random points between a [PAD] baseline and the "
        "noised input, Σ_d (signed)",
        GradientShapSettings,
        False,
    ),
    (
        "occlusion",
        "Occlusion",
        "sliding windows of tokens replaced by [PAD]: the drop of the class probability, "
        "averaged over the windows covering a token (signed)",
        OcclusionSettings,
        False,
    ),
    (
        "lime",
        "LIME",
        "LIME: a ridge model of the class probability over random token masks (removed: [PAD])",
        SamplingSettings,
        False,
    ),
    (
        "kernelshap",
        "KernelSHAP",
        "KernelSHAP: Shapley values estimated over random token masks (removed: [PAD])",
        SamplingSettings,
        False,
    ),
    (
        "ablation",
        "Feature Ablation",
        "each token alone replaced by [PAD]: the drop of the class probability (signed)",
        NoSettings,
        False,
    ),
):
    register(Explainer(name, title, description, settings, f"{FUNCTIONS}:{name}", layered))
del name, title, description, settings, layered
