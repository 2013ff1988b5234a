"""Token attribution for BERT-style classifiers (docs/methods.md §4–§6).

- :func:`integrated_gradients`, :func:`attribution_map`, :func:`attribution_maps` — IG w.r.t. the
  embedding output (or an encoder layer's output), batched over steps and views, memory-bounded,
  differentiable with ``create_graph=True`` (the AD-KD student term);
- :func:`grad_saliency` (gradient × input) and :func:`input_gradients` (GKD's signal);
- :func:`captum_integrated_gradients`, :func:`captum_grad_saliency` — the same through Captum, for
  analysis (and as the tests' reference);
- :class:`AttributionConfig`, :func:`attribute_texts`, :func:`save_attributions`,
  :func:`load_attributions` — attribute a list of texts and keep the result.

Faithfulness (AOPC) is in :mod:`workbench.faithfulness`, agreement between two models in
:mod:`workbench.agreement`.
"""

from workbench.attribution.baselines import baseline_output, site_output
from workbench.attribution.captum_backend import captum_grad_saliency, captum_integrated_gradients
from workbench.attribution.gradients import (
    attribution_map,
    attribution_maps,
    grad_saliency,
    input_gradients,
    integrated_gradients,
)
from workbench.attribution.records import (
    AttributionRecord,
    attribute_texts,
    load_attributions,
    save_attributions,
)
from workbench.attribution.settings import METHODS, AttributionConfig, compute_maps
from workbench.attribution.targets import view_names
from workbench.config import BASELINES, VIEWS

__all__ = [
    "BASELINES",
    "METHODS",
    "VIEWS",
    "AttributionConfig",
    "AttributionRecord",
    "attribute_texts",
    "attribution_map",
    "attribution_maps",
    "baseline_output",
    "captum_grad_saliency",
    "captum_integrated_gradients",
    "compute_maps",
    "grad_saliency",
    "input_gradients",
    "integrated_gradients",
    "load_attributions",
    "save_attributions",
    "site_output",
    "view_names",
]
