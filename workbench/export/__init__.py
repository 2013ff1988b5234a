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

from pathlib import Path

from workbench.export.html import to_html, token_cell
from workbench.export.latex import latex_escape, to_latex, to_latex_document
from workbench.export.model import ExportOptions, Heatmap, HeatmapRow, merge_wordpieces
from workbench.export.raster import (
    MAX_PNG_PIXELS,
    check_png_size,
    describe_characters,
    font_fallback,
    to_pdf,
    to_png,
    undrawable_characters,
)
from workbench.export.scale import (
    DIVERGING_CMAP,
    SEQUENTIAL_CMAP,
    ColorScale,
    color_scale,
    score_to_rgb,
    text_rgb,
)
from workbench.export.svg import to_svg

__all__ = [
    "DIVERGING_CMAP",
    "FORMATS",
    "MAX_PNG_PIXELS",
    "SEQUENTIAL_CMAP",
    "ColorScale",
    "ExportOptions",
    "Heatmap",
    "HeatmapRow",
    "check_png_size",
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
    "token_cell",
    "undrawable_characters",
]


_TEXTS = {".html": to_html, ".svg": to_svg, ".tex": to_latex}  # the formats written as text
FORMATS = (".html", ".pdf", ".png", ".svg", ".tex")


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
    if suffix == ".png":
        return to_png(heatmap, path, dpi, options)
    if suffix == ".pdf":
        return to_pdf(heatmap, path, options)
    path.write_text(_TEXTS[suffix](heatmap, options), encoding="utf-8")
    return path
