"""Loyalty: on a split, each student's task metrics and its label, probability and saliency
loyalty to the teacher (LL, PL, SL; docs/methods.md §6; SL by the explainer chosen, Grad saliency
by default), as a table and as plots of the per-example values; select an example where a
student departs from its teacher to open it in the Case study. Against a teacher cache, the
cache's row and each student's LL and PL on the logits it holds (``kdw evaluate``'s rows)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from kd.training.evaluate import evaluate_runs
from workbench.app import common
from workbench.app.catalog import RunEntry
from workbench.app.figures import loyalty_histograms, loyalty_scatter

KEY = "loyalty"
SAMPLE = 500  # examples scored by default


def departures(frame: pd.DataFrame, student: str) -> pd.DataFrame:
    """The examples sorted from the largest departure (lowest PL, then lowest SL)."""
    columns = [f"{student} PL", f"{student} SL", student, "teacher", "gold", "text"]
    return frame[columns].sort_values(columns[:2])


@st.cache_data(show_spinner="Scoring the split against the cache's logits…", max_entries=8)
def _cache_rows(
    cache: tuple[str, int, str], students: tuple[tuple[str, int, str], ...], split: str
) -> tuple[pd.DataFrame, list[str]]:
    notes: list[str] = []
    rows = evaluate_runs(
        [cache[0], *(s[0] for s in students)], split, teacher=cache[0], notify=notes.append
    )
    return pd.DataFrame(rows).set_index("run"), notes


def cache_loyalty(cache: RunEntry, students: list[RunEntry], split: str) -> pd.DataFrame:
    """The teacher cache's row (task metrics of the logits it holds on the whole ``split``) and
    each student's, with its label and probability loyalty to those logits: the rows of
    :func:`~kd.training.evaluate.evaluate_runs`, computed once per runs and split."""
    table, notes = _cache_rows(cache.key(), tuple(s.key() for s in students), split)
    for note in notes:
        st.caption(common.plain(note))
    return table


def above_the_teacher(table: pd.DataFrame, teacher: str) -> list[str]:
    """One line per student whose accuracy (or first metric) in ``table`` (a row per model,
    indexed by name) is above the teacher's row ``teacher``: such a teacher teaches less than
    the labels do."""
    metric = next(m for m in ("accuracy", "spearman", *table.columns) if m in table.columns)
    own = table.loc[teacher, metric]
    return [
        f"{name} scores {score:.3f} {metric}, above its teacher's {own:.3f}: the teacher "
        "teaches less than the labels do here; a stronger teacher, or a transfer set "
        "(--transfer), may help"
        for name, score in table[metric].items()
        if name != teacher and score > own
    ]


def render() -> None:
    st.title("Loyalty")
    picked = common.teacher_and_students(KEY)
    if picked is None:
        return
    teacher, students = picked
    if common.load(teacher).spec.regression:
        st.info("Loyalty (LL, PL, SL) is defined here for classification tasks.")
        return
    if common.weightless(teacher, "saliency loyalty and the per-example plots need them"):
        split = common.split_choice(KEY)
        table = cache_loyalty(teacher, students, split)
        st.subheader(f"Scores on {split} (the whole split: {table['examples'].iloc[0]} examples)")
        st.dataframe(table.style.format(precision=3, na_rep="—"))
        for line in above_the_teacher(table, table.index[0]):
            st.warning(common.plain(line))
        st.caption(
            "label_loyalty (LL): share of examples where the student predicts the class of the "
            "cache's logits; probability_loyalty (PL): mean of 1 − √JSD(p_t ‖ p_s)."
        )
        return
    left, right = st.columns(2)
    split = common.split_choice(KEY, left)
    limit, size = common.sample_size(right, KEY, teacher, split, SAMPLE)
    with st.expander("Saliency loyalty's explainer", expanded=False):
        explaining = common.heatmap_settings(f"{KEY}.settings", default="grad")
    choice = explaining.explainer
    summary, frame = common.split_loyalty(teacher, students, split, limit, choice, explaining.words)
    names = [s.name for s in students]
    whole = "the whole split" if len(frame) == size else f"a sample of the split's {size}"
    st.subheader(f"Scores on {split} ({len(frame)} examples: {whole})")
    st.dataframe(summary.style.format(precision=3, na_rep="—"))  # numbers stay numbers
    for line in above_the_teacher(summary, "teacher"):
        st.warning(common.plain(line))
    per = f" per word ({explaining.words} of its sub-tokens)" if explaining.words else ""
    explainer = choice.describe() + per
    st.caption(
        common.plain(
            "LL: share of examples where the student predicts the teacher's class; PL: mean "
            "of 1 − √JSD(p_t ‖ p_s); SL: mean Pearson correlation of the two models' scores "
            f"of their predicted class by {explainer} (×100), over what 'SL over' says: for a "
            "student of another tokenizer, the words both tokenisations share (each side's "
            "scores summed per word). The teacher's row: the teacher against itself."
        )
    )
    st.page_link(
        Path(__file__).resolve().parent / "compression.py",
        label="Compression: the size and speed these students buy, beside their loyalty",
        icon=":material/speed:",
    )
    st.plotly_chart(loyalty_histograms(frame, names, explainer), key=f"{KEY}.distributions")
    st.caption(
        "Click a point to open its example in the Case study; select several (the box or lasso "
        "tool above the chart) to list them below."
    )
    selected = common.selected_points(loyalty_scatter(frame, names, explainer), f"{KEY}.scatter")
    if len(selected) == 1:
        _open_case_study(teacher, names, split, selected[0])

    st.subheader("Where a student departs most from its teacher")
    student = st.selectbox("Student", names, key=f"{KEY}.student")
    table = departures(frame, student)
    if selected:
        table = table[table.index.isin(selected)]
        st.caption(f"The {len(table)} examples selected in the scatter plot.")
    rows = common.selected_rows(table.style.format(precision=3), f"{KEY}.departures", height=260)
    if not rows:
        st.caption("Select a row to see the example and open it in the Case study.")
        return
    index = table.index[rows[0]]
    st.text(frame.loc[index, "text"])
    if st.button("Open in the Case study", key=f"{KEY}.open"):
        _open_case_study(teacher, names, split, index)


def _open_case_study(teacher: RunEntry, students: list[str], split: str, index: int) -> None:
    """Hand example ``index`` of ``split`` (an index of the loyalty table) and the chosen models
    to the Case study page, and go there."""
    example = common.frame_examples(common.split_frame(common.load(teacher), split).loc[[index]])
    common.open_in_case_study(example[0], teacher, students)


if __name__ == "__main__":
    common.run_page(render)
