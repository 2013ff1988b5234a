"""First run: where the runs root holds no runs yet, build the embedded demo — the MiniLM-L6
teacher fine-tuned on the bundled tweets and 3-layer students distilled with vanilla KD and AD-KD
(:func:`kd.demo.build_demo`) — in a background process, with progress in the terminal and on
every page. The runs stay in ``<runs root>/demo`` and are reused on later launches; a build
interrupted by closing the app resumes on the next launch.

``KDW_DEMO`` chooses the build: ``default`` (the size ``kdw demo`` uses, sharing its runs),
``quick`` (a much smaller one, in ``demo-quick``) or ``off`` (tests, or bring your own runs).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from workbench.app.catalog import discover_runs, runs_root
from workbench.app.common import plain
from workbench.app.jobs import Job, job_for, launch, read_progress
from workbench.errors import WorkbenchError

DEMO_ENV = "KDW_DEMO"
DEMO_FOLDERS = {"default": "demo", "quick": "demo-quick"}
READY = "demo: ready"
_STARTING = threading.Lock()  # sessions are threads of one server: one of them launches


def demo_mode() -> str:
    """``default``, ``quick`` or ``off``, from ``$KDW_DEMO``."""
    mode = os.environ.get(DEMO_ENV, "default").strip().lower()
    if mode not in (*DEMO_FOLDERS, "off"):
        raise WorkbenchError(f"{DEMO_ENV}={mode!r}: use default, quick or off")
    return mode


@dataclass
class DemoState:
    """Where the demo stands: not needed, being built, or failed with a message."""

    folder: Path
    job: Job | None = None
    error: str | None = None


def _launch_build(root: Path, folder: Path, mode: str) -> Job:
    print(
        f"kd-workbench: no runs under {root}: building the demo in {folder} "
        f"(MiniLM-L6 teacher on tweets, KD and AD-KD students); progress follows",
        flush=True,
    )
    return launch(root, "demo", "demo", folder, mode, to_terminal=True)


def ensure_demo(
    root: Path, mode: str, launch_build: Callable[[Path, Path, str], Job] = _launch_build
) -> DemoState | None:
    """Start the demo build when the root has no runs (or only an unfinished demo) and no
    build is running; ``None`` when there is nothing to do. A failed build is not retried
    automatically: its error is returned."""
    if mode == "off":
        return None
    folder = root / DEMO_FOLDERS[mode]
    entries = discover_runs(root)
    if any(not e.path.resolve().is_relative_to(folder.resolve()) for e in entries):
        return None  # the user's own runs
    records = read_progress(folder)
    if entries and records and records[-1].get("stage") == READY:
        return None
    job = job_for(root, folder)
    if job is not None and job.alive:
        return DemoState(folder, job)
    if records and "error" in records[-1]:
        return DemoState(folder, job, records[-1]["error"])
    if entries and not records:
        return None  # built by `kdw demo`: its runs are there
    return DemoState(folder, launch_build(root, folder, mode))


@st.fragment(run_every=2)
def _progress(state: DemoState) -> None:
    records = read_progress(state.folder)
    stages = [r["stage"] for r in records if r.get("stage")]
    steps = [r for r in records if "step" in r]
    stage = stages[-1] if stages else "starting…"
    if steps and steps[-1].get("stage") == stage:
        step, total = steps[-1]["step"], steps[-1]["total"]
        st.progress(step / total, text=f"{stage} — step {step}/{total}")
    else:
        st.progress(0.0, text=stage)
    if state.job is None or not state.job.alive:
        st.rerun(scope="app")


def first_run_panel() -> None:
    """Build the demo on first launch and show its progress above the page."""
    root = runs_root()
    try:
        with _STARTING:
            state = ensure_demo(root, demo_mode())
    except WorkbenchError as error:
        st.error(plain(error))
        return
    if state is None:
        return
    if state.error:
        st.error(plain(f"The demo build failed: {state.error}"))
        if st.button("Retry the demo build"):
            _launch_build(root, state.folder, demo_mode())
            st.rerun()
        return
    st.info(
        f"First run: building the demo runs in {plain(state.folder)} (MiniLM-L6 teacher "
        "fine-tuned on the bundled tweets, then students distilled with vanilla KD and "
        "AD-KD). This happens once; the pages fill in when it is done.",
        icon=":material/hourglass_top:",
    )
    _progress(state)
