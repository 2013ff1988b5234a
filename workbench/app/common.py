"""What the pages share: the runs in the sidebar, models and data loaded once per server, the
model and example pickers and the attribution settings widgets.

User and dataset text is never given to Markdown: it goes through ``st.text``, data frames,
widgets, or HTML escaped by :mod:`workbench.app.heatmap_view`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import pandas as pd
import streamlit as st
import torch

from workbench.analysis import loyalty_tables, split_outputs
from workbench.app.catalog import RunEntry, runs_root, same_folder
from workbench.app.forms import config_widgets
from workbench.app.jobs import shown_runs
from workbench.config import DataConfig, config_key, from_dict
from workbench.data import Split, TaskData, load_task, sample_split
from workbench.errors import WorkbenchError
from workbench.heatmaps import Example, HeatmapSettings, read_examples, split_examples
from workbench.models import LoadedRun, load_run, quiet_library_output

THREADS_ENV = "KDW_APP_THREADS"
CASE_EXAMPLE = "case_study.handover"  # session key: an example sent to the Case study page
DEFAULT_TEXT = "the movie was not good, but the music was really great"
_MARKDOWN_SPECIALS = re.compile(r"([\\`*_{}\[\]()#+\-.!|$<>~:])")


def plain(text: object) -> str:
    """``text`` for Streamlit's Markdown (messages, captions, headers) shown as it is: its
    special characters backslash-escaped, so ``$…$`` or ``**`` in user or dataset text stays
    text."""
    return _MARKDOWN_SPECIALS.sub(r"\\\1", str(text))


def run_page(render: Callable[[], None]) -> None:
    """Run a page; a problem with a run or its data (a moved task file, a corrupt cache) ends
    it with its one-line message instead of a stack trace."""
    try:
        render()
    except WorkbenchError as error:
        st.error(plain(error))


def runs() -> list[RunEntry]:
    """The run folders under the runs root (broken ones with their problem; of the demos, the
    one shown: :func:`~workbench.app.jobs.shown_runs`)."""
    return shown_runs(runs_root())


def runs_sidebar() -> None:
    """The runs root in the sidebar, and one clear line per run folder that cannot be used."""
    root = runs_root()
    entries = shown_runs(root)
    usable = sum(e.usable for e in entries)
    summary = f"Runs in {root.resolve()}: {usable} ready, {len(entries) - usable} not"
    st.sidebar.caption(plain(summary))
    for entry in entries:
        if entry.problem:
            st.sidebar.caption(":material/warning: " + plain(f"{entry.name}: {entry.problem}"))


# --------------------------------------------------------------------------- models


@st.cache_resource(show_spinner="Loading model…", max_entries=12)
def load_cached(path: str, stamp: int) -> LoadedRun:
    """The run at ``path``, loaded once per server; ``stamp`` (see :meth:`RunEntry.stamp`)
    makes new weights load anew. The app computes on ``$KDW_APP_THREADS`` torch threads
    (default 1: one sentence at a time is fastest, and steadiest on a busy machine, on one)."""
    quiet_library_output()
    torch.set_num_threads(int(os.environ.get(THREADS_ENV, "1")))
    return load_run(path)


def load(entry: RunEntry) -> LoadedRun:
    """The run's model, loaded once per server (reloaded when its weights change)."""
    return load_cached(str(entry.path), entry.stamp())


def pick_models(
    entries: Sequence[RunEntry], key: str, single_student: bool = False
) -> tuple[RunEntry, list[RunEntry]] | None:
    """A teacher and students of the same task (default: those distilled from it)."""
    teachers = {e.name: e for e in entries if e.kind == "teacher" and e.usable}
    if not teachers:
        st.info("No trained teacher yet: the first-run demo build or the Train page makes one.")
        return None
    left, right = st.columns(2)
    teacher = teachers[left.selectbox("Teacher", list(teachers), key=f"{key}.teacher")]
    students = {
        e.name: e for e in entries if e.kind == "student" and e.usable and e.task == teacher.task
    }
    own = [name for name, e in students.items() if same_folder(e.teacher_run, teacher.path)]
    if single_student:
        if not students:
            right.info("No student of this task yet.")
            return teacher, []
        names = own + [n for n in students if n not in own]
        return teacher, [students[right.selectbox("Student", names, key=f"{key}.student")]]
    chosen = right.multiselect("Students", list(students), default=own, key=f"{key}.students")
    return teacher, [students[name] for name in chosen]


def teacher_and_students(key: str) -> tuple[RunEntry, list[RunEntry]] | None:
    """The teacher and at least one student a page compares (:func:`pick_models`), loaded;
    None, with a message on the page, until there are such runs and they load."""
    picked = pick_models(runs(), key)
    if picked is None:
        return None
    teacher, students = picked
    if not students:
        st.info("Choose at least one student.")
        return None
    if load_models([teacher, *students]) is None:
        return None
    return teacher, students


def load_models(entries: Sequence[RunEntry]) -> list[LoadedRun] | None:
    """Load the chosen runs; a run that fails shows its message and stops the page."""
    loaded = []
    for entry in entries:
        try:
            loaded.append(load(entry))
        except WorkbenchError as error:
            st.error(plain(f"{entry.name}: {error}"))
            return None
    return loaded


# --------------------------------------------------------------------------- examples


@st.cache_resource(show_spinner="Loading the data…", max_entries=4)
def _task(data_json: str) -> TaskData:
    return load_task(from_dict(DataConfig, json.loads(data_json)))


def task_split(loaded: LoadedRun, split: str) -> Split:
    """One split of a run's task (loaded once per server)."""
    data = _task(config_key(loaded.data))
    if split not in data.splits:
        raise WorkbenchError(f"the task has no {split!r} split: {sorted(data.splits)}")
    return data.splits[split]


def split_frame(loaded: LoadedRun, split: str) -> pd.DataFrame:
    """A split as a table: ``text``, ``pair``, ``label`` (class name), ``uid``."""
    examples = split_examples(task_split(loaded, split), loaded.spec)
    return pd.DataFrame([asdict(e) for e in examples])


@st.cache_data(show_spinner="Scoring the split: predictions and Grad saliency…", max_entries=8)
def _split_loyalty(
    teacher: tuple[str, int], students: tuple[tuple[str, str, int], ...], split: str, limit: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    model = load_cached(*teacher)
    part = sample_split(task_split(model, split), limit, seed=0, stratify=not model.spec.regression)
    outputs = {
        name: split_outputs(load_cached(path, stamp), part) for name, path, stamp in students
    }
    summary, frame = loyalty_tables(
        model.spec, split_examples(part, model.spec), split_outputs(model, part), outputs
    )
    position = {uid: i for i, uid in enumerate(task_split(model, split).uids)}
    return summary, frame.set_axis([position[uid] for uid in part.uids])


def split_loyalty(
    teacher: RunEntry, students: Sequence[RunEntry], split: str, limit: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Summary and per-example loyalty tables of the students on a fixed stratified sample of
    ``limit`` examples of a split (computed once per choice); the per-example table is indexed
    by the examples' positions in the split (the index of :func:`split_frame`)."""
    return _split_loyalty(
        (str(teacher.path), teacher.stamp()),
        tuple((s.name, str(s.path), s.stamp()) for s in students),
        split,
        limit,
    )


def frame_examples(frame: pd.DataFrame) -> list[Example]:
    """The examples of rows of :func:`split_frame`."""
    return [
        Example(r.text, r.pair if isinstance(r.pair, str) else None, r.label, r.uid)
        for r in frame.itertuples()
    ]


def open_in_case_study(example: Example, teacher: RunEntry, students: Sequence[str]) -> None:
    """Switch to the Case study page, showing ``example`` through the same teacher and the
    students named."""
    st.session_state[CASE_EXAMPLE] = example
    st.session_state["case.teacher"] = teacher.name
    st.session_state["case.students"] = list(students)
    st.switch_page("workbench/app/case_study.py")


def typed_examples(key: str, pair: bool, many: bool = False) -> list[Example]:
    """Texts typed by the user (one per line when ``many``), with a second text for pairs."""
    handed = st.session_state.pop(CASE_EXAMPLE, None)
    if handed is not None:
        st.session_state[f"{key}.text"] = handed.text
        st.session_state[f"{key}.pair"] = handed.pair or ""
    st.session_state.setdefault(f"{key}.text", DEFAULT_TEXT)
    label = "Texts, one per line" if many else "Text"
    text = st.text_area(label, key=f"{key}.text", height=100 if many else 80)
    second = st.text_input("Second text (pair task)", key=f"{key}.pair") if pair else None
    lines = [t.strip() for t in (text.splitlines() if many else [text]) if t.strip()]
    return [Example(t, second or "") if pair else Example(t) for t in lines]


def uploaded_examples(key: str) -> list[Example]:
    """Examples from an uploaded CSV/JSONL file, checked for type and size."""
    upload = st.file_uploader(
        "CSV or JSONL with a text column (optional text_pair, label)",
        type=["csv", "jsonl"],
        key=f"{key}.upload",
    )
    if upload is None:
        return []
    try:
        return read_examples(upload.getvalue(), upload.name)
    except WorkbenchError as error:
        st.error(plain(error))
        return []


def split_choice(key: str) -> str:
    return st.selectbox("Split", ["test", "dev", "train"], key=f"{key}.split")


# --------------------------------------------------------------------------- settings


def _view_widget(class_names: Sequence[str]):
    def widget(label: str, default: Any, help_text: str, key: str) -> str:
        options = ["pred", "gold", "all", *class_names]
        return st.selectbox(label, options, index=options.index(default), help=help_text, key=key)

    return widget


def heatmap_settings(key: str, class_names: Sequence[str]) -> HeatmapSettings:
    """Method, steps, baseline, K and view, from :class:`HeatmapSettings`'s fields."""
    return config_widgets(
        HeatmapSettings, key, overrides={"view": _view_widget(class_names)}, columns=5
    )
