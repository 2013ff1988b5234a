"""Distillation: the methods (their pure loss functions importable from here), the objective,
the trainer, the CLI."""

from kd.methods.adkd import attribution_loss
from kd.methods.ckd import layer_relation_loss, word_relation_loss
from kd.methods.gkd import gradient_alignment_loss
from kd.methods.pkd import patient_loss
from kd.methods.vanilla import logit_kd_loss, task_loss

__all__ = [
    "attribution_loss",
    "gradient_alignment_loss",
    "layer_relation_loss",
    "logit_kd_loss",
    "patient_loss",
    "task_loss",
    "word_relation_loss",
]
