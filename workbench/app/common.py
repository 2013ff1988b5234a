"""What the pages share: the runs in the sidebar, models and data loaded once per server, the
model and example pickers and the attribution settings widgets.

User and dataset text is never given to Markdown: it goes through ``st.text``, data frames,
widgets, or HTML escaped by :mod:`workbench.app.heatmap_view`.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st
import torch

from kd.training.config import StudentConfig
from kd.training.teacher_cache import is_cache, open_cache
from workbench.analysis.attribution.registry import (
    EXPLAINERS,
    WORD_AGGREGATIONS,
    ExplainerChoice,
)
from workbench.analysis.examples import Example, read_examples, split_examples
from workbench.analysis.explanations import HeatmapSettings
from workbench.analysis.loyalty import loyalty_tables, split_outputs
from workbench.app.catalog import (
    ADDED_FILE,
    CACHE,
    RunEntry,
    added_entries,
    added_sources,
    discover_runs,
    forget_missing,
    named_under,
    remove_added,
    runs_root,
    runs_roots,
    same_folder,
    shown_name,
)
from workbench.app.forms import choice_widget, config_widgets, fixed
from workbench.app.jobs import live_label, shown_runs
from workbench.core.config import DataConfig, config_key, from_dict, parse_label_map, to_dict
from workbench.core.data import Split, TaskData, load_task, sample_split
from workbench.core.errors import WorkbenchError
from workbench.core.files import atomic_write_json, user_cache
from workbench.core.models import LoadedModel, load_model, load_run, quiet_library_output

THREADS_ENV = "KDW_APP_THREADS"
CASE_EXAMPLE = "case_study.handover"  # session key: an example sent to the Case study page
ADDED_NOTE = "models.added_note"  # session key: what the last folder added gave
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
    """The run and model folders under the runs roots (broken ones with their problem; of the
    demos in the first root, the one shown: :func:`~workbench.app.jobs.shown_runs`), and what
    was added in the sidebar (:func:`~workbench.app.catalog.added_entries`), each folder once."""
    first, *others = runs_roots()
    entries = shown_runs(first)
    for root in others:
        entries += named_under(discover_runs(root), root)
    for source in added_sources():
        entries += added_entries(source)
    unique: dict[Path, RunEntry] = {}
    for entry in entries:
        unique.setdefault(_identity(entry.path), entry)
    return list(unique.values())


def _identity(path: Path) -> Path:
    """``path`` resolved where it exists, else as given (a hub id, a name the file system
    cannot take)."""
    try:
        return path.resolve() if path.exists() else path
    except (OSError, ValueError):
        return path


def _add_model() -> None:
    source = st.session_state.get("models.source", "").strip()
    added = added_sources()
    if source and source not in added:
        atomic_write_json(user_cache() / ADDED_FILE, [*added, source])
        found = added_entries(source)
        usable = [e.name for e in found if e.usable]
        st.session_state[ADDED_NOTE] = (
            f"{source}: {len(usable)} listed ({', '.join(usable)})" if usable else ""
        )
    st.session_state["models.source"] = ""


def runs_sidebar() -> None:
    """The runs root in the sidebar, a field to add a classifier the workbench did not train
    (a Hugging Face folder or hub id), and one clear line per folder that cannot be used; added
    folders that no longer exist are forgotten, with a note."""
    if gone := forget_missing():
        st.session_state[ADDED_NOTE] = f"no longer there, removed from Added: {', '.join(gone)}"
    entries = runs()
    usable = sum(e.usable for e in entries)
    unfinished = sum(e.usable and e.unfinished is not None for e in entries)
    where = ", ".join(str(root.resolve()) for root in runs_roots())
    summary = f"Runs in {where} and added: {usable} ready, {len(entries) - usable} not"
    if unfinished:
        summary += f" ({unfinished} of the ready ones unfinished: their best dev model so far)"
    st.sidebar.caption(plain(summary))
    st.sidebar.text_input(
        "Add a model or runs (folder or hub id)",
        key="models.source",
        on_change=_add_model,
        help="a Hugging Face sequence classifier (a folder saved with save_pretrained: config, "
        "weights, tokenizer; or a hub id), a run folder, or a folder of runs kept outside the "
        "runs root. A student's teacher comes with it, wherever it lives. Kept across reloads "
        "and launches (in the user's cache); a folder under the runs root is listed by itself.",
    )
    if st.session_state.get(ADDED_NOTE):
        st.sidebar.caption(plain(st.session_state[ADDED_NOTE]))
    added = added_sources()
    if added:  # each can be forgotten, whatever its problem
        with st.sidebar.expander(f"Added ({len(added)})"):
            for index, source in enumerate(added):
                st.button(
                    plain(f"Remove {shown_name(source)}"),
                    key=f"models.remove.{index}",
                    on_click=remove_added,
                    args=(source,),
                )
    for entry in entries:
        for problem in filter(None, [entry.problem, *entry.notes]):
            st.sidebar.caption(":material/warning: " + plain(f"{entry.name}: {problem}"))


# --------------------------------------------------------------------------- models


@st.cache_resource(show_spinner="Loading model…", max_entries=12)
def load_cached(path: str, stamp: int, task_of: str = "") -> tuple[LoadedModel, tuple[str, ...]]:
    """The run or model at ``path``, loaded once per server, and what loading it noted (a
    decoder padded with its config's pad token, classes matched by position); ``stamp`` (see
    :meth:`RunEntry.stamp`) makes new weights load anew. A model the workbench did not train is
    applied to the task of the student run ``task_of`` (its data, classes and label map), or to
    its own classes without one. A teacher cache is its teacher without weights (a model on
    the ``meta`` device: :func:`~kd.training.teacher_cache.cached_teacher`), on the data it was
    built on. The app computes on ``$KDW_APP_THREADS`` torch threads
    (default 1: one sentence at a time is fastest, and steadiest on a busy machine, on one)."""
    quiet_library_output()
    torch.set_num_threads(int(os.environ.get(THREADS_ENV, "1")))
    if is_cache(path):
        return open_cache(path), ()
    notes: list[str] = []
    if not task_of:
        return load_model(path, notify=notes.append), tuple(notes)
    student = load_run(task_of)
    label_map = student.run.config(StudentConfig, "student").label_map
    loaded = load_model(path, student.spec, student.data, parse_label_map(label_map), notes.append)
    return loaded, tuple(notes)


def load(entry: RunEntry) -> LoadedModel:
    """The entry's model, loaded once per server (reloaded when its weights change); what
    loading it noted is shown under the page's title."""
    loaded, notes = load_cached(*entry.key())
    for note in notes:
        st.caption(":material/info: " + plain(note))
    return loaded


# the teacher and each teacher's students last chosen, which every page starts with (their
# keys end as the pickers' do: a demo swapped in forgets them, first_run.PICKERS)
CHOSEN_TEACHER, CHOSEN_STUDENTS = "models.chosen.teacher", "models.chosen.students"


def pick_models(
    entries: Sequence[RunEntry], key: str, single_student: bool = False
) -> tuple[RunEntry, list[RunEntry]] | None:
    """A teacher (a teacher run, a model folder the workbench did not train, or a teacher cache)
    and students of the same task (default: those distilled from it; a model folder's or a
    cache's own students only, a model folder then applied to their task)."""
    teachers = {e.name: e for e in entries if e.kind in ("teacher", "model", CACHE) and e.usable}
    root = runs_root()
    if not teachers:
        st.info(
            "No trained teacher yet: the first-run demo build or the Train page makes one, or "
            "add a model folder in the sidebar."
        )
        return None
    # a single student beside the teacher; several below it, on the page's width (their names
    # would be cut in half of it)
    left, right = st.columns(2) if single_student else (st.container(), st.container())
    if st.session_state.get(f"{key}.teacher") not in teachers:  # first shown on this page
        st.session_state[f"{key}.teacher"] = st.session_state.get(CHOSEN_TEACHER, "")
        if st.session_state[f"{key}.teacher"] not in teachers:
            st.session_state[f"{key}.teacher"] = next(iter(teachers))
    name = left.selectbox(
        "Teacher",
        list(teachers),
        format_func=lambda n: live_label(teachers[n], root),
        key=f"{key}.teacher",
    )
    teacher = teachers[name]
    by_folder = teacher.kind != "teacher"  # a folder's own students; a run's: its task's
    students = {
        e.name: e
        for e in entries
        if e.kind == "student"
        and e.usable
        and (same_folder(e.teacher, teacher.path) if by_folder else e.task == teacher.task)
    }
    changed = [name for name, e in students.items() if e.teacher_changed]
    if changed:  # their loyalty would be measured against a teacher they did not learn from
        right.caption(
            f"Not compared: {', '.join(changed)} (teacher changed since distilled; see the sidebar)"
        )
        students = {name: e for name, e in students.items() if not e.teacher_changed}
    own = [name for name, e in students.items() if same_folder(e.teacher, teacher.path)]
    if single_student:
        if not students:
            right.info("No student of this task yet.")
            return teacher, []
        names = own + [n for n in students if n not in own]
        picked = right.selectbox(
            "Student",
            names,
            format_func=lambda n: live_label(students[n], root),
            key=f"{key}.student",
        )
        chosen = [students[picked]]
    else:
        chosen_before = st.session_state.get(f"{key}.students")
        if chosen_before is None or (chosen_before and not set(chosen_before) & set(students)):
            # first shown, or another teacher's: what another page chose for this teacher, else
            # its own students, else every student of its task
            shared = st.session_state.get(CHOSEN_STUDENTS, {}).get(name)
            shared = None if shared is None else [n for n in shared if n in students]
            st.session_state[f"{key}.students"] = (
                shared if shared is not None else own or list(students)
            )
        picked = right.multiselect(
            "Students",
            list(students),
            format_func=lambda n: live_label(students[n], root),
            key=f"{key}.students",
        )
        chosen = [students[name] for name in picked]
        st.session_state.setdefault(CHOSEN_STUDENTS, {})[name] = list(picked)
    st.session_state[CHOSEN_TEACHER] = name
    if teacher.kind == "model" and chosen:  # applied to its students' task
        teacher = replace(teacher, task_of=chosen[0].path)
    return teacher, chosen


def teacher_and_students(key: str) -> tuple[RunEntry, list[RunEntry]] | None:
    """The teacher and at least one student a page compares (:func:`pick_models`), loaded;
    None, with a message on the page, until there are such runs and they load."""
    picked = pick_models(runs(), key)
    if picked is None:
        return None
    teacher, students = picked
    if not students:
        st.info(
            "No student chosen: choose one above, or wait for one (the demo build and the "
            "Train page make them)."
        )
        return None
    return None if load_models([teacher, *students]) is None else (teacher, students)


def weightless(teacher: RunEntry, needs: str) -> bool:
    """Whether ``teacher`` is a teacher cache, said in one caption with what the page ``needs``
    the teacher's weights for, and what it shows instead."""
    if teacher.kind != CACHE:
        return False
    st.caption(
        plain(
            f"{teacher.name} is a teacher cache: the logits its teacher gave, without the "
            f"teacher's weights; {needs}."
        )
    )
    return True


def load_models(entries: Sequence[RunEntry]) -> list[LoadedModel] | None:
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


def task_split(loaded: LoadedModel, split: str) -> Split:
    """One split of a run's task (loaded once per server)."""
    if loaded.data is None:
        raise WorkbenchError(
            f"{loaded.name} is a model applied to no task yet: choose a student distilled from "
            "it (the model is then applied to its task), or type a text"
        )
    data = _task(config_key(loaded.data))
    if split not in data.splits:
        raise WorkbenchError(f"the task has no {split!r} split: {sorted(data.splits)}")
    return data.splits[split]


def split_frame(loaded: LoadedModel, split: str) -> pd.DataFrame:
    """A split as a table: ``text``, ``pair``, ``label`` (class name), ``uid``."""
    examples = split_examples(task_split(loaded, split), loaded.spec)
    return pd.DataFrame([asdict(e) for e in examples])


@st.cache_data(show_spinner="Scoring the split: predictions and saliency…", max_entries=8)
def _split_loyalty(
    teacher: tuple[str, int, str],
    students: tuple[tuple[str, str, int, str], ...],
    split: str,
    limit: int,
    explainer: str,
    words: str | None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    model = load_cached(*teacher)[0]
    part = sample_split(task_split(model, split), limit, seed=0, stratify=not model.spec.regression)
    record = json.loads(explainer)
    choice = ExplainerChoice(record["explainer"], record["explainer_settings"])
    outputs = {
        name: split_outputs(load_cached(*key)[0], part, explainer=choice, words=words)
        for name, *key in students
    }
    summary, frame = loyalty_tables(
        model.spec,
        split_examples(part, model.spec),
        split_outputs(model, part, explainer=choice, words=words),
        outputs,
    )
    position = {uid: i for i, uid in enumerate(task_split(model, split).uids)}
    return summary, frame.set_axis([position[uid] for uid in part.uids])


def split_loyalty(
    teacher: RunEntry,
    students: Sequence[RunEntry],
    split: str,
    limit: int,
    explainer: ExplainerChoice | None = None,
    words: str | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Summary and per-example loyalty tables of the students on a fixed stratified sample of
    ``limit`` examples of a split, their saliency loyalty by ``explainer`` (default: Grad
    saliency) per sub-token or, with ``words``, per word, computed once per choice; the
    per-example table is indexed by the examples' positions in the split (the index of
    :func:`split_frame`)."""
    choice = json.dumps((explainer or ExplainerChoice("grad")).record(), sort_keys=True)
    return _split_loyalty(
        teacher.key(), tuple((s.name, *s.key()) for s in students), split, limit, choice, words
    )


def frame_examples(frame: pd.DataFrame) -> list[Example]:
    """The examples of rows of :func:`split_frame`."""
    return [
        Example(r.text, r.pair if isinstance(r.pair, str) else None, r.label, r.uid)
        for r in frame.itertuples()
    ]


def selected_rows(table: Any, key: str, mode: str = "single-row", **options: Any) -> list[int]:
    """The positions of the rows the user selects in ``table`` (a data frame, or its styler),
    drawn by ``st.dataframe`` with ``options``."""
    chosen = st.dataframe(table, on_select="rerun", selection_mode=mode, key=key, **options)
    return chosen.selection.rows


def selected_points(figure: Any, key: str, mode: Any = ("points", "box", "lasso")) -> list[int]:
    """The ``customdata[0]`` of each point the user selects in ``figure`` (each once, in order),
    drawn by ``st.plotly_chart`` with the selection ``mode``."""
    event = st.plotly_chart(figure, key=key, on_select="rerun", selection_mode=mode)
    points = event.selection.points
    return list(dict.fromkeys(int(p["customdata"][0]) for p in points if "customdata" in p))


def open_in_case_study(example: Example, teacher: RunEntry, students: Sequence[str]) -> None:
    """Switch to the Case study page, showing ``example`` through the same teacher and the
    students named."""
    st.session_state[CASE_EXAMPLE] = example
    st.session_state["case.teacher"] = teacher.name
    st.session_state["case.students"] = list(students)
    st.switch_page(Path(__file__).resolve().parent / "case_study.py")


def typed_examples(key: str, pair: bool, many: bool = False) -> list[Example]:
    """Texts typed by the user (one per line when ``many``), with a second text for pairs."""
    handed = st.session_state.pop(CASE_EXAMPLE, None)
    if handed is not None:  # kept, with its gold label, while its text is not edited
        st.session_state[f"{key}.text"] = handed.text
        st.session_state[f"{key}.pair"] = handed.pair or ""
        st.session_state[f"{key}.handed"] = handed
    st.session_state.setdefault(f"{key}.text", DEFAULT_TEXT)
    label = "Texts, one per line" if many else "Text"
    text = st.text_area(label, key=f"{key}.text", height=100 if many else 80)
    second = st.text_input("Second text (pair task)", key=f"{key}.pair") if pair else None
    lines = [t.strip() for t in (text.splitlines() if many else [text]) if t.strip()]
    examples = [Example(t, second or "") if pair else Example(t) for t in lines]
    handed = st.session_state.get(f"{key}.handed")
    if handed is not None and [(e.text, e.pair or "") for e in examples] == [
        (handed.text, handed.pair or "")
    ]:
        return [handed]
    return examples


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


def sample_size(
    column, key: str, teacher: RunEntry, split: str, default: int, help_text: str | None = None
) -> tuple[int, int]:
    """How many examples of ``split`` a page scores (a fixed stratified sample, at most the
    whole split), asked in ``column``, and the split's size. The field starts anew at
    ``default`` (or the whole split, if smaller) when the split's size changes."""
    size = len(task_split(load(teacher), split))
    chosen = column.number_input(
        f"Examples (a fixed stratified sample of the split's {size})",
        min_value=1,
        max_value=size,
        value=min(default, size),
        step=max(1, min(100, size // 10)),
        key=f"{key}.examples.{split}.{size}",
        help=help_text,
    )
    return int(chosen), size


def split_choice(key: str, column=st) -> str:
    return column.selectbox("Split", ["test", "dev", "train"], key=f"{key}.split")


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Explaining:
    """How a page explains: the class explained, a registered explainer with its settings and
    the word aggregation (None: sub-tokens)."""

    settings: HeatmapSettings
    explainer: ExplainerChoice = field(default_factory=ExplainerChoice)
    words: str | None = None

    def key(self) -> str:
        """The three as one JSON text (a cache key; :meth:`from_key` reads it back)."""
        values = [to_dict(self.settings), self.explainer.record(), self.words]
        return json.dumps(values, sort_keys=True)

    @classmethod
    def from_key(cls, text: str) -> Explaining:
        settings, choice, words = json.loads(text)
        explainer = ExplainerChoice(choice["explainer"], choice["explainer_settings"])
        return cls(from_dict(HeatmapSettings, settings), explainer, words)


def heatmap_settings(
    key: str, class_names: Sequence[str] | None = None, words: bool = True, default: str = "ig"
) -> Explaining:
    """An explainer of the registry (docs/explainers.md), its settings (its own dataclass's),
    the class explained and whether scores are per sub-token or per word.
    Without ``class_names`` the page explains the predicted class and asks no class; without
    ``words``, it scores sub-tokens and asks nothing of words. ``default``: the explainer shown
    first."""
    left, right = st.columns(2)
    name = left.selectbox(
        "Explainer",
        list(EXPLAINERS),
        index=list(EXPLAINERS).index(default),
        format_func=lambda n: f"{EXPLAINERS[n].title} ({n})",
        key=f"{key}.explainer",
        help=" · ".join(f"{n}: {e.description}" for n, e in EXPLAINERS.items()),
    )
    per = "sub-token"
    if words:
        per = right.selectbox(
            "Scores per",
            ["sub-token", *WORD_AGGREGATIONS],
            format_func=lambda w: w if w == "sub-token" else f"word ({w} of its sub-tokens)",
            key=f"{key}.words",
            help="a word's score: the sum, the mean or the largest |score| of its sub-tokens",
        )
    aggregation = None if per == "sub-token" else per
    classes = None if class_names is None else ("pred", "gold", "all", *class_names)
    view = fixed("pred") if classes is None else functools.partial(choice_widget, choices=classes)
    own = EXPLAINERS[name].settings
    choice = config_widgets(own, f"{key}.{name}", columns=4) if fields(own) else None
    view_help = HeatmapSettings.__dataclass_fields__["view"].metadata["help"]
    settings = HeatmapSettings(view=view("view", "pred", view_help, f"{key}.view"))
    return Explaining(settings, ExplainerChoice(name, choice), aggregation)
