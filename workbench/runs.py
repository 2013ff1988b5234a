"""The run folder: everything one training leaves behind, written atomically.

```
<run>/
  run.json          kind (teacher | student), configs (the dataclasses as JSON), task spec
  manifest.json     package versions, seed, git commit, data source and split fingerprint
  status.json       running | finished | failed, with the step reached
  metrics.jsonl     one line per evaluation
  checkpoint.pt     the last resumable state: weights, optimizer, scheduler, RNG, step
  model/            best weights so far (safetensors) and the tokenizer: loadable by from_pretrained
  results.json      final dev/test metrics of the best model
  teacher_cache/    what the frozen teacher says about each example (students only)
```
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError

RUN_FILE = "run.json"
PACKAGES = ("torch", "transformers", "captum", "datasets", "tokenizers", "numpy", "kd-workbench")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def atomic_write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def replace_directory(target: Path, write: Any) -> None:
    """Fill a fresh temporary directory with ``write(path)``, then swap it in for ``target``:
    a reader sees either the old or the new directory, never half of one."""
    staging = target.with_name(f".{target.name}.new")
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    write(staging)
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
            text=True, timeout=5, check=False,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


@dataclass
class Run:
    """A run folder."""

    path: Path

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint.pt"

    @property
    def cache_dir(self) -> Path:
        return self.path / "teacher_cache"

    @property
    def name(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, path: str | Path, info: dict[str, Any], manifest: dict[str, Any]) -> Run:
        """A new run folder holding ``info`` (kind, configs, task) and a manifest.

        An existing folder with the same ``info`` is reopened (so the training resumes); one
        with other settings is refused rather than overwritten."""
        run = cls(Path(path))
        if (run.path / RUN_FILE).exists():
            existing = run.read_json(RUN_FILE)
            if existing != json.loads(json.dumps(info, default=str)):
                changed = sorted(
                    k for k in set(existing) | set(info)
                    if existing.get(k) != json.loads(json.dumps(info.get(k), default=str))
                )
                raise WorkbenchError(
                    f"{run.path} already holds a run with other settings ({', '.join(changed)}): "
                    "choose another --run-dir, or delete that folder"
                )
            return run
        if run.path.exists() and any(run.path.iterdir()):
            raise WorkbenchError(f"{run.path} exists and is not a run folder: choose another")
        run.path.mkdir(parents=True, exist_ok=True)
        manifest = {
            **manifest,
            "versions": _versions(),
            "git_commit": _git_commit(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": sys.argv,
        }
        atomic_write_json(run.path / "manifest.json", manifest)
        atomic_write_json(run.path / RUN_FILE, info)
        run.set_status("created")
        return run

    @classmethod
    def open(cls, path: str | Path) -> Run:
        """An existing run folder; a missing or corrupt one is a one-line error."""
        run = cls(Path(path))
        if not run.path.is_dir():
            raise WorkbenchError(f"run folder {run.path} does not exist")
        if not (run.path / RUN_FILE).exists():
            raise WorkbenchError(f"{run.path} is not a run folder (no {RUN_FILE})")
        run.info()  # validates the JSON
        return run

    def read_json(self, name: str) -> Any:
        path = self.path / name
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise WorkbenchError(f"{path} is missing: the run folder is incomplete") from None
        except json.JSONDecodeError as error:
            raise WorkbenchError(f"{path} is corrupt ({error.msg}): delete the run") from None

    def info(self) -> dict[str, Any]:
        info = self.read_json(RUN_FILE)
        if not isinstance(info, dict) or "kind" not in info or "configs" not in info:
            raise WorkbenchError(f"{self.path / RUN_FILE} is corrupt: no kind or configs")
        return info

    def status(self) -> dict[str, Any]:
        return self.read_json("status.json")

    def set_status(self, state: str, **details: Any) -> None:
        atomic_write_json(self.path / "status.json", {"state": state, **details})

    def append_metrics(self, record: dict[str, Any]) -> None:
        with open(self.path / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def metrics(self, split: str | None = None) -> list[dict[str, Any]]:
        """The logged records: evaluations (``split`` ``"dev"``) and objective diagnostics
        (``"train"``, see :mod:`kd.diagnostics`); all of them when ``split`` is None."""
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a kill mid-write
        return [r for r in records if split is None or r.get("split") == split]

    def truncate_metrics(self, after_step: int) -> None:
        """Forget evaluations logged after ``after_step`` (they are redone on resume)."""
        kept = [r for r in self.metrics() if r.get("step", 0) <= after_step]
        atomic_write_text(
            self.path / "metrics.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept)
        )

    def results(self) -> dict[str, Any] | None:
        return self.read_json("results.json") if (self.path / "results.json").exists() else None


def list_runs(root: str | Path) -> list[tuple[Path, Run | None, str | None]]:
    """Every run folder under ``root``: ``(path, run, None)`` or ``(path, None, error)`` for a
    broken one, so one bad folder never hides the others."""
    found = []
    for path in sorted(Path(root).glob("*/")) if Path(root).is_dir() else []:
        try:
            found.append((path, Run.open(path), None))
        except WorkbenchError as error:
            found.append((path, None, str(error)))
    return found
