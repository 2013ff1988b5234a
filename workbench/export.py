"""Paper-ready token attribution heatmaps: SVG, HTML, LaTeX, PDF and PNG.

A :class:`Heatmap` holds one or more :class:`HeatmapRow` objects, each one model's attribution
scores over one example's tokens.  Every format draws the rows stacked, labelled at the left,
with one shared colour scale and a legend, and embeds :attr:`Heatmap.metadata` (model names,
run ids, settings) together with the colour-scale settings actually used:

* SVG: ``<title>``, ``<desc>`` and a ``<metadata>`` element holding JSON;
* HTML: ``<meta name=... content=...>`` elements plus a visible settings table;
* LaTeX: ``%`` comment lines at the top of the fragment;
* PDF: the document-information dictionary (``Title``, ``Subject`` = JSON, ``Keywords``);
* PNG: ``tEXt``/``iTXt`` chunks (``Title``, ``Description`` = JSON, ``Software``).

Colours
-------
Signed scores use :data:`DIVERGING_CMAP` (ColorBrewer ``PuOr_r``: purple for negative,
orange for positive evidence, near-white at zero).  Purple–orange is the ColorBrewer diverging
scheme that stays distinguishable under all three common colour-vision deficiencies
(deuteranopia, protanopia, tritanopia), unlike red–blue or red–green maps, and both of its ends
keep a distinct lightness so the figure survives greyscale printing.  Non-negative scores use
:data:`SEQUENTIAL_CMAP` (ColorBrewer ``Oranges``): single hue with monotone lightness, hence
CVD-safe, and it starts at white so near-zero tokens stay quiet.  ``cividis``/``viridis``
were rejected because their zero end is dark, which would make unimportant tokens the most
salient.  All rows share one scale (:func:`color_scale`), and :func:`score_to_rgb` is the
single colour function used by every format, so a score gets the same RGB everywhere.
"""

from __future__ import annotations

import html
import itertools
import json
import logging
import math
import unicodedata
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Literal

import matplotlib
import numpy as np
from matplotlib.colors import Colormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

__all__ = [
    "DIVERGING_CMAP",
    "FORMATS",
    "SEQUENTIAL_CMAP",
    "ColorScale",
    "ExportOptions",
    "Heatmap",
    "HeatmapRow",
    "color_scale",
    "describe_characters",
    "export",
    "font_fallback",
    "latex_escape",
    "merge_wordpieces",
    "score_to_rgb",
    "text_rgb",
    "to_html",
    "to_latex",
    "to_latex_document",
    "to_pdf",
    "to_png",
    "to_svg",
    "undrawable_characters",
]

DIVERGING_CMAP = "PuOr_r"
SEQUENTIAL_CMAP = "Oranges"
FORMATS = (".html", ".pdf", ".png", ".svg", ".tex")
GENERATOR = "workbench.export"
DEFAULT_TITLE = "Token attribution heatmap"

RGB = tuple[int, int, int]
_BLACK: RGB = (0, 0, 0)
_WHITE: RGB = (255, 255, 255)
_GREY: RGB = (90, 90, 90)
_RULE: RGB = (128, 128, 128)


# --------------------------------------------------------------------------- data model


@dataclass(frozen=True)
class HeatmapRow:
    """One model's attribution over one example's tokens.

    ``scores[i]`` belongs to ``tokens[i]``; scores may be signed.  ``prediction`` (for
    example ``"positive 0.91"``) is shown under the label.
    """

    label: str
    tokens: list[str]
    scores: list[float]
    prediction: str | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.scores):
            raise ValueError(
                f"row {self.label!r}: {len(self.tokens)} tokens but {len(self.scores)} scores"
            )
        if not self.tokens:
            raise ValueError(f"row {self.label!r} has no tokens")
        bad = [i for i, s in enumerate(self.scores) if not math.isfinite(float(s))]
        if bad:
            raise ValueError(f"row {self.label!r}: non-finite (NaN/inf) score at token {bad[0]}")


@dataclass(frozen=True)
class Heatmap:
    """Rows drawn on one shared colour scale, with a title and metadata to embed."""

    rows: list[HeatmapRow]
    title: str = ""
    metadata: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError("heatmap has no rows")


@dataclass(frozen=True)
class ExportOptions:
    """Rendering options shared by every format.

    Attributes:
        vmin, vmax: explicit colour-scale bounds; scores outside are clipped.  Unset bounds
            come from the data (see :func:`color_scale`).
        cmap: a matplotlib colormap name overriding the automatic diverging/sequential choice.
        drop_tokens: tokens removed before drawing (default: ``[PAD]``); their scores do not
            enter the colour scale.
        merge_wordpieces: join WordPiece continuations (``"##ing"``) onto the preceding token
            (``"play" + "##ing"`` -> ``"playing"``), summing their scores.  Summing keeps the
            total attribution of the word, which is what additive methods (Integrated
            Gradients, SHAP, occlusion deltas) distribute over its pieces.  A continuation
            with no preceding token is kept as it is.
        font_size: token font size in points (SVG, PDF, PNG).
        max_width: target figure width in points before token lines wrap (SVG, PDF, PNG).
    """

    vmin: float | None = None
    vmax: float | None = None
    cmap: str | None = None
    drop_tokens: tuple[str, ...] = ("[PAD]",)
    merge_wordpieces: bool = False
    font_size: float = 9.0
    max_width: float = 480.0

    def __post_init__(self) -> None:
        if self.font_size <= 0 or self.max_width <= 0:
            raise ValueError("font_size and max_width must be positive")


# --------------------------------------------------------------------------- colour


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
        largest = max(abs(v) for v in values)
        lo = vmin if vmin is not None else -(vmax if vmax is not None else largest)
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


def _luminance(rgb: RGB) -> float:
    """WCAG 2 relative luminance of an sRGB colour."""

    def linear(c: int) -> float:
        v = c / 255
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def text_rgb(background: RGB) -> RGB:
    """Black or white, whichever has the higher WCAG contrast against ``background``."""
    lum = _luminance(background)
    return _BLACK if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else _WHITE


def _hex(rgb: RGB) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def _legend_stops(scale: ColorScale, count: int = 33) -> list[tuple[float, RGB]]:
    """Evenly spaced ``(position, colour)`` stops along the colormap."""
    positions = [i / (count - 1) for i in range(count)]
    return [(p, _position_to_rgb(scale.cmap, p)) for p in positions]


# --------------------------------------------------------------------------- text helpers


def _format_number(value: float) -> str:
    return "0" if value == 0 else f"{value:.3g}"


def _clean_text(text: str) -> str:
    """Replace control characters: whitespace ones by a space, others by U+FFFD.

    Keeps XML/HTML well-formed and keeps every token on one line in every format.
    """
    return "".join(
        (" " if ch.isspace() else "\ufffd")
        if unicodedata.category(ch) in ("Cc", "Cs") or ch in "\ufffe\uffff"
        else ch
        for ch in str(text)
    )


def _clean_multiline(text: str) -> str:
    return "\n".join(_clean_text(line) for line in str(text).splitlines())


# --------------------------------------------------------------------------- preparation


@dataclass(frozen=True)
class _Prepared:
    """Rows ready to draw, the shared scale and the metadata to embed."""

    title: str
    rows: list[HeatmapRow]
    scale: ColorScale
    metadata: dict[str, str]


def merge_wordpieces(
    tokens: Sequence[str], scores: Sequence[float]
) -> tuple[list[str], list[float]]:
    """WordPiece continuations (``"##ing"``) joined onto the preceding token, their scores
    summed (see :attr:`ExportOptions.merge_wordpieces`)."""
    merged_tokens: list[str] = []
    merged_scores: list[float] = []
    for token, score in zip(tokens, scores, strict=True):
        if token.startswith("##") and merged_tokens:
            merged_tokens[-1] += token[2:]
            merged_scores[-1] += score
        else:
            merged_tokens.append(token)
            merged_scores.append(score)
    return merged_tokens, merged_scores


def _prepare_row(row: HeatmapRow, options: ExportOptions) -> HeatmapRow:
    kept = [
        (t, float(s))
        for t, s in zip(row.tokens, row.scores, strict=True)
        if t not in options.drop_tokens
    ]
    if not kept:
        dropped = ", ".join(options.drop_tokens)
        raise ValueError(f"row {row.label!r} has no tokens left after dropping {dropped}")
    tokens, scores = [t for t, _ in kept], [s for _, s in kept]
    if options.merge_wordpieces:
        tokens, scores = merge_wordpieces(tokens, scores)
    prediction = None if row.prediction is None else _clean_text(row.prediction)
    return HeatmapRow(_clean_text(row.label), [_clean_text(t) for t in tokens], scores, prediction)


def _prepare(heatmap: Heatmap, options: ExportOptions | None) -> _Prepared:
    options = options or ExportOptions()
    rows = [_prepare_row(row, options) for row in heatmap.rows]
    scale = color_scale(
        (s for row in rows for s in row.scores), options.vmin, options.vmax, options.cmap
    )
    metadata = {_clean_text(k): _clean_multiline(v) for k, v in heatmap.metadata.items()}
    generated = {
        "export.generator": GENERATOR,
        "export.colormap": scale.cmap,
        "export.vmin": repr(scale.vmin),
        "export.vmax": repr(scale.vmax),
        "export.scale": "diverging (zero-centred)" if scale.diverging else "sequential",
        "export.drop_tokens": ", ".join(options.drop_tokens) or "(none)",
        "export.merge_wordpieces": str(options.merge_wordpieces).lower(),
    }
    for key, value in generated.items():
        metadata.setdefault(key, value)
    return _Prepared(_clean_text(heatmap.title), rows, scale, metadata)


def _metadata_json(prepared: _Prepared) -> str:
    return json.dumps(prepared.metadata, ensure_ascii=False, indent=1)


# --------------------------------------------------------------------------- shared layout
# Coordinates are points (1/72 in), origin top-left, y growing downwards.  SVG, PDF and PNG
# draw the same scene, so they look alike.  All text except the title is monospace, whose
# advance width (~0.60 em in DejaVu Sans Mono, Menlo, Consolas) makes widths predictable.

_MONO_ADVANCE = 0.61
_LEGEND_CAPTION = "score"
_TICK_SCALE = 0.85  # legend text size relative to the token font size
_SANS_BOLD_ADVANCE = 0.68
# CSS-style font stacks for SVG/HTML; matplotlib uses the first entry, which it bundles.
_MONO_FAMILY = ("DejaVu Sans Mono", "Menlo", "Consolas", "Liberation Mono", "monospace")
_SANS_FAMILY = ("DejaVu Sans", "Helvetica", "Arial", "sans-serif")


@dataclass(frozen=True)
class _Text:
    x: float
    y: float  # baseline
    text: str
    size: float
    rgb: RGB = _BLACK
    anchor: Literal["start", "middle", "end"] = "start"
    bold: bool = False
    mono: bool = True


@dataclass(frozen=True)
class _Token:
    x: float
    y: float
    width: float
    height: float
    text: str
    score: float
    rgb: RGB
    size: float

    def label(self) -> _Text:
        """The token text, centred in its box, black or white by background luminance."""
        center_y = _baseline(self.y + self.height / 2, self.size)
        return _Text(
            self.x + self.width / 2,
            center_y,
            self.text,
            self.size,
            text_rgb(self.rgb),
            anchor="middle",
        )


@dataclass(frozen=True)
class _Gradient:
    x: float
    y: float
    width: float
    height: float
    stops: tuple[tuple[float, RGB], ...]


@dataclass(frozen=True)
class _Line:
    x1: float
    y1: float
    x2: float
    y2: float


_Item = _Text | _Token | _Gradient | _Line


@dataclass(frozen=True)
class _Scene:
    width: float
    height: float
    items: tuple[_Item, ...]


def _text_width(text: str, size: float, advance: float = _MONO_ADVANCE) -> float:
    cells = sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)
    return cells * advance * size


def _baseline(center_y: float, size: float) -> float:
    """Baseline that vertically centres mixed-case text on ``center_y``."""
    return center_y + 0.34 * size


def _wrap_tokens(
    row: HeatmapRow, left: float, right: float, size: float
) -> list[list[tuple[float, float, str, float]]]:
    """Greedy line filling: lines of ``(x, width, token, score)`` between left and right."""
    pad, gap = 0.35 * size, 0.25 * size
    lines: list[list[tuple[float, float, str, float]]] = [[]]
    x = left
    for token, score in zip(row.tokens, row.scores, strict=True):
        width = max(_text_width(token, size), _text_width("m", size)) + 2 * pad
        if lines[-1] and x + width > right:
            lines.append([])
            x = left
        lines[-1].append((x, width, token, score))
        x += width + gap
    return lines


def _legend_items(
    scale: ColorScale, x: float, y: float, width: float, size: float
) -> tuple[list[_Item], float, float]:
    """Caption, gradient bar and ticks; also returns the legend's bottom and right edges."""
    bar_h, tick_len, tick_size = 0.9 * size, 0.3 * size, _TICK_SCALE * size
    label_y = y + bar_h + tick_len + tick_size
    items: list[_Item] = [
        _Text(
            x - 1.5 * size,
            _baseline(y + bar_h / 2, tick_size),
            _LEGEND_CAPTION,
            tick_size,
            _GREY,
            anchor="end",
        ),
        _Gradient(x, y, width, bar_h, tuple(_legend_stops(scale))),
    ]
    for position, label in scale.ticks():
        tx = x + position * width
        items.append(_Line(tx, y + bar_h, tx, y + bar_h + tick_len))
        items.append(_Text(tx, label_y, label, tick_size, anchor="middle"))
    overhang = max(_text_width(label, tick_size) for _, label in scale.ticks()) / 2
    return items, label_y + 0.3 * tick_size, x + width + overhang


def _build_scene(prepared: _Prepared, options: ExportOptions | None) -> _Scene:
    options = options or ExportOptions()
    size = options.font_size
    pred_size, title_size = 0.85 * size, 1.2 * size
    margin, box_h, line_gap, row_gap = size, 1.6 * size, 0.3 * size, 1.0 * size
    items: list[_Item] = []

    y = margin
    right_edge = margin
    if prepared.title:
        items.append(
            _Text(margin, y + title_size, prepared.title, title_size, bold=True, mono=False)
        )
        right_edge = margin + _text_width(prepared.title, title_size, _SANS_BOLD_ADVANCE)
        y += 2.0 * title_size

    label_w = max(
        _text_width(_LEGEND_CAPTION, _TICK_SCALE * size),
        *(_text_width(r.label, size) for r in prepared.rows),
        *(_text_width(r.prediction or "", pred_size) for r in prepared.rows),
    )
    left = margin + label_w + 1.5 * size
    widest = max(_text_width(t, size) for r in prepared.rows for t in r.tokens) + 0.7 * size
    right = max(options.max_width - margin, left + widest)

    for row in prepared.rows:
        lines = _wrap_tokens(row, left, right, size)
        for i, line in enumerate(lines):
            top = y + i * (box_h + line_gap)
            for x, width, token, score in line:
                rgb = score_to_rgb(score, prepared.scale)
                items.append(_Token(x, top, width, box_h, token, score, rgb, size))
            right_edge = max(right_edge, line[-1][0] + line[-1][1])
        label_y = _baseline(y + box_h / 2, size)
        items.append(_Text(margin, label_y, row.label, size, bold=True))
        label_h = box_h
        if row.prediction:
            items.append(
                _Text(margin, label_y + 1.35 * pred_size, row.prediction, pred_size, _GREY)
            )
            label_h += 1.35 * pred_size
        lines_h = len(lines) * box_h + (len(lines) - 1) * line_gap
        y += max(lines_h, label_h) + row_gap

    bar_w = max(12 * size, min(24 * size, right_edge - left))
    y += 0.2 * size
    legend, bottom, legend_right = _legend_items(prepared.scale, left, y, bar_w, size)
    items.extend(legend)
    return _Scene(max(right_edge, legend_right) + margin, bottom + margin, tuple(items))


# --------------------------------------------------------------------------- SVG

_SVG_NS = "http://www.w3.org/2000/svg"
_GRADIENT_ID = "attribution-scale"


def _svg_number(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _svg_box(item: _Token | _Gradient) -> dict[str, str]:
    return {
        "x": _svg_number(item.x),
        "y": _svg_number(item.y),
        "width": _svg_number(item.width),
        "height": _svg_number(item.height),
    }


def _svg_text(parent: ET.Element, item: _Text) -> None:
    attrs = {
        "x": _svg_number(item.x),
        "y": _svg_number(item.y),
        "font-size": _svg_number(item.size),
        "font-family": ", ".join(_MONO_FAMILY if item.mono else _SANS_FAMILY),
        "fill": _hex(item.rgb),
        "text-anchor": item.anchor,
    }
    if item.bold:
        attrs["font-weight"] = "bold"
    ET.SubElement(parent, "text", attrs).text = item.text


def _svg_item(root: ET.Element, item: _Item) -> None:
    match item:
        case _Text():
            _svg_text(root, item)
        case _Token():
            group = ET.SubElement(
                root, "g", {"class": "token-cell", "data-score": repr(item.score)}
            )
            ET.SubElement(group, "title").text = f"{item.text}: {item.score:.4g}"
            ET.SubElement(
                group,
                "rect",
                {
                    "class": "token",
                    **_svg_box(item),
                    "fill": _hex(item.rgb),
                },
            )
            _svg_text(group, item.label())
        case _Gradient():
            ET.SubElement(
                root,
                "rect",
                {
                    "class": "legend",
                    **_svg_box(item),
                    "fill": f"url(#{_GRADIENT_ID})",
                    "stroke": _hex(_RULE),
                    "stroke-width": "0.4",
                },
            )
        case _Line():
            ET.SubElement(
                root,
                "line",
                {
                    "x1": _svg_number(item.x1),
                    "y1": _svg_number(item.y1),
                    "x2": _svg_number(item.x2),
                    "y2": _svg_number(item.y2),
                    "stroke": _hex(_RULE),
                    "stroke-width": "0.6",
                },
            )


def to_svg(heatmap: Heatmap, options: ExportOptions | None = None) -> str:
    """The heatmap as a standalone SVG document (sizes in points).

    Built with :mod:`xml.etree.ElementTree`, so all text is escaped.  Each token is a
    ``<rect class="token">`` plus ``<text>`` inside a ``<g data-score=...>``; metadata is JSON
    in ``<metadata id="heatmap-metadata">``.
    """
    prepared = _prepare(heatmap, options)
    scene = _build_scene(prepared, options)
    width, height = _svg_number(scene.width), _svg_number(scene.height)
    root = ET.Element(
        "svg",
        {
            "xmlns": _SVG_NS,
            "version": "1.1",
            "width": f"{width}pt",
            "height": f"{height}pt",
            "viewBox": f"0 0 {width} {height}",
        },
    )
    ET.SubElement(root, "title").text = prepared.title or DEFAULT_TITLE
    ET.SubElement(root, "desc").text = _description(prepared)
    ET.SubElement(root, "metadata", {"id": "heatmap-metadata"}).text = _metadata_json(prepared)
    gradient = ET.SubElement(ET.SubElement(root, "defs"), "linearGradient", {"id": _GRADIENT_ID})
    for position, rgb in _legend_stops(prepared.scale):
        ET.SubElement(gradient, "stop", {"offset": f"{position:.4f}", "stop-color": _hex(rgb)})
    ET.SubElement(
        root, "rect", {"class": "background", "width": "100%", "height": "100%", "fill": "#ffffff"}
    )
    for item in scene.items:
        _svg_item(root, item)
    ET.indent(root, space=" ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode")


def _description(prepared: _Prepared) -> str:
    scale = prepared.scale
    rows = "; ".join(row.label for row in prepared.rows)
    return (
        f"Token attribution heatmap of {len(prepared.rows)} row(s): {rows}. "
        f"Colormap {scale.cmap}, scale {_format_number(scale.vmin)} to "
        f"{_format_number(scale.vmax)}."
    )


# --------------------------------------------------------------------------- HTML

_HTML_STYLE = """
body { font-family: var(--sans); margin: 2em; color: #111; background: #fff; }
h1 { font-size: 1.2em; margin: 0 0 1em; }
.rows { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 0.9em 1.5em;
  align-items: start; max-width: 60em; }
.label { font-family: var(--mono); font-weight: bold; font-size: 0.9em; line-height: 1.8; }
.prediction { display: block; font-weight: normal; color: #5a5a5a; line-height: 1.2; }
.tokens { display: flex; flex-wrap: wrap; gap: 0.3em 0.2em; font-family: var(--mono);
  font-size: 0.9em; }
.token { padding: 0.2em 0.35em; white-space: pre; }
.legend-caption { color: #5a5a5a; font-size: 0.85em; text-align: right; }
.legend { position: relative; width: 18em; height: 2.4em; }
.bar { height: 0.8em; border: 0.5px solid #808080; }
.tick { position: absolute; top: 1em; transform: translateX(-50%); font-size: 0.8em;
  font-family: var(--mono); }
table.settings { border-collapse: collapse; margin-top: 2em; font-size: 0.85em; }
.settings caption { text-align: left; font-weight: bold; padding-bottom: 0.3em; }
.settings th, .settings td { text-align: left; vertical-align: top; padding: 0.2em 0.8em;
  border-top: 1px solid #ddd; }
.settings td { white-space: pre-wrap; font-family: var(--mono); }
"""


def _html_fonts() -> str:
    """CSS custom properties holding the same font stacks as the SVG output."""
    return f":root {{ --mono: {', '.join(_MONO_FAMILY)}; --sans: {', '.join(_SANS_FAMILY)}; }}"


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _html_token(token: str, score: float, scale: ColorScale) -> str:
    rgb = score_to_rgb(score, scale)
    style = f"background:{_hex(rgb)};color:{_hex(text_rgb(rgb))}"
    return (
        f'<span class="token" style="{style}" title="{_e(f"score {score:.4g}")}" '
        f'data-score="{score!r}">{_e(token)}</span>'
    )


def _html_row(row: HeatmapRow, scale: ColorScale) -> str:
    prediction = f'<span class="prediction">{_e(row.prediction)}</span>' if row.prediction else ""
    tokens = "".join(_html_token(t, s, scale) for t, s in zip(row.tokens, row.scores, strict=True))
    return (
        f'<div class="label">{_e(row.label)}{prediction}</div>\n<div class="tokens">{tokens}</div>'
    )


def _html_legend(scale: ColorScale) -> str:
    stops = ", ".join(f"{_hex(rgb)} {100 * p:.1f}%" for p, rgb in _legend_stops(scale))
    ticks = "".join(
        f'<span class="tick" style="left:{100 * p:.1f}%">{_e(label)}</span>'
        for p, label in scale.ticks()
    )
    return (
        f'<div class="legend-caption">{_LEGEND_CAPTION}</div>\n'
        f'<div class="legend"><div class="bar" style="background:linear-gradient(to right, '
        f'{stops})"></div>{ticks}</div>'
    )


def to_html(heatmap: Heatmap, options: ExportOptions | None = None) -> str:
    """The heatmap as a standalone HTML5 document (also well-formed XML, i.e. polyglot XHTML).

    Tokens are ``<span class="token">`` with the colour in ``style`` and the score in
    ``title``/``data-score``; metadata goes into ``<meta>`` elements and a settings table.
    """
    prepared = _prepare(heatmap, options)
    metas = "\n".join(
        f'<meta name="{_e(k)}" content="{_e(v)}" />' for k, v in prepared.metadata.items()
    )
    settings = "\n".join(
        f'<tr><th scope="row">{_e(k)}</th><td>{_e(v)}</td></tr>'
        for k, v in prepared.metadata.items()
    )
    rows = "\n".join(_html_row(row, prepared.scale) for row in prepared.rows)
    heading = f"<h1>{_e(prepared.title)}</h1>\n" if prepared.title else ""
    return f"""<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml" lang="en">
<head>
<meta charset="utf-8" />
<meta name="viewport" content="width=device-width, initial-scale=1" />
<title>{_e(prepared.title or DEFAULT_TITLE)}</title>
<meta name="description" content="{_e(_description(prepared))}" />
{metas}
<style>{_html_fonts()}{_HTML_STYLE}</style>
</head>
<body>
<main>
{heading}<div class="rows">
{rows}
{_html_legend(prepared.scale)}
</div>
<table class="settings">
<caption>Settings</caption>
<tbody>
{settings}
</tbody>
</table>
</main>
</body>
</html>
"""


# --------------------------------------------------------------------------- LaTeX

_LATEX_ESCAPES = str.maketrans(
    {
        "\\": r"\textbackslash{}",
        "&": r"\&",
        "%": r"\%",
        "$": r"\$",
        "#": r"\#",
        "_": r"\_",
        "{": r"\{",
        "}": r"\}",
        "~": r"\textasciitilde{}",
        "^": r"\textasciicircum{}",
        "<": r"\textless{}",
        ">": r"\textgreater{}",
        "|": r"\textbar{}",
    }
)


def latex_escape(text: str) -> str:
    """Escape ``text`` for LaTeX text mode (specials become literal characters)."""
    return text.translate(_LATEX_ESCAPES)


def _latex_rgb(rgb: RGB) -> str:
    return "[RGB]{{{},{},{}}}".format(*rgb)


def _latex_token(token: str, score: float, scale: ColorScale) -> str:
    rgb = score_to_rgb(score, scale)
    text = latex_escape(token)
    return rf"\colorbox{_latex_rgb(rgb)}{{\strut\textcolor{_latex_rgb(text_rgb(rgb))}{{{text}}}}}"


def _latex_comments(prepared: _Prepared) -> list[str]:
    lines = [
        f"% {DEFAULT_TITLE} generated by {GENERATOR}.",
        r"% Needs \usepackage{xcolor} in the preamble; compile with pdflatex or lualatex.",
        "% Metadata:",
    ]
    for key, value in prepared.metadata.items():
        first, *rest = value.splitlines() or [""]
        lines.append(f"%   {key}: {first}")
        lines.extend(f"%     {continuation}" for continuation in rest)
    return lines


def _latex_legend(scale: ColorScale, cells_per_segment: int = 10) -> str:
    ticks = scale.ticks()
    parts = [rf"{{\footnotesize {_LEGEND_CAPTION}\quad {latex_escape(ticks[0][1])}}}\,"]
    for (start, _), (end, label) in itertools.pairwise(ticks):
        for i in range(cells_per_segment):
            position = start + (end - start) * (i + 0.5) / cells_per_segment
            rgb = _position_to_rgb(scale.cmap, position)
            parts.append(rf"\colorbox{_latex_rgb(rgb)}{{\strut\hspace{{4pt}}}}")
        parts.append(rf"\,{{\footnotesize {latex_escape(label)}}}\,")
    return "%\n".join(parts)


def to_latex(heatmap: Heatmap, options: ExportOptions | None = None) -> str:
    r"""A LaTeX fragment (needs ``xcolor``) drawing tokens as ``\colorbox[RGB]{r,g,b}{...}``.

    Colours are given inline, every piece of text is escaped with :func:`latex_escape`,
    and metadata is written as ``%`` comment lines at the top.  Token lines wrap at the text
    width.  Input it inside a ``figure``; see :func:`to_latex_document` for a standalone file.
    """
    prepared = _prepare(heatmap, options)
    body = [
        *_latex_comments(prepared),
        r"\begingroup",
        r"\setlength{\fboxsep}{1.5pt}%",
        r"\raggedright\ttfamily\small",
    ]
    if prepared.title:
        body.append(rf"{{\normalfont\bfseries {latex_escape(prepared.title)}}}\par\medskip")
    for row in prepared.rows:
        prediction = latex_escape(row.prediction) if row.prediction else ""
        body.append(
            rf"\noindent{{\normalfont\bfseries {latex_escape(row.label)}}}\hfill{{\footnotesize "
            rf"{prediction}}}\par\nopagebreak"
        )
        tokens = (
            _latex_token(t, s, prepared.scale) for t, s in zip(row.tokens, row.scores, strict=True)
        )
        body.append("\\hspace{1pt}\\allowbreak%\n".join(tokens) + r"\par\medskip")
    body += [
        r"{\setlength{\fboxsep}{0pt}%",
        _latex_legend(prepared.scale) + r"\par}",
        r"\endgroup",
        "",
    ]
    return "\n".join(body)


def to_latex_document(heatmap: Heatmap, options: ExportOptions | None = None) -> str:
    """:func:`to_latex` wrapped in a minimal ``article`` document that compiles standalone."""
    return "\n".join(
        [
            r"\documentclass{article}",
            r"\usepackage[T1]{fontenc}",
            r"\IfFileExists{lmodern.sty}{\usepackage{lmodern}}{}",
            r"\usepackage[table]{xcolor}",
            r"\pagestyle{empty}",
            r"\begin{document}",
            to_latex(heatmap, options),
            r"\end{document}",
            "",
        ]
    )


# --------------------------------------------------------------------------- PDF / PNG

_ANCHOR_TO_HA = {"start": "left", "middle": "center", "end": "right"}
# fonts that draw any character as a box holding its code point: they cover nothing
_PLACEHOLDER_FONTS = ("Last Resort",)


@cache
def _charmap(path: str) -> frozenset[int]:
    """The code points a font file has glyphs for."""
    from matplotlib.ft2font import FT2Font

    try:
        return frozenset(FT2Font(path).get_charmap())
    except (OSError, RuntimeError):  # an unreadable font covers nothing
        return frozenset()


@cache
def _font_file(family: str) -> str | None:
    """The file matplotlib draws ``family``'s regular face from (None: not installed)."""
    from matplotlib import font_manager

    quiet = logging.getLogger(font_manager.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "failed to find font weight normal": the nearest will do
    try:
        return font_manager.findfont(
            font_manager.FontProperties(family=family), fallback_to_default=False
        )
    except ValueError:
        return None
    finally:
        quiet.setLevel(level)


@lru_cache(maxsize=1)
def _installed_families() -> tuple[str, ...]:
    """The font families matplotlib finds on this system (its own and the system's)."""
    from matplotlib import font_manager

    names = {entry.name for entry in font_manager.fontManager.ttflist}
    return tuple(sorted(n for n in names if not n.startswith(_PLACEHOLDER_FONTS)))


def font_fallback(texts: Iterable[str], family: str) -> tuple[list[str], list[str]]:
    """The family list that draws ``texts`` in PNG and PDF: ``family`` first, then installed
    families that have the characters it lacks (matplotlib falls back along the list, glyph by
    glyph); and the characters no installed font has, which would be drawn as boxes."""
    primary = _font_file(family)
    families = [family]
    covered = set(_charmap(primary)) if primary else set()
    missing = []
    wanted = {c for text in texts for c in text if not c.isspace() and c.isprintable()}
    for character in sorted(wanted, key=ord):
        if ord(character) in covered:
            continue
        for name in _installed_families():
            path = _font_file(name)
            if path and ord(character) in _charmap(path):
                families.append(name)
                covered |= _charmap(path)
                break
        else:
            missing.append(character)
    return families, missing


def _scene_fonts(scene: _Scene) -> tuple[dict[bool, list[str]], list[str]]:
    """The family lists of the scene's monospace and sans-serif text (keyed by ``mono``) and
    the characters that no installed font can draw."""
    texts: dict[bool, list[str]] = {True: [], False: []}
    for item in scene.items:
        text = item.label() if isinstance(item, _Token) else item
        if isinstance(text, _Text):
            texts[text.mono].append(text.text)
    fonts, missing = {}, []
    for mono, base in ((True, _MONO_FAMILY[0]), (False, _SANS_FAMILY[0])):
        fonts[mono], lacking = font_fallback(texts[mono], base)
        missing += [c for c in lacking if c not in missing]
    return fonts, missing


def undrawable_characters(heatmap: Heatmap, options: ExportOptions | None = None) -> list[str]:
    """The characters of ``heatmap`` that no installed font has: PNG and PDF draw them as
    boxes (SVG, HTML and LaTeX leave the fonts to the viewer)."""
    prepared = _prepare(heatmap, options)
    return _scene_fonts(_build_scene(prepared, options))[1]


def describe_characters(characters: Sequence[str]) -> str:
    """``"中 (U+4E2D), 文 (U+6587)"``: characters with their code points."""
    return ", ".join(f"{c} (U+{ord(c):04X})" for c in characters)


def _mpl_text(ax, item: _Text, fonts: dict[bool, list[str]]) -> None:
    ax.text(
        item.x,
        item.y,
        item.text,
        fontsize=item.size,
        color=_hex(item.rgb),
        ha=_ANCHOR_TO_HA[item.anchor],
        va="baseline",
        fontweight="bold" if item.bold else "normal",
        fontfamily=fonts[item.mono],
        parse_math=False,
        usetex=False,
    )


def _mpl_item(ax, item: _Item, fonts: dict[bool, list[str]]) -> None:
    match item:
        case _Text():
            _mpl_text(ax, item, fonts)
        case _Token():
            ax.add_patch(
                Rectangle(
                    (item.x, item.y), item.width, item.height, facecolor=_hex(item.rgb), linewidth=0
                )
            )
            _mpl_text(ax, item.label(), fonts)
        case _Gradient():
            positions = np.linspace(0, 1, 256)
            stops = np.array([p for p, _ in item.stops])
            colours = np.array([rgb for _, rgb in item.stops], dtype=float)
            strip = np.stack([np.interp(positions, stops, colours[:, c]) for c in range(3)], -1)
            ax.imshow(
                strip[np.newaxis].astype(np.uint8),
                aspect="auto",
                interpolation="bilinear",
                extent=(item.x, item.x + item.width, item.y + item.height, item.y),
            )
            ax.add_patch(
                Rectangle(
                    (item.x, item.y),
                    item.width,
                    item.height,
                    fill=False,
                    edgecolor=_hex(_RULE),
                    linewidth=0.4,
                )
            )
        case _Line():
            ax.plot([item.x1, item.x2], [item.y1, item.y2], color=_hex(_RULE), linewidth=0.6)


def _render(
    heatmap: Heatmap,
    path: Path,
    fmt: str,
    dpi: float,
    options: ExportOptions | None,
) -> Path:
    prepared = _prepare(heatmap, options)
    scene = _build_scene(prepared, options)
    fonts, missing = _scene_fonts(scene)
    if missing:  # recorded in the file: its boxes are characters no installed font has
        prepared.metadata["characters_not_drawn"] = describe_characters(missing)
    title = prepared.title or DEFAULT_TITLE
    if fmt == "pdf":
        labels = ", ".join(row.label for row in prepared.rows)
        metadata = {
            "Title": title,
            "Subject": _metadata_json(prepared),
            "Keywords": f"token attribution, heatmap, {labels}",
            "Creator": GENERATOR,
        }
    else:
        metadata = {
            "Title": title,
            "Description": _metadata_json(prepared),
            "Software": f"{GENERATOR} (matplotlib {matplotlib.__version__})",
        }
    # TrueType (42) instead of Type 3 fonts: many venues reject PDFs with Type 3 fonts.
    with (
        matplotlib.rc_context({"pdf.fonttype": 42, "text.usetex": False}),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", "Glyph .* missing from font", UserWarning)  # in metadata
        fig = Figure(figsize=(scene.width / 72, scene.height / 72), dpi=dpi)
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_axis_off()
        for item in scene.items:
            _mpl_item(ax, item, fonts)
        ax.set_xlim(0, scene.width)
        ax.set_ylim(scene.height, 0)
        fig.savefig(path, format=fmt, dpi=dpi, metadata=metadata, facecolor="white")
    return path


def to_pdf(heatmap: Heatmap, path: str | Path, options: ExportOptions | None = None) -> Path:
    """Render to a vector PDF (TrueType fonts); metadata goes into the document info."""
    return _render(heatmap, Path(path), "pdf", 300, options)


def to_png(
    heatmap: Heatmap, path: str | Path, dpi: float = 200, options: ExportOptions | None = None
) -> Path:
    """Render to a PNG at ``dpi``; metadata goes into PNG text chunks."""
    return _render(heatmap, Path(path), "png", dpi, options)


# --------------------------------------------------------------------------- dispatch


def export(
    heatmap: Heatmap,
    path: str | Path,
    fmt: str | None = None,
    dpi: float = 200,
    options: ExportOptions | None = None,
) -> Path:
    """Write ``heatmap`` to ``path`` in the format named by ``fmt`` or the path's suffix.

    ``.tex`` writes the :func:`to_latex` fragment (for ``\\input``); ``dpi`` only affects PNG.
    """
    path = Path(path)
    suffix = (fmt or path.suffix).lower()
    suffix = suffix if suffix.startswith(".") else f".{suffix}"
    if suffix not in FORMATS:
        raise ValueError(
            f"unsupported heatmap format {suffix!r} for {path}; "
            f"expected one of {', '.join(FORMATS)}"
        )
    if suffix == ".pdf":
        return to_pdf(heatmap, path, options)
    if suffix == ".png":
        return to_png(heatmap, path, dpi, options)
    writers = {".svg": to_svg, ".html": to_html, ".tex": to_latex}
    path.write_text(writers[suffix](heatmap, options), encoding="utf-8")
    return path
