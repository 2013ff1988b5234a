"""The app's Plotly figures: pure functions from analysis results (tensors, tables) to
``plotly.graph_objects.Figure``, so each can be tested for its data without a browser.

Text from users and data sets reaches Plotly only HTML-escaped (Plotly reads a subset of HTML
in labels and hover text, and decodes entities back to the characters), and values are shown
in hover labels with :data:`DIGITS` significant digits."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.colors import qualitative
from plotly.subplots import make_subplots
from torch import Tensor

TEACHER_COLOUR, STUDENT_COLOUR = "#e66101", "#5e3c99"  # PuOr ends: colour-blind safe
RIGHT, WRONG = TEACHER_COLOUR, STUDENT_COLOUR
SERIES_COLOURS = qualitative.Safe  # colour-blind safe
DIGITS = 6
HOVER_TEXT_CHARS = 160  # an example's text in a hover label, cut after this many characters
FONT = {"size": 11}


def number(value: float) -> str:
    """A value as hover labels show it (``—`` for NaN)."""
    return "—" if math.isnan(value) else f"{value:.{DIGITS}g}"


def _escaped(text: object, limit: int | None = None) -> str:
    text = str(text)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    return html.escape(text)


def relation_heatmaps(
    matrices: Sequence[tuple[Tensor, Sequence[str], str]],
    axis: str,
    colorscale: str,
    zrange: tuple[float, float] | None = None,
    blank: str = "",
) -> go.Figure:
    """Relation matrices side by side on one colour scale (one colour bar).

    ``matrices``: ``(matrix [n, n], labels (n), title)`` per model, teacher first; ``axis``
    names what the labels are (``token`` or ``layer``); ``zrange``: the scale's ends (default:
    the finite values' min and max over all matrices). The hover label of a cell names its
    row and column labels and its exact value; NaN cells (``blank`` says why) show no colour.
    """
    if zrange is None:
        finite = torch.cat([m[torch.isfinite(m)].flatten() for m, _, _ in matrices])
        zrange = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    fig = make_subplots(
        rows=1,
        cols=len(matrices),
        subplot_titles=[_escaped(title) for _, _, title in matrices],
        horizontal_spacing=0.12,
    )
    for column, (matrix, labels, _) in enumerate(matrices, start=1):
        names = [_escaped(label) for label in labels]
        values = matrix.double().tolist()
        hover = [
            [
                f"{axis} {names[i]} × {axis} {names[j]}: "
                + (number(value) if not math.isnan(value) else f"— {blank}".strip())
                for j, value in enumerate(row)
            ]
            for i, row in enumerate(values)
        ]
        fig.add_trace(
            go.Heatmap(
                z=values,
                x=names,
                y=names,
                hovertext=hover,
                hoverinfo="text",
                coloraxis="coloraxis",
                xgap=1,
                ygap=1,
            ),
            row=1,
            col=column,
        )
        fig.update_yaxes(autorange="reversed", row=1, col=column)
    side = max(320, 22 * max(len(labels) for _, labels, _ in matrices) + 140)
    fig.update_layout(
        coloraxis={"colorscale": colorscale, "cmin": zrange[0], "cmax": zrange[1]},
        height=side,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        font=FONT,
    )
    fig.update_xaxes(tickangle=-90, type="category")
    return fig.update_yaxes(type="category")


def layer_mapping_figure(
    pairs: Sequence[tuple[int, int]],
    teacher_layers: int,
    student_layers: int,
    chosen: tuple[int, int],
) -> go.Figure:
    """Teacher layers on the left, student layers on the right (``hidden_states`` indices, 0 =
    the embedding output), a line per matched ``(student, teacher)`` pair, the chosen one
    bold; hovering a line names its pair."""
    scale = teacher_layers / max(student_layers, 1)
    fig = go.Figure()
    for student, teacher in pairs:
        bold = (student, teacher) == chosen
        fig.add_trace(
            go.Scatter(
                x=[0, 1],
                y=[teacher, student * scale],
                mode="lines",
                line={"color": "black" if bold else "#999999", "width": 3 if bold else 1},
                hoverinfo="text",
                hovertext=f"student layer {student} ← teacher layer {teacher}",
                showlegend=False,
            )
        )
    for side, count, colour, letter, name, step in (
        (0, teacher_layers, TEACHER_COLOUR, "T", "teacher", 1.0),
        (1, student_layers, STUDENT_COLOUR, "S", "student", scale),
    ):
        fig.add_trace(
            go.Scatter(
                x=[side] * (count + 1),
                y=[layer * step for layer in range(count + 1)],
                mode="markers+text",
                marker={"size": 26, "color": colour},
                text=[f"{letter}{layer}" for layer in range(count + 1)],
                textfont={"color": "white", "size": 10},
                hoverinfo="text",
                hovertext=[f"{name} layer {layer}" for layer in range(count + 1)],
                showlegend=False,
            )
        )
    return fig.update_layout(
        title={"text": "teacher → student", "font": {"size": 12}},
        height=max(260, 42 * (teacher_layers + 1) + 80),
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        xaxis={"visible": False, "range": [-0.4, 1.4]},
        yaxis={"visible": False, "range": [teacher_layers + 0.6, -0.6]},
        font=FONT,
    )


def loyalty_histograms(
    frame: pd.DataFrame, students: Sequence[str], explainer: str = "Grad saliency"
) -> go.Figure:
    """Histograms of per-example PL and SL (columns ``<student> PL``/``SL`` of the loyalty
    table), one colour per student, overlaid; ``explainer`` (SL's) named in the title."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["per-example PL", "per-example SL"])
    for index, student in enumerate(students):
        colour = SERIES_COLOURS[index % len(SERIES_COLOURS)]
        for column, metric in enumerate(("PL", "SL"), start=1):
            values = frame.get(f"{student} {metric}", pd.Series(dtype=float)).dropna()
            fig.add_trace(
                go.Histogram(
                    x=values.tolist(),
                    nbinsx=20,
                    name=_escaped(student),
                    legendgroup=student,
                    showlegend=column == 1,
                    opacity=0.55,
                    marker_color=colour,
                    hovertemplate=f"{_escaped(student)}: %{{y}} examples with {metric} in "
                    "%{x}<extra></extra>",
                ),
                row=1,
                col=column,
            )
    return fig.update_layout(
        title=_escaped(f"Per example; SL by {explainer}"),
        barmode="overlay",
        height=340,
        margin={"t": 80, "b": 10},
        font=FONT,
    )


def example_hover(row: pd.Series, student: str) -> str:
    """An example's hover label on the loyalty scatter: its text (cut), gold label, the
    teacher's and the student's predictions, PL and SL."""
    return "<br>".join(
        [
            _escaped(row["text"], HOVER_TEXT_CHARS),
            f"gold: {_escaped(row['gold'])}",
            f"teacher: {_escaped(row['teacher'])}",
            f"{_escaped(student)}: {_escaped(row[student])}",
            f"PL {number(row[f'{student} PL'])} · SL {number(row[f'{student} SL'])}",
        ]
    )


def loyalty_scatter(
    frame: pd.DataFrame, students: Sequence[str], explainer: str = "Grad saliency"
) -> go.Figure:
    """Per student a panel of PL (x) against SL (y), one point per example of the loyalty
    table, coloured by whether the student is right; each point's ``customdata`` is its row's
    index in ``frame`` (what a click or a box selection returns); ``explainer`` (SL's) named
    in the title."""
    fig = make_subplots(rows=1, cols=len(students), subplot_titles=[_escaped(s) for s in students])
    for column, student in enumerate(students, start=1):
        right = frame[f"{student} ✓"].astype(bool)
        for mask, colour, label in ((right, RIGHT, "student right"), (~right, WRONG, "wrong")):
            part = frame[mask]
            fig.add_trace(
                go.Scatter(
                    x=part[f"{student} PL"].tolist(),
                    y=part[f"{student} SL"].tolist(),
                    mode="markers",
                    marker={"color": colour, "size": 7, "opacity": 0.7},
                    name=label,
                    legendgroup=label,
                    showlegend=column == 1,
                    customdata=[[int(i)] for i in part.index],
                    hovertext=[example_hover(row, student) for _, row in part.iterrows()],
                    hoverinfo="text",
                ),
                row=1,
                col=column,
            )
        fig.update_xaxes(title_text="probability loyalty PL", row=1, col=column)
        fig.update_yaxes(title_text="saliency loyalty SL", row=1, col=column)
    return fig.update_layout(
        title=_escaped(f"Probability against saliency loyalty; SL by {explainer}"),
        height=400,
        margin={"t": 80, "b": 10},
        font=FONT,
    )


def curves(
    frame: pd.DataFrame, x: str, y: str, second: tuple[str, ...] = (), second_y: str = ""
) -> go.Figure:
    """One line per column of ``frame`` against its index (named ``x``), e.g. each loss term
    per step; hover gives the step, the series and its exact value. The columns ``second``
    (a gradient norm beside losses) are drawn dashed on their own axis, ``second_y``, at the
    right."""
    fig = go.Figure()
    for column in frame.columns:
        series = frame[column].dropna()
        own = column in second
        fig.add_trace(
            go.Scatter(
                x=series.index.tolist(),
                y=series.tolist(),
                mode="lines+markers" if len(series) < 30 else "lines",
                name=_escaped(column),
                hovertext=[
                    f"{x} {step}: {_escaped(column)} {number(float(value))}"
                    for step, value in series.items()
                ],
                hoverinfo="text",
                yaxis="y2" if own else "y",
                line={"dash": "dot"} if own else {},
            )
        )
    if any(column in second for column in frame.columns):
        fig.update_layout(
            yaxis2={"title": second_y, "overlaying": "y", "side": "right", "showgrid": False}
        )
    return fig.update_layout(
        xaxis_title=x,
        yaxis_title=y,
        height=300,
        margin={"t": 20, "b": 10},
        legend={"orientation": "h", "y": -0.25},
        font=FONT,
    )


def trials_figure(trials: pd.DataFrame, metric: str = "dev") -> go.Figure:
    """A tuning study's trials (rows of :func:`kd.experiments.tune.trials_table`): each finished
    trial's dev value against its number, coloured by state, the best so far (studies maximise it)
    as a line; hover gives the trial's settings."""
    settings = [c for c in trials.columns if c not in ("trial", "state", metric, "steps")]
    done = trials.dropna(subset=[metric]).sort_values("trial")
    fig = go.Figure()
    for state, part in done.groupby("state", sort=True):
        fig.add_trace(
            go.Scatter(
                x=part["trial"].tolist(),
                y=part[metric].tolist(),
                mode="markers",
                marker={"size": 9},
                name=_escaped(state),
                hovertext=[
                    "<br>".join(
                        [f"trial {row['trial']} ({_escaped(state)})"]
                        + [f"{_escaped(s)} = {_escaped(row[s])}" for s in settings]
                        + [f"{metric} {number(float(row[metric]))}"]
                    )
                    for _, row in part.iterrows()
                ],
                hoverinfo="text",
            )
        )
    if len(done):
        fig.add_trace(
            go.Scatter(
                x=done["trial"].tolist(),
                y=done[metric].cummax().tolist(),
                mode="lines",
                line={"shape": "hv", "color": "#999999"},
                name="best so far",
                hoverinfo="skip",
            )
        )
    return fig.update_layout(
        xaxis_title="trial", yaxis_title=metric, height=300, margin={"t": 20}, font=FONT
    )


def _measure(value: float | None, ratio: float | None, unit: str = "") -> str:
    """A benchmark value with its ratio to the reference (``—`` where it was not measured)."""
    if value is None:
        return "—"
    shown = f"{number(float(value))}{unit}"
    return shown if ratio is None else f"{shown} ({number(float(ratio))}×)"


def compression_hover(row: dict, method: str, metric: str, reference: str) -> str:
    """A model's hover label on the compression scatter: its name, engine and method, the
    metric plotted, then its size, latency and throughput, each with its ratio to the
    reference (the teacher), and its loyalty to it."""
    throughput = [k for k in row if k.startswith("throughput_b") and not k.endswith("_ratio")]
    lines = [
        f"<b>{_escaped(row['name'])}</b> ({_escaped(row['engine'])})",
        f"method: {_escaped(method or '–')}",
        f"{_escaped(metric)} {_measure(row.get(metric), None)}",
        f"ratios are to {_escaped(reference)}",
        f"parameters: {_measure(row['parameters'], row.get('parameters_ratio'))}",
        f"on disk: {_measure(row.get('disk_mb'), row.get('disk_mb_ratio'), ' MB')}",
        "latency at batch 1: "
        + _measure(row.get("latency_ms_median"), row.get("latency_ms_median_ratio"), " ms")
        + f", p95 {_measure(row.get('latency_ms_p95'), row.get('latency_ms_p95_ratio'), ' ms')}",
        *(
            f"examples/s at batch {key.removeprefix('throughput_b')}: "
            + _measure(row[key], row.get(f"{key}_ratio"))
            for key in throughput
        ),
        f"label loyalty {_measure(row.get('label_loyalty'), None)} · probability loyalty "
        f"{_measure(row.get('probability_loyalty'), None)}",
    ]
    return "<br>".join(lines)


def compression_scatter(
    report: dict, metric: str = "accuracy", methods: Mapping[str, str] | None = None
) -> go.Figure:
    """What a student buys (a :func:`workbench.analysis.benchmark.benchmark` report): ``metric`` (a
    task metric or a loyalty of the report's rows) against the median latency at batch 1, one point
    per model and engine, the reference (the teacher, first) in its colour, one marker symbol
    per engine. ``methods`` maps a row's ``source`` to its method (from its run record); each
    point's ``customdata`` is its row's index in ``report["rows"]`` (what a click returns)."""
    methods = methods or {}
    rows = report["rows"]
    symbols = ("circle", "diamond", "square", "cross", "triangle-up")
    fig = go.Figure()
    for number_, engine in enumerate(dict.fromkeys(row["engine"] for row in rows)):
        indices = [i for i, row in enumerate(rows) if row["engine"] == engine]
        fig.add_trace(
            go.Scatter(
                x=[rows[i].get("latency_ms_median") for i in indices],
                y=[rows[i].get(metric) for i in indices],
                mode="markers+text",
                text=[_escaped(rows[i]["name"]) for i in indices],
                textposition="top center",
                marker={
                    "size": 12,
                    "symbol": symbols[number_ % len(symbols)],
                    "color": [TEACHER_COLOUR if i == 0 else STUDENT_COLOUR for i in indices],
                },
                name=_escaped(engine),
                customdata=[[i] for i in indices],
                hovertext=[
                    compression_hover(
                        rows[i], methods.get(rows[i]["source"], ""), metric, report["reference"]
                    )
                    for i in indices
                ],
                hoverinfo="text",
            )
        )
    return fig.update_layout(
        xaxis_title="median latency at batch 1 (ms per text)",
        yaxis_title=metric.replace("_", " "),
        height=380,
        margin={"t": 20, "b": 10},
        legend={"title": {"text": "engine"}},
        font=FONT,
    )
