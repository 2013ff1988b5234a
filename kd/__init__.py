"""Distillation, one subpackage per layer: the methods and the objective (:mod:`kd.methods`; their
pure loss functions importable from here), training (:mod:`kd.training`), experiments over many
trainings (:mod:`kd.experiments`) and the command line (:mod:`kd.cli`).

The loss functions are imported when first asked for, so that importing the package (as
``kdw --help`` does) loads neither torch nor transformers."""

from __future__ import annotations

from workbench.core.lazy import lazy_names

_LOSSES = {
    "attribution_loss": "kd.methods.adkd",
    "gradient_alignment_loss": "kd.methods.gkd",
    "layer_relation_loss": "kd.methods.ckd",
    "logit_kd_loss": "kd.methods.vanilla",
    "patient_loss": "kd.methods.pkd",
    "task_loss": "kd.methods.vanilla",
    "word_relation_loss": "kd.methods.ckd",
}
__all__ = sorted(_LOSSES)

__getattr__ = lazy_names(__name__, _LOSSES)
