"""``kdw tune``: choose a method's weights on the dev split, as the papers did, with Optuna
(docs/tuning.md).

Each trial distils one student (a run folder under ``<out>/trials/``, named by its settings; one
teacher cache, ``<out>/teacher_cache``) and scores its best dev evaluation. A grid no larger than
the budget is queued whole, a larger space sampled by TPE, with median pruning; the study lives
in ``<out>/study.db`` (or ``--storage``, shared by workers that agree on all but
:data:`WORKER_SETTINGS`; a silent worker's trial is retried after :data:`GRACE_SECONDS`), so a
killed search resumes. The best configuration goes to ``<out>/best.json``. Searchable
parameters: :func:`searchable`; each method's default space is its preset's ``space``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import sqlite3
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import TrialState
from sqlalchemy.exc import SQLAlchemyError
from tqdm.auto import tqdm

from kd.experiments.config import TuneConfig
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import PARAMETERS, PRESETS, Parameter, Preset, preset_weights
from kd.training import tracking
from kd.training.config import CONFIG_SECTIONS, OptimConfig, StudentConfig
from kd.training.pipeline import distill, prepare_distillation
from kd.training.tracking import TrackingConfig
from kd.training.trainer import Callback, TrainingDiverged, main_metric
from workbench.core.config import DataConfig, to_dict
from workbench.core.data import TaskSpec
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import (
    FORMAT_KEY,
    atomic_write_json,
    check_format,
    check_parents,
    hold,
    read_json_file,
    with_format,
)
from workbench.core.records import Record, RecordProblem, checked
from workbench.core.runs import current_configs, differences

STUDY_NAME = TuneConfig.study_name  # the study of ``<out>/study.db``, and --study-name's default
MAX_CONFIG_BYTES = 1_000_000  # a best.json holds a few kilobytes of settings
HEARTBEAT_SECONDS = 20  # a worker's running trial says it is alive this often ...
GRACE_SECONDS = 120  # ... and is retried by another worker once silent this long
POLL_SECONDS = 2  # a worker waiting for the others' last trials looks again this often
CONNECT_SECONDS = 10  # how long a database server may take to answer
# settings a worker chooses for its machine: the study does not ask its workers to agree on them
WORKER_SETTINGS = ("threads", "device", "log_every", "checkpoint_every", "eval_batch_size")
WORKER = f"{socket.gethostname()}:{os.getpid()}"  # recorded with each trial this process runs


LEARNING_RATE = Parameter("peak learning rate", 0.0, closed=False)  # the optimiser's, not the
# objective's: the one searchable parameter no method registers


def searchable() -> dict[str, Parameter]:
    """Every parameter ``kdw tune`` searches: the methods' (:data:`kd.methods.objective.
    PARAMETERS`) and the learning rate (``lr``)."""
    return {**PARAMETERS, "lr": LEARNING_RATE}


@dataclass(frozen=True)
class Dimension:
    """One parameter's search space: choices, or a range."""

    name: str
    choices: tuple[float, ...] = ()
    low: float = 0.0
    high: float = 0.0
    log: bool = False

    def suggest(self, trial) -> float:
        if self.choices:
            return trial.suggest_categorical(self.name, list(self.choices))
        if searchable()[self.name].integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)

    def describe(self) -> str:
        if self.choices:
            return ",".join(f"{c:g}" for c in self.choices)
        return f"{self.low:g}:{self.high:g}" + (":log" if self.log else "")


def _number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise WorkbenchError(f"--space {name}: {text!r} is not a number") from None


def parse_dimension(name: str, text: str) -> Dimension:
    """``"1,10,50"`` (choices) or ``"1:4"`` / ``"1e-5:1e-3:log"`` (a range) → a checked
    :class:`Dimension`."""
    parameter = searchable()[name]
    text = text.strip()
    if not text:
        raise WorkbenchError(f"--space {name}: no values given (use {name}=v1,v2 or LOW:HIGH)")
    if ":" in text:
        parts = text.split(":")
        log = len(parts) == 3 and parts[2] == "log"
        if len(parts) not in (2, 3) or (len(parts) == 3 and not log):
            raise WorkbenchError(f"--space {name}={text}: a range is LOW:HIGH or LOW:HIGH:log")
        low, high = _number(name, parts[0]), _number(name, parts[1])
        if not low < high:
            raise WorkbenchError(f"--space {name}={text}: empty or inverted range (LOW < HIGH)")
        if log and low <= 0:
            raise WorkbenchError(f"--space {name}={text}: a log range needs LOW > 0")
        dimension = Dimension(name, low=low, high=high, log=log)
        values = (low, high)
    else:
        values = tuple(_number(name, part) for part in text.split(",") if part.strip())
        if not values:
            raise WorkbenchError(f"--space {name}: no values given")
        unique = dict.fromkeys(values)
        choices = tuple(int(v) if parameter.integer and v == int(v) else v for v in unique)
        dimension = Dimension(name, choices=choices)
    for value in values:
        if problem := parameter.problem(value):
            raise WorkbenchError(f"--space {name}: {value:g} {problem} ({parameter.help})")
    return dimension


def search_space(
    preset: str, overrides: tuple[str, ...], base_weights: dict[str, float]
) -> dict[str, Dimension]:
    """The preset's default space with ``NAME=SPEC`` overrides, checked against the terms the method
    has (``beta`` of a method without a β term is an unknown parameter)."""
    registered = PRESETS.get(preset, Preset({}, {}))
    available = sorted(
        name
        for name, p in searchable().items()
        if set((registered.beta,) if name == "beta" else p.needs) <= set(base_weights)
    )
    specs = {k: v for k, v in registered.space.items() if k in available}
    for item in overrides:
        name, equals, text = (part.strip() for part in item.partition("="))
        if not equals:
            raise WorkbenchError(f"--space {item!r}: use NAME=v1,v2 or NAME=LOW:HIGH")
        if name not in available:
            raise WorkbenchError(
                f"--space: unknown parameter {name!r} for {preset}: use one of "
                f"{', '.join(available)}"
            )
        specs[name] = text
    if not specs:
        raise WorkbenchError(f"nothing to search for {preset}: give --space NAME=...")
    return {name: parse_dimension(name, text) for name, text in specs.items()}


def apply(
    values: dict[str, float],
    base_weights: dict[str, float],
    objective: ObjectiveConfig,
    optim: OptimConfig,
) -> tuple[ObjectiveConfig, OptimConfig]:
    """The configs of a trial: the parameters' ``values`` set into the base configs."""
    objective = replace(objective, weights=dict(base_weights))
    for name, value in values.items():
        apply = searchable()[name].apply
        if apply is None:  # the learning rate
            optim = replace(optim, learning_rate=float(value))
        else:
            objective = apply(objective, value)
    return objective, optim


def trial_folder(values: dict[str, float]) -> str:
    """A run folder name from a trial's settings (the same settings resume the same run)."""
    return "-".join(f"{name}{value:g}" for name, value in sorted(values.items()))


class PruningCallback:
    """Reports each dev evaluation to the trial; asks the trainer to stop when pruned."""

    def __init__(self, trial, metric: str, enabled: bool) -> None:
        self.trial, self.metric, self.enabled, self.pruned = trial, metric, enabled, False

    def on_evaluate(self, step: int, metrics: dict[str, float]) -> None:
        self.trial.report(metrics[self.metric], step)
        self.pruned = self.enabled and self.trial.should_prune()

    def should_stop(self) -> bool:
        return self.pruned


@dataclass
class TuneResult:
    """The finished study: its trials as rows and the best configuration's file."""

    rows: list[dict] = field(default_factory=list)
    best: Path | None = None


def grid_points(space: dict[str, Dimension], trials: int) -> list[dict]:
    """The settings of a grid search (the last parameter varies fastest): a space of choices of at
    most ``trials`` settings is tried whole; a larger one (no points) is sampled by TPE."""
    choices = [d.choices for d in space.values()]
    if not all(choices) or math.prod(map(len, choices)) > trials:
        return []
    return [dict(zip(space, values, strict=True)) for values in itertools.product(*choices)]


@dataclass(frozen=True)
class StudyPlace:
    """Where a study lives: its database, as Optuna opens it and as messages name it."""

    url: str
    shown: str  # the URL with its password hidden, or the study.db file
    remedy: str  # what to change to search elsewhere
    shared: bool  # given by --storage: workers share it (heartbeats, no lock of <out>)
    engine: dict = field(default_factory=dict)  # SQLAlchemy's create_engine arguments


def study_place(out: Path, storage: str | None) -> StudyPlace:
    """The study's database: ``<out>/study.db``, or ``storage`` once it is a database URL whose
    driver is installed and whose server answers (within :data:`CONNECT_SECONDS`). Nothing is
    written."""
    if storage is None:
        path = out / "study.db"
        if path.exists():
            check_study_file(path)
        return StudyPlace(f"sqlite:///{path.resolve()}", str(path), "choose another --out", False)
    url, dialect, shown = tracking.database_url(storage, "--storage")
    servers = ("postgresql", "mysql", "mariadb")  # must answer within CONNECT_SECONDS
    engine = (
        {"connect_args": {"connect_timeout": CONNECT_SECONDS}} if dialect.name in servers else {}
    )
    full = url.render_as_string(hide_password=False)
    place = StudyPlace(full, shown, "choose another --study-name", True, engine)
    if dialect.name == "sqlite":
        if not url.database or url.database == ":memory:":
            raise WorkbenchError(f"--storage {shown}: name a database file (sqlite:///FILE)")
        if not Path(url.database).exists():  # made by Optuna later, once all checks passed
            if not Path(url.database).parent.is_dir():
                raise WorkbenchError(f"--storage {shown}: no such folder")
            return place
    connection = sqlalchemy.create_engine(url, **engine)
    try:
        with connection.connect() as opened:
            sqlalchemy.inspect(opened).get_table_names()
    except SQLAlchemyError as error:
        reason = first_line(getattr(error, "orig", None) or error)
        raise WorkbenchError(f"--storage {shown}: cannot connect ({reason})") from None
    finally:
        connection.dispose()
    return place


def _storage(place: StudyPlace, attempts: int = 5):
    """The study's Optuna storage; a shared one keeps each running trial's heartbeat. Workers that
    start together on an empty database race to make Optuna's tables: the losers try again."""
    if not place.shared:
        return place.url
    for attempt in range(1, attempts + 1):
        try:
            with warnings.catch_warnings():  # heartbeats are an experimental Optuna feature
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    place.url,
                    engine_kwargs=place.engine,
                    heartbeat_interval=HEARTBEAT_SECONDS,
                    grace_period=GRACE_SECONDS,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(),
                )
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as error:  # made first
            if attempt == attempts:
                raise WorkbenchError(
                    f"--storage {place.shown}: cannot make the study's tables "
                    f"({first_line(getattr(error, 'orig', None) or error)})"
                ) from None
            time.sleep(attempt)


def _sections(*configs) -> dict:
    """The configs of a configuration file's sections, in :data:`CONFIG_SECTIONS`' order, as plain
    values by section."""
    return dict(zip(CONFIG_SECTIONS, map(to_dict, configs), strict=True))


def study_settings(
    data: DataConfig,
    student: StudentConfig,
    objective: ObjectiveConfig,
    optim: OptimConfig,
    metric: str,
    prune: bool,
) -> dict:
    """What every worker of a study must share, as the study records it: the configs (less
    :data:`WORKER_SETTINGS`), the dev metric and whether trials are pruned."""
    configs = _sections(data, student, objective, optim)
    configs["optim"] = {k: v for k, v in configs["optim"].items() if k not in WORKER_SETTINGS}
    settings = {"configs": configs, "metric": metric, "prune": prune}
    return json.loads(json.dumps(settings, default=str))  # as the database gives it back


def _study(place: StudyPlace, name: str, attrs: dict, sampler, pruner, points: list[dict]):
    """The study ``name`` in ``place``: made (recording ``attrs``, and queueing the grid
    ``points``), or joined after :func:`_check_record`."""
    attrs = with_format(attrs)
    options = {"study_name": name, "storage": _storage(place), "sampler": sampler, "pruner": pruner}
    try:
        study = optuna.create_study(**options, direction="maximize")
    except optuna.exceptions.DuplicatedStudyError:  # made by an earlier run or another worker
        study = optuna.load_study(**options)
        where = f"study {name!r} in {place.shown}" if place.shared else place.shown
        _check_record(study, attrs, where, place.remedy)
        return study
    for values in points:  # queued before the record: a worker that joins finds the grid whole
        study.enqueue_trial(values)
    for key, value in sorted(attrs.items(), key=lambda item: item[0] == "space"):
        study.set_user_attr(key, value)  # the space last: a joining worker waits for it
    return study


class StudySettings(Record):
    """What every worker of a study shares (:func:`study_settings`)."""

    configs: dict[str, dict[str, Any]]
    metric: str
    prune: bool


class StudyRecord(Record):
    """A study's record (its Optuna user attributes): the preset, task and space it searches, and
    the settings every worker shares."""

    preset: str
    task: str
    space: dict[str, str]
    settings: StudySettings


def _check_record(study, attrs: dict, where: str, remedy: str) -> None:
    """Refuse to join a study of another preset, task, space or settings (one line naming the
    first few differences); a study whose maker is still recording it is waited for."""
    for _ in range(20):  # the worker that made it records the space last
        stored = study.user_attrs
        if "space" in stored:
            break
        time.sleep(0.5)
    else:
        raise WorkbenchError(f"{where} is not a kdw tune study: {remedy}")
    check_format(stored, where, remedy)
    given = checked(attrs, StudyRecord)
    try:
        record = checked(stored, StudyRecord)
        record.settings.configs = current_configs(record.settings.configs)
    except (RecordProblem, WorkbenchError) as error:
        raise WorkbenchError(f"{where} records damaged settings ({error}): {remedy}") from None
    for key in ("preset", "task", "space"):
        found, wanted = getattr(record, key), getattr(given, key)
        if found != wanted:
            raise WorkbenchError(f"{where} is a study of {key} {found!r}, not {wanted!r}: {remedy}")
    if changed := differences(record.settings.model_dump(), given.settings.model_dump()):
        raise WorkbenchError(
            f"{where} was made with other settings ({changed}): give every worker the study's "
            f"settings, or {remedy}"
        )


STUDY_REMEDY = (
    "delete it to start the search over (trials already trained keep their run folders, "
    "which the new search reuses), or choose another --out"
)


def check_study_file(path: Path) -> None:
    """Refuse a ``study.db`` that is not a sound SQLite database holding a ``kdw tune`` study,
    before Optuna opens it (and adds its tables to a foreign database). The file is read only."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(16)
    except OSError as error:
        raise WorkbenchError(f"{path} cannot be read ({first_line(error)})") from None
    if header != b"SQLite format 3\x00":
        raise WorkbenchError(f"{path} is not a study (not an SQLite database): {STUDY_REMEDY}")
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as error:
        raise WorkbenchError(f"{path} cannot be opened ({first_line(error)})") from None
    try:
        check = connection.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise WorkbenchError(f"{path} is damaged ({first_line(check)}): {STUDY_REMEDY}")
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        found = (
            "studies" in tables
            and connection.execute(
                "SELECT 1 FROM studies WHERE study_name = ?", (STUDY_NAME,)
            ).fetchone()
        )
    except sqlite3.Error as error:  # malformed pages, a truncated file
        raise WorkbenchError(f"{path} is damaged ({first_line(error)}): {STUDY_REMEDY}") from None
    finally:
        connection.close()
    if not found:
        raise WorkbenchError(f"{path} holds no kdw tune study: {STUDY_REMEDY}")


def _retry_interrupted(study, exclusive: bool) -> None:
    """Queue again every trial left running by a killed search (only when ``exclusive``: this
    process holds the study's lock) or stopped on request, unless a later trial retried its
    settings."""
    trials = study.get_trials(deepcopy=False)
    for trial in trials:
        left = exclusive and trial.state == TrialState.RUNNING
        if (left or trial.user_attrs.get("stopped")) and not any(
            later.params == trial.params for later in trials[trial.number + 1 :]
        ):
            if trial.state == TrialState.RUNNING:
                study.tell(trial.number, state=TrialState.FAIL)
            study.enqueue_trial(trial.params)


def _key(values: dict) -> tuple:
    return tuple(sorted(values.items()))


def _setting(trial) -> tuple:
    """A trial's settings as a key: those it was queued with, or those it tried once it has chosen
    them all, else its number (a trial writes its parameters one at a time)."""
    values = trial.system_attrs.get("fixed_params")
    if values is None and (trial.state.is_finished() or "run" in trial.user_attrs):
        values = trial.params
    return _key(values) if values else (("trial", trial.number),)


def _counted(trial) -> bool:
    """Whether a trial's settings count as tried: completed, pruned or diverged, not stopped."""
    return (
        trial.state in (TrialState.COMPLETE, TrialState.PRUNED) or trial.user_attrs.get("diverged")
    ) and not trial.user_attrs.get("stopped")


def _twin(trials: Sequence, number: int, values: dict, found: Callable):
    """Of ``trials``, another trial than ``number`` with the settings ``values`` for which
    ``found`` holds, if any."""
    return next((t for t in trials if t.number != number and t.params == values and found(t)), None)


class GiveWay(Exception):
    """A trial that must not train: another trial runs its settings, or the trials before it
    already fill the budget (a failed trial, not counted)."""


def _planned(trials) -> set[tuple]:
    """The settings that count towards the budget: tried, being tried, or queued."""
    active = (TrialState.RUNNING, TrialState.WAITING)
    return {_setting(t) for t in trials if _counted(t) or t.state in active}


def _surplus(study, number: int, target: int) -> bool:
    """Whether the trials before trial ``number``, this one not queued, already plan ``target``
    settings: of two workers that start the last setting at once, the later gives way."""
    trials = study.get_trials(deepcopy=False)
    this = next(t for t in trials if t.number == number)
    if this.params or this.system_attrs.get("fixed_params"):  # queued: planned already
        return False
    return len(_planned(t for t in trials if t.number < number)) >= target


def _state(trial) -> str:
    """A trial's state for the table: Optuna's, or why it ended (stopped on request, diverged,
    duplicate of another trial's settings, surplus to the budget)."""
    reasons = ("stopped", "diverged", "duplicate", "surplus")  # "duplicate": a number, maybe 0
    return next((r for r in reasons if r in trial.user_attrs), trial.state.name.lower())


def trials_table(study) -> list[dict]:
    """One row per trial: number, state, settings, best dev value, last reported step."""
    return [
        {"trial": t.number, "state": _state(t), **t.params, "dev": t.value, "steps": t.last_step}
        for t in study.get_trials(deepcopy=False)
    ]


def best_trial(study):
    """The completed trial of the best dev value, None before one completes; of equal values, the
    one whose settings sort first, and of those the trial that trained them."""
    return min(
        study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
        key=lambda t: (-t.value, _key(t.params), "run" not in t.user_attrs, t.number),
        default=None,
    )


def study_trials(out: str | Path) -> list[dict]:
    """The trials table of the study in ``out`` (for the app), read without locking it."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_study_file(Path(out) / "study.db")
    storage = f"sqlite:///{(Path(out) / 'study.db').resolve()}"
    return trials_table(optuna.load_study(study_name=STUDY_NAME, storage=storage))


def _search(run_trial: _Trial, points: list[dict]) -> None:
    """Run trials, one at a time, until the study (all its workers) has tried ``run_trial.target``
    distinct settings, then wait for the others' trials; grid ``points`` missing from the study are
    queued (again); TPE proposes a bounded number."""
    study, target, proposals, told = run_trial.study, run_trial.target, 0, False
    with tqdm(total=target, desc="settings tried", unit="setting") as progress:
        while not run_trial.stopped:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(study)  # none without heartbeats
            trials = study.get_trials(deepcopy=False)
            progress.update(len({_setting(t) for t in trials if _counted(t)}) - progress.n)
            planned = _planned(trials)
            missing = [values for values in points if _key(values) not in planned]
            for values in missing:
                study.enqueue_trial(values)
            queued = missing or any(t.state == TrialState.WAITING for t in trials)
            if queued or (len(planned) < target and proposals < 10 * target):
                proposals += 1
                study.optimize(run_trial, n_trials=1, catch=(TrainingDiverged, GiveWay))
            elif any(t.state == TrialState.RUNNING for t in trials):
                if not told:
                    progress.write("waiting for the trials other workers run", file=sys.stderr)
                    told = True
                time.sleep(POLL_SECONDS)
            else:
                break


@dataclass
class _Trial:
    """One trial of a search, called by optuna: the settings it suggests distilled into
    ``out/trials/<settings>`` (unless tried already, or running elsewhere), scored on dev."""

    study: Any
    data: DataConfig
    student: StudentConfig
    objective: ObjectiveConfig
    optim: OptimConfig
    space: dict[str, Dimension]
    base_weights: dict[str, float]
    metric: str
    target: int
    config: TuneConfig
    out: Path
    callbacks: Sequence[Callback]
    tracking_config: TrackingConfig
    parent: str | None
    stopped: list[int] = field(default_factory=list)  # trials asked to stop: retried on resume

    def __call__(self, trial) -> float:
        study = self.study
        if _surplus(study, trial.number, self.target):
            trial.set_user_attr("surplus", True)
            raise GiveWay("the trials before it fill the budget")
        values = {name: dimension.suggest(trial) for name, dimension in self.space.items()}
        # one read for both looks: a twin that finished between two reads would be in neither
        others = study.get_trials(deepcopy=False)
        # settings already tried (proposed again, or queued twice): a trial that completed,
        # was pruned or diverged ran in this trial's folder, so its outcome stands
        earlier = _twin(others, trial.number, values, _counted)
        if earlier is not None:
            if earlier.user_attrs.get("diverged"):
                trial.set_user_attr("diverged", earlier.user_attrs["diverged"])
                raise TrainingDiverged(earlier.user_attrs["diverged"])
            if earlier.state == TrialState.PRUNED:
                raise optuna.TrialPruned()
            return earlier.value
        # each trial records its settings before it looks, so of two given the same settings
        # at once the later to look sees the other running: at most one of them runs
        twin = _twin(others, trial.number, values, lambda t: t.state == TrialState.RUNNING)
        if twin is not None:  # a failed trial, not counted: the setting stays twin's
            trial.set_user_attr("duplicate", twin.number)
            raise GiveWay(f"trial {twin.number} tries these settings")
        folder = self.out / "trials" / trial_folder(values)
        trial.set_user_attr("run", str(folder.resolve()))
        trial.set_user_attr("worker", WORKER)
        trial_objective, trial_optim = apply(values, self.base_weights, self.objective, self.optim)
        callback = PruningCallback(trial, self.metric, self.config.prune)
        try:
            run = distill(
                self.data,
                self.student,
                trial_objective,
                trial_optim,
                folder,
                callbacks=[callback, *self.callbacks],
                cache_dir=self.out / "teacher_cache",
                tracking_config=self.tracking_config,
                tracking_parent=self.parent,
            )
        except TrainingDiverged as error:  # the trial fails (unscored); the study goes on
            trial.set_user_attr("diverged", str(error))
            raise
        if callback.pruned:
            raise optuna.TrialPruned()
        if run.status().state == "stopped":  # asked to stop: retried on resume
            trial.set_user_attr("stopped", True)
            self.stopped.append(trial.number)
            study.stop()
            raise optuna.TrialPruned()
        return run.results()["dev"][self.metric]


def _write_best(search: _Trial, place: StudyPlace, space: dict[str, str]) -> Path | None:
    """``best.json`` (the configs of the study's best trial and what it was chosen from), or
    None while no trial has a score."""
    best = best_trial(search.study)
    if best is None:
        return None
    objective, optim = apply(best.params, search.base_weights, search.objective, search.optim)
    tuned = {
        "trial": best.number,
        "dev": best.value,
        "metric": search.metric,
        "params": best.params,
        "space": space,
        "study": search.config.study_name,
        "storage": place.shown if place.shared else None,
        "run": best.user_attrs.get("run"),
        "worker": best.user_attrs.get("worker"),
    }
    sections = _sections(search.data, search.student, objective, optim)
    path = search.out / "best.json"
    atomic_write_json(path, with_format({**sections, "tuned": tuned}))
    return path


def _metric(config: TuneConfig, spec: TaskSpec) -> str:
    """The dev metric the search maximises: ``--metric``, or the task's main one; one the task
    does not report is a one-line error."""
    metric = config.metric or main_metric(spec)
    known = (*spec.metrics, *(() if spec.regression else ("accuracy", "macro_f1")))
    if metric not in known:
        raise WorkbenchError(f"--metric {metric!r}: use one of {', '.join(known)}")
    return metric


def _target(points: list[dict], trials: int) -> int:
    """How many settings the search tries: ``trials``, or every point of a grid smaller than
    that (said in a note)."""
    target = len(points) or trials
    if target < trials:
        print(
            f"note: the space has {target} settings: each is tried once (grid search), "
            f"not {trials} trials",
            file=sys.stderr,
        )
    return target


def tune(
    data: DataConfig,
    student: StudentConfig,
    objective: ObjectiveConfig,
    optim: OptimConfig,
    config: TuneConfig,
    out: str | Path,
    callbacks: Sequence[Callback] = (),
    tracking_config: TrackingConfig | None = None,
) -> TuneResult:
    """Search ``config.space`` for ``objective.preset`` on dev; write ``best.json``. ``callbacks``
    follow every trial's training; with ``config.storage`` this process is one worker of the study
    there; ``tracking_config``'s trackers follow every trial. Bad settings raise before anything is
    written."""
    out = Path(out)
    tracking_config = tracking_config or TrackingConfig()
    tracking.check(tracking_config)
    if "mlflow" in tracking_config.report_to:  # the trials' runs go to the study's store
        uri = tracking.store_uri(tracking_config, out)
        tracking_config = replace(tracking_config, mlflow_uri=uri)
    base_weights = preset_weights(objective)
    space = search_space(objective.preset, config.space, base_weights)
    if out.exists() and not out.is_dir():
        raise WorkbenchError(f"--out {out} is a file: give a folder")
    check_parents(out, "--out")
    place = study_place(out, config.storage)
    # every check of the settings against the models (an unfinished teacher run included),
    # before anything is written; the task's data comes with them
    task = prepare_distillation(data, student, objective, optim.seed).data
    metric = _metric(config, task.spec)
    steps_per_epoch = math.ceil(len(task.splits["train"]) / optim.batch_size)
    if not optim.eval_every:  # several dev evaluations per epoch, for the pruner
        optim = replace(optim, eval_every=max(1, steps_per_epoch // config.reports_per_epoch))
    if not place.shared:  # the study and its lock live in <out>
        out.mkdir(parents=True, exist_ok=True)
    points = grid_points(space, config.trials)
    target = _target(points, config.trials)
    attrs = {
        "preset": objective.preset,
        "task": data.task,
        "space": {name: d.describe() for name, d in space.items()},
        "settings": study_settings(data, student, objective, optim, metric, config.prune),
    }
    # workers of a shared study sample apart, and count the settings others run as tried
    sampler = optuna.samplers.TPESampler(
        seed=None if place.shared else 0, constant_liar=place.shared
    )
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=steps_per_epoch // 2)
        if config.prune
        else optuna.pruners.NopPruner()
    )
    lock = nullcontext() if place.shared else hold(out / "study.lock", f"the study in {out}")
    tracked = {"tune": to_dict(config), "configs": _sections(data, student, objective, optim)}
    with lock, tracking.tracked_study(tracking_config, out, tracked) as parent:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = _study(place, config.study_name, attrs, sampler, pruner, points)
        out.mkdir(parents=True, exist_ok=True)  # a shared study's worker joined: its trials
        _retry_interrupted(study, exclusive=not place.shared)
        search = _Trial(
            study,
            data,
            student,
            objective,
            optim,
            space,
            base_weights,
            metric,
            target,
            config,
            out,
            callbacks,
            tracking_config,
            parent,
        )
        _search(search, points)
        return TuneResult(trials_table(study), _write_best(search, place, attrs["space"]))


class TunedChoice(Record):
    """``best.json``'s ``tuned``: the trial chosen, its dev score, parameters and space, the study
    and where it lives (none: its folder), and the trial's run folder and worker."""

    trial: int
    dev: float
    metric: str
    params: dict[str, int | float]
    space: dict[str, str]
    study: str
    storage: str | None
    run: str | None
    worker: str | None


class BestConfiguration(Record):
    """``best.json``: the config sections of the best trial (``kdw distill --config`` trains
    them) and how it was chosen."""

    data: dict[str, Any]
    student: dict[str, Any]
    objective: dict[str, Any]
    optim: dict[str, Any]
    tuned: TunedChoice


def read_best(path: Path) -> BestConfiguration:
    """The ``best.json`` a search wrote, checked; another file is a one-line error."""
    best = read_json_file(path, MAX_CONFIG_BYTES, "the best configuration")
    remedy = "tune again in a new folder"
    check_format(best, path, remedy)
    try:
        return checked(best, BestConfiguration)
    except RecordProblem as problem:
        raise WorkbenchError(
            f"{path} is not the best configuration of a search: {problem}: {remedy}"
        ) from None


def load_config_file(path: str | Path) -> dict:
    """The sections of a configuration file (``best.json``): ``{"data": {...}, ...}``."""
    path = Path(path)
    values = read_json_file(path, MAX_CONFIG_BYTES, "--config")
    if not isinstance(values, dict):
        raise WorkbenchError(f"--config {path}: expected a JSON object of config sections")
    if FORMAT_KEY in values:  # a best.json kdw tune wrote; a file written by hand has none
        check_format(values, f"--config {path}", "tune again")
    return values
