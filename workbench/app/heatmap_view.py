"""The app's heatmap: a row per model whose tokens wrap to the page's width, on the shared colour
scale (or one per row) and with the colours of :mod:`workbench.export` (so the app and the
exported files look the same); every piece of text is escaped."""

from __future__ import annotations

import html
from collections.abc import Mapping

import streamlit as st

from workbench.export import Heatmap, color_scale, token_cell
from workbench.export.scale import hex_color, legend_stops

_VIEW_STYLE = """
<style>
.kdw-heatmap .kdw-row { display: flex; gap: 1em; align-items: flex-start; margin: 0.45em 0; }
.kdw-heatmap .kdw-label { flex: 0 0 11em; font-weight: 600; font-size: 0.85em;
  overflow-wrap: anywhere; }
.kdw-heatmap .kdw-sub { display: block; font-weight: normal; color: #555; font-size: 0.9em; }
.kdw-heatmap .kdw-cells { display: flex; flex-wrap: wrap; gap: 4px 2px; min-width: 0; }
.kdw-heatmap .kdw-token { font-family: monospace; padding: 0.25em 0.3em; white-space: pre;
  border-radius: 2px; font-size: 0.9em; }
.kdw-heatmap .kdw-columns { overflow-x: auto; }
.kdw-heatmap .kdw-columns table { border-spacing: 2px 4px; border: none; }
.kdw-heatmap .kdw-columns th, .kdw-heatmap .kdw-columns td { border: none; padding: 0; }
.kdw-heatmap .kdw-columns td.kdw-token { padding: 0.25em 0.3em; text-align: center; }
.kdw-legend { display: flex; align-items: center; gap: 0.6em; font-size: 0.8em; color: #555;
  margin-top: 0.3em; }
.kdw-legend .kdw-bar { width: 16em; height: 0.8em; border: 1px solid #999; }
</style>
"""


def heatmap_html(
    heatmap: Heatmap, notes: Mapping[str, str] | None = None, per_row: bool = False
) -> str:
    """The heatmap as HTML: one row per model, its tokens wrapping to the page's width (rows of
    one tokenizer wrap at the same tokens, their cells being the same width), or for a heatmap
    in columns (:attr:`~workbench.export.Heatmap.columns`: words of models of different
    tokenizers) one table whose columns are the words, scrolling sideways, in the export's
    colours on the scale all rows share — or, ``per_row``, each row on a scale of its own, its
    bounds under its label (a teacher's faint map beside a student's strong one). ``notes[row
    label]`` (agreement with the teacher) goes under the label too; the cells are the export's
    (:func:`workbench.export.token_cell`): hovering one shows its token and score."""

    def scored(scores: list) -> list[float]:
        return [s for s in scores if s is not None]

    shared = color_scale(s for row in heatmap.rows for s in scored(row.scores))
    scales = [color_scale(scored(row.scores)) if per_row else shared for row in heatmap.rows]
    e = html.escape
    rows = []
    for row, scale in zip(heatmap.rows, scales, strict=True):
        element = "td" if heatmap.columns else "span"
        cells = [
            f"<{element}></{element}>"
            if score is None
            else token_cell(token, score, scale, element=element, css_class="kdw-token")
            for token, score in zip(row.tokens, row.scores, strict=True)
        ]
        bounds = f"scale {scale.ticks()[0][1]} to {scale.ticks()[-1][1]}" if per_row else ""
        sub = [row.prediction or "", (notes or {}).get(row.label, ""), bounds]
        label = e(row.label) + "".join(f'<span class="kdw-sub">{e(s)}</span>' for s in sub if s)
        if heatmap.columns:
            rows.append(f'<tr><th class="kdw-label">{label}</th>{"".join(cells)}</tr>')
        else:
            rows.append(
                f'<div class="kdw-row"><div class="kdw-label">{label}</div>'
                f'<div class="kdw-cells">{"".join(cells)}</div></div>'
            )
    if heatmap.columns:  # one table: the rows' words stand in columns
        rows = [f'<div class="kdw-columns"><table>{"".join(rows)}</table></div>']
    stops = ", ".join(f"{hex_color(rgb)} {100 * p:.1f}%" for p, rgb in legend_stops(shared))
    ticks = [label for _, label in shared.ticks()]
    ends = ("low", "high") if per_row else (ticks[0], ticks[-1])
    which = "each row on its own scale" if per_row else "shared by all rows"
    legend = (
        f'<div class="kdw-legend"><span>{e(ends[0])}</span><div class="kdw-bar" '
        f'style="background:linear-gradient(to right, {stops})"></div>'
        f"<span>{e(ends[1])}</span><span>{e(', '.join(sorted({s.cmap for s in scales})))}, "
        f"{which}</span></div>"
    )
    return f'{_VIEW_STYLE}<div class="kdw-heatmap">{"".join(rows)}{legend}</div>'


def show_heatmap(
    heatmap: Heatmap, notes: Mapping[str, str] | None = None, per_row: bool = False
) -> None:
    st.html(heatmap_html(heatmap, notes, per_row))
