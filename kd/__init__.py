"""Distillation: pure loss terms (importable from here), the objective, the trainer, the CLI."""

from kd.terms.attribution import attribution_loss
from kd.terms.contextual import layer_relation_loss, word_relation_loss
from kd.terms.gradient import gradient_alignment_loss
from kd.terms.logits import logit_kd_loss, task_loss
from kd.terms.patient import patient_loss

__all__ = [
    "attribution_loss",
    "gradient_alignment_loss",
    "layer_relation_loss",
    "logit_kd_loss",
    "patient_loss",
    "task_loss",
    "word_relation_loss",
]
