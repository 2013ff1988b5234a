"""What is attributed: checked inputs, target classes and views, and the scores ``F_v`` the engine
differentiates (a class probability per view, or GKD's ``p_max``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor
from transformers import PreTrainedModel

from workbench.core.config import VIEWS, Views
from workbench.core.errors import WorkbenchError
from workbench.core.models import forward, layer_count

Batch = Mapping[str, Tensor]
Target = int | str | Tensor
# scores(logits [R, C], example index of each row [R]) -> [R, V]
Scorer = Callable[[Tensor, Tensor], Tensor]


def as_batch(input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None) -> Batch:
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_type_ids is not None:
        batch["token_type_ids"] = token_type_ids
    return batch


def is_regression(model: PreTrainedModel) -> bool:
    """One output: ``F`` is the output itself and targets are ignored."""
    return model.config.num_labels == 1


def check_double_backward(model: PreTrainedModel, create_graph: bool) -> None:
    kernel = getattr(model.config, "_attn_implementation", "eager")
    if create_graph and kernel != "eager":
        raise WorkbenchError(
            f"create_graph=True needs a double backward, which {kernel!r} attention lacks on CPU: "
            'load the model with attn_implementation="eager"'
        )


def check_top_k(top_k: int | None, hidden_size: int) -> None:
    if top_k is not None and not 1 <= top_k <= hidden_size:
        raise WorkbenchError(
            f"top_k={top_k} is outside 1..{hidden_size} (the hidden size); use None for all"
        )


def check_layer(model: PreTrainedModel, layer: int | None) -> None:
    count = layer_count(model)
    if layer is not None and not 0 <= layer < count:
        raise WorkbenchError(
            f"layer={layer} is outside 0..{count - 1}; use None for the embedding output"
        )


def predictions(model: PreTrainedModel, batch: Batch) -> Tensor:
    """Predicted class per example ``[B]``."""
    with torch.no_grad():
        return forward(model, batch).logits.argmax(-1)


def class_ids(
    model: PreTrainedModel, values: Tensor | Sequence[int], what: str, device: torch.device
) -> Tensor:
    """``values`` as class indices on ``device``, checked against the model's classes (plain
    ints before a tensor, which may not hold them, is made)."""
    classes = model.config.num_labels
    tensor = isinstance(values, Tensor)
    listed = values.flatten().tolist() if tensor else list(values)
    if (tensor and values.is_floating_point()) or any(not 0 <= v < classes for v in listed):
        raise WorkbenchError(
            f"{what} {sorted(set(listed))} outside the model's classes 0..{classes - 1}"
        )
    return (values if tensor else torch.tensor(listed)).long().to(device)


def resolve_target(model: PreTrainedModel, batch: Batch, target: Target) -> Tensor:
    """Target class per example ``[B]``: an int, a ``[B]`` tensor, or ``"pred"``."""
    size, device = batch["input_ids"].shape[0], batch["input_ids"].device
    if is_regression(model):
        return torch.zeros(size, dtype=torch.long, device=device)
    if isinstance(target, str):
        if target != "pred":
            raise WorkbenchError(f"target {target!r}: give a class index, a [B] tensor or 'pred'")
        return predictions(model, batch)
    values = torch.as_tensor(target).reshape(-1)
    if len(values) not in (1, size):
        raise WorkbenchError(f"target has {len(values)} values for a batch of {size} examples")
    return class_ids(model, values.expand(size), "target", device)


def view_names(model: PreTrainedModel, views: Views) -> list[str]:
    """Names of the views :func:`resolve_views` gives: class names for ``"all"`` and class
    indices, ``"pred"``, ``"gold"``, or ``"output"`` for regression."""
    if is_regression(model):
        return ["output"]
    names = model.config.id2label
    if isinstance(views, str) and views == "all":
        return [str(names[c]) for c in range(model.config.num_labels)]
    if isinstance(views, str):
        return [views]
    indices = [views] if isinstance(views, int) else [int(c) for c in views]
    outside = [c for c in indices if not 0 <= c < model.config.num_labels]
    if outside:
        raise WorkbenchError(
            f"views {', '.join(map(str, outside))}: not a class of this model "
            f"(its classes are 0..{model.config.num_labels - 1})"
        )
    return [str(names[c]) for c in indices]


def resolve_views(
    model: PreTrainedModel, batch: Batch, views: Views, labels: Tensor | None = None
) -> Tensor:
    """The classes attributed per example ``[B, V]``: ``"all"`` — every class; ``"pred"`` — the
    predicted class; ``"gold"`` — ``labels``; an int or a list of ints — those classes.
    Regression models have one view (their output)."""
    size, device = batch["input_ids"].shape[0], batch["input_ids"].device
    if is_regression(model):
        return torch.zeros(size, 1, dtype=torch.long, device=device)
    if not isinstance(views, str):
        chosen = class_ids(model, [views] if isinstance(views, int) else views, "view", device)
        return chosen.expand(size, -1)
    if views == "all":
        return torch.arange(model.config.num_labels, device=device).expand(size, -1)
    if views == "pred":
        return predictions(model, batch)[:, None]
    if views == "gold":
        if labels is None:
            raise WorkbenchError("views='gold' needs the labels of the examples")
        return class_ids(model, torch.as_tensor(labels), "label", device)[:, None]
    raise WorkbenchError(f"unknown views {views!r}: use {', '.join(VIEWS)} or class indices")


def class_probabilities(model: PreTrainedModel, targets: Tensor) -> Scorer:
    """``F_v`` = probability of class ``targets[b, v]`` (regression: the output itself)."""
    if is_regression(model):
        return lambda logits, _rows: logits[:, :1]
    return lambda logits, rows: logits.softmax(-1).gather(1, targets[rows])


def max_probability(logits: Tensor, _rows: Tensor) -> Tensor:
    """``p_max`` per row ``[R, 1]`` (GKD's signal)."""
    return logits.softmax(-1).max(-1, keepdim=True).values
