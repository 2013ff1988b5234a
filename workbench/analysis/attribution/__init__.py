"""Token attribution for BERT-style classifiers (docs/methods.md §4–§6, docs/explainers.md): the
IG engine (:mod:`.gradients`), its Captum references (:mod:`.captum_backend`), the explainer
registry (:mod:`.registry`, :mod:`.explainers`) and attributions of texts (:mod:`.records`).

Names are imported when first used, so that the registry (no torch) loads alone for ``kdw``'s
parser.
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
    "settings": ("check_layer", "compute_maps"),
    "targets": ("view_names",),
    "registry": (
        "BASELINES",
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
