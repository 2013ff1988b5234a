"""Straightforward forms of the authors' AD-KD and GKD training steps, for comparison only.

They follow the released code's structure: the teacher runs forward *with a graph* every step and
is differentiated there; AD-KD loops over classes, retaining the graph for each class, and the
student's attribution shares its forward pass with its logits (m = 1). The maps and the loss
terms come from ``tests/reference_terms.py``, the reimplementation behind the stored golden
values, so nothing here goes through ``kd``'s terms. The benchmark times these steps against the
workbench's objective (teacher fields from the cache, views batched) and prints both loss
values; the tests check that the values agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

from kd.methods.adkd import ADKDSettings
from tests.reference_terms import (
    attribution_loss,
    attribution_map,
    gradient_alignment_loss,
    logit_kd_loss,
    task_loss,
)
from workbench.core.models import embed, forward


def _leaf_embedding(model: PreTrainedModel, batch: dict[str, Tensor]) -> Tensor:
    embedded = embed(model, batch)
    return embedded if embedded.requires_grad else embedded.detach().requires_grad_()


def _pad_baseline(model: PreTrainedModel, batch: dict[str, Tensor]) -> Tensor:
    pad_id = model.config.pad_token_id or 0
    return embed(model, {**batch, "input_ids": torch.full_like(batch["input_ids"], pad_id)})


def adkd_step_loss(
    teacher: PreTrainedModel,
    student: PreTrainedModel,
    batch: dict[str, Tensor],
    *,
    weights: dict[str, float],
    tau: float,
    kd_form: str = "kl",
    top_k: int | None = None,
    reduction: str = "paper",
) -> dict[str, Tensor]:
    """AD-KD with m = 1, all classes, [PAD] baseline: ``(1−α)CE + αKD + β·d(Ã_t, Ã_s)`` with
    the KD form ``kd_form`` and the distance ``d`` of ``reduction`` (Eq. 9's ``‖Ã_t − Ã_s‖``
    by default)."""
    mask = batch["attention_mask"]
    t_embedded = _leaf_embedding(teacher, batch)
    t_logits = forward(teacher, batch, embedding_output=t_embedded).logits
    t_probs = t_logits.softmax(-1)
    s_embedded = _leaf_embedding(student, batch)
    s_logits = forward(student, batch, embedding_output=s_embedded).logits
    s_probs = s_logits.softmax(-1)
    with torch.no_grad():
        t_delta = t_embedded - _pad_baseline(teacher, batch)
    s_delta = s_embedded - _pad_baseline(student, batch)
    t_igs, s_igs = [], []
    for c in range(t_logits.shape[-1]):
        (t_grad,) = torch.autograd.grad(t_probs[:, c].sum(), t_embedded, retain_graph=True)
        (s_grad,) = torch.autograd.grad(
            s_probs[:, c].sum(), s_embedded, retain_graph=True, create_graph=True
        )
        t_igs.append(t_delta * t_grad)
        s_igs.append(s_delta * s_grad)
    t_maps = attribution_map(torch.stack(t_igs, 1), mask, top_k)
    s_maps = attribution_map(torch.stack(s_igs, 1), mask)
    values = {
        "ce": task_loss(s_logits, batch["labels"]),
        "kd": logit_kd_loss(s_logits, t_logits.detach(), tau, kd_form),
        "attr": attribution_loss(s_maps, t_maps.detach(), mask, reduction),
    }
    values["loss"] = sum(weights[name] * value for name, value in values.items())
    return values


def _input_gradient(model: PreTrainedModel, batch: dict[str, Tensor], create_graph: bool):
    embedded = _leaf_embedding(model, batch)
    logits = forward(model, batch, embedding_output=embedded).logits
    signal = F.softmax(logits, -1).max(-1).values.sum()
    (grad,) = torch.autograd.grad(signal, embedded, create_graph=create_graph)
    return logits, grad


def gkd_step_loss(
    teacher: PreTrainedModel,
    student: PreTrainedModel,
    batch: dict[str, Tensor],
    *,
    weights: dict[str, float],
    tau: float,
    kd_form: str = "kl",
) -> dict[str, Tensor]:
    """GKD (``gkd.py``): ``αKD + (1−α)CE + β L_grad``, teacher differentiated every step."""
    t_logits, t_grad = _input_gradient(teacher, batch, create_graph=False)
    s_logits, s_grad = _input_gradient(student, batch, create_graph=True)
    values = {
        "ce": task_loss(s_logits, batch["labels"]),
        "kd": logit_kd_loss(s_logits, t_logits.detach(), tau, kd_form),
        "grad": gradient_alignment_loss(s_grad, t_grad.detach(), batch["attention_mask"]),
    }
    values["loss"] = sum(weights[name] * value for name, value in values.items())
    return values


def authors_step_loss(
    method: str,
    teacher: PreTrainedModel,
    student: PreTrainedModel,
    batch: dict[str, Tensor],
    objective,
) -> dict[str, Tensor]:
    """The straightforward step of ``method`` (``"adkd"`` or ``"gkd"``) with the weights,
    temperature, KD form and attribution distance of a resolved
    :class:`kd.methods.objective.Objective`."""
    settings = {
        "weights": objective.weights,
        "tau": objective.temperature,
        "kd_form": objective.kd_form,
    }
    if method == "adkd":
        return adkd_step_loss(
            teacher,
            student,
            batch,
            **settings,
            reduction=objective.of(ADKDSettings).attr_reduction,
        )
    return gkd_step_loss(teacher, student, batch, **settings)
