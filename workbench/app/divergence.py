"""Where explanations diverge: over a split, with the explainer chosen (any registered one, with its
settings), per word the teacher's mean attribution against a student's (a scatter), the words the
student over- and under-attributes most (overall or for one gold class), and per model the
distributions of the per-example attribution gap and of AOPC faithfulness
(:mod:`workbench.analysis.explanation_divergence`). A click on a point or a row opens its example
in the Case study. Each model's outputs are cached in its run folder, and the comparison in the
server (per explainer and settings), so a second visit is instant."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import replace

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from workbench.analysis.attribution import ExplainerChoice
from workbench.analysis.explanation_divergence import TEACHER, Divergence, divergence, word_table
from workbench.analysis.settings import DivergenceSettings
from workbench.app import common
from workbench.app.catalog import RunEntry
from workbench.app.forms import config_widgets
from workbench.core.config import config_key

KEY = "divergence"
ALL_CLASSES = "all examples"
KEPT = 8  # comparisons kept in the server


@st.cache_resource
def _kept() -> OrderedDict:
    """The last comparisons computed in this server, by runs and settings."""
    return OrderedDict()


def _compare(
    teacher: RunEntry,
    students: list[RunEntry],
    settings: DivergenceSettings,
    explainer: ExplainerChoice | None,
) -> tuple[Divergence, str]:
    """The comparison, from the server's memory, or from the run folders' caches (computed
    there first when missing, with a progress bar), per runs, settings and explainer; and where
    it came from."""
    table_only = replace(settings, min_count=1, top=1)  # what the tables alone change
    key = (
        tuple(e.key() for e in (teacher, *students)),
        config_key(table_only),
        json.dumps(explainer.record(), sort_keys=True) if explainer else None,
    )
    kept = _kept()
    if key in kept:
        kept.move_to_end(key)
        return kept[key], "kept from an earlier visit"
    loaded = [common.load(e) for e in (teacher, *students)]
    split = common.task_split(loaded[0], settings.split)
    bar = st.progress(0.0, "Loading the cached maps…")
    try:
        result = divergence(
            loaded[0], loaded[1:], split, settings, lambda f, text: bar.progress(f, text), explainer
        )
    finally:
        bar.empty()
    kept[key] = result
    while len(kept) > KEPT:
        kept.popitem(last=False)
    if result.computed:
        return result, f"computed now for {', '.join(result.computed)}"
    return result, "read from the run folders' caches"


def _scatter(table: pd.DataFrame, student: str, explainer: str) -> go.Figure:
    """A point per word: the teacher's mean attribution (x) against the student's (y), by the
    explainer named in the title."""
    hover = (
        "<b>%{text}</b><br>teacher %{x:.4f}<br>" + student.replace("%", "%%") + " %{y:.4f}"
        "<br>difference %{customdata[1]:+.4f}<br>seen %{customdata[2]} times"
        "<br>click: open example %{customdata[0]}<extra></extra>"
    )
    figure = go.Figure(
        go.Scatter(
            x=table[TEACHER],
            y=table[student],
            text=table["word"],
            customdata=table[["example", "difference", "count"]].to_numpy(),
            mode="markers",
            marker={
                "color": table["difference"],
                "colorscale": "PuOr_r",
                "cmid": 0,
                "size": 8,
                "colorbar": {"title": "student − teacher"},
            },
            hovertemplate=hover,
        )
    )
    low = float(min(table[TEACHER].min(), table[student].min()))
    high = float(max(table[TEACHER].max(), table[student].max()))
    figure.add_shape(
        type="line", x0=low, y0=low, x1=high, y1=high, line={"dash": "dot", "color": "grey"}
    )
    return figure.update_layout(
        title=f"Mean attribution per word: {explainer}",
        xaxis_title="teacher: mean attribution",
        yaxis_title=f"{student}: mean attribution",
        height=460,
        margin={"t": 50},
    )


def _histograms(result: Divergence) -> go.Figure:
    """The per-example attribution gap of every student and the AOPC values of every model,
    each model in one colour and one legend entry across the three panels; the explainer in
    the title."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    figure = make_subplots(
        1, 3, subplot_titles=("attribution gap", "AOPC comprehensiveness", "AOPC sufficiency")
    )
    colours = dict(zip(result.models(), qualitative.Plotly, strict=False))
    panels = (
        ("gap", result.students),
        ("comprehensiveness", result.models()),
        ("sufficiency", result.models()),
    )
    shown: set[str] = set()
    for column, (suffix, models) in enumerate(panels, start=1):
        for model in models:
            figure.add_trace(
                go.Histogram(
                    x=result.examples[f"{model} {suffix}"],
                    name=model,
                    legendgroup=model,
                    showlegend=model not in shown,
                    marker_color=colours[model],
                    opacity=0.6,
                    nbinsx=30,
                ),
                1,
                column,
            )
            shown.add(model)
    return figure.update_layout(
        title=f"Per example, {result.explainer.describe()} maps",
        barmode="overlay",
        height=360,
        margin={"t": 80},
    )


def _picked(frame: pd.DataFrame, key: str, height: int = 250) -> int | None:
    """The ``example`` of the row the user selects in ``frame`` (None until one is)."""
    shown = frame.style.format(precision=4)
    rows = common.selected_rows(shown, key, hide_index=True, height=height)
    return int(frame["example"].iloc[rows[0]]) if rows else None


def _word_tables(result: Divergence, student: str, scope: str) -> int | None:
    """The words the student over- and under-attributes most; the example of a clicked row."""
    by_class = scope != ALL_CLASSES
    table = word_table(result, student, by_class=by_class)
    if by_class:
        table = table[table["class"] == scope].drop(columns="class")
    if table.empty:
        st.info(f"No word occurs {result.settings.min_count} times or more here: lower min count.")
        return None
    top = result.settings.top
    left, right = st.columns(2)
    with left:
        st.markdown("**Over-attributed** (student > teacher)")
        over = _picked(table.head(top), f"{KEY}.over")
    with right:
        st.markdown("**Under-attributed** (student < teacher)")
        under = _picked(table.iloc[::-1].head(top), f"{KEY}.under")
    return over if over is not None else under


def _examples_table(result: Divergence, student: str) -> int | None:
    """The examples, largest attribution gap first; the example of a clicked row."""
    pair = (TEACHER, student)
    columns = ["text", "label", *(f"{m} prediction" for m in pair), f"{student} gap"]
    columns += [f"{m} {aopc}" for aopc in ("comprehensiveness", "sufficiency") for m in pair]
    frame = result.examples[columns].rename_axis("example").reset_index()
    return _picked(frame.sort_values(f"{student} gap", ascending=False), f"{KEY}.examples")


def render() -> None:
    st.title("Where explanations diverge")
    picked = common.teacher_and_students(KEY)
    if picked is None:
        return
    teacher, students = picked
    if common.weightless(teacher, "this page compares its attribution maps with the students'"):
        return
    with st.expander("Settings", expanded=False):
        explaining = common.heatmap_settings(f"{KEY}.settings", words=False)
        settings = config_widgets(DivergenceSettings, f"{KEY}.settings", columns=5)
    result, source = _compare(teacher, students, settings, explaining.explainer)
    explainer = result.explainer.describe()
    st.caption(
        common.plain(
            f"{len(result.examples)} examples of the {settings.split} split (a fixed stratified "
            f"sample), {source}. Attribution of the {settings.explained} class per word "
            f"(word pieces summed) by {explainer}; words seen at least "
            f"{settings.min_count} times."
        )
    )
    if result.truncated:
        st.warning(
            f"{result.truncated} example(s) were longer than the teacher's maximum length and "
            "were truncated: only their first tokens are compared."
        )
    student = st.selectbox("Student", result.students, key=f"{KEY}.student")
    table = word_table(result, student)
    clicks = []
    if table.empty:
        st.info(f"No word occurs {settings.min_count} times or more: lower min count.")
    else:
        event = st.plotly_chart(
            _scatter(table, student, explainer),
            on_select="rerun",
            selection_mode=("points", "box", "lasso"),
            key=f"{KEY}.scatter",
        )
        rows = [p["point_index"] for p in event.selection.points if "point_index" in p]
        clicks += [int(table["example"].iloc[row]) for row in rows[:1]]
        st.caption(
            "A point per word: above the diagonal the student attributes it more than the "
            "teacher. Click a point to open the example where the two differ most on it."
        )
    st.subheader("Words the student over- and under-attributes")
    scope = st.radio(
        "Examples",
        [ALL_CLASSES, *common.load(teacher).spec.label_names],
        horizontal=True,
        key=f"{KEY}.scope",
        help="all examples, or those of one gold class",
    )
    clicks.append(_word_tables(result, student, scope))
    st.caption("Select a row to open the example where the two differ most on that word.")
    st.subheader("Attribution gap and faithfulness per example")
    st.plotly_chart(_histograms(result), key=f"{KEY}.histograms")
    st.caption(
        common.plain(
            "Attribution gap: AD-KD Eq. 11, the L2 distance of the two models' normalised maps "
            "of every class (lower: closer). AOPC of each model's map of its own prediction, "
            f"under the {settings.rules} rules: comprehensiveness (higher: the top words "
            "matter), sufficiency (lower: the top words suffice). Select a row to open it."
        )
    )
    clicks.append(_examples_table(result, student))
    clicked = next((c for c in clicks if c is not None), None)
    if clicked is not None:
        example = common.frame_examples(result.examples.iloc[[clicked]])[0]
        common.open_in_case_study(example, teacher, [s.name for s in students])


if __name__ == "__main__":
    common.run_page(render)
