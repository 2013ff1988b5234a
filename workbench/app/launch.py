"""What the app's server does as it starts, kept light so that it answers at once (no torch, no
transformers): the entry script each browser session runs (:data:`ENTRY`), the start of the
first-run demo build (:func:`ensure_demo`, :func:`start_demo`), and :func:`at_launch`, the
lifespan of the ``st.App`` of ``app.py`` and :mod:`workbench.app.server`, which starts the build
beside the server, not when a browser first opens a page (the pages follow it:
:mod:`workbench.app.first_run`)."""

import os
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.app.catalog import discover_runs, runs_root
from workbench.app.jobs import Job, job_for, launch, read_progress
from workbench.app.runner import DEMO_FOLDERS, DEMO_PLANS, pending_demos
from workbench.core.errors import WorkbenchError, one_line

ENTRY = Path(__file__).resolve().with_name("main.py")
DEMO_ENV = "KDW_DEMO"
DEMO_NAMES = {DEMO_FOLDERS["quick"]: "quick demo", DEMO_FOLDERS["default"]: "full demo"}
_STARTING = threading.Lock()  # sessions are threads of one server: one of them launches


def demo_mode() -> str:
    """``default``, ``quick`` or ``off``, from ``$KDW_DEMO``."""
    mode = os.environ.get(DEMO_ENV, "default").strip().lower()
    if mode not in (*DEMO_PLANS, "off"):
        raise WorkbenchError(f"{DEMO_ENV}={mode!r}: use default, quick or off")
    return mode


@dataclass
class DemoState:
    """A demo build under way (``folder``: the demo it is building) or failed with a message."""

    folder: Path
    job: Job | None = None
    error: str | None = None


def launch_build(root: Path, mode: str) -> Job:
    print(
        f"kd-workbench: no runs under {root}: building the demo "
        f"({' then '.join(DEMO_NAMES[DEMO_FOLDERS[s]] for s in DEMO_PLANS[mode])}: MiniLM-L6 "
        "teacher on tweets, KD and AD-KD students); progress follows. It stops with the app "
        "and resumes on its next launch",
        flush=True,
    )
    return launch(root, "demo", "demo", root, mode, to_terminal=True)


def ensure_demo(
    root: Path, mode: str, launch_build: Callable[[Path, str], Job] = launch_build
) -> DemoState | None:
    """Start the demo build when the root has no runs but demo ones, a demo of ``mode`` is
    still to build and no build is running; ``None`` when there is nothing to do. A failed
    build is not retried automatically: its error is returned."""
    if mode == "off":
        return None
    demos = [root / folder for folder in DEMO_FOLDERS.values()]
    if any(not any(e.path.is_relative_to(d) for d in demos) for e in discover_runs(root)):
        return None  # the user's own runs
    pending = pending_demos(root, mode)
    if not pending:
        return None
    job = job_for(root, root)
    if job is not None and job.alive:
        return DemoState(pending[0], job)
    records = read_progress(pending[0])
    if records and "error" in records[-1]:
        return DemoState(pending[0], job, records[-1]["error"])
    return DemoState(pending[0], launch_build(root, mode))


def start_demo() -> DemoState | None:
    """Start the demo build where one is due (:func:`ensure_demo` on the runs root, once for all
    sessions); an invalid ``$KDW_DEMO`` is said on the terminal and on every page."""
    with _STARTING:
        return ensure_demo(runs_root(), demo_mode())


def _start_demo() -> None:
    try:
        start_demo()
    except WorkbenchError as error:  # an invalid $KDW_DEMO: said here and on every page
        print(f"kd-workbench: {one_line(str(error))}", file=sys.stderr, flush=True)


@asynccontextmanager
async def at_launch(_app: Any) -> AsyncIterator[None]:
    """Start the demo build in a thread (reading the runs root takes a moment) and serve
    meanwhile."""
    threading.Thread(target=_start_demo, name="kdw-demo-start", daemon=True).start()
    yield
