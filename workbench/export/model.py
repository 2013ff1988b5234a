"""The data model (:class:`Heatmap`, its rows, :class:`ExportOptions`) and its preparation for
drawing: word pieces merged, scores scaled, texts cleaned, metadata gathered."""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

from workbench.export.scale import ColorScale, _format_number, color_scale

GENERATOR = "workbench.export"
DEFAULT_TITLE = "Token attribution heatmap"


@dataclass(frozen=True)
class HeatmapRow:
    """One model's attribution over one example's tokens.

    ``scores[i]`` belongs to ``tokens[i]``; scores may be signed.  ``prediction`` (for
    example ``"positive 0.91"``) is shown under the label.  A score of None is a blank cell
    (its token ``""``): a column of a :attr:`Heatmap.columns` heatmap this row has no word in.
    """

    label: str
    tokens: list[str]
    scores: list[float | None]
    prediction: str | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.scores):
            raise ValueError(
                f"row {self.label!r}: {len(self.tokens)} tokens but {len(self.scores)} scores"
            )
        if all(s is None for s in self.scores):
            raise ValueError(f"row {self.label!r} has no tokens")
        bad = [i for i, s in enumerate(self.scores) if s is not None and not math.isfinite(s)]
        if bad:
            raise ValueError(f"row {self.label!r}: non-finite (NaN/inf) score at token {bad[0]}")


@dataclass(frozen=True)
class Heatmap:
    """Rows drawn on one shared colour scale, with a title and metadata to embed.

    With ``columns``, cell ``i`` of every row is one column (the same word read by models of
    different tokenizers, a blank cell where a row lacks it), and every format draws the rows
    aligned on them; otherwise each row's tokens flow on their own."""

    rows: list[HeatmapRow]
    title: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    columns: bool = False

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError("heatmap has no rows")
        if self.columns and len({len(row.tokens) for row in self.rows}) > 1:
            raise ValueError("the rows of a heatmap in columns must have as many cells")


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


# --------------------------------------------------------------------------- preparation


@dataclass(frozen=True)
class _Prepared:
    """Rows ready to draw, the shared scale and the metadata to embed."""

    title: str
    rows: list[HeatmapRow]
    scale: ColorScale
    metadata: dict[str, str]
    columns: bool = False


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


def _prepare_row(row: HeatmapRow, options: ExportOptions, columns: bool) -> HeatmapRow:
    """The row to draw: dropped tokens removed (in columns, blanked, so that the columns stay),
    WordPiece continuations merged (not in columns, whose cells are words)."""
    cells = [
        ("", None) if t in options.drop_tokens else (t, None if s is None else float(s))
        for t, s in zip(row.tokens, row.scores, strict=True)
        if columns or t not in options.drop_tokens
    ]
    if all(s is None for _, s in cells):
        dropped = ", ".join(options.drop_tokens)
        raise ValueError(f"row {row.label!r} has no tokens left after dropping {dropped}")
    tokens, scores = [t for t, _ in cells], [s for _, s in cells]
    if options.merge_wordpieces and not columns:
        tokens, scores = merge_wordpieces(tokens, scores)
    prediction = None if row.prediction is None else _clean_text(row.prediction)
    return HeatmapRow(_clean_text(row.label), [_clean_text(t) for t in tokens], scores, prediction)


def _prepare(heatmap: Heatmap, options: ExportOptions | None) -> _Prepared:
    options = options or ExportOptions()
    rows = [_prepare_row(row, options, heatmap.columns) for row in heatmap.rows]
    scores = (s for row in rows for s in row.scores if s is not None)
    scale = color_scale(scores, options.vmin, options.vmax, options.cmap)
    metadata = {
        _clean_text(k): "\n".join(map(_clean_text, str(v).splitlines()))
        for k, v in heatmap.metadata.items()
    }
    generated = {
        "export.generator": GENERATOR,
        "export.colormap": scale.cmap,
        "export.vmin": repr(scale.vmin),
        "export.vmax": repr(scale.vmax),
        "export.scale": "diverging (zero-centred)" if scale.diverging else "sequential",
        "export.drop_tokens": ", ".join(options.drop_tokens) or "(none)",
        "export.merge_wordpieces": str(options.merge_wordpieces).lower(),
    }
    metadata |= {key: value for key, value in generated.items() if key not in metadata}
    return _Prepared(_clean_text(heatmap.title), rows, scale, metadata, heatmap.columns)


def _metadata_json(prepared: _Prepared) -> str:
    return json.dumps(prepared.metadata, ensure_ascii=False, indent=1)


def _description(prepared: _Prepared) -> str:
    scale = prepared.scale
    rows = "; ".join(row.label for row in prepared.rows)
    return (
        f"Token attribution heatmap of {len(prepared.rows)} row(s): {rows}. "
        f"Colormap {scale.cmap}, scale {_format_number(scale.vmin)} to "
        f"{_format_number(scale.vmax)}."
    )
