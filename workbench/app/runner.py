"""Run one training, or the build of the embedded demo, in its own process for the app.

```
python -m workbench.app.runner teacher RUN_DIR CONFIGS_JSON   # data, teacher, optim
python -m workbench.app.runner student RUN_DIR CONFIGS_JSON   # data, student, objective, optim
python -m workbench.app.runner tune OUT CONFIGS_JSON           # the student's sections + tune
python -m workbench.app.runner demo RUNS_ROOT MODE             # the demos of KDW_DEMO=MODE
python -m workbench.app.runner faithfulness FOLDER CONFIGS_JSON  # runs, settings, explainers
```

``CONFIGS_JSON`` has the layout of ``run.json``'s ``configs``, so a run resumes by being launched
again with its own configs. A :class:`ProgressFile` callback appends each step's losses, and the
teacher cache's progress, to ``progress.jsonl`` in the run folder (each demo's folder for the
demo) and stops the training at its next step once a ``STOP`` file appears there. Errors go to
stderr (the job's log); the demo's also to the ``progress.jsonl`` of the demo it was building,
as ``{"error": ...}``, since its output goes to the terminal. The demo build stops with the
process that launched it (:func:`stop_with_parent`) and resumes on the app's next launch; a
training outlives the app.

The faithfulness job (``kdw faithfulness`` for the app's explainer ranking) writes its report to
``FOLDER/report.json`` after each explainer and, launched again, computes only the explainers
that report lacks.

The demo job builds the demos of its mode in order (:data:`DEMO_PLANS`): for ``default``, the quick
demo first (a teacher and a student within minutes), then the full one, which the app shows in its
place once it is ready (:func:`demo_ready`). ``$KDW_DEMO_SIZES`` (a JSON object of
:class:`kd.training.demo.DemoSize` fields, e.g. ``{"train_examples": 64, "teacher_model":
"tiny-bert"}``) overrides every demo's size: the first-run machinery tried on a tiny model.
"""

from __future__ import annotations

import _thread
import dataclasses
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from kd.experiments.config import TuneConfig
from kd.methods.config import ObjectiveConfig
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.tracking import TrackingConfig
from workbench.analysis.settings import FaithfulnessSettings
from workbench.core.config import DataConfig, from_dict
from workbench.core.errors import WorkbenchError
from workbench.core.files import (
    append_json_line,
    atomic_write_json,
    read_json_file,
    read_json_lines,
)
from workbench.core.runs import RUN_FILE, Run

PROGRESS_FILE = "progress.jsonl"
FAITHFULNESS = "faithfulness"  # the job kind of an explainer ranking (kdw faithfulness)
REPORT_FILE = "report.json"  # a faithfulness job's report, in its folder
STOP_FILE = "STOP"
READY = "demo: ready"
DEMO_FOLDERS = {"quick": "demo-quick", "default": "demo"}  # size -> folder in the runs root
DEMO_PLANS = {"quick": ("quick",), "default": ("quick", "default")}  # KDW_DEMO -> sizes, in order
SIZES_ENV = "KDW_DEMO_SIZES"


class ProgressFile:
    """Trainer callback: live progress for the app, and its stop button."""

    def __init__(self, folder: Path, stage: str = "") -> None:
        self.folder = Path(folder)
        self.stage = stage

    def announce(self, message: str) -> None:
        """A new stage (the demo builds several runs); also printed for the terminal."""
        self.stage = message
        print(message, flush=True)
        self._write()

    def on_step(self, step: int, total: int, losses: dict[str, float]) -> None:
        self._write(step=step, total=total, **losses)

    def on_cache(self, description: str, done: int, total: int) -> None:
        self._write(cache=description, done=done, total=total)

    def _write(self, **record: Any) -> None:
        """A record of the current stage, timed, appended to the progress file."""
        append_json_line(
            self.folder / PROGRESS_FILE, {"stage": self.stage, **record, "time": time.time()}
        )

    def should_stop(self) -> bool:
        return (self.folder / STOP_FILE).exists()


def demo_ready(folder: Path) -> bool:
    """Whether the demo in ``folder`` is complete: its build's last record says so, or, with no
    progress file (built by ``kdw demo``), it holds runs and all of them have finished."""
    records = read_json_lines(folder / PROGRESS_FILE)
    if records:
        return records[-1].get("stage") == READY
    runs = [p for p in folder.glob("*") if (p / RUN_FILE).exists()]
    return bool(runs) and all(Run(p).status().state == "finished" for p in runs)


def pending_demos(root: Path, mode: str) -> list[Path]:
    """The demo folders that the build of ``KDW_DEMO=mode`` still has to make, in order: none
    before a ready one (a full demo made by ``kdw demo`` needs no quick one)."""
    folders = [Path(root) / DEMO_FOLDERS[size] for size in DEMO_PLANS[mode]]
    ready = [i for i, folder in enumerate(folders) if demo_ready(folder)]
    return folders[ready[-1] + 1 :] if ready else folders


def _train(kind: str, run_dir: Path, configs: dict[str, Any]) -> None:
    from kd.experiments.tune import tune
    from kd.training.pipeline import distill, train_teacher

    callback = ProgressFile(run_dir, f"{kind} {run_dir.name}")
    data = from_dict(DataConfig, configs["data"])
    optim = from_dict(OptimConfig, configs["optim"])
    # (a run's record holds no trackers: resumed from the run list, it is tracked by none)
    tracking = from_dict(TrackingConfig, configs.get("tracking", {}))
    if kind == "teacher":
        teacher = from_dict(TeacherConfig, configs["teacher"])
        train_teacher(data, teacher, optim, run_dir, [callback], tracking)
        return
    student = from_dict(StudentConfig, configs["student"])
    objective = from_dict(ObjectiveConfig, configs["objective"])
    if kind == "tune":  # each trial's steps land in the study's progress file
        tuning = from_dict(TuneConfig, configs["tune"])
        tune(data, student, objective, optim, tuning, run_dir, [callback], tracking)
    else:
        distill(data, student, objective, optim, run_dir, [callback], tracking_config=tracking)


def _faithfulness(folder: Path, configs: dict[str, Any]) -> None:
    from workbench.analysis.attribution import ExplainerChoice
    from workbench.analysis.faithfulness_report import MAX_REPORT_BYTES, explainer_faithfulness

    path = folder / REPORT_FILE
    settings = from_dict(FaithfulnessSettings, configs["settings"])
    choices = [ExplainerChoice(n, configs["explainers"].get(n)) for n in settings.names()]
    folder.mkdir(parents=True, exist_ok=True)
    explainer_faithfulness(
        configs["runs"],
        settings,
        choices,
        notify=print,
        previous=read_json_file(path, MAX_REPORT_BYTES, "report") if path.exists() else None,
        checkpoint=lambda report: atomic_write_json(path, report),
    )


def _demo(root: Path, mode: str) -> None:
    from kd.training.demo import APP_METHODS, SIZES, DemoSize, build_demo

    sizes = {folder: size for size, folder in DEMO_FOLDERS.items()}
    try:
        override = json.loads(os.environ.get(SIZES_ENV) or "{}")
    except ValueError:
        override = None
    if not isinstance(override, dict):
        raise WorkbenchError(f"${SIZES_ENV} must be a JSON object of demo size settings")
    for folder in pending_demos(root, mode):
        size = from_dict(DemoSize, dataclasses.asdict(SIZES[sizes[folder.name]]) | override)
        callback = ProgressFile(folder)
        build_demo(folder, size, APP_METHODS, [callback], callback.announce)
        callback.announce(READY)


def stop_with_parent(interval: float = 1.0) -> None:
    """Interrupt this process (as Ctrl-C does) once the process that started it is gone: the
    demo build ends with the app that launched it, however the app ended, keeping its last
    checkpoint for the next launch. Python's Ctrl-C handler is installed first: a process
    started in the background (``nohup``, ``&`` in a script) inherits SIGINT ignored, and the
    interrupt would then be dropped."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        _thread.interrupt_main()

    threading.Thread(target=watch, name="stop-with-parent", daemon=True).start()


def main(argv: list[str]) -> int:
    """Run the job ``argv`` describes; exit status 2 for a problem with the input."""
    from workbench.core.models import quiet_library_output

    quiet_library_output()
    kind, target = argv[0], Path(argv[1])
    try:
        if kind == "demo":
            _demo(target, argv[2])
        elif kind == FAITHFULNESS:
            _faithfulness(target, json.loads(argv[2]))
        else:
            _train(kind, target, json.loads(argv[2]))
    except KeyboardInterrupt:
        print(
            f"interrupted: {target} keeps its last checkpoint and resumes when launched again",
            file=sys.stderr,
        )
        return 130
    except WorkbenchError as error:
        print(f"error: {error}", file=sys.stderr)
        message, status = str(error), 2
    except Exception as error:
        traceback.print_exc()
        message, status = f"{type(error).__name__}: {error}", 1
    else:
        return 0
    if kind == "demo":  # its output is the terminal's; a training's errors go to its log
        folder = (pending_demos(target, argv[2]) or [target])[0]
        append_json_line(folder / PROGRESS_FILE, {"error": message, "time": time.time()})
    return status


if __name__ == "__main__":
    if sys.argv[1:2] == ["demo"]:
        stop_with_parent()
    sys.exit(main(sys.argv[1:]))
