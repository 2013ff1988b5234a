"""Token attribution for BERT-style classifiers (docs/methods.md §4–§6, docs/explainers.md).

- :func:`integrated_gradients`, :func:`attribution_map`, :func:`attribution_maps` — IG w.r.t. the
  embedding output (or an encoder layer's output), batched over steps and views, memory-bounded,
  differentiable with ``create_graph=True`` (the AD-KD student term); :func:`ig_completeness`
  — how far IG's attributions add up to the change of the score they explain;
- :func:`grad_saliency` (gradient × input) and :func:`input_gradients` (GKD's signal);
- :func:`captum_integrated_gradients`, :func:`captum_grad_saliency` — the same through Captum, for
  analysis (and as the tests' reference);
- the explainer registry (:data:`EXPLAINERS`, :func:`register`, :class:`ExplainerChoice`) and
  :func:`explain_batch`: IG, Grad, Gradient × Input, DeepLift, GradientShap, Occlusion, LIME,
  KernelSHAP and Feature Ablation, one score per token;
- :class:`AttributionSettings`, :func:`attribute_texts`, :func:`save_attributions`,
  :func:`load_attributions` — attribute a list of texts (per token or per word) and keep the
  result.

Names are imported when first used, so that the registry (:mod:`.registry`, no torch) loads
alone for ``kdw``'s parser. Faithfulness (AOPC) is in :mod:`workbench.analysis.faithfulness`,
agreement between two models in :mod:`workbench.analysis.agreement`.
"""

from __future__ import annotations

from workbench.core.lazy import lazy_names

_NAMES = {
    "baselines": ("baseline_output", "site_output"),
    "captum_backend": ("captum_grad_saliency", "captum_integrated_gradients"),
    "gradients": (
        "attribution_map",
        "attribution_maps",
        "COMPLETENESS_LIMIT",
        "completeness_warning",
        "grad_saliency",
        "ig_completeness",
        "input_gradients",
        "integrated_gradients",
    ),
    "records": ("AttributionRecord", "attribute_texts", "load_attributions", "save_attributions"),
    "settings": ("compute_maps", "resolve_explainer"),
    "targets": ("view_names",),
    "registry": (
        "BASELINES",
        "METHODS",
        "AttributionSettings",
        "EXPLAINERS",
        "Explainer",
        "ExplainerChoice",
        "get_explainer",
        "register",
    ),
    "explainers": ("explain_batch",),
    "words": ("WORD_AGGREGATIONS", "word_groups", "to_words"),
}
_MODULES = {name: f"{__name__}.{module}" for module, names in _NAMES.items() for name in names} | {
    name: "workbench.core.config" for name in ("VIEWS",)
}

__all__ = sorted(_MODULES)
__getattr__ = lazy_names(__name__, _MODULES)
