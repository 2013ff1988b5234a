"""Token attribution heatmap export: structure, escaping, metadata and colours of every format."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import debian_package
from workbench.export import (
    DIVERGING_CMAP,
    SEQUENTIAL_CMAP,
    ExportOptions,
    Heatmap,
    HeatmapRow,
    color_scale,
    export,
    latex_escape,
    score_to_rgb,
    text_rgb,
    to_html,
    to_latex,
    to_latex_document,
    to_pdf,
    to_png,
    to_svg,
)

SVG = "{http://www.w3.org/2000/svg}"
XHTML = "{http://www.w3.org/1999/xhtml}"
HOSTILE = "<script>alert(1)</script>"
METADATA = {"teacher": "bert-base run teacher-01", "method": "integrated gradients"}


def _heatmap(**overrides) -> Heatmap:
    rows = [
        HeatmapRow(
            "teacher (run teacher-01)",
            ["[CLS]", "great", "movie", "not", "$x$", "[SEP]", "[PAD]"],
            [0.05, 0.8, 0.3, -0.6, 0.1, 0.0, 0.0],
            "positive 0.91",
        ),
        HeatmapRow(
            "student kd",
            ["[CLS]", "great", "##ly", HOSTILE, "&", "[SEP]"],
            [0.0, 0.8, 0.2, -0.2, 0.4, 0.01],
        ),
    ]
    fields = {"rows": rows, "title": "IG: teacher vs student", "metadata": dict(METADATA)}
    return Heatmap(**{**fields, **overrides})


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def _scale_of(heatmap: Heatmap):
    """The scale the exporters should use by default ([PAD] dropped)."""
    return color_scale(
        s
        for row in heatmap.rows
        for t, s in zip(row.tokens, row.scores, strict=True)
        if t != "[PAD]"
    )


# --------------------------------------------------------------------------- parsers


def _svg_cells(svg: str) -> list[tuple[str, float, str]]:
    """``(token text, score, fill)`` for every token cell of an SVG."""
    root = ET.fromstring(svg)
    cells = []
    for group in root.iter(f"{SVG}g"):
        if group.get("class") == "token-cell":
            rect, text = group.find(f"{SVG}rect"), group.find(f"{SVG}text")
            cells.append((text.text, float(group.get("data-score")), rect.get("fill")))
    return cells


def _html_cells(document: str) -> list[tuple[str, float, str]]:
    root = ET.fromstring(document)
    cells = []
    for span in root.iter(f"{XHTML}span"):
        if span.get("class") == "token":
            background = re.search(r"background:(#[0-9a-f]{6})", span.get("style")).group(1)
            cells.append((span.text, float(span.get("data-score")), background))
    return cells


_COLORBOX = re.compile(
    r"\\colorbox\[RGB\]\{(\d+),(\d+),(\d+)\}\{\\strut\\textcolor\[RGB\]\{[\d,]+\}\{(.*)\}\}"
)


def _latex_cells(tex: str) -> list[tuple[str, str]]:
    """``(escaped token, fill)`` for every token box of a LaTeX fragment."""
    return [
        (m.group(4), _hex((int(m.group(1)), int(m.group(2)), int(m.group(3)))))
        for line in tex.splitlines()
        if (m := _COLORBOX.match(line.removesuffix(r"\hspace{1pt}\allowbreak%")))
    ]


class _TagBalance(HTMLParser):
    """Records start tags and checks that every non-void element is closed in order."""

    VOID = frozenset({"meta", "link", "br", "hr", "img", "input"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.seen: list[tuple[str, dict[str, str | None]]] = []
        self.errors: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(f"unexpected </{tag}>")

    def handle_data(self, data: str) -> None:
        self.text.append(data)


# --------------------------------------------------------------------------- SVG


def test_svg_parses_with_one_rect_per_token_and_metadata() -> None:
    heatmap = _heatmap()
    svg = to_svg(heatmap)
    root = ET.fromstring(svg)
    token_rects = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "token"]
    assert len(token_rects) == 6 + 6  # [PAD] dropped from row 1
    assert root.find(f"{SVG}title").text == "IG: teacher vs student"
    assert "student kd" in root.find(f"{SVG}desc").text
    embedded = json.loads(root.find(f"{SVG}metadata").text)
    assert embedded["teacher"] == METADATA["teacher"]
    assert embedded["export.colormap"] == DIVERGING_CMAP
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "teacher (run teacher-01)" in texts and "positive 0.91" in texts
    assert {"-0.8", "0", "0.8"} <= set(texts)  # legend ticks: min / 0 / max


def test_svg_escapes_hostile_text_and_still_parses() -> None:
    heatmap = _heatmap(title="a & b <i>", metadata={"note": "</metadata><x>&"})
    svg = to_svg(heatmap)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in svg
    assert ">&amp;<" in svg
    root = ET.fromstring(svg)
    tags = {element.tag for element in root.iter()}
    assert f"{SVG}script" not in tags and f"{SVG}i" not in tags and f"{SVG}x" not in tags
    assert HOSTILE in [t.text for t in root.iter(f"{SVG}text")]
    assert json.loads(root.find(f"{SVG}metadata").text)["note"] == "</metadata><x>&"


def test_svg_survives_control_characters() -> None:
    row = HeatmapRow("ctrl\x00label", ["a\x01b", "tab\there"], [0.1, 0.2])
    root = ET.fromstring(to_svg(Heatmap([row])))
    assert {"a\ufffdb", "tab here"} <= {t.text for t in root.iter(f"{SVG}text")}


# --------------------------------------------------------------------------- HTML


def test_html_is_balanced_escaped_and_carries_metadata() -> None:
    heatmap = _heatmap(metadata={**METADATA, "evil": '"><script>x</script>'})
    document = to_html(heatmap)
    assert document.startswith("<!DOCTYPE html>")
    parser = _TagBalance()
    parser.feed(document)
    parser.close()
    assert parser.errors == [] and parser.stack == []
    tags = [tag for tag, _ in parser.seen]
    assert "script" not in tags
    assert HOSTILE in "".join(parser.text)
    metas = {attrs.get("name"): attrs.get("content") for tag, attrs in parser.seen if tag == "meta"}
    assert metas["teacher"] == METADATA["teacher"]
    assert metas["evil"] == '"><script>x</script>'
    assert metas["export.colormap"] == DIVERGING_CMAP
    root = ET.fromstring(document)  # polyglot: also well-formed XML
    settings = {
        row.find(f"{XHTML}th").text: row.find(f"{XHTML}td").text for row in root.iter(f"{XHTML}tr")
    }
    assert settings["method"] == "integrated gradients"
    assert len(_html_cells(document)) == 12
    assert [span.get("class") for span in root.iter(f"{XHTML}span")].count("tick") == 3


# --------------------------------------------------------------------------- LaTeX


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("\\", r"\textbackslash{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("$", r"\$"),
        ("#", r"\#"),
        ("_", r"\_"),
        ("{", r"\{"),
        ("}", r"\}"),
        ("~", r"\textasciitilde{}"),
        ("^", r"\textasciicircum{}"),
        ("<", r"\textless{}"),
        (">", r"\textgreater{}"),
        ("##ing", r"\#\#ing"),
        (r"$\textbf{x}$", r"\$\textbackslash{}textbf\{x\}\$"),
        (
            "100% #1 ~ ^ \\ {}",
            r"100\% \#1 \textasciitilde{} \textasciicircum{} \textbackslash{} \{\}",
        ),
    ],
)
def test_latex_escape(raw: str, escaped: str) -> None:
    assert latex_escape(raw) == escaped


def test_latex_fragment_escapes_tokens_and_comments_metadata() -> None:
    heatmap = _heatmap(metadata={"notes": "line one\nline two % \\input{evil}\r\nthree"})
    tex = to_latex(heatmap)
    tokens = [token for token, _ in _latex_cells(tex)]
    assert r"\#\#ly" in tokens and r"\$x\$" in tokens
    assert r"\textless{}script\textgreater{}alert(1)\textless{}/script\textgreater{}" in tokens
    assert "[PAD]" not in tokens
    header = tex.split(r"\begingroup")[0].splitlines()
    assert header and all(line.startswith("%") for line in header)
    assert any("line two % \\input{evil}" in line for line in header)
    assert any(line.endswith("three") for line in header)
    document = to_latex_document(heatmap)
    assert document.startswith(r"\documentclass{article}")
    assert r"\usepackage{color}" in document and tex in document
    assert document.rstrip().endswith(r"\end{document}")


@pytest.fixture(scope="module")
def pdflatex() -> str:
    """pdflatex with Latin Modern's Type 1 fonts (their glyphs map back to text), installed with
    apt when missing and possible: the smallest TeX that compiles the export."""
    debian_package("pdflatex")
    return shutil.which("pdflatex")


@pytest.fixture(scope="module")
def poppler() -> None:
    """poppler-utils' pdftoppm and pdftotext, installed with apt when missing and possible."""
    debian_package("poppler")


def _pdf_text(pdf: Path) -> str:
    return subprocess.run(
        ["pdftotext", "-layout", str(pdf), "-"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


def _assert_in_order(text: str, pieces: list[str]) -> None:
    at = 0
    for piece in pieces:
        found = text.find(piece, at)
        assert found >= 0, f"{piece!r} missing after offset {at} in {text!r}"
        at = found + len(piece)


LATEX_HOSTILE = [
    "100%",
    "R&D",
    "snake_case",
    "#1",
    "$x$",
    "C:\\dir",
    "{}",
    "a~b",
    "x^2",
    "Grüße—ok",
]


# slow: installs Debian's LaTeX and poppler where they are missing, then runs pdflatex
def test_latex_document_compiles_and_reads_back_in_order(
    tmp_path: Path, pdflatex: str, poppler: None
) -> None:
    special = HeatmapRow(
        "specials & 50% of {it}",
        LATEX_HOSTILE,
        [0.2, -0.1, 0.0, 0.5, 0.3, -0.4, 0.1, 0.6, -0.2, 0.4],
    )
    heatmap = _heatmap(rows=[*_heatmap().rows, special], title="IG: #1 & 100% — naïve")
    (tmp_path / "heatmap.tex").write_text(to_latex_document(heatmap), encoding="utf-8")
    result = subprocess.run(
        [pdflatex, "-interaction=nonstopmode", "-halt-on-error", "heatmap.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:]
    text = _pdf_text(tmp_path / "heatmap.pdf")
    _assert_in_order(
        text,
        [
            "IG: #1 & 100% — naïve",
            "teacher (run teacher-01)",
            *["[CLS]", "great", "movie", "not", "$x$", "[SEP]"],
            "student kd",
            *["[CLS]", "great", "##ly", HOSTILE, "&", "[SEP]"],
            "specials & 50% of {it}",
            *LATEX_HOSTILE,
        ],
    )
    assert "[PAD]" not in text


# --------------------------------------------------------------------------- PDF / PNG


def test_pdf_header_and_metadata(tmp_path: Path) -> None:
    path = to_pdf(_heatmap(), tmp_path / "heatmap.pdf")
    data = path.read_bytes()
    assert data.startswith(b"%PDF")
    assert b"/Title (IG: teacher vs student)" in data
    assert b"bert-base run teacher-01" in data  # Subject holds the metadata JSON
    assert b"/Type /Font" in data and b"/Type3" not in data  # TrueType, not Type 3 fonts


def _svg_token_boxes(svg: str) -> list[tuple[float, float, float, float, str]]:
    """``(x, y, width, height, fill)`` in points of every token cell of an SVG."""
    boxes = []
    for rect in ET.fromstring(svg).iter(f"{SVG}rect"):
        if rect.get("class") == "token":
            x, y, width, height = (float(rect.get(k)) for k in ("x", "y", "width", "height"))
            boxes.append((x, y, width, height, rect.get("fill")))
    return boxes


# Matplotlib's Agg (PNG) and poppler's Splash (the PDF) anti-alias glyph edges differently:
# averaged over 4×4-pixel blocks the two renderings of the same page differ by about 3 levels of
# 255 at 100 dpi, while the PNG against itself moved 3 pixels sideways differs by about 6 and a
# blank page by about 18.
BLOCK, MAX_BLOCK_DIFFERENCE = 4, 4.5


def test_pdf_rasterizes_like_the_png_at_the_same_dpi(tmp_path: Path, poppler: None) -> None:
    dpi = 100
    heatmap = _heatmap()
    pdf = to_pdf(heatmap, tmp_path / "heatmap.pdf")
    subprocess.run(
        ["pdftoppm", "-png", "-r", str(dpi), "-singlefile", str(pdf), str(tmp_path / "page")],
        check=True,
        timeout=60,
    )
    with (
        Image.open(tmp_path / "page.png") as page,
        Image.open(to_png(heatmap, tmp_path / "h.png", dpi=dpi)) as png,
    ):
        assert abs(page.width - png.width) <= 1 and abs(page.height - png.height) <= 1
        box = (0, 0, min(page.width, png.width), min(page.height, png.height))
        from_pdf, from_png = (image.convert("RGB").crop(box) for image in (page, png))
    blocks = [np.asarray(image.reduce(BLOCK), dtype=float) for image in (from_pdf, from_png)]
    assert np.abs(blocks[0] - blocks[1]).mean() < MAX_BLOCK_DIFFERENCE
    cells = _svg_token_boxes(to_svg(heatmap))
    assert len(cells) == 12
    pixels = [np.asarray(image) for image in (from_pdf, from_png)]
    for x, y, width, height, fill in cells:
        # the cell's centre column, a tenth of its height below its top: its fill colour, clear
        # of the token's glyphs (the tallest reach 0.3 of the height above the centre)
        column = round((x + width / 2) * dpi / 72)
        row = round((y + height / 10) * dpi / 72)
        expected = np.array([int(fill[i : i + 2], 16) for i in (1, 3, 5)])
        for image in pixels:  # PDF colours are fractions of 1: a level of rounding either way
            assert np.abs(image[row, column].astype(int) - expected).max() <= 1, fill
    text = _pdf_text(pdf)
    _assert_in_order(text, ["teacher (run teacher-01)", "$x$", "student kd", HOSTILE])  # no math


def test_png_scales_with_dpi_and_has_text_chunks(tmp_path: Path) -> None:
    low = to_png(_heatmap(), tmp_path / "low.png", dpi=100)
    high = export(_heatmap(), tmp_path / "high.png", dpi=200)
    with Image.open(low) as small, Image.open(high) as big:
        assert abs(big.size[0] - 2 * small.size[0]) <= 2
        assert abs(big.size[1] - 2 * small.size[1]) <= 2
        assert big.text["Title"] == "IG: teacher vs student"
        assert json.loads(big.text["Description"])["teacher"] == METADATA["teacher"]


# --------------------------------------------------------------------------- colour


def test_same_score_same_colour_in_svg_html_and_latex() -> None:
    heatmap = _heatmap()
    scale = _scale_of(heatmap)
    svg_cells, html_cells = _svg_cells(to_svg(heatmap)), _html_cells(to_html(heatmap))
    latex_cells = _latex_cells(to_latex(heatmap))
    assert len(svg_cells) == len(html_cells) == len(latex_cells) == 12
    for (token, score, svg_fill), (_, _, html_fill), (tex_token, tex_fill) in zip(
        svg_cells, html_cells, latex_cells, strict=True
    ):
        assert svg_fill == html_fill == tex_fill == _hex(score_to_rgb(score, scale))
        assert tex_token == latex_escape(token)
    great = {fill for token, _, fill in svg_cells if token == "great"}
    assert len(great) == 1  # "great" has 0.8 in both rows


def test_rows_share_one_scale() -> None:
    quiet = HeatmapRow("quiet", ["a", "b"], [0.01, -0.02])
    loud = HeatmapRow("loud", ["c", "d", "e"], [0.1, -1.0, 0.5])
    cells = _svg_cells(to_svg(Heatmap([quiet, loud])))
    fills = {token: fill for token, _, fill in cells}
    scale = color_scale([0.01, -0.02, 0.1, -1.0, 0.5])
    assert (scale.vmin, scale.vmax) == (-1.0, 1.0)
    assert fills["d"] == _hex(score_to_rgb(-1e9, scale))  # most extreme colour of the map
    for token in ("a", "b"):  # small scores stay pale instead of being stretched per row
        assert min(int(fills[token][i : i + 2], 16) for i in (1, 3, 5)) > 225


def test_zero_is_near_white_and_scale_kinds() -> None:
    signed = color_scale([-0.3, 0.1])
    assert signed.cmap == DIVERGING_CMAP and (signed.vmin, signed.vmax) == (-0.3, 0.3)
    zero = score_to_rgb(0.0, signed)
    assert min(zero) >= 240 and max(zero) - min(zero) <= 6
    positive = color_scale([0.0, 0.2, 0.4])
    assert positive.cmap == SEQUENTIAL_CMAP and (positive.vmin, positive.vmax) == (0.0, 0.4)
    assert min(score_to_rgb(0.0, positive)) >= 235
    assert score_to_rgb(0.4, positive) != score_to_rgb(0.2, positive)


def test_explicit_bounds_clip_and_keep_zero_neutral() -> None:
    scale = color_scale([-0.1, 0.1], vmin=-2.0, vmax=0.5)
    assert score_to_rgb(3.0, scale) == score_to_rgb(0.5, scale)
    assert score_to_rgb(0.0, scale) == score_to_rgb(0.0, color_scale([-1.0, 1.0]))
    assert color_scale([0.1], vmax=1.0).vmax == 1.0
    assert (color_scale([-0.1], vmax=2.0).vmin, color_scale([-0.1], vmin=-3.0).vmax) == (-2, 3)
    with pytest.raises(ValueError, match="vmin < vmax"):
        color_scale([0.1, 0.2], vmin=0.5, vmax=0.5)
    with pytest.raises(ValueError, match="unknown matplotlib colormap"):
        color_scale([0.1], cmap="no-such-map")


def test_text_colour_follows_background_luminance() -> None:
    scale = color_scale([-1.0, 1.0])
    assert text_rgb(score_to_rgb(1.0, scale)) == (255, 255, 255)
    assert text_rgb(score_to_rgb(-1.0, scale)) == (255, 255, 255)
    assert text_rgb(score_to_rgb(0.0, scale)) == (0, 0, 0)
    assert text_rgb((255, 255, 0)) == (0, 0, 0)


# --------------------------------------------------------------------------- tokens


def test_merge_wordpieces_sums_scores_and_keeps_orphans() -> None:
    row = HeatmapRow("r", ["##x", "play", "##ing", "##s", "[PAD]"], [0.1, 0.2, 0.3, -0.1, 9.0])
    cells = _svg_cells(to_svg(Heatmap([row]), ExportOptions(merge_wordpieces=True)))
    assert [(token, round(score, 9)) for token, score, _ in cells] == [
        ("##x", 0.1),
        ("playings", 0.4),
    ]
    unmerged = _svg_cells(to_svg(Heatmap([row]), ExportOptions(drop_tokens=())))
    assert [token for token, _, _ in unmerged] == ["##x", "play", "##ing", "##s", "[PAD]"]


def test_dropped_tokens_leave_the_scale() -> None:
    row = HeatmapRow("r", ["a", "[PAD]"], [0.5, -9.0])
    cells = _svg_cells(to_svg(Heatmap([row])))
    assert [token for token, _, _ in cells] == ["a"]
    assert cells[0][2] == _hex(score_to_rgb(0.5, color_scale([0.5])))  # sequential, max 0.5


# --------------------------------------------------------------------------- validation


def test_validation_errors() -> None:
    with pytest.raises(ValueError, match="row 'bad row': 2 tokens but 1 scores"):
        HeatmapRow("bad row", ["a", "b"], [0.1])
    with pytest.raises(ValueError, match=r"row 'nan row'.*NaN"):
        HeatmapRow("nan row", ["a", "b"], [0.1, float("nan")])
    with pytest.raises(ValueError, match="no rows"):
        Heatmap([])
    with pytest.raises(ValueError, match="no tokens"):
        HeatmapRow("empty", [], [])
    padded = Heatmap([HeatmapRow("only pads", ["[PAD]"], [0.0])])
    with pytest.raises(ValueError, match="'only pads' has no tokens left"):
        to_svg(padded)


def test_export_dispatches_on_suffix_and_rejects_unknown(tmp_path: Path) -> None:
    heatmap = _heatmap()
    assert export(heatmap, tmp_path / "h.svg").read_text(encoding="utf-8").startswith("<?xml")
    assert "<!DOCTYPE html>" in export(heatmap, tmp_path / "h.html").read_text(encoding="utf-8")
    assert r"\colorbox[RGB]" in export(heatmap, tmp_path / "h.tex").read_text(encoding="utf-8")
    assert export(heatmap, tmp_path / "h.out", fmt="pdf").read_bytes().startswith(b"%PDF")
    with pytest.raises(ValueError, match=r"unsupported heatmap format '\.docx'.*\.svg"):
        export(heatmap, tmp_path / "h.docx")
