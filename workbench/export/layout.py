"""The shared layout: a scene of texts, token boxes, the legend's gradient and rules, measured
once and drawn by the SVG and raster writers alike.

Coordinates are points (1/72 in), origin top-left, y growing downwards. SVG, PDF and PNG draw the
same scene, so they look alike. All text except the title is monospace, whose advance width
(~0.60 em in DejaVu Sans Mono, Menlo, Consolas) makes widths predictable."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Literal

from workbench.export.model import ExportOptions, HeatmapRow, _Prepared
from workbench.export.scale import (
    _BLACK,
    _GREY,
    RGB,
    ColorScale,
    legend_stops,
    score_to_rgb,
    text_rgb,
)

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
        x, y = self.x + self.width / 2, _baseline(self.y + self.height / 2, self.size)
        return _Text(x, y, self.text, self.size, text_rgb(self.rgb), anchor="middle")


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


_Cell = tuple[float, float, str, float | None]  # x, width, token, score (None: blank)


def _cell_width(token: str, size: float) -> float:
    return max(_text_width(token, size), _text_width("m", size)) + 0.7 * size


def _fill(
    widths: list[float], left: float, right: float, gap: float
) -> list[list[tuple[int, float]]]:
    """Greedy line filling: lines of ``(index, x)`` of boxes of ``widths`` between left and
    right, ``gap`` apart (at least one box a line)."""
    lines: list[list[tuple[int, float]]] = [[]]
    x = left
    for index, width in enumerate(widths):
        if lines[-1] and x + width > right:
            lines.append([])
            x = left
        lines[-1].append((index, x))
        x += width + gap
    return lines


def _column_blocks(
    rows: list[HeatmapRow], left: float, right: float, size: float
) -> list[list[list[_Cell]]]:
    """Rows whose cells are columns (:attr:`Heatmap.columns`) in blocks of columns that fit
    between left and right: ``blocks[b][r]`` is row ``r``'s cells ``(x, width, token, score)``
    in block ``b``, each column as wide as its widest cell, so that the rows' words stand one
    above the other. A row alone gets its tokens wrapped in lines, one block a line."""
    cells = zip(*(row.tokens for row in rows), strict=True)
    widths = [max(_cell_width(token, size) for token in column) for column in cells]
    return [
        [[(x, widths[c], row.tokens[c], row.scores[c]) for c, x in block] for row in rows]
        for block in _fill(widths, left, right, 0.25 * size)
    ]


def _legend_items(
    scale: ColorScale, x: float, y: float, width: float, size: float
) -> tuple[list[_Item], float, float]:
    """Caption, gradient bar and ticks; also returns the legend's bottom and right edges."""
    bar_h, tick_len, tick_size = 0.9 * size, 0.3 * size, _TICK_SCALE * size
    label_y, caption_y = y + bar_h + tick_len + tick_size, _baseline(y + bar_h / 2, tick_size)
    items: list[_Item] = [
        _Text(x - 1.5 * size, caption_y, _LEGEND_CAPTION, tick_size, _GREY, anchor="end"),
        _Gradient(x, y, width, bar_h, tuple(legend_stops(scale))),
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

    # bands of lines beside a label: a row's wrapped lines, or in columns a row's line of each
    # block of columns (its prediction under its label in the first block only)
    if prepared.columns:
        blocks = _column_blocks(prepared.rows, left, right, size)
        bands = [
            (row, [line], b == 0)
            for b, block in enumerate(blocks)
            for row, line in zip(prepared.rows, block, strict=True)
        ]
    else:
        bands = [
            (row, [line for (line,) in _column_blocks([row], left, right, size)], True)
            for row in prepared.rows
        ]
    for number, (row, lines, first) in enumerate(bands):
        for i, line in enumerate(lines):
            top = y + i * (box_h + line_gap)
            for x, width, token, score in line:
                if score is not None:
                    rgb = score_to_rgb(score, prepared.scale)
                    items.append(_Token(x, top, width, box_h, token, score, rgb, size))
            right_edge = max(right_edge, line[-1][0] + line[-1][1])
        label_y = _baseline(y + box_h / 2, size)
        items.append(_Text(margin, label_y, row.label, size, bold=True))
        label_h = box_h
        if row.prediction and first:
            items.append(
                _Text(margin, label_y + 1.35 * pred_size, row.prediction, pred_size, _GREY)
            )
            label_h += 1.35 * pred_size
        lines_h = len(lines) * box_h + (len(lines) - 1) * line_gap
        y += max(lines_h, label_h) + row_gap
        if prepared.columns and (number + 1) % len(prepared.rows) == 0 < len(bands) - number - 1:
            y += row_gap  # a block's rows apart from the next block's

    bar_w = max(12 * size, min(24 * size, right_edge - left))
    y += 0.2 * size
    legend, bottom, legend_right = _legend_items(prepared.scale, left, y, bar_w, size)
    items.extend(legend)
    return _Scene(max(right_edge, legend_right) + margin, bottom + margin, tuple(items))
