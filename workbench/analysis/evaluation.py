"""Predictions over a split and the metrics of a model, alone or against its teacher."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from transformers import PreTrainedModel

from workbench.analysis.metrics import loyalty, task_metrics
from workbench.core.data import EncodedSplit, TaskSpec, batches, to_device
from workbench.core.models import forward, model_device


@torch.no_grad()
def logits_in_order(
    run: Callable[[dict[str, Tensor]], Tensor],
    dataset: EncodedSplit,
    batch_size: int = 64,
    pad_token_id: int = 0,
) -> Tensor:
    """Logits ``[N, C]`` in dataset order of ``run`` (a padded batch → its logits ``[B, C]``,
    float32 on the CPU); batches are formed by length so little is padded."""
    order = sorted(range(len(dataset)), key=lambda i: len(dataset.input_ids[i]))
    out: Tensor | None = None
    for batch in batches(dataset, order, batch_size, pad_token_id):
        logits = run(batch)
        if out is None:
            out = logits.new_zeros((len(dataset), logits.shape[-1]))
        out[batch["index"]] = logits
    assert out is not None, "empty dataset"
    return out


def predict_logits(
    model: PreTrainedModel, dataset: EncodedSplit, batch_size: int = 64, pad_token_id: int = 0
) -> Tensor:
    """Logits ``[N, C]`` of a PyTorch model in dataset order (:func:`logits_in_order`)."""
    was_training, device = model.training, model_device(model)
    model.eval()

    def run(batch: dict[str, Tensor]) -> Tensor:
        return forward(model, to_device(batch, device)).logits.float().cpu()

    out = logits_in_order(run, dataset, batch_size, pad_token_id)
    model.train(was_training)
    return out


def evaluate_logits(
    spec: TaskSpec, logits: Tensor, labels: Tensor, teacher_logits: Tensor | None = None
) -> dict[str, float]:
    """Task metrics, plus label/probability loyalty when the teacher's logits are given."""
    metrics = task_metrics(spec, logits, labels)
    if teacher_logits is not None:
        metrics |= loyalty(teacher_logits, logits)
    return metrics
