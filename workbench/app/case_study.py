"""Case study: one text (or a pair) through the teacher and any students — each model's
prediction and probabilities, its token attribution map on a shared colour scale, and how far
each student's explanation follows the teacher's (saliency loyalty, rank correlation). A
teacher that is only a cache has no weights to explain: the students are shown alone.

Examples come from the keyboard or from a split, filtered to where teacher and students
disagree, where a model is wrong, or where saliency loyalty is low.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pandas as pd
import streamlit as st

from workbench.analysis.examples import Example
from workbench.analysis.explanation_agreement import Agreement, agreement
from workbench.analysis.explanations import Explanation, explain
from workbench.analysis.heatmap_export import explained_settings, to_heatmap
from workbench.app import common
from workbench.app.catalog import CACHE, RunEntry
from workbench.app.heatmap_view import show_heatmap
from workbench.core.config import config_key
from workbench.core.errors import WorkbenchError

KEY = "case"
SOURCES = ("Type a text", "Pick from a split", "Upload a file")
FILTERS = (
    "all examples",
    "teacher and a student disagree",
    "a model is wrong",
    "low saliency loyalty",
)
SPLIT_LIMIT = 500


def case_study(
    entries: list[RunEntry], example: Example, explaining: common.Explaining, teacher: bool = True
) -> tuple[list[Explanation], dict[str, Agreement]]:
    """Explanations of every chosen run (the teacher first, where ``teacher``) and each
    student's agreement with the teacher by its name (none without a teacher), computed once
    per (runs, example, explainer and settings)."""
    runs = tuple((e.name, *e.key()) for e in entries)
    return _case_study(runs, config_key(example), explaining.key(), teacher)


@st.cache_data(show_spinner="Attributing…", max_entries=64)
def _case_study(
    runs: tuple[tuple[str, str, int, str], ...],
    example_json: str,
    explaining_key: str,
    teacher: bool,
) -> tuple[list[Explanation], dict[str, Agreement]]:
    example = Example(**json.loads(example_json))
    how = common.Explaining.from_key(explaining_key)
    explanations = [
        explain(common.load_cached(*key)[0], [example], name, how.explainer, how.words)[0]
        for name, *key in runs
    ]
    if not teacher:
        return explanations, {}
    first, *students = explanations
    return explanations, {s.name: agreement(first, s, how.settings.view) for s in students}


def _filtered(frame: pd.DataFrame, students: list[str], choice: str) -> pd.DataFrame:
    """The rows of the per-example loyalty table that a filter keeps."""
    if choice == FILTERS[1]:
        return frame[
            pd.concat([frame[s] != frame["teacher"] for s in students], axis=1).any(axis=1)
        ]
    if choice == FILTERS[2]:
        return frame[~frame[[c for c in frame.columns if c.endswith("✓")]].all(axis=1)]
    threshold = st.slider("Saliency loyalty below", -1.0, 1.0, 0.5, 0.05, key=f"{KEY}.threshold")
    frame = frame.assign(**{"lowest SL": frame[[f"{s} SL" for s in students]].min(axis=1)})
    return frame[frame["lowest SL"] < threshold].sort_values("lowest SL")


def _split_example(teacher: RunEntry, students: list[RunEntry]) -> Example | None:
    left, right = st.columns(2)
    split = common.split_choice(KEY, left)
    scored = students and teacher.kind != CACHE  # the filters score the teacher's outputs
    choice = right.selectbox("Show", FILTERS if scored else FILTERS[:1], key=f"{KEY}.filter")
    examples = common.split_frame(common.load(teacher), split)
    if choice == FILTERS[0]:
        frame = examples[["text", "label"]].rename(columns={"label": "gold"})
    else:
        frame = common.split_loyalty(teacher, students, split, SPLIT_LIMIT)[1]
        frame = _filtered(frame, [s.name for s in students], choice)
        st.caption(f"{len(frame)} of the first {min(SPLIT_LIMIT, len(examples))} examples")
    index = _picked_row(frame)
    return None if index is None else common.frame_examples(examples.loc[[index]])[0]


def _picked_row(frame: pd.DataFrame) -> int | None:
    """The index of the row the user selects in ``frame`` (None until one is selected)."""
    rows = common.selected_rows(frame, f"{KEY}.table", height=230)
    if not rows:
        st.caption("Select a row to explain it.")
        return None
    return frame.index[rows[0]]


def _uploaded_example() -> Example | None:
    examples = common.uploaded_examples(KEY)
    if not examples:
        return None
    index = _picked_row(pd.DataFrame([asdict(e) for e in examples]))
    return None if index is None else examples[index]


def _probabilities(explanations: list[Explanation]) -> pd.DataFrame:
    """A row per model: its prediction and the probability of every class."""
    return pd.DataFrame(
        [
            {
                "model": e.name,
                "prediction": e.probabilities[0] if e.regression else e.class_names[e.predicted],
                **({} if e.regression else dict(zip(e.class_names, e.probabilities, strict=True))),
            }
            for e in explanations
        ]
    ).set_index("model")


def _row_notes(explanations: list[Explanation], agreements: dict[str, Agreement]) -> dict[str, str]:
    """Beside each model's rows (label prefixes match every class row): IG's completeness gap,
    and ``SL … · ρ …`` for a student."""

    def number(value: float) -> str:
        return "n/a" if math.isnan(value) else f"{value:.2f}"

    notes = {e.name: [] for e in explanations}
    for e in explanations:
        if e.completeness_gap is not None:
            notes[e.name].append(f"gap {e.completeness_gap:.1%}")
    for name, a in agreements.items():
        notes[name].append(f"SL {number(a.saliency_loyalty)} · ρ {number(a.rank_correlation)}")
    return {name: " · ".join(parts) for name, parts in notes.items()}


def render() -> None:
    st.title("Case study")
    picked = common.pick_models(common.runs(), KEY)
    if picked is None:
        return
    teacher, students = picked
    loaded = common.load_models([teacher, *students])
    if loaded is None:
        return
    weightless = common.weightless(
        teacher, "its attribution map and saliency loyalty need them: the students are shown alone"
    )
    explained_runs = students if weightless else [teacher, *students]
    if not explained_runs:
        st.info("No student chosen: choose one above.")
        return
    spec = loaded[0].spec
    if common.CASE_EXAMPLE in st.session_state:
        st.session_state[f"{KEY}.source"] = SOURCES[0]
    source = st.radio("Example", SOURCES, horizontal=True, key=f"{KEY}.source")
    if source == SOURCES[0]:
        typed = common.typed_examples(KEY, spec.pair)
        example = typed[0] if typed else None
    elif source == SOURCES[1]:
        example = _split_example(teacher, students)
    else:
        example = _uploaded_example()
    explaining = common.heatmap_settings(f"{KEY}.settings", spec.label_names)
    per_row = st.toggle(
        "A colour scale per row",
        key=f"{KEY}.per_row",
        help="each row's colours from its own scores (a faint map beside a strong one shows "
        "its shape); off, all rows share one scale and their strengths compare",
    )
    if example is None:
        return
    try:
        explanations, agreements = case_study(explained_runs, example, explaining, not weightless)
        explained = explained_settings(explaining.explainer, explaining.words)
        heatmap = to_heatmap(explanations, example, explaining.settings, explained=explained)
    except WorkbenchError as error:
        st.error(common.plain(error))
        return
    st.dataframe(_probabilities(explanations).style.format(precision=3))
    if example.label is not None:
        st.text(f"gold label: {example.label}")
    notes = _row_notes(explanations, agreements)
    beside = {row.label: notes.get(row.label.split(" · ")[0], "") for row in heatmap.rows}
    show_heatmap(heatmap, beside, per_row)
    gap = (
        "gap: IG's completeness gap, |Σ attributions − (F(x) − F(x′))| / |F(x) − F(x′)| for "
        "the predicted class's probability F from the baseline x′ to the text x (the Riemann "
        "sum's error; more steps close it on a smooth path); "
        if any(e.completeness is not None for e in explanations)
        else ""
    )
    loyalty = (
        "SL: saliency loyalty, Pearson correlation of the Grad saliency of the teacher and the "
        "student (each for its predicted class); ρ: Spearman correlation of the shown "
        "attribution maps (the teacher's predicted class for the view pred)."
        if agreements
        else ""
    )
    if gap or loyalty:
        st.caption((gap + loyalty).rstrip("; "))
    for explanation in explanations:
        if explanation.gap_warning:
            st.warning(common.plain(explanation.gap_warning))
        if explanation.truncated:
            st.warning(
                common.plain(
                    f"{explanation.truncation_note} (its maximum length): the text was "
                    "truncated, and the rest is neither shown nor explained."
                )
            )
    for name, agreement_ in agreements.items():
        for note in agreement_.notes:
            st.warning(common.plain(f"{name}: {note}"))


if __name__ == "__main__":
    common.run_page(render)
