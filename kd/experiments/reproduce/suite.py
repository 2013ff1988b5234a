"""The suite as data: what each task trains (:class:`TaskPlan`), which students
(:class:`Experiment`), which weights are chosen on dev first, and the two suites the CLI offers
(:data:`DEFAULT`, :data:`FULL`).

An experiment's :func:`identity` keys its row in ``results.json``: its task, group, name and seed,
and a fingerprint of every setting that changes the student but of no path, so a suite folder can
move or be cloned without its run folders and still count its finished students as done.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from kd.methods.config import ObjectiveConfig
from kd.methods.objective import PRESETS, Sweep, ablated, control
from kd.training.config import StudentConfig, TeacherConfig
from workbench.core.config import DataConfig, from_dict, spelled, to_dict
from workbench.core.data import data_version
from workbench.core.errors import WorkbenchError

STUDENT_KEYS = ("name", "task", "objective", "group", "sample", "seeds", "student")  # --students
MAIN_METHODS = tuple(PRESETS)  # the built-in methods, in the order of registration
CONTROL = " control"  # a control student's name: its method's, then this
# the key weights chosen on dev before the main table (each preset's ``tuned`` parameters, over
# its ``space``); vanilla KD's τ is tuned too, so that every method meets a reference tuned alike
TUNED_PARAMETERS: dict[str, tuple[str, ...]] = {
    name: preset.tuned for name, preset in PRESETS.items() if preset.tuned
}


def ablated_methods() -> list[str]:
    """The registered presets that declare ablations (the ablations' references)."""
    return [name for name, preset in PRESETS.items() if preset.ablations]


@dataclass(frozen=True)
class TaskPlan:
    """How one task is run: its data subsample, model and training lengths, and seeds."""

    data: DataConfig
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    student_train_examples: int | None = None  # the main table's students train on this many
    # examples of the training split (a stratified sample; None: the teacher's data)
    teacher_epochs: float = 3.0
    student_epochs: float = 3.0
    student_layers: int = 3
    seeds: tuple[int, ...] = (1, 2, 3)
    batch_size: int = 32
    teacher_learning_rate: float = 5e-5
    student_learning_rate: float = 1e-4
    sweeps: dict[str, tuple[int, ...]] = field(default_factory=dict)  # a sweep's key → its
    # values on this task, where they are not the sweep's own (kd.methods.objective.Sweep)
    explained_examples: int | None = 500  # SL, gap and AOPC on the first N test examples
    given_teacher: str = ""  # a classifier folder to use as the task's teacher, as it is
    # (``kdw reproduce --teacher TASK=FOLDER``): ``teacher`` and its training lengths unused

    def sweep_values(self, sweep: Sweep) -> tuple[int, ...]:
        """The values ``sweep`` takes on this task."""
        return tuple(self.sweeps.get(sweep.key, sweep.values))


@dataclass(frozen=True)
class Experiment:
    """One student: a method (or ablation) on a task with a seed."""

    task: str
    name: str
    group: str
    objective: ObjectiveConfig
    seed: int
    sweep: float | None = None
    student: dict = field(default_factory=dict)  # StudentConfig settings that differ
    optim: dict = field(default_factory=dict)  # OptimConfig settings that differ (a tuned lr)
    sample: str = ""  # the data it trains on: "main" (the main table's) or "ablation" (the
    # ablations' sample); "": by its group, the main table's for "main", else the ablations'

    @property
    def on_ablation_sample(self) -> bool:
        return (self.sample or ("main" if self.group == "main" else "ablation")) == "ablation"


@dataclass(frozen=True)
class Suite:
    plans: dict[str, TaskPlan]
    ablation_task: str
    ablation_seeds: tuple[int, ...] = (1,)
    description: str = ""
    methods: tuple[str, ...] = MAIN_METHODS
    controls: bool = True  # beside each method, its control (kd.methods.objective.control)
    ablation_groups: tuple[str, ...] | None = None  # None: all; (): none
    cuts: str = ""  # what the suite leaves out of the papers' protocol, for the report
    ablation_data: DataConfig | None = None  # a smaller sample for the ablations (None: the
    # task's own); then the full methods are retrained on it as the ablations' reference
    extra: tuple[Experiment, ...] = ()  # more students, after the main table and ablations
    tuned: dict[str, tuple[str, ...]] = field(default_factory=dict)  # method → parameters
    # chosen on dev (ablation scale, seed 1) before the main table; {}: the presets' defaults
    tune_trials: int = 8
    speed_examples: int | None = 200  # test texts each task's first-seed students are timed
    # on beside their teacher (kdw benchmark, PyTorch fp32 on the CPU); None: not timed

    def plan_of(self, experiment: Experiment) -> TaskPlan:
        """The plan an experiment trains under: the students may train on fewer examples than
        their teacher, the ablations on their own sample."""
        plan = self.plans[experiment.task]
        if experiment.on_ablation_sample and self.ablation_data is not None:
            return replace(plan, data=self.ablation_data)
        if plan.student_train_examples is None:
            return plan
        return replace(
            plan, data=replace(plan.data, max_train_examples=plan.student_train_examples)
        )

    def tuning_data(self, task: str) -> DataConfig:
        """The data the weights are chosen on: the ablations' sample (its dev split)."""
        return self.ablation_data or self.plans[task].data

    def fixed(self) -> Suite:
        """The same suite with the presets' defaults (``--fixed``): nothing tuned."""
        return replace(self, tuned={})

    def with_ablations(self) -> Suite:
        """The same suite with all the papers' ablations (``--ablations``)."""
        return replace(self, ablation_groups=None)

    def with_teachers(self, given: dict[str, str]) -> Suite:
        """The same suite with the tasks named in ``given`` taught by those classifiers, used as
        they are (``--teacher TASK=FOLDER``); an unknown task is a one-line error."""
        if unknown := sorted(set(given) - set(self.plans)):
            raise WorkbenchError(
                f"--teacher names the task(s) {unknown}; the suite's are {sorted(self.plans)}"
            )
        taught = {task: replace(self.plans[task], given_teacher=f) for task, f in given.items()}
        return replace(self, plans=self.plans | taught)

    def with_students(self, entries: Sequence[dict]) -> Suite:
        """The same suite with more students (``--students FILE``), each entry a mapping of
        ``name``, ``task``, ``objective`` and optionally ``group`` (default ``"extra"``), ``sample``
        (``"main"`` or ``"ablation"``), ``seeds`` (default: the task's) and ``student`` (settings
        that differ); every problem is a one-line error, found before anything is trained."""
        students = []
        for number, entry in enumerate(entries, 1):
            where = f"student {number}"
            if not isinstance(entry, dict):
                raise WorkbenchError(f"{where}: give a mapping of name, task and objective")
            unknown = sorted(set(entry) - set(STUDENT_KEYS))
            missing = [key for key in STUDENT_KEYS[:3] if key not in entry]
            if unknown or missing:
                problems = [f"unknown keys {unknown}"] * bool(unknown)
                problems += [f"missing {missing}"] * bool(missing)
                raise WorkbenchError(
                    f"{where}: {'; '.join(problems)} (keys: {', '.join(STUDENT_KEYS)})"
                )
            name, task = str(entry["name"]), str(entry["task"])
            where = f"student {name!r}"
            if task not in self.plans:
                raise WorkbenchError(
                    f"{where}: task {task!r}; the suite's are {sorted(self.plans)}"
                )
            sample = entry.get("sample", "main")
            if sample not in ("main", "ablation"):
                raise WorkbenchError(f"{where}: sample {sample!r}: use main or ablation")
            seeds = entry.get("seeds", self.plans[task].seeds)
            if not seeds or not all(isinstance(s, int) and 0 <= s < 2**32 for s in seeds):
                raise WorkbenchError(f"{where}: seeds must be a list of integers 0..2^32-1")
            student = entry.get("student", {})
            try:
                objective = from_dict(ObjectiveConfig, entry["objective"])
                from_dict(StudentConfig, {"teacher": "-", **student})
            except (WorkbenchError, TypeError, ValueError) as error:
                raise WorkbenchError(f"{where}: {error}") from None
            if objective.preset not in PRESETS:
                raise WorkbenchError(
                    f"{where}: preset {objective.preset!r}; use one of {', '.join(PRESETS)}"
                )
            group = str(entry.get("group", "extra"))
            students += [
                Experiment(task, name, group, objective, seed, student=dict(student), sample=sample)
                for seed in seeds
            ]
        taken = {(e.task, e.group, e.name) for e in experiments(self)}
        if clash := sorted({e.name for e in students if (e.task, e.group, e.name) in taken}):
            raise WorkbenchError(f"--students: {clash} already name students of the suite")
        names = [(e.task, e.group, e.name, e.seed) for e in students]
        if len(set(names)) < len(names):
            raise WorkbenchError("--students: two entries name the same student")
        return replace(self, extra=(*self.extra, *students))

    def with_seeds(self, count: int) -> Suite:
        """The same suite with the main table trained over seeds ``1..count`` (``--seeds``):
        the rows of seeds already recorded keep their identities."""
        seeds = tuple(range(1, count + 1))
        plans = {task: replace(plan, seeds=seeds) for task, plan in self.plans.items()}
        return replace(self, plans=plans)


def fingerprint(values: dict) -> str:
    """A short hash of canonical JSON: equal settings, equal fingerprint."""
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def data_settings(data: DataConfig) -> dict:
    """A data config as the suite's records key it: its settings, and the bundled set's data
    version where its cleaning changed (so rows trained on the former texts are retrained)."""
    version = data_version(data.task)
    return to_dict(data) | ({"version": version} if version else {})


def teacher_settings(plan: TaskPlan) -> dict:
    """What changes a task's teacher (no path, but that of a given teacher)."""
    if plan.given_teacher:
        return {"data": data_settings(plan.data), "given_teacher": plan.given_teacher}
    return {
        "data": data_settings(plan.data),
        "teacher": to_dict(plan.teacher),
        "epochs": plan.teacher_epochs,
        "batch_size": plan.batch_size,
        "learning_rate": plan.teacher_learning_rate,
    }


def student_optim(plan: TaskPlan, seed: int, changes: dict | None = None) -> dict:
    """The :class:`OptimConfig` settings a student of ``plan`` trains with (no threads)."""
    return {
        "epochs": plan.student_epochs,
        "batch_size": plan.batch_size,
        "learning_rate": plan.student_learning_rate,
        "seed": seed,
        **(changes or {}),
    }


def identity(experiment: Experiment, plan: TaskPlan, teacher_plan: TaskPlan) -> str:
    """``task/group/name/seed@fingerprint``: the key of an experiment's row in
    ``results.json``; ``plan`` is the one it trains under, ``teacher_plan`` its teacher's."""
    settings = {
        "teacher": teacher_settings(teacher_plan),
        "data": data_settings(plan.data),
        "student": {"num_layers": plan.student_layers, **experiment.student},
        "objective": spelled(experiment.objective),
        "optim": student_optim(plan, experiment.seed, experiment.optim),
        "explained_examples": plan.explained_examples,
    }
    return (
        f"{experiment.task}/{experiment.group}/{experiment.name}/seed{experiment.seed}"
        f"@{fingerprint(settings)}"
    )


def suite_key(suite: Suite) -> str:
    """A fingerprint of every setting of the suite: records of the same suite (its shards) have the
    same key, of any other suite (``--fixed``, ``--seeds``, …) another; each registered sweep's
    values are keyed under its key."""
    settings = asdict(suite)
    for task, plan in suite.plans.items():
        del settings["plans"][task]["sweeps"]
        settings["plans"][task].update({s.key: plan.sweep_values(s) for s in registered_sweeps()})
    return fingerprint(settings)


def registered_sweeps() -> list[Sweep]:
    """The sweeps the registered presets declare, in the order of registration."""
    return [a for preset in PRESETS.values() for a in preset.ablations if isinstance(a, Sweep)]


def quick_sweeps() -> dict[str, tuple[int, ...]]:
    """Each registered sweep's values in the 2-core default suite, by its key, where the sweep
    declares fewer than its own (:attr:`~kd.methods.objective.Sweep.quick`)."""
    return {sweep.key: sweep.quick for sweep in registered_sweeps() if sweep.quick}


def ablations(task: str, plan: TaskPlan, seeds: Sequence[int]) -> list[Experiment]:
    """The ablations the registered presets declare, each derived from its preset's objective: the
    sweeps first (an interrupted suite then still has its figures), then the other variants."""
    sweeps: list[Experiment] = []
    variants: list[Experiment] = []
    for method, preset in PRESETS.items():
        base = ObjectiveConfig(preset=method)
        for entry in preset.ablations:
            if not isinstance(entry, Sweep):
                variant = ablated(base, entry)
                variants += [
                    Experiment(task, f"{method} {entry.name}", entry.group, variant, s)
                    for s in seeds
                ]
                continue
            for value in plan.sweep_values(entry):
                name, swept = f"{method} {entry.label}={value}", float(value)
                objective = base.with_settings(**{entry.setting: value})
                sweeps += [Experiment(task, name, entry.group, objective, s, swept) for s in seeds]
    return sweeps + variants


def experiments(suite: Suite, chosen: dict[str, ObjectiveConfig] | None = None) -> list[Experiment]:
    """The main table (every task, method and seed; a method's objective as ``chosen`` on dev where
    it was tuned) and the ablations (at the presets' defaults): the ablation task's main table, its
    ablations, then the other tasks', so that a call stopped part-way leaves the next fewer teachers
    to train again."""
    chosen = chosen or {}
    tasks = [suite.ablation_task, *(task for task in suite.plans if task != suite.ablation_task)]
    objectives = {m: chosen.get(m, ObjectiveConfig(preset=m)) for m in suite.methods}
    rows = list(objectives.items())
    if suite.controls:  # each method without its own terms, on the same data and seeds
        rows += [
            (m + CONTROL, control(objective))
            for m, objective in objectives.items()
            if control(objective) != objective
        ]
    main = {
        task: [
            Experiment(task, name, "main", objective, seed)
            for seed in suite.plans[task].seeds
            for name, objective in rows
        ]
        for task in tasks
    }
    extra = ablations(suite.ablation_task, suite.plans[suite.ablation_task], suite.ablation_seeds)
    if suite.ablation_groups is not None:
        extra = [e for e in extra if e.group in suite.ablation_groups]
    if extra and suite.ablation_data is not None:
        extra = [
            Experiment(
                suite.ablation_task, method, "reference", ObjectiveConfig(preset=method), seed
            )
            for seed in suite.ablation_seeds
            for method in ablated_methods()
        ] + extra
    others = [e for task in tasks[1:] for e in main[task]]
    return main[suite.ablation_task] + extra + others + list(suite.extra)


def limit(value: int | None) -> str:
    """A subsample size as the report states it: ``"all"`` or ``"≤ 1,000"``."""
    return "all" if value is None else f"≤ {value:,}"


def plan_summary(plan: TaskPlan) -> dict:
    """The sizes of one task's plan that the report states (what was cut from the papers)."""
    return {
        "teacher": plan.given_teacher or plan.teacher.model,
        "max_train_examples": plan.data.max_train_examples,
        "student_train_examples": plan.student_train_examples,
        "max_eval_examples": plan.data.max_eval_examples,
        "max_length": plan.data.max_length,
        "teacher_epochs": plan.teacher_epochs,
        "student_layers": plan.student_layers,
        "student_epochs": plan.student_epochs,
        "seeds": list(plan.seeds),
        "batch_size": plan.batch_size,
        "student_learning_rate": plan.student_learning_rate,
        "explained_examples": plan.explained_examples,
    }


DEFAULT = Suite(
    plans={
        "tweets": TaskPlan(
            DataConfig(task="tweets", max_length=64, max_train_examples=6000),
            student_train_examples=2000,
            teacher_epochs=3,
            student_epochs=1,
            seeds=(1, 2, 3),
            sweeps=quick_sweeps(),
        ),
        "bbc-news": TaskPlan(
            DataConfig(task="bbc-news", max_length=128),
            student_train_examples=600,
            teacher_epochs=3,
            student_epochs=1,
            seeds=(1, 2, 3),
        ),
    },
    ablation_task="tweets",
    ablation_groups=(),  # --ablations adds them
    ablation_data=DataConfig(
        task="tweets", max_length=64, max_train_examples=1000, max_eval_examples=500
    ),
    tuned=TUNED_PARAMETERS,
    tune_trials=4,
    description="2-core CPU default: tweets (teacher on 6,000 train, students on 2,000, the "
    "whole test split, 64 tokens) and BBC News (teacher on the whole training split, students "
    "on 600 articles, the whole test split, first 128 tokens), 3 seeds each; 3-layer students "
    "cut from MiniLM-L6; key weights chosen on dev first",
    cuts="a MiniLM-L6 teacher (22.7M parameters) instead of BERT-base; 3-layer students trained 1 "
    "epoch (the papers: 3–4) on a third of their teacher's training data (2,000 tweets; 600 BBC "
    "News articles), stratified samples, the same for every seed; 6,000 of the 29,748 training "
    "tweets for the tweets teacher, at 64 tokens; BBC News at 128 tokens, about a quarter of "
    "each article's tokens (measured in the table above; 256 tokens would keep half and 512 "
    "tokens 83 %, at a dearer step: a cut to fit the time); the weights chosen from 4 distinct "
    "settings per method (grids of 3 or 4 tried whole, larger ones by TPE) on 1,000 training "
    "tweets, scored on 500 dev tweets, seed 1, and used for both tasks; the papers' "
    "ablations left out (`kdw reproduce --ablations` adds them: 1,000 tweets tested on 500, "
    "seed 1, against the full methods retrained on the same sample, K ∈ {96, 192, all 384} and "
    "m ∈ {1, 2, 4}); saliency loyalty, attribution gap and AOPC on the first 500 test examples "
    "of each task (accuracy, label and probability loyalty on the whole split).",
)
FULL = Suite(
    plans={
        name: TaskPlan(
            DataConfig(task=name, max_length=128),
            teacher=TeacherConfig(model="bert-base-uncased"),
            teacher_epochs=3,
            student_epochs=4,
            student_layers=6,
            student_learning_rate=5e-5,
            explained_examples=1000,
        )
        for name in ("sst2", "mrpc", "qnli", "rte", "cola", "stsb", "qqp", "mnli")
    },
    ablation_task="mrpc",
    ablation_seeds=(1, 2, 3),
    tuned=TUNED_PARAMETERS,
    tune_trials=20,
    description="papers' scale: GLUE, BERT-base teacher, 6-layer students (GPU and network)",
)
