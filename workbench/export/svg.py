"""SVG: the scene as SVG elements, with ``<title>``, ``<desc>`` and JSON ``<metadata>``."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from workbench.export.layout import (
    _MONO_FAMILY,
    _SANS_FAMILY,
    _build_scene,
    _Gradient,
    _Item,
    _Line,
    _Text,
    _Token,
)
from workbench.export.model import (
    DEFAULT_TITLE,
    ExportOptions,
    Heatmap,
    _description,
    _metadata_json,
    _prepare,
)
from workbench.export.scale import _RULE, hex_color, legend_stops

_SVG_NS = "http://www.w3.org/2000/svg"
_GRADIENT_ID = "attribution-scale"


def _svg_number(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _svg_box(item: _Token | _Gradient) -> dict[str, str]:
    return {k: _svg_number(getattr(item, k)) for k in ("x", "y", "width", "height")}


def _svg_text(parent: ET.Element, item: _Text) -> None:
    attrs = {
        "x": _svg_number(item.x),
        "y": _svg_number(item.y),
        "font-size": _svg_number(item.size),
        "font-family": ", ".join(_MONO_FAMILY if item.mono else _SANS_FAMILY),
        "fill": hex_color(item.rgb),
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
                group, "rect", {"class": "token", **_svg_box(item), "fill": hex_color(item.rgb)}
            )
            _svg_text(group, item.label())
        case _Gradient():
            paint = {"fill": f"url(#{_GRADIENT_ID})", "stroke": hex_color(_RULE)}
            ET.SubElement(
                root, "rect", {"class": "legend", **_svg_box(item), **paint, "stroke-width": "0.4"}
            )
        case _Line():
            ends = {k: _svg_number(getattr(item, k)) for k in ("x1", "y1", "x2", "y2")}
            ET.SubElement(root, "line", {**ends, "stroke": hex_color(_RULE), "stroke-width": "0.6"})


def to_svg(heatmap: Heatmap, options: ExportOptions | None = None) -> str:
    """The heatmap as a standalone SVG document (sizes in points).

    Built with :mod:`xml.etree.ElementTree`, so all text is escaped.  Each token is a
    ``<rect class="token">`` plus ``<text>`` inside a ``<g data-score=...>``; metadata is JSON
    in ``<metadata id="heatmap-metadata">``.
    """
    prepared = _prepare(heatmap, options)
    scene = _build_scene(prepared, options)
    width, height = _svg_number(scene.width), _svg_number(scene.height)
    size = {"width": f"{width}pt", "height": f"{height}pt", "viewBox": f"0 0 {width} {height}"}
    root = ET.Element("svg", {"xmlns": _SVG_NS, "version": "1.1", **size})
    ET.SubElement(root, "title").text = prepared.title or DEFAULT_TITLE
    ET.SubElement(root, "desc").text = _description(prepared)
    ET.SubElement(root, "metadata", {"id": "heatmap-metadata"}).text = _metadata_json(prepared)
    gradient = ET.SubElement(ET.SubElement(root, "defs"), "linearGradient", {"id": _GRADIENT_ID})
    for position, rgb in legend_stops(prepared.scale):
        ET.SubElement(gradient, "stop", {"offset": f"{position:.4f}", "stop-color": hex_color(rgb)})
    ET.SubElement(
        root, "rect", {"class": "background", "width": "100%", "height": "100%", "fill": "#ffffff"}
    )
    for item in scene.items:
        _svg_item(root, item)
    ET.indent(root, space=" ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode")
