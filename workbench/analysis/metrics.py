"""Task metrics (GLUE conventions) and a student's loyalty to its teacher (docs/methods.md §6,
§7)."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats
from scipy.spatial.distance import jensenshannon
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef, recall_score
from torch import Tensor

from workbench.core.data import TaskSpec


def task_metrics(spec: TaskSpec, logits: Tensor, labels: Tensor) -> dict[str, float]:
    """The task's metrics from logits ``[N, C]`` (``[N, 1]`` for regression) and labels ``[N]``.

    accuracy, macro_f1, f1 (positive class 1, binary tasks), mcc (Matthews), spearman, pearson;
    for classification also ``recall/<class name>`` per class, so that a neglected class shows.
    """
    if spec.regression:
        predictions = logits.reshape(-1).double().numpy()
        gold = labels.double().numpy()
        return {
            "spearman": float(stats.spearmanr(predictions, gold).statistic),
            "pearson": float(stats.pearsonr(predictions, gold).statistic),
        }
    predictions = logits.argmax(-1).numpy()
    gold = labels.numpy()
    scorers = {
        "accuracy": lambda: accuracy_score(gold, predictions),
        "macro_f1": lambda: f1_score(
            gold, predictions, average="macro", labels=list(range(spec.num_labels)), zero_division=0
        ),
        "f1": lambda: f1_score(gold, predictions, zero_division=0),
        "mcc": lambda: matthews_corrcoef(gold, predictions),
    }
    names = dict.fromkeys((*spec.metrics, "accuracy", "macro_f1"))
    recall = recall_score(
        gold, predictions, average=None, labels=list(range(spec.num_labels)), zero_division=0
    )
    per_class = zip(spec.label_names, recall, strict=True)
    return {
        **{name: float(scorers[name]()) for name in names},
        **{f"recall/{label}": float(r) for label, r in per_class},
    }


def label_loyalty(teacher_logits: Tensor, student_logits: Tensor) -> float:
    """Share of examples where student and teacher predict the same class. ``[N, C]`` each."""
    return float((teacher_logits.argmax(-1) == student_logits.argmax(-1)).double().mean())


def probability_loyalties(teacher_logits: Tensor, student_logits: Tensor) -> Tensor:
    """Xu et al. 2021, per example: ``1 − √JSD(p_t ‖ p_s)`` with base-2 logs, in [0, 1].
    ``[N, C]`` logits each → ``[N]`` (float64; √JSD by scipy's ``jensenshannon``)."""
    p = teacher_logits.double().softmax(-1).numpy(force=True)
    q = student_logits.double().softmax(-1).numpy(force=True)
    with np.errstate(invalid="ignore"):
        distance = jensenshannon(p, q, base=2, axis=-1)
    # nearly equal distributions: rounding can make the divergence a hair below 0, its root NaN
    return torch.from_numpy(1 - np.nan_to_num(distance, nan=0.0))


def probability_loyalty(teacher_logits: Tensor, student_logits: Tensor) -> float:
    """Mean of :func:`probability_loyalties` over examples."""
    return float(probability_loyalties(teacher_logits, student_logits).mean())


def nan_mean(values: Tensor) -> tuple[float, int]:
    """Mean over the defined (non-NaN) values of ``[N]`` and how many were undefined (the mean
    is NaN when none is defined)."""
    defined = ~values.isnan()
    mean = float(values[defined].mean()) if defined.any() else float("nan")
    return mean, int((~defined).sum())


def loyalty_per_example(teacher_logits: Tensor, student_logits: Tensor) -> dict[str, list]:
    """Label loyalty (1: the same class as the teacher's, else 0) and probability loyalty
    (:func:`probability_loyalties`) per example of a classifier student, ``[N, C]`` logits
    each → lists ``[N]`` (empty for regression): the units of paired intervals on loyalty."""
    if teacher_logits.shape[-1] == 1:
        return {}
    same = teacher_logits.argmax(-1) == student_logits.argmax(-1)
    return {
        "label_loyalty": same.int().tolist(),
        "probability_loyalty": probability_loyalties(teacher_logits, student_logits).tolist(),
    }


def loyalty(teacher_logits: Tensor, student_logits: Tensor) -> dict[str, float]:
    """Label and probability loyalty of a classifier student (empty for regression)."""
    if teacher_logits.shape[-1] == 1:
        return {}
    return {
        "label_loyalty": label_loyalty(teacher_logits, student_logits),
        "probability_loyalty": probability_loyalty(teacher_logits, student_logits),
    }


def mean_and_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    array = np.asarray(values, dtype=float)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0
