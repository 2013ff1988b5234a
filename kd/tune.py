"""``kdw tune``: choose a method's weights on the dev split, as the papers did, with Optuna.

Each trial distils one student (a run folder under ``<out>/trials/``, named by its settings) and
scores its best dev evaluation; the test split is never looked at. The trials share one teacher
cache (``<out>/teacher_cache``), computed once per setting that changes it. Sampling is TPE; a
trial whose dev curve falls below the median of earlier trials at the same step is pruned (the
trainer's evaluations report to the pruner; none is pruned in its first half epoch), and
settings proposed again keep their first outcome. A trial whose training diverges (a loss or
weight goes NaN or infinite) fails, unscored, and the search goes on. The study lives in
``<out>/study.db`` (SQLite), so a killed search resumes: the trial that was running is retried
with the same settings and its run folder resumes from its checkpoint. The best configuration is
written to ``<out>/best.json``, which ``kdw distill --config`` trains.

Searchable parameters (:data:`PARAMETERS`) and the default space of each method
(:data:`DEFAULT_SPACES`, from the papers' grids); ``--space NAME=v1,v2`` (choices) or
``--space NAME=LOW:HIGH`` (a range, ``:log`` for a log scale) overrides one.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kd.trainer import Callback, TrainingDiverged
from workbench.config import (
    MAX_TEMPERATURE,
    DataConfig,
    ObjectiveConfig,
    OptimConfig,
    StudentConfig,
    TrackingConfig,
    TuneConfig,
    to_dict,
)
from workbench.errors import WorkbenchError, first_line
from workbench.files import atomic_write_json, hold, read_limited
from workbench.runs import same_value

STUDY_NAME = "kdw-tune"
MAX_CONFIG_BYTES = 1_000_000  # a best.json holds a few kilobytes of settings


@dataclass(frozen=True)
class Parameter:
    """A searchable setting: its domain, and the terms a method needs for it to apply."""

    help: str
    low: float  # the domain: finite, low < value (low ≤ value when ``closed``), value ≤ high
    high: float = math.inf
    closed: bool = True
    integer: bool = False
    needs: tuple[str, ...] = ()  # terms the objective must have (beta: the method's own)

    def problem(self, value: float) -> str | None:
        """Why ``value`` is outside the domain, or None."""
        above = value >= self.low if self.closed else value > self.low
        if not math.isfinite(value) or not (above and value <= self.high):
            left, right = "[" if self.closed else "(", ")" if self.high == math.inf else "]"
            return f"must lie in {left}{self.low:g}, {self.high:g}{right}"
        if self.integer and value != int(value):
            return "must be an integer"
        return None


PARAMETERS: dict[str, Parameter] = {
    "alpha": Parameter("weight α of the KD term; CE gets 1 − α", 0.0, 1.0, needs=("kd",)),
    "beta": Parameter(
        "weight β of the method's own term (AD-KD attr, GKD grad, PKD and GKD-CLS [CLS] states)",
        0.0,
    ),
    "gamma": Parameter(
        "GKD-CLS: weight γ of the [CLS]-state gradient term", 0.0, needs=("cls_grad",)
    ),
    "tau": Parameter("KD temperature τ", 0.0, MAX_TEMPERATURE, closed=False, needs=("kd",)),
    "wr": Parameter("CKD: λ of word relation", 0.0, needs=("wr",)),
    "ltr": Parameter("CKD: λ of layer-transforming relation", 0.0, needs=("ltr",)),
    "lr": Parameter("peak learning rate", 0.0, closed=False),
    "top_k": Parameter(
        "AD-KD: K largest |IG| dimensions of the teacher's map", 1, integer=True, needs=("attr",)
    ),
}
WEIGHT_PARAMETERS = ("gamma", "wr", "ltr")  # set the weight of every term they need
BETA_TERM = {"pkd-skip": "pkd", "pkd-last": "pkd", "adkd": "attr", "gkd": "grad", "gkd-cls": "pkd"}
DEFAULT_SPACES: dict[str, dict[str, str]] = {
    # AD-KD Table 5 / §4.1: β ∈ {1, 10, 50, 100}, α ∈ {0.8, 0.9, 1.0}, τ ∈ {1, 2, 3, 4}
    "adkd": {
        "beta": "1,10,50,100",
        "alpha": "0.8,0.9,1.0",
        "tau": "1,2,3,4",
        "lr": "5e-5,1e-4,2e-4",
    },
    "gkd": {"beta": "0.1,1,10", "alpha": "0.1,0.5,0.9", "tau": "1,2,5"},
    "gkd-cls": {"beta": "0.1,1,10", "gamma": "0.01,0.1,1", "alpha": "0.1,0.5,0.9"},
    "ckd": {"wr": "0.1,1,10", "ltr": "0.1,1,10"},
    "pkd-skip": {"beta": "0.1,1,10,100"},
    "pkd-last": {"beta": "0.1,1,10,100"},
    "kd": {"alpha": "0.1,0.5,0.9", "tau": "1,2,4,8"},
}


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
        if PARAMETERS[self.name].integer:
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
    :class:`Dimension`; a one-line error for an empty or inverted range or a value outside the
    parameter's domain."""
    parameter = PARAMETERS[name]
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
        dimension = Dimension(
            name,
            choices=tuple(
                int(v) if parameter.integer and v == int(v) else v for v in dict.fromkeys(values)
            ),
        )
    for value in values:
        problem = parameter.problem(value)
        if problem:
            raise WorkbenchError(f"--space {name}: {value:g} {problem} ({parameter.help})")
    return dimension


def search_space(
    preset: str, overrides: tuple[str, ...], base_weights: dict[str, float]
) -> dict[str, Dimension]:
    """The preset's default space with ``NAME=SPEC`` overrides, checked against what the
    method has (``beta`` of a method without its own term is an unknown parameter)."""
    own = BETA_TERM.get(preset)
    available = sorted(
        name
        for name, p in PARAMETERS.items()
        if set((own,) if name == "beta" else p.needs) <= set(base_weights)
    )
    specs = {k: v for k, v in DEFAULT_SPACES.get(preset, {}).items() if k in available}
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
    preset: str,
    base_weights: dict[str, float],
    objective: ObjectiveConfig,
    optim: OptimConfig,
) -> tuple[ObjectiveConfig, OptimConfig]:
    """The configs of a trial: the parameters' ``values`` set into the base configs."""
    weights = dict(base_weights)
    for name, value in values.items():
        if name == "alpha":
            weights["kd"], weights["ce"] = value, 1 - value
        elif name == "beta":
            weights[BETA_TERM[preset]] = value
        elif name in WEIGHT_PARAMETERS:
            weights.update(dict.fromkeys(PARAMETERS[name].needs, value))
    text = ",".join(f"{term}={weight:g}" for term, weight in weights.items())
    objective = replace(objective, weights=text)
    if "tau" in values:
        objective = replace(objective, temperature=float(values["tau"]))
    if "top_k" in values:
        objective = replace(objective, attr_top_k=int(values["top_k"]))
    if "lr" in values:
        optim = replace(optim, learning_rate=float(values["lr"]))
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


def grid(space: dict[str, Dimension]) -> dict[str, list[float]] | None:
    """The space as a grid of settings when every parameter is a list of choices (None when
    one is a range)."""
    if all(d.choices for d in space.values()):
        return {name: list(d.choices) for name, d in space.items()}
    return None


def plan_search(space: dict[str, Dimension], trials: int) -> tuple[int, bool]:
    """How many distinct settings a search of ``trials`` tries, and whether it is a grid
    search: a grid of at most ``trials`` settings is tried whole, each setting once (Optuna's
    grid sampler); a larger space is sampled by TPE for ``trials`` distinct settings."""
    points = grid(space)
    size = math.prod(len(values) for values in points.values()) if points else None
    if size is not None and size <= trials:
        return size, True
    return trials, False


def _study(
    out: Path,
    preset: str,
    task: str,
    space: dict[str, Dimension],
    prune: bool,
    warmup_steps: int,
    exhaustive: bool,
):
    """The study in ``out`` (created, or loaded after checking it searches the same preset,
    task and space), sampled over the grid when ``exhaustive``, else by TPE; no trial is
    pruned before ``warmup_steps``."""
    import optuna

    attrs = {
        "preset": preset,
        "task": task,
        "space": {name: d.describe() for name, d in space.items()},
    }
    storage = f"sqlite:///{(out / 'study.db').resolve()}"
    sampler = (
        optuna.samplers.GridSampler(grid(space), seed=0)
        if exhaustive
        else optuna.samplers.TPESampler(seed=0)
    )
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=warmup_steps)
        if prune
        else optuna.pruners.NopPruner()
    )
    if (out / "study.db").exists():
        check_study_file(out / "study.db")
        study = optuna.load_study(
            study_name=STUDY_NAME, storage=storage, sampler=sampler, pruner=pruner
        )
        stored = {k: study.user_attrs.get(k) for k in attrs}
        for key in ("preset", "task", "space"):
            if not same_value(stored[key], attrs[key]):  # a task path recorded relative too
                raise WorkbenchError(
                    f"{out / 'study.db'} is a study of {key} {stored[key]!r}, not "
                    f"{attrs[key]!r}: choose another --out"
                )
    else:
        study = optuna.create_study(
            study_name=STUDY_NAME,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            direction="maximize",
        )
        for key, value in attrs.items():
            study.set_user_attr(key, value)
    return study


STUDY_REMEDY = (
    "delete it to start the search over (trials already trained keep their run folders, "
    "which the new search reuses), or choose another --out"
)


def check_study_file(path: Path) -> None:
    """Refuse a ``study.db`` that is not a sound SQLite database holding a ``kdw tune`` study
    (random bytes, a truncated copy, another program's database), with a one-line error naming
    it, before Optuna opens it (which would add its tables to a foreign database). The file is
    read only."""
    import sqlite3

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


def _interrupted(study) -> list:
    """Trials that did not finish: left running by a killed search (this process holds the
    study's lock, so no other process runs them) or stopped on request (the app's stop button),
    unless a later trial already retried their settings."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    return [
        t
        for t in trials
        if (t.state == TrialState.RUNNING or t.user_attrs.get("stopped"))
        and not any(later.params == t.params for later in trials[t.number + 1 :])
    ]


def _retry_interrupted(study) -> None:
    """Queue every interrupted trial again with its settings (its run folder resumes from its
    checkpoint); a trial left running is marked failed."""
    from optuna.trial import TrialState

    for trial in _interrupted(study):
        if trial.state == TrialState.RUNNING:
            study.tell(trial.number, state=TrialState.FAIL)
        study.enqueue_trial(trial.params)


def _earlier_outcome(study, number: int, values: dict):
    """An earlier completed, pruned or diverged trial with the same settings, if any: its run
    folder is this trial's, so its outcome stands (a pruned run is not trained on, a diverged
    one would diverge again)."""
    from optuna.trial import TrialState

    return next(
        (
            t
            for t in study.get_trials(deepcopy=False)
            if t.number < number
            and t.params == values
            and not t.user_attrs.get("stopped")
            and (
                t.state in (TrialState.COMPLETE, TrialState.PRUNED) or t.user_attrs.get("diverged")
            )
        ),
        None,
    )


def _finished(study) -> int:
    """Distinct settings tried so far, what counts towards ``--trials``: those of completed,
    pruned or diverged trials, not stopped on request (settings proposed again count once)."""
    from optuna.trial import TrialState

    return len(
        {
            tuple(sorted(t.params.items()))
            for t in study.get_trials(deepcopy=False)
            if (t.state in (TrialState.COMPLETE, TrialState.PRUNED) or t.user_attrs.get("diverged"))
            and not t.user_attrs.get("stopped")
        }
    )


def _state(trial) -> str:
    """A trial's state for the table: Optuna's, or why it ended (stopped on request, or its
    training diverged: a failed trial)."""
    for reason in ("stopped", "diverged"):
        if trial.user_attrs.get(reason):
            return reason
    return trial.state.name.lower()


def trials_table(study) -> list[dict]:
    """One row per trial: number, state, settings, best dev value, last reported step."""
    return [
        {
            "trial": t.number,
            "state": _state(t),
            **t.params,
            "dev": t.value,
            "steps": t.last_step,
        }
        for t in study.get_trials(deepcopy=False)
    ]


def study_trials(out: str | Path) -> list[dict]:
    """The trials table of the study in ``out`` (for the app), read without locking it."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_study_file(Path(out) / "study.db")
    storage = f"sqlite:///{(Path(out) / 'study.db').resolve()}"
    return trials_table(optuna.load_study(study_name=STUDY_NAME, storage=storage))


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
    """Search ``config.space`` for ``objective.preset`` on dev; write ``best.json``.
    ``callbacks`` follow every trial's training (the app's live progress). The trackers
    ``tracking_config`` asks for follow every trial, each in its run folder's TensorBoard
    events and, in MLflow, as a nested run of the study's run (its store by default
    ``out/mlruns``: :func:`kd.tracking.store_uri`).

    Bad settings (an unknown parameter, an empty or inverted range, a value outside a domain,
    a study of another preset or task in ``out``) raise before anything is written."""
    import optuna

    from kd import tracking
    from kd.objective import preset_weights
    from kd.pipeline import distill, prepare_distillation
    from kd.trainer import main_metric

    out = Path(out)
    tracking_config = tracking_config or TrackingConfig()
    tracking.check(tracking_config)
    if "mlflow" in tracking_config.report_to:  # the trials' runs go to the study's store
        tracking_config = replace(
            tracking_config, mlflow_uri=tracking.store_uri(tracking_config, out)
        )
    base_weights = preset_weights(objective)
    space = search_space(objective.preset, config.space, base_weights)
    # every check of the settings against the models (an unfinished teacher run included),
    # before anything is written; the task's data comes with them
    task = prepare_distillation(data, student, objective, optim.seed).data
    metric = config.metric or main_metric(task.spec)
    known = (*task.spec.metrics, *(() if task.spec.regression else ("accuracy", "macro_f1")))
    if metric not in known:
        raise WorkbenchError(f"--metric {metric!r}: use one of {', '.join(known)}")
    steps_per_epoch = math.ceil(len(task.splits["train"]) / optim.batch_size)
    if not optim.eval_every:  # several dev evaluations per epoch, for the pruner
        optim = replace(optim, eval_every=max(1, steps_per_epoch // config.reports_per_epoch))
    if out.exists() and not out.is_dir():
        raise WorkbenchError(f"--out {out} is a file: give a folder")
    out.mkdir(parents=True, exist_ok=True)
    target, exhaustive = plan_search(space, config.trials)
    if exhaustive and target < config.trials:
        print(
            f"note: the space has {target} settings: each is tried once (grid search), "
            f"not {config.trials} trials",
            file=sys.stderr,
        )
    study_settings = {
        "tune": to_dict(config),
        "configs": {
            "data": to_dict(data),
            "student": to_dict(student),
            "objective": to_dict(objective),
            "optim": to_dict(optim),
        },
    }
    with (
        hold(out / "study.lock", f"the study in {out}"),
        tracking.tracked_study(tracking_config, out, study_settings) as parent,
    ):
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = _study(
            out,
            objective.preset,
            data.task,
            space,
            config.prune,
            warmup_steps=steps_per_epoch // 2,
            exhaustive=exhaustive,
        )
        _retry_interrupted(study)

        def run_trial(trial) -> float:
            values = {name: dimension.suggest(trial) for name, dimension in space.items()}
            earlier = _earlier_outcome(study, trial.number, values)
            if earlier is not None:  # the sampler proposed settings already tried
                if earlier.user_attrs.get("diverged"):
                    trial.set_user_attr("diverged", earlier.user_attrs["diverged"])
                    raise TrainingDiverged(earlier.user_attrs["diverged"])
                if earlier.state == optuna.trial.TrialState.PRUNED:
                    raise optuna.TrialPruned()
                return earlier.value
            trial_objective, trial_optim = apply(
                values, objective.preset, base_weights, objective, optim
            )
            callback = PruningCallback(trial, metric, config.prune)
            try:
                run = distill(
                    data,
                    student,
                    trial_objective,
                    trial_optim,
                    out / "trials" / trial_folder(values),
                    callbacks=[callback, *callbacks],
                    cache_dir=out / "teacher_cache",
                    tracking_config=tracking_config,
                    tracking_parent=parent,
                )
            except TrainingDiverged as error:  # the trial fails (unscored); the study goes on
                trial.set_user_attr("diverged", str(error))
                raise
            if callback.pruned:
                raise optuna.TrialPruned()
            if run.status()["state"] == "stopped":  # asked to stop: retried on resume
                trial.set_user_attr("stopped", True)
                stopped.append(trial.number)
                study.stop()
                raise optuna.TrialPruned()
            return run.results()["dev"][metric]

        # until the search has tried ``target`` distinct settings: settings TPE proposes again
        # keep their first outcome and count once (bounded: a space of few settings cannot
        # keep the loop going)
        stopped: list[int] = []
        proposals = 0
        while not stopped and (left := target - _finished(study)) > 0 and proposals < 10 * target:
            study.optimize(
                run_trial, n_trials=left, show_progress_bar=True, catch=(TrainingDiverged,)
            )
            proposals += left
        result = TuneResult(rows=trials_table(study))
        completed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if completed:
            best = study.best_trial
            best_objective, best_optim = apply(
                best.params, objective.preset, base_weights, objective, optim
            )
            result.best = out / "best.json"
            atomic_write_json(
                result.best,
                {
                    "data": to_dict(data),
                    "student": to_dict(student),
                    "objective": to_dict(best_objective),
                    "optim": to_dict(best_optim),
                    "tuned": {
                        "trial": best.number,
                        "dev": best.value,
                        "metric": metric,
                        "params": best.params,
                        "space": {n: d.describe() for n, d in space.items()},
                    },
                },
            )
    return result


def load_config_file(path: str | Path) -> dict:
    """The sections of a configuration file (``best.json``): ``{"data": {...}, ...}``."""
    path = Path(path)
    if not path.exists():
        raise WorkbenchError(f"--config {path}: no such file")
    try:
        values = json.loads(read_limited(path, MAX_CONFIG_BYTES, "--config"))
    except json.JSONDecodeError as error:
        raise WorkbenchError(f"--config {path}: not JSON ({error})") from None
    except UnicodeDecodeError:
        raise WorkbenchError(f"--config {path}: not a JSON text file (not UTF-8)") from None
    except OSError as error:
        raise WorkbenchError(f"--config {path}: cannot be read ({first_line(error)})") from None
    if not isinstance(values, dict):
        raise WorkbenchError(f"--config {path}: expected a JSON object of config sections")
    return values
