"""The app's background jobs: trainings, the demo build and faithfulness reports, each a
separate process running :mod:`workbench.app.runner`, so the UI stays responsive and a page
reload loses nothing.

A job is recorded in ``<runs root>/.jobs/<name>.json`` (process id, target folder, log); its
progress is read from the files it writes (``progress.jsonl``, and the run's ``metrics.jsonl``
and ``status.json``). Stopping a training creates the ``STOP`` file its callback polls.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench.app.catalog import RunEntry, discover_runs
from workbench.app.runner import DEMO_FOLDERS, PROGRESS_FILE, STOP_FILE, demo_ready
from workbench.core.errors import WorkbenchError
from workbench.core.files import RECORD_LIMIT, atomic_write_json, read_json_file, read_json_lines

JOBS_DIR = ".jobs"
RUNNER = "workbench.app.runner"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
TRAININGS = ("teacher", "student", "tune")  # the kinds of job the Train page follows


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) runner process; reaps our finished children.
    Another process's ``pid`` may have been reused, so its command line must name the runner."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != pid
    except ChildProcessError:
        pass  # not our child: another server started it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        return True  # no procfs: trust the signal check
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return state != "Z" and RUNNER in command


@dataclass
class Job:
    """A background process of the app."""

    name: str
    kind: str  # teacher | student | tune (TRAININGS) | demo | faithfulness
    target: str  # the run folder, or the demo's root
    pid: int
    started: float
    log: str | None = None

    @property
    def alive(self) -> bool:
        return process_alive(self.pid)

    @property
    def folder(self) -> Path:
        return Path(self.target)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the job's output (tqdm's carriage returns made line breaks)."""
        if not self.log or not Path(self.log).exists():
            return ""
        text = Path(self.log).read_text(errors="replace").replace("\r", "\n")
        return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


def job_file(root: Path, name: str) -> Path:
    return Path(root) / JOBS_DIR / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.json"


def launch(
    root: Path, name: str, kind: str, target: Path, argument: str, to_terminal: bool = False
) -> Job:
    """Start ``python -m workbench.app.runner KIND TARGET ARGUMENT`` and record it: a training in a
    session of its own writing to ``.jobs/<name>.log`` (it survives the server), the demo build
    (``to_terminal``) in the app's terminal, stopping with it."""
    (target / STOP_FILE).unlink(missing_ok=True)
    path = job_file(root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    log = None if to_terminal else path.with_suffix(".log")
    paths = filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    command = [sys.executable, "-m", RUNNER, kind, str(target), argument]
    with open(log, "w") if log else nullcontext() as output:
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
            start_new_session=not to_terminal,
        )
    job = Job(name, kind, str(target), process.pid, time.time(), str(log) if log else None)
    atomic_write_json(path, asdict(job))
    return job


def launch_training(root: Path, run_dir: Path, kind: str, configs: dict[str, Any]) -> Job:
    """Train (or resume) a teacher or a student from ``run.json``-style configs."""
    return launch(root, run_dir.name, kind, run_dir, json.dumps(configs))


def read_jobs(root: Path) -> list[Job]:
    """Every recorded job, newest first (unreadable records are skipped)."""
    jobs = []
    for path in sorted((Path(root) / JOBS_DIR).glob("*.json")):
        try:
            jobs.append(Job(**read_json_file(path, RECORD_LIMIT, "job record")))
        except (WorkbenchError, ValueError, TypeError):
            continue
    return sorted(jobs, key=lambda job: -job.started)


def covers(job: Job, folder: Path) -> bool:
    """Whether ``job`` works on ``folder``: its target, or a run of a demo the build makes."""
    folder, target = Path(folder).resolve(), job.folder.resolve()
    demos = [target / name for name in DEMO_FOLDERS.values()] if job.kind == "demo" else []
    return folder == target or any(folder.is_relative_to(demo) for demo in demos)


def job_for(root: Path, target: Path) -> Job | None:
    """The latest job that worked on ``target`` (:func:`covers`)."""
    return next((job for job in read_jobs(root) if covers(job, target)), None)


def live_progress(job: Job, folder: Path) -> str:
    """Where the training that a live ``job`` runs in run ``folder`` stands (step ``3/47``, the
    teacher cache's examples, or ``preparing``), from its progress file: the run's
    ``status.json`` moves only at checkpoints. The demo build trains its runs one after the
    other, in the progress file of the demo that holds them, each under a stage of its own."""
    records = read_progress(Path(folder).parent if job.kind == "demo" else job.folder)
    stage = records[-1].get("stage") if records else None
    steps = step_records([r for r in records if r.get("stage") == stage])
    if steps:
        return f"{steps[-1]['step']}/{steps[-1]['total']}"
    cache = cache_progress(records)
    return cache[1] if cache else "preparing"


def live_label(entry: RunEntry, root: Path) -> str:
    """``entry``'s label; a run in training says where its job stands now, from the progress
    file the progress bars read, not where its last checkpoint left it (``status.json``)."""
    job = job_for(root, entry.path) if entry.state == "running" else None
    if job is None or not job.alive:
        return entry.label
    live = live_progress(job, entry.path)
    return f"{entry.name} (unfinished: running, {'step ' if live[:1].isdigit() else ''}{live})"


def request_stop(job: Job) -> None:
    """Ask a training to stop at its next step (it keeps a checkpoint and can resume); a job
    that has not created its run folder yet is terminated."""
    if (job.folder / "run.json").exists():
        (job.folder / STOP_FILE).touch()
    elif job.alive:
        os.killpg(job.pid, signal.SIGTERM)


def read_progress(folder: Path) -> list[dict[str, Any]]:
    """The records of ``progress.jsonl`` in order (a line cut by a kill is skipped)."""
    return read_json_lines(Path(folder) / PROGRESS_FILE)


def cache_progress(records: list[dict[str, Any]]) -> tuple[float, str] | None:
    """How far the teacher cache is, when it is what a job computes now (the last record is
    one of :meth:`~workbench.app.runner.ProgressFile.on_cache`'s): the fraction done and a line
    such as ``teacher cache (train): 640/1500 examples``."""
    last = records[-1] if records else {}
    if "done" not in last:
        return None
    return last["done"] / last["total"], f"{last['cache']}: {last['done']}/{last['total']} examples"


def step_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per training step, the latest one (steps after the last checkpoint are
    trained again when a run resumes)."""
    by_step = {r["step"]: r for r in records if "step" in r}
    return [by_step[step] for step in sorted(by_step)]


def shown_demo(root: Path) -> Path | None:
    """The demo folder the pages show: the full demo once it is ready, else the quick one once
    it is ready (``None`` before either is)."""
    folders = [Path(root) / DEMO_FOLDERS[size] for size in ("default", "quick")]
    return next((folder for folder in folders if demo_ready(folder)), None)


def shown_runs(root: Path) -> list[RunEntry]:
    """The run folders under ``root`` the pages list: a demo that is still building, or that a
    finished full demo replaced, is left out while another demo is shown."""
    entries = discover_runs(root)
    shown = shown_demo(root)
    if shown is None:
        return entries
    hidden = [Path(root) / folder for folder in DEMO_FOLDERS.values() if folder != shown.name]
    return [e for e in entries if not any(e.path.is_relative_to(h) for h in hidden)]
