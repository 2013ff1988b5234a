"""Predictions over a split and the metrics of a model, alone or against its teacher."""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedModel

from workbench.data import EncodedSplit, TaskSpec, batches, to_device
from workbench.metrics import loyalty, task_metrics
from workbench.models import forward, model_device


@torch.no_grad()
def predict_logits(
    model: PreTrainedModel, dataset: EncodedSplit, batch_size: int = 64, pad_token_id: int = 0
) -> Tensor:
    """Logits ``[N, C]`` in dataset order; batches are formed by length so little is padded."""
    was_training = model.training
    model.eval()
    order = sorted(range(len(dataset)), key=lambda i: len(dataset.input_ids[i]))
    device = model_device(model)
    out: Tensor | None = None
    for batch in batches(dataset, order, batch_size, pad_token_id):
        logits = forward(model, to_device(batch, device)).logits.float().cpu()
        if out is None:
            out = logits.new_zeros((len(dataset), logits.shape[-1]))
        out[batch["index"]] = logits
    model.train(was_training)
    assert out is not None, "empty dataset"
    return out


def evaluate_logits(
    spec: TaskSpec, logits: Tensor, labels: Tensor, teacher_logits: Tensor | None = None
) -> dict[str, float]:
    """Task metrics, plus label/probability loyalty when the teacher's logits are given."""
    metrics = task_metrics(spec, logits, labels)
    if teacher_logits is not None:
        metrics |= loyalty(teacher_logits, logits)
    return metrics
