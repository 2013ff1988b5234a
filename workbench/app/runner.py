"""Run one training, or the build of the embedded demo, in its own process for the app.

```
python -m workbench.app.runner teacher RUN_DIR CONFIGS_JSON   # data, teacher, optim
python -m workbench.app.runner student RUN_DIR CONFIGS_JSON   # data, student, objective, optim
python -m workbench.app.runner tune OUT CONFIGS_JSON           # the student's sections + tune
python -m workbench.app.runner demo ROOT SIZE                 # kd.demo.build_demo
```

``CONFIGS_JSON`` has the layout of ``run.json``'s ``configs``, so a run resumes by being launched
again with its own configs. A :class:`ProgressFile` callback appends each step's losses to
``progress.jsonl`` in the run folder (the demo's root for the demo) and stops the training at
its next step once a ``STOP`` file appears there. Errors go to stderr (the job's log); the
demo's also to its ``progress.jsonl`` as ``{"error": ...}``, since its output goes to the terminal.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from workbench.config import (
    DataConfig,
    ObjectiveConfig,
    OptimConfig,
    StudentConfig,
    TeacherConfig,
    TuneConfig,
    from_dict,
)
from workbench.errors import WorkbenchError
from workbench.files import append_json_line

PROGRESS_FILE = "progress.jsonl"
STOP_FILE = "STOP"


class ProgressFile:
    """Trainer callback: live progress for the app, and its stop button."""

    def __init__(self, folder: Path, stage: str = "") -> None:
        self.folder = Path(folder)
        self.stage = stage

    def announce(self, message: str) -> None:
        """A new stage (the demo builds several runs); also printed for the terminal."""
        self.stage = message
        print(message, flush=True)
        append_json_line(self.folder / PROGRESS_FILE, {"stage": message, "time": time.time()})

    def on_step(self, step: int, total: int, losses: dict[str, float]) -> None:
        append_json_line(
            self.folder / PROGRESS_FILE,
            {
                "step": step,
                "total": total,
                "stage": self.stage,
                "time": time.time(),
                **losses,
            },
        )

    def should_stop(self) -> bool:
        return (self.folder / STOP_FILE).exists()


def _train(kind: str, run_dir: Path, configs: dict[str, Any]) -> None:
    from kd.pipeline import distill, train_teacher
    from kd.tune import tune

    callback = ProgressFile(run_dir, f"{kind} {run_dir.name}")
    data = from_dict(DataConfig, configs["data"])
    optim = from_dict(OptimConfig, configs["optim"])
    if kind == "teacher":
        train_teacher(
            data, from_dict(TeacherConfig, configs["teacher"]), optim, run_dir, [callback]
        )
        return
    student = from_dict(StudentConfig, configs["student"])
    objective = from_dict(ObjectiveConfig, configs["objective"])
    if kind == "tune":  # each trial's steps land in the study's progress file
        tune(
            data,
            student,
            objective,
            optim,
            from_dict(TuneConfig, configs["tune"]),
            run_dir,
            callbacks=[callback],
        )
    else:
        distill(data, student, objective, optim, run_dir, [callback])


def _demo(root: Path, size: str) -> None:
    from kd.demo import APP_METHODS, SIZES, build_demo

    callback = ProgressFile(root)
    build_demo(root, SIZES[size], APP_METHODS, [callback], callback.announce)
    callback.announce("demo: ready")


def main(argv: list[str]) -> int:
    """Run the job ``argv`` describes; exit status 2 for a problem with the input."""
    from workbench.models import quiet_library_output

    quiet_library_output()
    kind, target = argv[0], Path(argv[1])
    try:
        if kind == "demo":
            _demo(target, argv[2])
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
    if kind == "demo":  # the demo's root is a plain folder; a training's errors go to its log
        append_json_line(target / PROGRESS_FILE, {"error": message, "time": time.time()})
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
