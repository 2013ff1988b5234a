"""Colour: one shared scale for all rows and the one colour function every format uses (see
the package docstring for the choice of colour maps)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import matplotlib
from matplotlib.colors import Colormap

DIVERGING_CMAP = "PuOr_r"
SEQUENTIAL_CMAP = "Oranges"

RGB = tuple[int, int, int]
_BLACK: RGB = (0, 0, 0)
_WHITE: RGB = (255, 255, 255)
_GREY: RGB = (90, 90, 90)
_RULE: RGB = (128, 128, 128)


@dataclass(frozen=True)
class ColorScale:
    """A colour scale shared by all rows.

    A diverging scale maps ``vmin..0`` to the lower half of the colormap and ``0..vmax`` to
    the upper half, so zero always gets the neutral middle colour even for asymmetric bounds.
    """

    vmin: float
    vmax: float
    cmap: str
    diverging: bool

    def __post_init__(self) -> None:
        if not self.vmin < self.vmax:
            raise ValueError(f"colour scale needs vmin < vmax, got {self.vmin} and {self.vmax}")
        if self.diverging and not self.vmin < 0 < self.vmax:
            raise ValueError(
                f"a diverging scale needs vmin < 0 < vmax, got {self.vmin} and {self.vmax}"
            )
        _colormap(self.cmap)

    def normalize(self, score: float) -> float:
        """Position of ``score`` on the colormap, in ``[0, 1]`` (clipped)."""
        s = min(max(float(score), self.vmin), self.vmax)
        if not self.diverging:
            return (s - self.vmin) / (self.vmax - self.vmin)
        return 0.5 + 0.5 * s / self.vmax if s >= 0 else 0.5 - 0.5 * s / self.vmin

    def ticks(self) -> list[tuple[float, str]]:
        """Legend ticks as ``(position in [0, 1], label)``: min, 0 (diverging) and max."""
        values = [self.vmin, 0.0, self.vmax] if self.diverging else [self.vmin, self.vmax]
        return [(self.normalize(v), _format_number(v)) for v in values]


def color_scale(
    scores: Iterable[float],
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str | None = None,
) -> ColorScale:
    """The shared colour scale for ``scores`` (all rows together).

    Signed data (or an explicit negative ``vmin``) gives a diverging scale symmetric around
    zero, ``vmax = max |score|``; otherwise a sequential scale from 0 to the largest score.
    Explicit bounds win; one explicit bound of a signed scale mirrors the other.
    """
    values = [float(s) for s in scores]
    if not values:
        raise ValueError("no scores to build a colour scale from")
    diverging = min(values) < 0 if vmin is None else vmin < 0
    if diverging:
        lo = vmin if vmin is not None else -(vmax if vmax is not None else max(map(abs, values)))
        hi = vmax if vmax is not None else -lo
    else:
        lo = 0.0 if vmin is None else vmin
        hi = vmax if vmax is not None else max(values)
        if vmax is None and hi <= lo:
            hi = lo + 1.0
    name = cmap or (DIVERGING_CMAP if diverging else SEQUENTIAL_CMAP)
    return ColorScale(vmin=lo, vmax=hi, cmap=name, diverging=diverging)


@lru_cache(maxsize=32)
def _colormap(name: str) -> Colormap:
    try:
        return matplotlib.colormaps[name]
    except KeyError:
        raise ValueError(f"unknown matplotlib colormap {name!r}") from None


def _position_to_rgb(cmap: str, position: float) -> RGB:
    r, g, b, _ = _colormap(cmap)(position)
    return round(r * 255), round(g * 255), round(b * 255)


def score_to_rgb(score: float, scale: ColorScale) -> RGB:
    """The 8-bit RGB colour of ``score``; every output format uses this function."""
    return _position_to_rgb(scale.cmap, scale.normalize(score))


def text_rgb(background: RGB) -> RGB:
    """Black or white, whichever has the higher WCAG contrast against ``background`` (by its
    WCAG 2 relative luminance)."""
    r, g, b = (
        v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4
        for v in (c / 255 for c in background)
    )
    lum = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return _BLACK if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else _WHITE


def hex_color(rgb: RGB) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def legend_stops(scale: ColorScale, count: int = 33) -> list[tuple[float, RGB]]:
    """Evenly spaced ``(position, colour)`` stops along the colormap."""
    return [(p, _position_to_rgb(scale.cmap, p)) for p in (i / (count - 1) for i in range(count))]


def _format_number(value: float) -> str:
    return "0" if value == 0 else f"{value:.3g}"
