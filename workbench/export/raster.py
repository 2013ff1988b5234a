"""PDF and PNG through matplotlib, with font fallback over the installed families (characters
no font covers are reported, never drawn as boxes silently)."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterable, Sequence
from functools import cache, lru_cache
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from workbench.core.errors import WorkbenchError
from workbench.export.layout import (
    _MONO_FAMILY,
    _SANS_FAMILY,
    _build_scene,
    _Gradient,
    _Item,
    _Line,
    _Scene,
    _Text,
    _Token,
)
from workbench.export.model import (
    DEFAULT_TITLE,
    GENERATOR,
    ExportOptions,
    Heatmap,
    _metadata_json,
    _prepare,
)
from workbench.export.scale import _RULE, hex_color

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
    return _scene_fonts(_build_scene(_prepare(heatmap, options), options))[1]


def describe_characters(characters: Sequence[str]) -> str:
    """``"中 (U+4E2D), 文 (U+6587)"``: characters with their code points."""
    return ", ".join(f"{c} (U+{ord(c):04X})" for c in characters)


def _mpl_text(ax, item: _Text, fonts: dict[bool, list[str]]) -> None:
    ax.text(
        item.x,
        item.y,
        item.text,
        fontsize=item.size,
        color=hex_color(item.rgb),
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
            box = (item.x, item.y), item.width, item.height
            ax.add_patch(Rectangle(*box, facecolor=hex_color(item.rgb), linewidth=0))
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
            box = (item.x, item.y), item.width, item.height
            ax.add_patch(Rectangle(*box, fill=False, edgecolor=hex_color(_RULE), linewidth=0.4))
        case _Line():
            ax.plot([item.x1, item.x2], [item.y1, item.y2], color=hex_color(_RULE), linewidth=0.6)


MAX_PNG_PIXELS = 100_000_000
"""The most pixels of a PNG: matplotlib draws it into a buffer of 4 bytes a pixel (400 MB here)
before compressing it."""
MAX_PNG_SIDE = 2**16 - 1  # matplotlib's Agg renderer draws nothing wider or taller


def check_png_size(heatmap: Heatmap, dpi: float, options: ExportOptions | None = None) -> None:
    """A PNG over :data:`MAX_PNG_PIXELS` pixels or :data:`MAX_PNG_SIDE` on a side is a one-line
    error that names the largest ``dpi`` that fits."""
    scene = _build_scene(_prepare(heatmap, options), options)
    width, height = math.ceil(scene.width / 72 * dpi), math.ceil(scene.height / 72 * dpi)
    if width * height <= MAX_PNG_PIXELS and max(width, height) <= MAX_PNG_SIDE:
        return
    fits = dpi * min(
        math.sqrt(MAX_PNG_PIXELS / (width * height)), MAX_PNG_SIDE / max(width, height)
    )
    raise WorkbenchError(
        f"a PNG of {width:,}×{height:,} pixels at {dpi:g} dpi: the limit is "
        f"{MAX_PNG_PIXELS / 1e6:g} megapixels and {MAX_PNG_SIDE:,} pixels a side; use a dpi of "
        f"at most {math.floor(fits * 0.99)}, or PDF or SVG (vectors)"
    )


def _render(
    heatmap: Heatmap, path: Path, fmt: str, dpi: float, options: ExportOptions | None
) -> Path:
    prepared = _prepare(heatmap, options)
    scene = _build_scene(prepared, options)
    fonts, missing = _scene_fonts(scene)
    if missing:  # recorded in the file: its boxes are characters no installed font has
        prepared.metadata["characters_not_drawn"] = describe_characters(missing)
    metadata = {"Title": prepared.title or DEFAULT_TITLE}
    if fmt == "pdf":
        labels = ", ".join(row.label for row in prepared.rows)
        metadata |= {
            "Subject": _metadata_json(prepared),
            "Keywords": f"token attribution, heatmap, {labels}",
            "Creator": GENERATOR,
        }
    else:
        metadata |= {
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
    """Render to a PNG at ``dpi``; metadata goes into PNG text chunks. A PNG over
    :data:`MAX_PNG_PIXELS` is refused (:func:`check_png_size`)."""
    check_png_size(heatmap, dpi, options)
    return _render(heatmap, Path(path), "png", dpi, options)
