"""The run folder: everything one training leaves behind, written atomically.

```
<run>/
  run.json          kind (teacher | student), configs (the dataclasses as JSON), task spec
  manifest.json     package versions, seed, git commit, data source and split fingerprint
  status.json       created | running | stopped | diverged | finished, with the step reached
                    and the seconds spent (training; a student's teacher cache)
  metrics.jsonl     one line per evaluation
  checkpoint.pt     the last resumable state: weights, optimizer, scheduler, RNG, step (plain
                    tensors and numbers: it loads without running code)
  model/            best weights so far (safetensors), the tokenizer and a model card (README.md):
                    a Hugging Face checkpoint with the task's label names
  results.json      final dev/test metrics of the best model
  teacher_cache/    what the frozen teacher says about each example (students only)
  analysis_cache/   what the app's analyses computed with the best model (maps, AOPC)
  .lock             held by the process writing the run, its id inside (see Run.writing)
```
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields, replace
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field

from workbench.core.config import (
    SECTIONS,
    DataConfig,
    check_values,
    from_dict,
    option_name,
    set_settings,
)
from workbench.core.errors import WorkbenchError, first_line, mask_secrets
from workbench.core.files import (
    append_json_line,
    atomic_write_json,
    check_parents,
    check_writable,
    hold,
    lock_holder,
    read_json_lines,
    regular_file,
    remove_stale_temporaries,
    with_format,
    write_json_lines,
)
from workbench.core.records import Record, RecordProblem, checked, read_record_file

RUN_FILE = "run.json"
STATUS_FILE = "status.json"
RESOLVED = "resolved"  # the key of run.json's record of what the configs resolved to
LOCK_FILE = ".lock"
T = TypeVar("T")


# the run's records (:mod:`workbench.core.records`), checked whenever one is read
class TaskRecord(Record):
    """The task a run was trained on: its label names (by class id) and metrics (the first
    one chooses the best model)."""

    name: str
    label_names: list[str]
    metrics: list[str]
    pair: bool = False


class ResolvedObjective(Record):
    """What a run's objective resolved to: its terms' weights, τ, and (other keys) the settings
    each method in use records."""

    weights: dict[str, float]
    temperature: float | None = None


class ResolvedTeacher(Record):
    """The teacher a student was distilled from, pinned: its folder and the digests of its
    weights (every file of them), its tokenizer and its config's label map."""

    source: str
    weights: str
    tokenizer: str
    labels: str


class ResolvedLora(Record):
    """A LoRA teacher's adapters (``--adapt lora``): rank, scale α, dropout, the modules they
    adapt (the architecture's names, as peft resolved the targets) and the head's modules,
    trained whole."""

    rank: int
    alpha: float
    dropout: float
    target_modules: list[str]
    modules_to_save: list[str]
    layers: list[int] | None = None  # the layers adapted (--lora-layers); None: every one


class Resolved(Record):
    """What a run's configs resolved to when it was trained (:data:`RESOLVED`): its
    objective, the fingerprint of each data split, a student's teacher (none for a hub id), the
    layers a cut student kept of its source and a LoRA teacher's adapters."""

    objective: ResolvedObjective
    split_fingerprint: dict[str, str]
    teacher: ResolvedTeacher | None = None
    # 0-based layers of the teacher (--init cut) or of the checkpoint (--init pretrained with
    # --num-layers) that the student is made of; None: a random student or a whole checkpoint
    student_layers: list[int] | None = None
    lora: ResolvedLora | None = None


class RunRecord(Record):
    """``run.json``: the run's kind, its configs (the dataclasses as JSON, by section), its
    method and task, and what its settings resolved to."""

    kind: Literal["teacher", "student"]
    configs: dict[str, dict[str, Any]]
    method: str = ""
    task: TaskRecord | None = None
    resolved: Resolved


class RunStatus(Record):
    """``status.json``: the training's state, the step reached of the total, why it stopped,
    and the seconds spent on ``training`` and (a student's) ``teacher_cache``."""

    state: str
    step: int | None = None
    total: int | None = None
    reason: str = ""
    seconds: dict[str, float] = Field(default_factory=dict)


class Manifest(Record):
    """``manifest.json``: how the run was made (seed, data source and notes, each split's size
    and fingerprint, the package versions, the git commit, the command line)."""

    seed: int | None = None
    data_source: str | None = None
    data_notes: list[str] = Field(default_factory=list)
    split_sizes: dict[str, int] = Field(default_factory=dict)
    split_fingerprint: dict[str, str] = Field(default_factory=dict)
    versions: dict[str, str | None] = Field(default_factory=dict)
    git_commit: str | None = None
    command: list[str] = Field(default_factory=list)


class MetricsLine(Record):
    """A line of ``metrics.jsonl``: the step, the split it evaluates (none: training
    diagnostics), the epoch, and the metrics (other keys)."""

    step: int
    split: str = ""
    epoch: float | None = None


class OptimizerState(Record):
    state: dict[Any, Any]  # by parameter number
    param_groups: list[dict[str, Any]]


class RandomState(Record):
    torch: Any
    python: Any
    numpy: Any


class TrainingState(Record):
    step: int
    best: float | None
    best_step: int | None
    unsaved: bool = False  # the best model failed to save: it is this checkpoint's model


class Checkpoint(Record):
    """``checkpoint.pt``: plain tensors in containers (the model's, the optimizer's, the
    scheduler's and the scaler's state, each process's random state), the step reached and
    the best score, and the seconds of training up to it."""

    model: dict[str, Any]
    optimizer: OptimizerState
    scheduler: dict[str, Any]
    scaler: dict[str, Any] | None = None
    rng: list[RandomState]
    state: TrainingState
    seconds: float


Results = dict[str, dict[str, float | None]]  # results.json: the best model's metrics by split


class SplitPredictions(Record):
    """A split in ``predictions.json``: each example's id, gold label and prediction (class
    ids, or a regression's scores), and (other keys) a student's loyalty per example."""

    uids: list[Any]
    labels: list[int | float]
    predictions: list[int | float]


RUN_REMEDY = "restore the file, or delete the run folder to train anew"
FORMAT_REMEDY = "train the run again in a new --run-dir"
STATUS_REMEDY = (
    "it only records the training's progress, the model and checkpoint are not affected: run "
    "the command that made the run again to rewrite it"
)
METRICS_REMEDY = (
    "it only records the training's curves: delete that line (or the file, and the "
    "checkpoint.pt beside it to train the run again)"
)
RESULTS_REMEDY = (
    "delete it and status.json, then run the command that made the run again to score its "
    "best model anew"
)
PACKAGES = ("torch", "transformers", "captum", "datasets", "tokenizers", "numpy", "kd-workbench")


def replace_directory(target: Path, write: Any) -> None:
    """Fill a fresh temporary directory with ``write(path)`` (an absolute path), then swap it in for
    ``target``: a reader sees the old or the new directory, never half of one."""
    target = target.absolute()
    staging = target.with_name(f".{target.name}.new")
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    write(staging)
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)


def _changed(then: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The keys whose values differ between ``then`` and ``now`` (or that one lacks), sorted."""
    return sorted(k for k in then.keys() | now.keys() if then.get(k) != now.get(k))


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def _version(package: str) -> str | None:
    with suppress(metadata.PackageNotFoundError):
        return metadata.version(package)
    return None


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
    def analysis_dir(self) -> Path:
        return self.path / "analysis_cache"

    @property
    def name(self) -> str:
        return self.path.name

    @classmethod
    @contextmanager
    def writing(
        cls, path: str | Path, info: dict[str, Any], manifest: dict[str, Any]
    ) -> Iterator[Run]:
        """The run folder ``path`` holding ``info`` (kind, configs, task) and a manifest, written by
        this process alone while the block runs: created, or reopened with the same ``info`` (the
        training resumes). Other settings, a folder that is not a run, or a run another process
        holds (its ``.lock``, which dies with it) are refused in one line."""
        run, info = cls(Path(path)), with_format(info)
        given = checked(json.loads(json.dumps(info, default=str)), RunRecord)  # before writing
        if not run.path.exists():  # where nothing can be made (/proc/x): one line, not a trace
            check_writable(run.path, "--run-dir")
        check_parents(run.path, "--run-dir")
        if run.path.is_file() or (
            not (run.path / RUN_FILE).exists()
            and run.path.exists()
            and any(p.name != LOCK_FILE for p in run.path.iterdir())
        ):
            raise WorkbenchError(f"{run.path} exists and is not a run folder: choose another")
        with hold(run.path / LOCK_FILE, f"run folder {run.path}"):
            remove_stale_temporaries(run.path)  # left by a killed writer
            if (run.path / RUN_FILE).exists():
                run._check_settings(given)
                try:  # status.json only records progress: a missing or unreadable one is
                    run.status()
                except WorkbenchError:  # rewritten, and the training resumes from its checkpoint
                    run.set_status("unknown")
            else:
                run._start(info, manifest)
            yield run

    def _check_settings(self, given: RunRecord) -> None:
        """Refuse to reopen a run with other settings than ``given``, other data, another teacher,
        or an objective its settings no longer resolve to (a preset's defaults changed)."""
        existing = self.info()
        if shown := differences(
            existing.model_dump(exclude_unset=True, exclude={RESOLVED}),
            given.model_dump(exclude_unset=True, exclude={RESOLVED}),
        ):
            raise WorkbenchError(
                f"{self.path} already holds a run with other settings ({shown}): "
                "choose another --run-dir, or delete that folder"
            )
        old, new = existing.resolved, given.resolved
        if splits := _changed(old.split_fingerprint, new.split_fingerprint):
            raise WorkbenchError(
                f"{self.path} was trained on other data: the {', '.join(splits)} split(s) "
                "changed since (edited rows or labels); to train on the data as it is now, "
                "choose another --run-dir"
            )
        if changed := teacher_change(old.teacher, new.teacher):
            raise WorkbenchError(
                f"{self.path} was distilled from another teacher: {changed}; the student and "
                "its teacher cache learnt from the former one: to distil from the teacher as it "
                "is now, choose another --run-dir"
            )
        if old.objective != new.objective:
            keys = _changed(old.objective.model_dump(), new.objective.model_dump())
            raise WorkbenchError(
                f"{self.path} was trained with an objective that the same options no longer "
                f"resolve to (changed: {', '.join(keys)}; a preset's defaults changed): "
                "choose another --run-dir"
            )

    def _start(self, info: dict[str, Any], manifest: dict[str, Any]) -> None:
        manifest = {
            **manifest,
            "versions": {"python": platform.python_version()} | {p: _version(p) for p in PACKAGES},
            "git_commit": _git_commit(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": [mask_secrets(part) for part in sys.argv],
        }
        atomic_write_json(self.path / "manifest.json", manifest)
        atomic_write_json(self.path / RUN_FILE, info)
        self.set_status("created")

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

    def check_model(self) -> None:
        """Refuse a run whose best model (``model/``) is damaged, naming the file: its files and
        its config, read as any model's (:func:`~workbench.core.verify.check_config_file`)."""
        from workbench.core.verify import check_config_file, check_model_files

        check_model_files(
            self.model_dir, "the run's best model is lost: train the run again in a new --run-dir"
        )
        if (self.model_dir / "config.json").is_file():
            check_config_file(self.model_dir)

    def read_json(self, name: str, remedy: str, model: Any, what: str, again: str = "") -> Any:
        """The JSON file ``name`` of the run, read as ``model`` (:mod:`workbench.core.records`),
        its record format checked first where ``again`` (its remedy) is given; a missing or corrupt
        one, or one that is not of that model (``what`` the file should be, for the message), is
        a one-line error ending in ``remedy`` (for a corrupt file)."""
        path = self.path / name
        if not path.exists():
            raise WorkbenchError(f"{path} is missing: the run folder is incomplete")
        return read_record_file(path, model, what, remedy, "run file", again)

    def info(self) -> RunRecord:
        """The run's record, checked: its format, its model (:class:`RunRecord`) and each config
        section's settings."""
        record = self.read_json(RUN_FILE, RUN_REMEDY, RunRecord, "a run record", FORMAT_REMEDY)
        try:
            record.configs = current_configs(record.configs)
        except WorkbenchError as problem:
            raise self._not_a_record(problem) from None
        return record

    def _not_a_record(self, problem: Any) -> WorkbenchError:
        """The error of a ``run.json`` that is not a run record: ``problem``, and the remedy."""
        return WorkbenchError(
            f"{self.path / RUN_FILE} is not a run record: {problem}: {RUN_REMEDY}"
        )

    def config(self, cls: type[T], group: str) -> T:
        """The config ``group`` (``data``, ``student``…) of the run's record as ``cls``, its
        paths absolute."""
        configs = self.info().configs
        if group not in configs:
            raise self._not_a_record(f'"configs.{group}" is missing')
        try:  # a config dataclass makes its paths absolute (Checked)
            return from_dict(cls, configs[group])
        except WorkbenchError as error:  # a section a run of another kind would not hold
            raise self._not_a_record(f"configs.{group}: {error}") from None

    def task(self) -> TaskRecord:
        """The run's task record (name, label names, metrics, pair), which a trained run has."""
        if (task := self.info().task) is None:
            raise self._not_a_record('"task" is missing')
        return task

    def manifest(self) -> Manifest:
        """How the run was made (:class:`Manifest`)."""
        return self.read_json("manifest.json", RUN_REMEDY, Manifest, "a run's manifest")

    def status(self) -> RunStatus:
        """The training's progress (:class:`RunStatus`). A corrupt file loses only that record:
        its error says so and that rerunning the run's command rewrites it."""
        return self.read_json(STATUS_FILE, STATUS_REMEDY, RunStatus, "a run's status")

    def predictions(self) -> dict[str, SplitPredictions]:
        """The best model's predictions by split (:class:`SplitPredictions`)."""
        return self.read_json(
            "predictions.json", RESULTS_REMEDY, dict[str, SplitPredictions], "a run's predictions"
        )

    def writer(self) -> int | None:
        """The id of the process that holds the run's lock (``.lock``) and is alive, None when
        no live process does (the lock dies with its process; its id stays in the file)."""
        try:
            pid = int(lock_holder(self.path / LOCK_FILE))
        except ValueError:
            return None
        try:
            with suppress(PermissionError):  # alive, another user's
                os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def unfinished(self) -> str | None:
        """None when the training finished; else where it stands, in words
        (``stopped at step 30/120``, ``running at step 30/120 (process 123 is training it)``…)."""
        try:
            status = self.status()
        except WorkbenchError:
            return "state unknown (status.json unreadable)"
        state = status.state
        if state == "finished":
            return None
        text = state
        if status.step is not None:
            text += f" at step {status.step}/{status.total or '?'}"
        if state in ("created", "running", "unknown"):
            pid = self.writer()
            text += (
                f" (process {pid} is training it)"
                if pid is not None and pid != os.getpid()
                else " (no process is training it: interrupted or killed)"
            )
        return text

    def best_dev(self) -> dict[str, Any] | None:
        """The dev evaluation whose model ``model/`` holds (the first of the best by the task's main
        metric), None without one."""
        try:
            metric = self.task().metrics[0]
            records = self.metrics("dev")
        except (WorkbenchError, IndexError):
            return None
        scored = [record for record in records if isinstance(record.get(metric), int | float)]
        best = max(scored, key=lambda record: record[metric], default=None)  # the first of them
        return None if best is None else {"step": best.get("step"), metric: best[metric]}

    def snapshot(self) -> str:
        """Which model ``model/`` holds, in words: ``its best dev model so far (step 20, dev
        accuracy 0.6000)``."""
        if (best := self.best_dev()) is None:
            return "its best dev model so far"
        metric, value = next((k, v) for k, v in best.items() if k != "step")
        return f"its best dev model so far (step {best['step']}, dev {metric} {value:.4f})"

    def set_status(self, state: str, **details: Any) -> None:
        atomic_write_json(self.path / STATUS_FILE, {"state": state, **details})

    def load_checkpoint(self, device: Any) -> dict[str, Any]:
        """The resumable state ``checkpoint.pt`` holds (tensors on ``device``), read with
        ``torch.load(weights_only=True)``: nothing in a run folder runs code. A file that would need
        to (a planted pickle) or a damaged one is a one-line error naming the file and the remedy.
        """
        import pickle
        import warnings

        import torch

        remedy = (
            "delete it to train this run again from step 0 (the same command), or choose "
            "another --run-dir"
        )
        regular_file(self.checkpoint, "the checkpoint", remedy)  # a pipe would block torch
        try:
            with warnings.catch_warnings():  # torch warns of pickle protocols it reads
                warnings.simplefilter("ignore")
                saved = torch.load(self.checkpoint, weights_only=True, map_location=device)
        except pickle.UnpicklingError as error:
            called = re.search(r"GLOBAL (\S+) was not an allowed global", str(error))
            raise WorkbenchError(
                f"{self.checkpoint} is not a plain-tensor checkpoint (it would need to run code "
                f"to load{f': {called[1]}' if called else ''}): {remedy}"
            ) from None
        except KeyError:  # the weights-only reader meets an unknown opcode: not a pickle
            reason = "not a torch checkpoint"
        except (RuntimeError, EOFError, ValueError, OSError) as error:
            reason = first_line(error).split(". ")[0]  # torch adds sentences of advice
        else:
            if not (isinstance(saved, dict) and {"model", "state"} <= set(saved)):
                reason = "not a kd-workbench checkpoint"
            else:
                try:
                    checked(saved, Checkpoint)
                    return saved
                except RecordProblem as problem:
                    reason = str(problem)
        raise WorkbenchError(f"{self.checkpoint} is damaged ({reason}): {remedy}")

    def append_metrics(self, record: dict[str, Any]) -> None:
        append_json_line(self.path / "metrics.jsonl", record)

    def metrics(self, split: str | None = None) -> list[dict[str, Any]]:
        """The logged records: evaluations (``split`` ``"dev"``) and objective diagnostics
        (``"train"``, see :mod:`kd.training.diagnostics`); all of them when ``split`` is None."""
        path = self.path / "metrics.jsonl"
        records = read_json_lines(path, numbered=True)
        for number, record in records:
            try:
                checked(record, MetricsLine, whole="the line")
            except RecordProblem as problem:
                raise WorkbenchError(
                    f"{path}, line {number}: not a record of the training: {problem}: "
                    f"{METRICS_REMEDY}"
                ) from None
        return [r for _, r in records if split is None or r.get("split") == split]

    def truncate_metrics(self, after_step: int) -> None:
        """Forget evaluations logged after ``after_step`` (they are redone on resume)."""
        if not (self.path / "metrics.jsonl").exists():
            return
        kept = [r for r in self.metrics() if r.get("step", 0) <= after_step]
        write_json_lines(self.path / "metrics.jsonl", kept)

    def results(self) -> Results | None:
        """The best model's metrics per split (``{"dev": {"accuracy": …}, "test": …}``), None
        while there are none."""
        if not (self.path / "results.json").exists():
            return None
        return self.read_json(
            "results.json", RESULTS_REMEDY, Results, "the metrics of a run's best model"
        )


def same_task(one: str, other: str) -> bool:
    """Whether two task names name one task (a local one by the same path, however written)."""
    return one == other or Path(one).resolve() == Path(other).resolve()


def task_beside(
    model: str, sources: Sequence[str], notify: Callable[[str], None] | None = None
) -> tuple[DataConfig, str] | None:
    """The task a model that is not a run is scored on beside runs: the data settings and label map
    of the first run among ``sources``, said to ``notify``; None without a run."""
    for source in sources:
        if not (Path(source) / RUN_FILE).exists():
            continue
        run = Run.open(source)
        data, info = run.config(DataConfig, "data"), run.info()
        label_map = info.configs.get(info.kind, {}).get("label_map", "")
        settings = _given(data) | ({"label_map": label_map} if label_map else {})
        shown = f" ({_options(settings)})" if settings else ""
        if notify is not None:
            notify(
                f"{model} is not a run: scored on {data.task}, the task {source} recorded"
                f"{shown}; --task names another"
            )
        return data, label_map
    return None


def recorded_data(
    data: DataConfig, sources: Sequence[str], notify: Callable[[str], None] | None = None
) -> DataConfig:
    """``data`` with the settings it leaves at their defaults taken from the first run among
    ``sources`` that recorded its task (an explicit setting overrides the record); each said to
    ``notify`` in one line."""
    names = [f.name for f in fields(DataConfig) if f.name != "task"]
    given = _given(data)
    say = notify or (lambda _text: None)
    for source in sources:
        if not (Path(source) / RUN_FILE).exists():
            continue
        recorded = Run.open(source).config(DataConfig, "data")
        if not same_task(recorded.task, data.task):
            continue
        taken = {
            f: getattr(recorded, f)
            for f in names
            if f not in given and getattr(recorded, f) != getattr(data, f)
        }
        overridden = {f: v for f, v in given.items() if v != getattr(recorded, f)}
        if taken:
            say(f"{data.task} is read as {source} recorded: {_options(taken)}")
        if overridden:
            was = {f: getattr(recorded, f) for f in overridden}
            say(f"{_options(overridden)} given: {source} recorded {_options(was)}")
        return replace(data, **taken)
    return data


def _given(data: DataConfig) -> dict[str, Any]:
    """The data settings ``data`` sets to other values than their defaults, the task aside."""
    return {name: getattr(data, name) for name in set_settings(data) if name != "task"}


def _options(values: dict[str, Any]) -> str:
    """``{"max_length": 16, "dedupe": True, "glue_dir": None}`` as the options that set them:
    ``--max-length 16, --dedupe, no --glue-dir``."""
    return ", ".join(
        option_name(f)
        if v is True
        else f"no {option_name(f)}"
        if v is False or v is None
        else f"{option_name(f)} {v}"
        for f, v in values.items()
    )


def teacher_change(then: ResolvedTeacher | None, now: ResolvedTeacher | None) -> str | None:
    """What changed between the teacher a run pinned (``then``) and the teacher ``now``, in words;
    None when nothing did, or when either side has no record (a hub id)."""
    if not then or not now:
        return None
    parts = [
        f"its {part} {getattr(then, part)} → {getattr(now, part)}"
        for part in ("weights", "tokenizer", "labels")
        if getattr(then, part) != getattr(now, part)
    ]
    return f"the teacher {then.source} changed since ({', '.join(parts)})" if parts else None


_SHOWN = 4  # differences named by a refusal to reopen a run
_ABSENT = "(absent)"


def current_configs(configs: dict[str, Any]) -> dict[str, Any]:
    """Config sections as a record holds them, each registered section's settings checked, as JSON
    gives them back."""
    current = {}
    for group, values in configs.items():
        try:
            current[group] = check_values(SECTIONS[group], values) if group in SECTIONS else values
        except WorkbenchError as error:
            raise WorkbenchError(f"configs.{group}: {error}") from None
    return json.loads(json.dumps(current, default=str))


def differences(then: Any, now: Any) -> str:
    """What differs between recorded settings ``then`` and those given ``now``, on one line
    (the first few ``option old → new``, ``;``-separated); empty when nothing does."""
    changed = _differences(then, now)
    return "; ".join(changed[:_SHOWN]) + ("; …" if len(changed) > _SHOWN else "")


def _differences(then: Any, now: Any, where: tuple[str, ...] = ()) -> list[str]:
    """What differs between a run's recorded identity ``then`` and the one given ``now``, one
    ``option old → new`` each: config fields by their CLI option (``--learning-rate``), other
    keys by their dotted place (``task.label_names``)."""
    setting = where[:1] == ("configs",) and len(where) == 3  # one value, a mapping too
    if isinstance(then, dict) and isinstance(now, dict) and not setting:
        return [
            line
            for key in sorted(set(then) | set(now))
            for line in _differences(then.get(key, _ABSENT), now.get(key, _ABSENT), (*where, key))
        ]
    if then == now:
        return []
    name = option_name(where[-1]) if setting else ".".join(where)

    def shown(value: Any) -> str:
        return value if value == _ABSENT else json.dumps(value, ensure_ascii=False)

    return [f"{name} {shown(then)} → {shown(now)}"]


_MARKDOWN_SPECIALS = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~])")


def _one_line(text: Any) -> str:
    """``text`` on one line: line breaks of any kind as spaces."""
    return " ".join(str(text).splitlines())


def _plain(text: Any) -> str:
    """``text`` for Markdown as it is: one line, its special characters backslash-escaped."""
    return _MARKDOWN_SPECIALS.sub(r"\\\1", _one_line(text))


def _code(text: Any) -> str:
    """``text`` as inline code, whatever backticks it holds (a fence longer than its longest
    run of them, CommonMark's rule), on one line."""
    text = _one_line(text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def model_card(run: Run, library: str = "transformers") -> str:
    """The model card (``README.md`` with Hub metadata) of a run's best model, from the run's files
    only: what was trained and how, on which data, its metrics once ``results.json`` exists, the
    command line and the seconds it took. ``library``: the Hub's ``library_name`` (``onnx`` for an
    ONNX export)."""
    info, manifest, results = run.info(), run.manifest(), run.results()
    configs, task = info.configs, run.task()
    student = info.kind == "student"
    lines = [
        "---",
        f"library_name: {library}",
        "pipeline_tag: text-classification",
        "tags:",
        "- kd-workbench",
        *(["- knowledge-distillation"] if student else []),
        "---",
        "",
        f"# {_plain(run.name)}",
        "",
        f"A student distilled with the method {_code(info.method)} from the teacher "
        f"{_code(configs['student']['teacher'])}, on the task {_code(task.name)}."
        if student
        else f"A teacher fine-tuned from {_code(configs['teacher']['model'])} with the "
        f"objective {_code(info.method)} on the task {_code(task.name)}.",
        "Written by kd-workbench from the run's `run.json`, `manifest.json`"
        + (" and `results.json`." if results else "."),
        "",
        "## Labels",
        "",
    ]
    labels = [f"- {index}: {_code(name)}" for index, name in enumerate(task.label_names)]
    lines += labels or ["Regression: one output, the predicted score."]
    lines += ["", "## Training settings", ""]
    for group, values in configs.items():
        bullets = (f"- {_code(k)}: {_code(json.dumps(v, default=str))}" for k, v in values.items())
        lines += [f"### {group}", "", *bullets, ""]
    lines += [
        "## Data",
        "",
        f"- source: {_code(manifest.data_source)}",
        *(f"- {_plain(note)}" for note in manifest.data_notes),
        "",
        "| split | examples | fingerprint |",
        "|---|---|---|",
        *(
            f"| {split} | {manifest.split_sizes.get(split)} | `{fingerprint}` |"
            for split, fingerprint in manifest.split_fingerprint.items()
        ),
    ]
    if results:
        lines += ["", "## Results", ""]
        for split, metrics in results.items():
            values = ", ".join(f"{name} {value:.4f}" for name, value in metrics.items())
            lines.append(f"- {split}: {values}")
    if command := manifest.command:
        program = Path(command[0]).name
        program = "kdw" if program in ("kdw", "__main__.py") else program
        line = _one_line(shlex.join([program, *command[1:]]))
        fence = "`" * max(3, max((len(r) for r in re.findall(r"`+", line)), default=0) + 1)
        lines += ["", "## Command", "", fence, line, fence]
    versions = ", ".join(f"{name} {version}" for name, version in manifest.versions.items())
    lines += [
        "",
        "## Environment",
        "",
        f"- packages: {versions}",
        f"- git commit: `{manifest.git_commit}`",
        f"- seed: {manifest.seed}",
    ]
    spent = {}
    with suppress(WorkbenchError):  # a damaged status: the card goes without the times
        spent = run.status().seconds
    if spent:
        times = ", ".join(f"{name.replace('_', ' ')} {value:g} s" for name, value in spent.items())
        lines.append(f"- time: {times}")
    return "\n".join(lines) + "\n"
