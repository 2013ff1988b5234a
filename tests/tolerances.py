"""Tolerances derived from float32 arithmetic, not from one machine's result.

Another CPU kernel set (``ATEN_CPU_CAPABILITY=default`` or ``avx2`` against AVX-512) or another
batch shape sums in another order, so a float32 result moves by a few units of rounding of the
numbers it is computed from. A difference of nearly equal numbers ``a − b`` carries the rounding
of ``a`` and ``b``, not of the (small) difference: its tolerance needs an absolute floor tied to
the operands, which a relative tolerance on the difference alone does not give.
"""

from __future__ import annotations

import torch

EPS32 = torch.finfo(torch.float32).eps
ULPS = 8  # units of rounding allowed: a few for each side of a difference


def float32_floor(*operands: torch.Tensor | float, ulps: int = ULPS) -> float:
    """``ulps`` float32 rounding units of the largest magnitude among ``operands`` (tensors of
    any shape, or numbers): the absolute error a float32 result computed from them can carry."""
    return ulps * EPS32 * max(float(torch.as_tensor(o).detach().abs().max()) for o in operands)


def assert_close_to_scale(
    actual: torch.Tensor,
    expected: torch.Tensor,
    rtol: float = 1e-5,
    operands: tuple[torch.Tensor | float, ...] = (),
) -> None:
    """``|actual − expected| ≤ rtol · max|expected| + float32_floor(expected, *operands)``
    elementwise (equal shapes): a tolerance relative to the largest value, since rounding
    errors scale with the largest terms, plus the rounding of the numbers both were computed
    from (``operands``, e.g. the probabilities whose difference ``expected`` is)."""
    actual, expected = actual.detach(), expected.detach()
    scale = float(expected.abs().max())
    assert scale > 0, "the expected values are all 0: nothing is compared"
    bound = rtol * scale + float32_floor(expected, *operands)
    difference = float((actual - expected).abs().max())
    assert difference <= bound, f"max difference {difference:.3g} vs bound {bound:.3g}"
