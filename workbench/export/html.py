"""HTML: a standalone polyglot XHTML document, and the token cell the app's heatmap rows reuse."""

from __future__ import annotations

import html

from workbench.export.layout import _LEGEND_CAPTION, _MONO_FAMILY, _SANS_FAMILY
from workbench.export.model import (
    DEFAULT_TITLE,
    ExportOptions,
    Heatmap,
    HeatmapRow,
    _description,
    _prepare,
)
from workbench.export.scale import ColorScale, hex_color, legend_stops, score_to_rgb, text_rgb

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
.columns { grid-column: 1 / -1; overflow-x: auto; }
.columns table { border-spacing: 0.2em 0.3em; font-family: var(--mono); font-size: 0.9em; }
.columns td.token { text-align: center; }
.columns th { text-align: left; padding-right: 1.3em; }
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


# CSS custom properties holding the same font stacks as the SVG output
_HTML_FONTS = f":root {{ --mono: {', '.join(_MONO_FAMILY)}; --sans: {', '.join(_SANS_FAMILY)}; }}"


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def token_cell(
    token: str, score: float, scale: ColorScale, element: str = "span", css_class: str = "token"
) -> str:
    """One token as an HTML element on ``scale``'s colours: the score in ``data-score`` (exact)
    and, with the token, in ``title`` (6 significant digits, shown on hover). The app's heatmap
    rows are made of these cells too (as ``<td>``s, so the rows' tokens align in columns)."""
    rgb = score_to_rgb(score, scale)
    style = f"background:{hex_color(rgb)};color:{hex_color(text_rgb(rgb))}"
    return (
        f'<{element} class="{css_class}" style="{style}" title="{_e(f"{token}: {score:.6g}")}" '
        f'data-score="{score!r}">{_e(token)}</{element}>'
    )


def _label(row: HeatmapRow) -> str:
    """The row's label, with its prediction under it."""
    prediction = f'<span class="prediction">{_e(row.prediction)}</span>' if row.prediction else ""
    return _e(row.label) + prediction


def _html_row(row: HeatmapRow, scale: ColorScale) -> str:
    tokens = "".join(token_cell(t, s, scale) for t, s in zip(row.tokens, row.scores, strict=True))
    return f'<div class="label">{_label(row)}</div>\n<div class="tokens">{tokens}</div>'


def _html_columns(rows: list[HeatmapRow], scale: ColorScale) -> str:
    """Rows in columns (:attr:`Heatmap.columns`): one table, a line per row and a column per
    word (an empty cell where a row lacks it), scrolling sideways where it is wider than the
    page."""
    lines = []
    for row in rows:
        cells = "".join(
            "<td></td>" if s is None else token_cell(t, s, scale, element="td")
            for t, s in zip(row.tokens, row.scores, strict=True)
        )
        lines.append(f'<tr><th class="label" scope="row">{_label(row)}</th>{cells}</tr>')
    return '<div class="columns"><table>\n' + "\n".join(lines) + "\n</table></div>"


def _html_legend(scale: ColorScale) -> str:
    stops = ", ".join(f"{hex_color(rgb)} {100 * p:.1f}%" for p, rgb in legend_stops(scale))
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
    ``title``/``data-score`` (``<td>`` cells of one table for rows in columns); metadata goes
    into ``<meta>`` elements and a settings table.
    """
    prepared = _prepare(heatmap, options)
    metas = "\n".join(
        f'<meta name="{_e(k)}" content="{_e(v)}" />' for k, v in prepared.metadata.items()
    )
    settings = "\n".join(
        f'<tr><th scope="row">{_e(k)}</th><td>{_e(v)}</td></tr>'
        for k, v in prepared.metadata.items()
    )
    if prepared.columns:
        rows = _html_columns(prepared.rows, prepared.scale)
    else:
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
<style>{_HTML_FONTS}{_HTML_STYLE}</style>
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
