"""Vanilla knowledge distillation (Hinton et al. 2015; docs/methods.md §1): the task loss and the
teacher's softened outputs. Every other method adds terms to these two.

    L = (1 − α) · CE(z_s, y) + α · τ² · KL(σ(z_t/τ) ‖ σ(z_s/τ))

τ and the KD form are shared by all methods (resolved in :class:`kd.methods.objective.Objective`):
the papers' ``kl``; the AD-KD / CKD code's ``soft-ce``; the GKD / PKD code's ``kl-mean``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kd.methods.config import MAX_TEMPERATURE, MIN_TEMPERATURE
from kd.methods.objective import (
    LABELLED,
    PRESETS,
    Objective,
    Parameter,
    Preset,
    StepInputs,
    TeacherField,
    Term,
    preset_weights,
    register_method,
)
from workbench.core.lazy import lazy_module
from workbench.core.names import UNLABELLED

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedModel

F = lazy_module("torch.nn.functional")
models = lazy_module("workbench.core.models")

KD_FORMS = ("kl", "soft-ce", "kl-mean")


def task_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy for classification (``logits`` ``[B, C]``, ``labels`` ``[B]`` long), MSE for
    regression (``logits`` ``[B, 1]``, ``labels`` ``[B]`` float), averaged over the labelled
    examples: a transfer text's withheld label (``UNLABELLED``; NaN for regression) is left out,
    and a batch of none gives 0 (still a function of ``logits``)."""
    regression = logits.shape[-1] == 1
    labelled = ~labels.isnan() if regression else labels != UNLABELLED
    if not labelled.all():
        logits, labels = logits[labelled], labels[labelled]
        if not labelled.any():
            return logits.sum() * 0.0
    if regression:
        return F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
    return F.cross_entropy(logits, labels)


def logit_kd_loss(
    student_logits: Tensor, teacher_logits: Tensor, tau: float = 1.0, *, form: str = "kl"
) -> Tensor:
    """Distillation of the teacher's softened outputs. ``[B, C]`` each; the teacher is detached.

    - ``kl`` (paper): ``τ² · KL(σ(z_t/τ) ‖ σ(z_s/τ))``, summed over classes, mean over the batch;
    - ``soft-ce`` (AD-KD / CKD code): ``−Σ_c p_t log p_s``, mean over the batch, no τ²;
    - ``kl-mean`` (GKD / PKD code): ``KLDivLoss(reduction="mean") · τ²``, i.e. divided by B·C.

    Regression (C = 1): ``MSE(z_s/τ, z_t/τ)`` whatever the form.
    """
    teacher_logits = teacher_logits.detach()
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} differ"
        )
    if student_logits.shape[-1] == 1:
        return F.mse_loss(student_logits / tau, teacher_logits / tau)
    log_student = F.log_softmax(student_logits / tau, dim=-1)
    teacher = F.softmax(teacher_logits / tau, dim=-1)
    if form == "kl":
        return F.kl_div(log_student, teacher, reduction="batchmean") * tau**2
    if form == "soft-ce":
        return -(teacher * log_student).sum(-1).mean()
    if form == "kl-mean":  # the authors' mean over B·C, which torch warns is not the KL
        return (teacher * (teacher.clamp_min(1e-30).log() - log_student)).mean() * tau**2
    raise ValueError(f"unknown KD form {form!r}; use one of {KD_FORMS}")


def _teacher_logits(_objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    return models.forward(teacher, batch).logits


def _ce(_objective: Objective, inputs: StepInputs) -> Tensor:
    return task_loss(inputs.student.logits, inputs.batch["labels"])


def _kd(objective: Objective, inputs: StepInputs) -> Tensor:
    student, teacher = inputs.student.logits, inputs.teacher["logits"]
    return logit_kd_loss(student, teacher, objective.temperature, form=objective.kd_form)


register_method(
    "kd",
    teacher_fields={"logits": TeacherField(_teacher_logits)},
    terms={"ce": Term(_ce, labels=LABELLED), "kd": Term(_kd, teacher_fields=("logits",))},
    parameters={
        "alpha": Parameter(
            "weight α of the KD term; CE gets 1 − α",
            0.0,
            1.0,
            needs=("kd",),
            # 1 − α to 12 digits: 1 − 0.9 is 0.1, not 0.09999999999999998
            apply=lambda config, value: replace(
                config, weights=config.weights | {"kd": value, "ce": float(f"{1 - value:.12g}")}
            ),
            read=lambda config: preset_weights(config).get("kd"),
        ),
        "tau": Parameter(
            "KD temperature τ",
            MIN_TEMPERATURE,
            MAX_TEMPERATURE,
            needs=("kd",),
            apply=lambda config, value: replace(config, temperature=float(value)),
            read=lambda config: config.temperature or PRESETS[config.preset].temperature,
        ),
    },
    presets={
        "finetune": Preset({"ce": 1.0}, {"ce": 1.0}, name="the student trained alone"),
        "kd": Preset(
            {"ce": 0.5, "kd": 0.5},
            {"ce": 0.5, "kd": 0.5},
            name="vanilla KD",
            reference="Hinton et al. 2015",
            space={"alpha": "0.1,0.5,0.9", "tau": "1,2,4,8"},
            tuned=("tau",),  # so that every method meets a reference tuned alike
            gallery=True,
        ),
    },
)
