"""First run: where the runs root holds no runs yet, build the embedded demo
(:func:`kd.training.demo.build_demo`) in a background process that starts with the server
(:func:`workbench.app.launch.at_launch`), with progress in the terminal and on every page; an
interrupted build resumes on the next launch. ``KDW_DEMO`` chooses the build
(:data:`~workbench.app.runner.DEMO_PLANS`; docs/app.md, "The embedded demo"), and every page
says which demo it shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import streamlit as st

from kd.training.demo import APP_METHODS
from workbench.app.catalog import runs_root
from workbench.app.common import plain
from workbench.app.jobs import cache_progress, read_progress, shown_demo, shown_runs
from workbench.app.launch import DEMO_NAMES, DemoState, demo_mode, launch_build, start_demo
from workbench.app.runner import READY
from workbench.core.errors import WorkbenchError
from workbench.core.runs import Run

RUNS_PER_DEMO = 1 + len(APP_METHODS)  # the teacher, then one student per method
SHOWN_KEY = "first_run.shown"  # session key: the demo runs the session's pages last showed
PICKERS = (".teacher", ".students", ".student")  # the keys of common.pick_models's widgets


def build_fraction(records: Sequence[dict[str, Any]], runs: int = RUNS_PER_DEMO) -> float:
    """How much of a demo's build is done, from its progress records: each of its ``runs``
    counts as one equal part, the current one by its training steps."""
    stages = list(dict.fromkeys(r["stage"] for r in records if set(r) == {"stage", "time"}))
    if READY in stages:
        return 1.0
    last = records[-1] if records else {}
    within = last["step"] / last["total"] if "step" in last and stages else 0.0
    return min(1.0, (max(len(stages) - 1, 0) + within) / runs)


def stage_text(records: Sequence[dict[str, Any]]) -> tuple[float, str]:
    """The current stage of a build and how far it is: training steps, or the teacher
    cache's examples (the AD-KD teacher maps take long)."""
    last = records[-1] if records else {}
    stage = last.get("stage") or "starting…"
    if "step" in last:
        return last["step"] / last["total"], f"{stage} — step {last['step']}/{last['total']}"
    cache = cache_progress(list(records))
    if cache is not None:
        return cache[0], f"{stage} — {cache[1]}"
    return 0.0, stage


def teacher_accuracy(demo: Path) -> str:
    """`` Its teacher: 72.0% test accuracy.`` once the demo's teacher has its results, else
    nothing."""
    try:
        accuracy = (Run(demo / "teacher").results() or {}).get("test", {}).get("accuracy")
    except WorkbenchError:
        return ""
    return "" if accuracy is None else f" Its teacher: {accuracy:.1%} test accuracy."


def shown_line(root: Path, building: Path | None = None) -> str | None:
    """What every page says about the demo it shows (and the one being built)."""
    shown = shown_demo(root)
    if building is None and shown is None:
        return None
    if building is None:
        return f"Showing the {DEMO_NAMES[shown.name]} ({shown}).{teacher_accuracy(shown)}"
    percent = f"{build_fraction(read_progress(building)):.0%}"
    name = DEMO_NAMES[building.name]
    if shown is None:
        return (
            f"First run: building the {name} in {building}: {percent} (MiniLM-L6 teacher "
            "fine-tuned on the bundled tweets, then students distilled with vanilla KD and "
            "AD-KD). The teacher and the KD student appear on the pages as soon as they are "
            "trained."
        )
    return (
        f"Showing the {DEMO_NAMES[shown.name]} ({shown}); {name} building: {percent}. It "
        f"replaces this one on every page when it is ready.{teacher_accuracy(shown)}"
    )


def follow_build(root: Path) -> None:
    """Runs appear while the demo builds, and the full demo replaces the quick one: whenever
    the demo runs the pages show change, the session's choices of runs (the teacher and
    student pickers of :func:`~workbench.app.common.pick_models`) go back to their defaults,
    the teacher and all its students."""
    demo_runs = tuple(n for n in _usable(root) if n.split("/")[0] in DEMO_NAMES)
    before = st.session_state.get(SHOWN_KEY)
    st.session_state[SHOWN_KEY] = demo_runs
    if before is not None and before != demo_runs:
        for key in [k for k in st.session_state if str(k).endswith(PICKERS)]:
            del st.session_state[key]


def _usable(root: Path) -> tuple[str, ...]:
    return tuple(e.name for e in shown_runs(root) if e.usable)


@st.fragment(run_every=2)
def _progress(state: DemoState, root: Path, shown: tuple[str, ...]) -> None:
    st.info(plain(shown_line(root, state.folder)), icon=":material/hourglass_top:")
    fraction, text = stage_text(read_progress(state.folder))
    st.progress(min(fraction, 1.0), text=plain(text))
    if state.job is None or not state.job.alive or _usable(root) != shown:
        st.rerun(scope="app")  # a run is ready, or a demo swapped in: the pages show it


def first_run_panel() -> None:
    """Build the demo on first launch, say which demo the pages show, and show the build's
    progress above the page."""
    root = runs_root()
    follow_build(root)
    try:
        state = start_demo()
    except WorkbenchError as error:
        st.error(plain(error))
        return
    if state is None:
        line = shown_line(root)
        if line:
            st.caption(plain(line))
        return
    if state.error:
        st.error(plain(f"The demo build failed: {state.error}"))
        if st.button("Retry the demo build"):
            launch_build(root, demo_mode())
            st.rerun()
        return
    _progress(state, root, _usable(root))
