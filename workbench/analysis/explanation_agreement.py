"""How far two models' explanations of one example agree (:class:`Agreement`), as the app's Case
study page shows it: :func:`agreement` gives the saliency loyalty (Pearson of the two models' Grad
saliency of their predicted class) and the rank correlation of their maps for the class a view
shows (:func:`shown_classes`). Two models that tokenise the text differently are compared on the
words both read, each word's scores summed. The correlations are those of
:mod:`workbench.analysis.agreement`; torch is imported inside the functions that compute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workbench.analysis.explanations import gold_index
from workbench.core.errors import WorkbenchError

if TYPE_CHECKING:
    from workbench.analysis.explanations import Explanation


@dataclass
class Agreement:
    """How far a student's explanation follows the teacher's on one example."""

    saliency_loyalty: float  # Pearson of Grad saliency, real tokens (docs/methods.md §6)
    rank_correlation: float  # Spearman of the shown class's attribution maps
    same_prediction: bool
    notes: list[str] = field(default_factory=list)


def shown_classes(explanation: Explanation, view: str) -> list[int]:
    """The classes a view shows for one model: its prediction, the gold label, every class, or
    a named (or numbered) class."""
    names = explanation.class_names
    if view == "pred":
        return [explanation.predicted]
    if view == "all":
        return list(range(len(names)))
    if view == "gold":
        if explanation.gold is None:
            raise WorkbenchError("view 'gold' needs examples with a label")
        return [explanation.gold]
    index = gold_index(view, names)
    if index is None:
        raise WorkbenchError("choose a view: pred, gold, all or a class")
    return [index]


def correlation(a: Sequence[float], b: Sequence[float], rank: bool = False) -> float:
    """Pearson (with ``rank``: Spearman) correlation of two equally long score lists, by
    :mod:`workbench.analysis.agreement`; NaN when either is constant or shorter than two."""
    import torch

    from workbench.analysis.agreement import pearson_per_example, rank_correlation

    if len(a) != len(b):
        return math.nan
    first, second = torch.tensor([a], dtype=torch.float64), torch.tensor([b], dtype=torch.float64)
    mask = torch.ones_like(first, dtype=torch.long)
    measure = rank_correlation if rank else pearson_per_example
    return float(measure(first, second, mask)[0])


def agreement(teacher: Explanation, student: Explanation, view: str = "pred") -> Agreement:
    """Saliency loyalty (Pearson of the two models' Grad saliency of their predicted class) and
    the rank correlation of their maps for the class the view shows first (for ``pred``: the
    teacher's prediction)."""
    from workbench.core.data.alignment import align

    notes = []
    same = teacher.predicted == student.predicted
    shown = shown_classes(teacher, view)[0]
    pairs = [(teacher.saliency, student.saliency), (teacher.maps[shown], student.maps[shown])]
    if teacher.tokens != student.tokens:
        if not (teacher.spans and student.spans):
            notes.append("the two models tokenise the text differently: no per-token comparison")
            return Agreement(math.nan, math.nan, same, notes)
        aligned = align(teacher.spans, student.spans)
        notes.append(
            f"the two models tokenise the text differently: compared on the {aligned.words} "
            "words both read (each word's scores summed)"
            + (f"; {aligned.dropped} read by one model only left out" if aligned.dropped else "")
        )
        pairs = [
            (_summed(a, aligned.teacher, aligned.words), _summed(b, aligned.student, aligned.words))
            for a, b in pairs
        ]
    return Agreement(correlation(*pairs[0]), correlation(*pairs[1], rank=True), same, notes)


def _summed(scores: Sequence[float], word_ids: Sequence[int], words: int) -> list[float]:
    """Scores per position summed per word (``word_ids``: −1 for none) → ``words`` scores."""
    import torch

    from workbench.core.data.alignment import pool_words

    values = torch.tensor([scores], dtype=torch.float64)[..., None]
    return pool_words(values, torch.tensor([word_ids]), "sum", words)[0, :, 0].tolist()
