"""Train: configure a teacher fine-tuning or a distillation (any preset, or explicit term
weights) with widgets generated from the config dataclasses, launch it as a separate process,
follow its loss and dev-metric curves live, stop it, resume it; and the list of runs with their
configs and metrics (a broken run folder shows its problem on its row)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from kd.experiments.config import TuneConfig
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import PRESETS, TERMS
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.evaluate import objective_description
from kd.training.tracking import TrackingConfig
from workbench.app import common
from workbench.app.catalog import RunEntry, discover_runs, discover_studies, runs_root
from workbench.app.figures import curves, trials_figure
from workbench.app.forms import config_widgets, fixed
from workbench.app.jobs import (
    TRAININGS,
    Job,
    cache_progress,
    job_for,
    launch_training,
    live_progress,
    read_jobs,
    read_progress,
    request_stop,
    step_records,
)
from workbench.core.config import DataConfig, from_dict, to_dict
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.runs import Run

KEY = "train"
SECTIONS = {
    "teacher": (
        ("data", DataConfig),
        ("teacher", TeacherConfig),
        ("optim", OptimConfig),
        ("tracking", TrackingConfig),
    ),
    "student": (
        ("data", DataConfig),
        ("student", StudentConfig),
        ("objective", ObjectiveConfig),
        ("optim", OptimConfig),
        ("tracking", TrackingConfig),
    ),
}
SECTIONS["search"] = (*SECTIONS["student"], ("tune", TuneConfig))  # kdw tune
JOB_KIND = {"teacher": "teacher", "student": "student", "search": "tune"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
RESUMABLE = ("created", "running", "stopped", "failed", "unknown")
ALONE = "none: the student alone"  # the Train page's teacher for a student trained alone


def _select(options: list[str]):
    """A selectbox override for a text field whose sensible values are known."""

    def widget(label: str, default: Any, help_text: str, key: str) -> str:
        shown = list(dict.fromkeys([default, *options] if default else options))
        return st.selectbox(label, shown, help=help_text, key=key)

    return widget


def _form(root, kind: str, teacher: RunEntry | None) -> None:
    """The configuration form; on submit, the training starts in the background."""
    data_defaults = from_dict(DataConfig, teacher.info.configs["data"]) if teacher else None
    overrides = {"preset": _select(sorted(PRESETS))}
    if teacher is not None:
        overrides["teacher"] = _select([str(teacher.path)])
    elif kind == "student":  # trained alone: from the labels, with no teacher term
        st.caption(
            "The student alone: the finetune preset (cross-entropy on the labels) on a "
            "pretrained checkpoint, with no teacher."
        )
        alone = {"preset": "finetune", "teacher": "", "init": "pretrained"}
        overrides |= {name: fixed(value) for name, value in alone.items()}
    default_name = st.session_state.setdefault(
        f"{KEY}.default_name.{kind}", f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    with st.form(f"{KEY}.form.{kind}"):
        name = st.text_input(
            "Run name (a folder under the runs root)", default_name, key=f"{KEY}.name.{kind}"
        )
        configs = {}
        for section, cls in SECTIONS[kind]:
            scope = f"{KEY}.{kind}.{section}" + (
                f".{teacher.name}" if section == "data" and teacher is not None else ""
            )
            with st.expander(
                f"{section}: {(cls.__doc__ or '').strip()}",
                expanded=section not in ("optim", "tracking"),
            ):
                defaults = data_defaults if section == "data" else None
                configs[section] = to_dict(config_widgets(cls, scope, defaults, overrides))
        launched = st.form_submit_button("Launch", type="primary", key=f"{KEY}.launch")
    if not launched:
        return
    target = root / name.strip()
    if not NAME.match(name.strip()):
        st.error("Name the run with letters, digits, '-', '_' or '.'.")
    elif target.exists():
        st.error(
            common.plain(f"{target} exists: choose another name, or resume it from the list below.")
        )
    else:
        launch_training(root, target, JOB_KIND[kind], configs)
        st.success(common.plain(f"Started {name}: follow it below."))


def _curves(folder, metrics: list[dict], key: str) -> None:
    """Training losses per step (progress file), dev metrics per evaluation, and the
    objective's diagnostics (:mod:`kd.training.diagnostics`) where the run logged them; ``key``
    keeps the charts of several runs apart."""
    steps = step_records(read_progress(folder))
    left, right = st.columns(2)
    if steps:
        losses = pd.DataFrame(steps).set_index("step")
        columns = [c for c in losses.columns if c not in ("total", "time", "stage")]
        left.caption("training losses")
        left.plotly_chart(
            curves(losses[columns], "step", "loss", ("grad_norm",), "gradient norm"),
            key=f"{key}.losses",
        )
    dev = [r for r in metrics if r.get("split") == "dev"]
    if dev:
        frame = pd.DataFrame(dev).set_index("step")
        ignore = {"epoch", "split", "lr", "loss", "grad_norm", *TERMS}
        right.caption("dev metrics")
        right.plotly_chart(
            curves(frame[[c for c in frame.columns if c not in ignore]], "step", "dev"),
            key=f"{key}.dev",
        )
    diagnostics = [r for r in metrics if r.get("split") == "train"]
    if diagnostics:
        frame = pd.DataFrame(diagnostics).set_index("step")
        left, right = st.columns(2)
        for column, prefix, caption, axis in (
            (left, "value/", "each term's weighted value (what dominates the loss)", "value"),
            (
                right,
                "grad_share/",
                "each term's share of the gradient: all at the first and last logged step (they "
                "sum to 1), one term in turn between",
                "share",
            ),
        ):
            shown = frame[[c for c in frame.columns if c.startswith(prefix)]]
            column.caption(caption)
            column.plotly_chart(
                curves(shown.rename(columns=lambda c, p=prefix: c.removeprefix(p)), "step", axis),
                key=f"{key}.{axis}",
            )


def _metrics(folder: Path) -> list[dict]:
    """A run's logged records for its curves; a damaged ``metrics.jsonl`` is a warning in
    their place, the rest of the page drawn."""
    try:
        return Run(folder).metrics() if (folder / "run.json").exists() else []
    except WorkbenchError as error:
        st.warning(common.plain(error))
        return []


@st.fragment(run_every=2)
def _live(job: Job) -> None:
    """One running training: progress, curves and a stop button, refreshed every 2 s."""
    records = read_progress(job.folder)
    steps = step_records(records)
    last = steps[-1] if steps else None
    cache = cache_progress(records)
    if last:
        fraction = last["step"] / last["total"]
        text = f"{job.name}: step {last['step']}/{last['total']}, loss {last.get('loss', 0):.4f}"
    else:
        fraction, text = cache or (0.0, "preparing (data, model)…")
        text = f"{job.name}: {text}"
    st.progress(fraction, text=text)
    _curves(job.folder, _metrics(job.folder), f"{KEY}.live.{job.name}")
    if st.button("Stop", key=f"{KEY}.stop.{job.name}"):
        request_stop(job)
        st.info("Stopping at the next step; the run keeps a checkpoint and can resume.")
    if not job.alive:
        st.rerun(scope="app")


def _studies(root) -> None:
    """A ``kdw tune`` study under the runs root, chosen by the user: its trials as a table and
    a chart, and the best configuration."""
    from kd.experiments.tune import study_trials

    folders = {folder.name: folder for folder in discover_studies(root)}
    folder = folders[st.selectbox("Study", list(folders), key=f"{KEY}.study")]
    try:
        rows = study_trials(folder)
    except Exception as error:  # a study being created, or a damaged file
        known = isinstance(error, WorkbenchError)
        text = error if known else f"cannot read {folder / 'study.db'}: {first_line(error)}"
        st.caption(common.plain(text))
        return
    if rows:
        trials = pd.DataFrame(rows)
        st.dataframe(trials, hide_index=True)
        if trials["dev"].notna().any():
            st.caption("dev value of each finished trial, and the best so far")
            st.plotly_chart(trials_figure(trials), key=f"{KEY}.trials")
    best = folder / "best.json"
    if best.exists():
        st.caption(
            common.plain(f"best configuration: {best} (kdw distill --config {best} --run-dir DIR)")
        )


def _runs_table(entries: list[RunEntry], root) -> pd.DataFrame:
    """A row per run folder, and one per training launched whose folder is not written yet."""
    listed = {entry.path.resolve() for entry in entries}
    rows = [  # where each stands as its live panel says (the progress file)
        {
            "run": job.name,
            "kind": job.kind,
            "state": "training",
            "step": live_progress(job, job.folder),
        }
        for job in read_jobs(root)
        if job.kind in TRAININGS and job.alive and job.folder.resolve() not in listed
    ]
    for entry in entries:
        task = entry.info.task if entry.info else None
        main = ((task.metrics if task else []) or ["metric"])[0]
        results = entry.results()
        scored = {split: results.get(split, {}) for split in ("dev", "test")}
        job = _training(root, entry)
        step = f"{entry.status.step or 0}/{entry.status.total or '?'}"
        rows.append(
            {
                "run": entry.name,
                "kind": entry.kind,
                "method": entry.method,
                "objective": objective_description(entry.info)
                if entry.kind in ("teacher", "student")
                else "",  # a model folder was not trained here: no objective
                "task": entry.task,
                "state": "training" if job else entry.state if entry.kind else "broken",
                "step": live_progress(job, entry.path) if job else step,
                **{s: f"{main} {c[main]:.3f}" if main in c else "" for s, c in scored.items()},
                "problem": "; ".join(filter(None, [entry.problem, *entry.notes])),
            }
        )
    return pd.DataFrame(rows)


def _training(root, entry: RunEntry) -> Job | None:
    """The live job training ``entry`` now: its own training, or the demo build while the run
    is the one it trains."""
    job = job_for(root, entry.path)
    if job is None or not job.alive or (job.kind == "demo" and entry.state != "running"):
        return None
    return job


def _details(entry: RunEntry, root) -> None:
    """A run's configs, curves, results, log and a resume button."""
    if entry.kind == "model":  # a model folder: not trained here, nothing to resume
        if entry.problem:
            st.error(common.plain(entry.problem))
        else:
            st.caption(f"{common.plain(entry.path)}: a model folder, not trained by the workbench")
        return
    job = job_for(root, entry.path)
    if job is not None and job.alive and job.kind == "demo" and entry.state != "finished":
        st.caption(
            "The app's demo build trains this run: it resumes it by itself on the next launch "
            "if the app stops first."
        )
    elif entry.info and _training(root, entry) is None and entry.state in RESUMABLE:
        if entry.state == "running":
            st.caption(
                "Its status says running but the app runs no job for it: it was "
                "interrupted, or another process (kdw) is training it — resume only if "
                "not, or the two would overwrite each other."
            )
        if st.button(f"Resume {common.plain(entry.name)}", key=f"{KEY}.resume"):
            launch_training(root, entry.path, entry.kind, entry.info.configs)
            st.rerun()
    if not entry.info:
        st.error(common.plain(entry.problem))
        return
    st.caption(common.plain(entry.path))
    configs, curves = st.columns([1, 2])
    with configs:
        st.json(entry.info.configs, expanded=1)
        if entry.results():
            st.json(entry.results(), expanded=1)
        for note in entry.notes:
            st.warning(common.plain(note))
    with curves:
        _curves(entry.path, _metrics(entry.path), f"{KEY}.details")
    if job is not None and job.log_tail():
        with st.expander("log"):
            st.code(job.log_tail())


def render() -> None:
    st.title("Train")
    root = runs_root()
    entries = discover_runs(root)
    st.subheader("New training")
    kind = st.radio(
        "Train a",
        ["teacher", "student", "search"],
        horizontal=True,
        key=f"{KEY}.kind",
        help="search: choose a student method's weights on dev (kdw tune)",
    )
    teacher = None
    if kind in ("student", "search"):
        teachers = {e.name: e for e in entries if e.kind == "teacher" and e.usable}
        names = [*teachers, *([ALONE] if kind == "student" else [])]  # a search needs one
        if not names:
            st.info("Train a teacher first.")
            return
        teacher = teachers.get(
            st.selectbox(
                "Teacher",
                names,
                format_func=lambda n: teachers[n].label if n in teachers else n,
                help="an unfinished teacher (its best dev model so far) needs allow unfinished "
                "in the student's settings; with none, the student learns from the labels "
                "alone (the finetune preset and a pretrained student): the reference every "
                "distillation must beat",
                key=f"{KEY}.teacher",
            )
        )
    _form(root, kind, teacher)

    active = [job for job in read_jobs(root) if job.kind in TRAININGS and job.alive]
    if active:
        st.subheader("Running")
        for job in active:
            _live(job)

    if discover_studies(root):
        st.subheader("Searches (kdw tune)")
        _studies(root)

    st.subheader("Runs")
    entries = discover_runs(root)  # with the run the form may have just launched
    table = _runs_table(entries, root)
    if table.empty:
        st.info(common.plain(f"No runs under {root} yet."))
        return
    problem = st.column_config.TextColumn("problem", width="large")
    st.dataframe(table, hide_index=True, column_config={"problem": problem})
    for run, text in zip(table["run"], table["problem"], strict=True):
        if text:  # whole: a table cell cuts a long line
            st.caption(common.plain(f"{run}: {text}"))
    if not entries:
        return
    names = [e.name for e in entries]
    chosen = st.selectbox("Details of", names, key=f"{KEY}.details")
    _details(entries[names.index(chosen)], root)


if __name__ == "__main__":
    common.run_page(render)
