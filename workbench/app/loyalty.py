"""Loyalty: on a split, each student's task metrics and its label, probability and saliency
loyalty to the teacher (LL, PL, SL; METHODS.md §6), as a table and as plots of the per-example
values; select an example where a student departs from its teacher to open it in the Case
study."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st
from matplotlib.figure import Figure

from workbench.app import common

KEY = "loyalty"
RIGHT, WRONG = "#e66101", "#5e3c99"  # PuOr ends: colour-blind safe


def distributions(frame: pd.DataFrame, students: list[str]) -> Figure:
    """Histograms of per-example PL and SL, one colour per student."""
    fig = Figure(figsize=(9, 2.8), layout="constrained")
    for ax, metric in zip(fig.subplots(1, 2), ("PL", "SL"), strict=True):
        for student in students:
            values = frame.get(f"{student} {metric}", pd.Series(dtype=float)).dropna()
            if len(values):
                ax.hist(values, bins=20, alpha=0.55, label=student)
        ax.set_title(f"per-example {metric}", fontsize=9)
        ax.legend(fontsize=7)
    return fig


def loyalty_scatter(frame: pd.DataFrame, students: list[str]) -> Figure:
    """Per student: PL (x) against SL (y), each example coloured by whether the student is
    right."""
    fig = Figure(figsize=(4 * len(students), 3.2), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(students), squeeze=False)[0])
    for ax, student in zip(axes, students, strict=True):
        right = frame[f"{student} ✓"].astype(bool)
        for mask, colour, label in (
            (right, RIGHT, "student right"),
            (~right, WRONG, "student wrong"),
        ):
            ax.scatter(
                frame.loc[mask, f"{student} PL"],
                frame.loc[mask, f"{student} SL"],
                s=10,
                alpha=0.6,
                color=colour,
                label=label,
            )
        ax.set_xlabel("probability loyalty PL", fontsize=8)
        ax.set_ylabel("saliency loyalty SL", fontsize=8)
        ax.set_title(student, fontsize=9, parse_math=False)
        ax.legend(fontsize=7)
    return fig


def departures(frame: pd.DataFrame, student: str) -> pd.DataFrame:
    """The examples sorted from the largest departure (lowest PL, then lowest SL)."""
    columns = [f"{student} PL", f"{student} SL", student, "teacher", "gold", "text"]
    return frame[columns].sort_values(columns[:2])


def render() -> None:
    st.title("Loyalty")
    entries = common.runs()
    picked = common.pick_models(entries, KEY)
    if picked is None:
        return
    teacher, students = picked
    if not students:
        st.info("Choose at least one student.")
        return
    if common.load_models([teacher, *students]) is None:
        return
    if common.load(teacher).spec.regression:
        st.info("Loyalty (LL, PL, SL) is defined here for classification tasks.")
        return
    left, right = st.columns(2)
    with left:
        split = common.split_choice(KEY)
    limit = right.number_input(
        "Examples (a fixed sample of the split, stratified)",
        10,
        100_000,
        500,
        100,
        key=f"{KEY}.limit",
    )
    summary, frame = common.split_loyalty(teacher, students, split, int(limit))
    names = [s.name for s in students]
    st.subheader(f"Scores on {split} ({len(frame)} examples)")
    st.dataframe(summary.round(3).astype(object).where(summary.notna(), "—"))
    st.caption(
        "LL: share of examples where the student predicts the teacher's class; PL: mean "
        "of 1 − √JSD(p_t ‖ p_s); SL: mean Pearson correlation of the two models' Grad "
        "saliency (×100)."
    )
    st.pyplot(distributions(frame, names))
    st.pyplot(loyalty_scatter(frame, names))

    st.subheader("Where a student departs most from its teacher")
    student = st.selectbox("Student", names, key=f"{KEY}.student")
    table = departures(frame, student)
    chosen = st.dataframe(
        table.style.format(precision=3),
        on_select="rerun",
        height=260,
        selection_mode="single-row",
        key=f"{KEY}.departures",
    )
    if not chosen.selection.rows:
        st.caption("Select a row to see the example and open it in the Case study.")
        return
    index = table.index[chosen.selection.rows[0]]
    example = common.frame_examples(common.split_frame(common.load(teacher), split).loc[[index]])
    st.text(example[0].text)
    if st.button("Open in the Case study", key=f"{KEY}.open"):
        st.session_state[common.CASE_EXAMPLE] = example[0]
        st.session_state["case.teacher"] = teacher.name
        st.session_state["case.students"] = names
        st.switch_page("workbench/app/case_study.py")


if __name__ == "__main__":
    common.run_page(render)
