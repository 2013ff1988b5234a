"""Which student layer learns from, or is cut from, which teacher layer.

Layers are counted from 1 here as in ``hidden_states`` (0 = embedding output, ``k`` = output of
layer ``k``). Each mapping has one definition, :func:`skip_layers` and :func:`last_layers`,
read both by the layers a cut student keeps (:func:`select_layers`) and by the pairs the
layer-wise terms compare (:func:`patient_layers`, :func:`uniform_layers`).
"""

from __future__ import annotations

from workbench.core.errors import WorkbenchError


def skip_layers(teacher_layers: int, student_layers: int) -> list[int]:
    """``skip``: student layer ``j = 1..M`` ↔ teacher layer ``round(j·N/M)``, every (N/M)-th
    layer ending at the last (12→6: 2,4,6,8,10,12)."""
    n, m = teacher_layers, student_layers
    return [round(j * n / m) for j in range(1, m + 1)]


def last_layers(teacher_layers: int, student_layers: int) -> list[int]:
    """``last``: student layer ``j = 1..M`` ↔ teacher layer ``N−M+j`` (12→6: 7..12)."""
    n, m = teacher_layers, student_layers
    return [n - m + j for j in range(1, m + 1)]


def select_layers(teacher_layers: int, student_layers: int, strategy: str) -> list[int]:
    """0-based teacher layers a cut student keeps.

    ``first``: 0..M−1; ``last`` and ``skip``: the teacher layers of :func:`last_layers` and
    :func:`skip_layers` (12→6 skip: 1,3,5,7,9,11); or an explicit comma-separated list.
    """
    n, m = teacher_layers, student_layers
    if strategy == "first":
        chosen = list(range(m))
    elif strategy in ("last", "skip"):
        mapping = last_layers if strategy == "last" else skip_layers
        chosen = [layer - 1 for layer in mapping(n, m)]
    else:
        try:
            chosen = [int(part) for part in strategy.split(",")]
        except ValueError:
            raise WorkbenchError(
                f"layers {strategy!r}: use first, skip, last or a list such as 1,3,5"
            ) from None
    if not 1 <= m <= n and strategy in ("first", "last", "skip"):
        raise WorkbenchError(f"a student of {m} layers cannot be cut from a model of {n} layers")
    if any(not 0 <= i < n for i in chosen) or len(set(chosen)) != len(chosen):
        raise WorkbenchError(
            f"layers {chosen}: need distinct indices in 0..{n - 1} of the teacher's {n} layers"
        )
    return chosen


def patient_layers(teacher_layers: int, student_layers: int, mapping: str) -> list[tuple[int, int]]:
    """Patient KD pairs ``(student j, teacher I(j))`` for ``j = 1..M−1`` (the last layer is
    covered by the logits), ``I`` the ``skip`` (N divisible by M: ``I(j) = j·N/M``, 12→6:
    2,4,6,8,10) or ``last`` mapping (``I(j) = N−M+j``, 12→6: 7..11)."""
    n, m = teacher_layers, student_layers
    if m > n:
        raise WorkbenchError(f"a {m}-layer student cannot learn from a {n}-layer teacher here")
    if m < 2:
        raise WorkbenchError(
            "Patient KD (and GKD-CLS) pair the student's intermediate layers 1..M−1 with the "
            f"teacher's, and a {m}-layer student has none: use a student of at least 2 layers"
        )
    if mapping not in ("skip", "last"):
        raise WorkbenchError(f"unknown Patient KD mapping {mapping!r}: use skip or last")
    if mapping == "skip" and n % m:
        raise WorkbenchError(f"PKD-Skip needs the teacher's {n} layers divisible by {m}")
    teacher = skip_layers(n, m) if mapping == "skip" else last_layers(n, m)
    return list(enumerate(teacher[:-1], start=1))


def uniform_layers(teacher_layers: int, student_layers: int) -> list[tuple[int, int]]:
    """The ``skip`` mapping with the embeddings: student layer ``j`` (0..M) ↔ teacher ``j·N/M``."""
    n, m = teacher_layers, student_layers
    if n % m:
        raise WorkbenchError(f"uniform mapping needs the teacher's {n} layers divisible by {m}")
    return [(0, 0), *enumerate(skip_layers(n, m), start=1)]
