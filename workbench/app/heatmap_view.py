"""The app's heatmap: an HTML table with a row per model and the tokens aligned in columns, on
the shared colour scale and with the colours of :mod:`workbench.export` (so the app and the
exported files look the same); every piece of text is escaped."""

from __future__ import annotations

import html
from collections.abc import Mapping

import streamlit as st

from workbench.export import Heatmap, color_scale, token_cell
from workbench.export.scale import hex_color, legend_stops

_VIEW_STYLE = """
<style>
.kdw-heatmap { overflow-x: auto; padding-bottom: 0.4em; }
.kdw-heatmap table { border-collapse: separate; border-spacing: 2px 5px; }
.kdw-heatmap th { text-align: left; padding: 0 1em 0 0; font-weight: 600; white-space: nowrap;
  vertical-align: middle; font-size: 0.85em; }
.kdw-heatmap .kdw-sub { display: block; font-weight: normal; color: #555; font-size: 0.9em; }
.kdw-heatmap td.kdw-token { font-family: monospace; padding: 0.25em 0.3em; white-space: pre;
  border-radius: 2px; font-size: 0.9em; }
.kdw-legend { display: flex; align-items: center; gap: 0.6em; font-size: 0.8em; color: #555;
  margin-top: 0.3em; }
.kdw-legend .kdw-bar { width: 16em; height: 0.8em; border: 1px solid #999; }
</style>
"""


def heatmap_html(heatmap: Heatmap, notes: Mapping[str, str] | None = None) -> str:
    """The heatmap as an HTML table: one row per model, tokens aligned in columns, all rows on
    the export's shared colour scale and colours;
    ``notes[row label]`` (agreement with the teacher) goes under the row's label; the cells are
    the export's (:func:`workbench.export.token_cell`): hovering one shows its token and score."""
    scale = color_scale(s for row in heatmap.rows for s in row.scores)
    e = html.escape
    rows = []
    for row in heatmap.rows:
        cells = [
            token_cell(token, score, scale, element="td", css_class="kdw-token")
            for token, score in zip(row.tokens, row.scores, strict=True)
        ]
        sub = [row.prediction or "", (notes or {}).get(row.label, "")]
        label = e(row.label) + "".join(f'<span class="kdw-sub">{e(s)}</span>' for s in sub if s)
        rows.append(f'<tr class="kdw-row"><th>{label}</th>{"".join(cells)}</tr>')
    stops = ", ".join(f"{hex_color(rgb)} {100 * p:.1f}%" for p, rgb in legend_stops(scale))
    ticks = [label for _, label in scale.ticks()]
    legend = (
        f'<div class="kdw-legend"><span>{e(ticks[0])}</span><div class="kdw-bar" '
        f'style="background:linear-gradient(to right, {stops})"></div>'
        f"<span>{e(ticks[-1])}</span><span>{e(scale.cmap)}, shared by all rows</span></div>"
    )
    return f'{_VIEW_STYLE}<div class="kdw-heatmap"><table>{"".join(rows)}</table>{legend}</div>'


def show_heatmap(heatmap: Heatmap, notes: Mapping[str, str] | None = None) -> None:
    st.html(heatmap_html(heatmap, notes))
