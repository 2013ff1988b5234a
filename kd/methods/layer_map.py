"""Which student layer learns from which teacher layer.

Indices are into ``hidden_states`` (0 = embedding output, ``k`` = output of layer ``k``).
"""

from __future__ import annotations

from workbench.core.errors import WorkbenchError


def patient_layers(teacher_layers: int, student_layers: int, mapping: str) -> list[tuple[int, int]]:
    """Patient KD pairs ``(student j, teacher I(j))`` for ``j = 1..M−1`` (the last layer is
    covered by the logits). ``skip``: ``I(j) = j·N/M`` (12→6: 2,4,6,8,10); ``last``:
    ``I(j) = N−M+j`` (12→6: 7..11)."""
    n, m = teacher_layers, student_layers
    if m > n:
        raise WorkbenchError(f"a {m}-layer student cannot learn from a {n}-layer teacher here")
    if m < 2:
        raise WorkbenchError(
            "Patient KD (and GKD-CLS) pair the student's intermediate layers 1..M−1 with the "
            f"teacher's, and a {m}-layer student has none: use a student of at least 2 layers"
        )
    if mapping == "skip":
        if n % m:
            raise WorkbenchError(f"PKD-Skip needs the teacher's {n} layers divisible by {m}")
        return [(j, j * n // m) for j in range(1, m)]
    if mapping == "last":
        return [(j, n - m + j) for j in range(1, m)]
    raise WorkbenchError(f"unknown Patient KD mapping {mapping!r}: use skip or last")


def uniform_layers(teacher_layers: int, student_layers: int) -> list[tuple[int, int]]:
    """Uniform mapping with the embeddings: student layer ``j`` (0..M) ↔ teacher ``j·N/M``."""
    n, m = teacher_layers, student_layers
    if n % m:
        raise WorkbenchError(f"uniform mapping needs the teacher's {n} layers divisible by {m}")
    return [(j, j * n // m) for j in range(m + 1)]
