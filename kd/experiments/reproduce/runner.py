"""The runner: teachers, the weights chosen on dev, every student scored on the whole test split,
then each task's first-seed students timed beside their teacher (:func:`measure_speed`).

``results.json``, rewritten after each step, is the suite's record: a student whose
:func:`~kd.experiments.reproduce.suite.identity` has a row there is finished, on any machine, with
or without its run folder (an unfinished one resumes from its checkpoint). Paths in it are relative
to the suite folder; each row carries per-example test values for the report's paired intervals.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from unittest import mock

from kd.experiments.config import TuneConfig
from kd.experiments.reproduce.record import (
    Examples,
    Sample,
    Search,
    Speed,
    StudentRow,
    SuiteRecord,
    TeacherRecord,
    Truncation,
    read_results,
)
from kd.experiments.reproduce.suite import (
    CONTROL,
    Experiment,
    Suite,
    TaskPlan,
    data_settings,
    experiments,
    fingerprint,
    identity,
    limit,
    plan_summary,
    student_optim,
    suite_key,
    teacher_settings,
)
from kd.experiments.tune import read_best, tune
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import PARAMETERS, PRESETS
from kd.training.config import OptimConfig, StudentConfig
from kd.training.pipeline import check_teacher, distill, teacher_pin, train_teacher
from workbench.analysis.benchmark import benchmark
from workbench.analysis.evaluation import evaluate_logits, predict_logits
from workbench.analysis.faithfulness import aopc
from workbench.analysis.loyalty import agreement_per_example, split_outputs
from workbench.analysis.settings import BenchmarkSettings
from workbench.core.config import DataConfig, config_key, from_dict
from workbench.core.data import batches, encode, load_task, pad_id, prefixes
from workbench.core.errors import WorkbenchError
from workbench.core.files import (
    FORMAT_KEY,
    RECORD_FORMAT,
    RECORD_LIMIT,
    atomic_write_json,
    read_json_file,
)
from workbench.core.models import load_for_task, load_model, load_run, load_tokenizer, resolve_model
from workbench.core.runs import Run, teacher_change
from workbench.core.shards import Shard
from workbench.core.verify import weights_digest

LOYALTY = ("label_loyalty", "probability_loyalty")  # per example in a student's predictions


def compact(values: Sequence) -> str | list:
    """Class ids 0–9 as one string of digits (``[2, 0, 1]`` → ``"201"``); other values as a
    list (regression: floats rounded to 4 decimals)."""
    if all(isinstance(v, int) and 0 <= v <= 9 for v in values):
        return "".join(map(str, values))
    return [round(float(v), 4) for v in values]


def expand(values: str | list) -> list:
    """The inverse of :func:`compact`."""
    return [int(c) for c in values] if isinstance(values, str) else list(values)


def _rounded(values) -> list[float | None]:
    """Per-example floats for JSON: 4 decimals, NaN (undefined) as null."""
    return [None if math.isnan(v) else round(float(v), 4) for v in values]


def relative(path: Path, out: Path) -> str:
    """``path`` relative to the suite folder ``out``, as stored in ``results.json``."""
    return Path(os.path.relpath(path, out)).as_posix()


@dataclass
class Scored:
    """A finished student: its run (relative to the suite folder), test means, per-example values
    and the seconds this call spent on it."""

    run: str
    test: dict
    examples: dict
    seconds: float


class ExampleScores:
    """Per-example explanation scores of students on the first ``explained_examples`` test examples
    (all: None) against their teacher: saliency loyalty (Pearson of Grad saliency, docs/methods.md
    §6), attribution gap (AD-KD Eq. 11) and AOPC of the student's own Grad saliency; kept in its run
    folder (``scores.json``), the teacher's outputs once per process."""

    STORED = "scores.json"

    def __init__(self) -> None:
        self._teachers: dict[tuple, tuple] = {}

    def __call__(self, teacher: Run, student: Run, explained_examples: int | None) -> dict:
        stored = student.path / self.STORED
        settings = {
            "teacher": relative(teacher.path, student.path),  # moves with the suite folder
            "explained_examples": explained_examples,
        }
        if stored.exists():
            with suppress(WorkbenchError):  # a damaged file is computed again: it is only a cache
                scores = read_json_file(stored, RECORD_LIMIT, "stored scores")
                if isinstance(scores, dict) and scores.pop("settings", None) == settings:
                    return scores
        scores = self._compute(teacher, student, explained_examples)
        atomic_write_json(stored, {"settings": settings, **scores})
        return scores

    def _compute(self, teacher: Run, student: Run, explained_examples: int | None) -> dict:
        loaded = load_run(student.path)
        key = (teacher.path.resolve(), config_key(loaded.data), explained_examples)
        if key not in self._teachers:  # the ablations may test on a smaller sample
            split = load_task(loaded.data).splits["test"]
            count = len(split) if explained_examples is None else explained_examples
            explained = split.subset(range(min(count, len(split))))
            source = load_model(str(teacher.path), loaded.spec, loaded.data)  # a run, or given
            self._teachers[key] = split, explained, split_outputs(source, explained, maps=True)
        split, explained, reference = self._teachers[key]
        outputs = split_outputs(loaded, explained, maps=True)
        values = {
            name: _rounded(v.tolist())
            for name, v in agreement_per_example(reference, outputs).items()
        }
        if not loaded.spec.regression:
            dataset = encode(explained, loaded.tokenizer, loaded.data.max_length)
            order = sorted(range(len(explained)), key=lambda i: len(dataset.input_ids[i]))
            comprehensiveness, sufficiency = [0.0] * len(explained), [0.0] * len(explained)
            for batch in batches(dataset, order, 64, pad_id(loaded.tokenizer)):
                width = batch["input_ids"].shape[1]
                result = aopc(
                    loaded.model,
                    batch["input_ids"],
                    batch["attention_mask"],
                    batch["token_type_ids"],
                    scores=outputs.saliency[batch["index"], :width],
                )
                for row, index in enumerate(batch["index"].tolist()):
                    comprehensiveness[index] = float(result.comprehensiveness[row])
                    sufficiency[index] = float(result.sufficiency[row])
            values["aopc_comprehensiveness"] = _rounded(comprehensiveness)
            values["aopc_sufficiency"] = _rounded(sufficiency)
        means = {
            name: (sum(defined) / len(defined) if defined else None)
            for name, v in values.items()
            for defined in [[x for x in v if x is not None]]
        }
        return {"means": means, "examples": values, "uids": list(split.uids)}


SCORES = ExampleScores()  # one per process: each keeps its teachers' outputs


def given_teacher(plan: TaskPlan) -> tuple[Path, dict]:
    """A task's given teacher (``plan.given_teacher``, not fine-tuned): its folder, and its test
    metrics on the plan's data (its classes matched to the task's by name)."""
    check_teacher(plan.given_teacher, False, "give a finished teacher")
    loaded, task = load_for_task(plan.given_teacher, plan.data)
    test = task.splits["test"]
    dataset = encode(test, loaded.tokenizer, plan.data.max_length, task.spec.regression)
    logits = predict_logits(loaded.model, dataset, 64, pad_id(loaded.tokenizer))
    folder = Path(resolve_model(plan.given_teacher)).resolve()
    return folder, evaluate_logits(task.spec, logits, dataset.labels)


def same_teacher(before: TeacherRecord, now: TeacherRecord) -> bool:
    """Whether two records of a task's teacher hold the same weights (a given classifier's,
    without their digest: the same test metrics)."""
    if before.weights and now.weights:
        return before.weights == now.weights
    return before.test == now.test


def task_teacher(out: Path, task: str, plan: TaskPlan) -> Run:
    """Train (or reopen) a task's teacher, seed 1, on all the machine's cores, pinned: trained again
    on the same machine, it comes out with the same weights."""
    return train_teacher(
        plan.data,
        plan.teacher,
        OptimConfig(
            epochs=plan.teacher_epochs,
            batch_size=plan.batch_size,
            learning_rate=plan.teacher_learning_rate,
            threads=os.cpu_count() or 1,
            seed=1,
        ),
        out / "runs" / task / "teacher",
    )


def student_folder(out: Path, experiment: Experiment, key: str) -> Path:
    """``runs/<task>/[ablations/]<name>-seed<seed>-<settings hash>``: other settings (weights
    chosen anew, ``--fixed``) train into another folder."""
    folder = experiment.name.replace(" ", "_").replace("/", "-")
    if experiment.group != "main":
        folder = f"ablations/{folder}"
    settings = key.rpartition("@")[2][:8]
    return out / "runs" / experiment.task / f"{folder}-seed{experiment.seed}-{settings}"


def forget_other_teacher(folder: Path, teacher: Path) -> Run | None:
    """Remove the student folder ``folder`` if it learnt from another teacher than ``teacher`` as it
    is now, or if it is unfinished and was written when the suite lay elsewhere (its teacher's old
    path): the suite trains it anew. A finished one written elsewhere is returned, used as it
    is."""
    if not (folder / "run.json").exists():
        return None
    run = Run(folder)
    info = run.info()
    recorded = info.configs.get("student", {}).get("teacher", "")
    if teacher_change(info.resolved.teacher, teacher_pin(str(teacher))):
        shutil.rmtree(folder)
    elif Path(recorded).resolve() != teacher.resolve():  # not the same folder, however spelt
        if run.status().state == "finished":
            return run
        shutil.rmtree(folder)
    return None


def train_and_score(
    out: Path, teacher: Path, plan: TaskPlan, experiment: Experiment, key: str, threads: int = 0
) -> Scored:
    """Train one student (or reuse its finished run) and score it on the test split; ``key``: its
    identity. Runs in a worker process under ``--jobs``."""
    started = time.time()
    folder = student_folder(out, experiment, key)
    run = forget_other_teacher(folder, teacher) or distill(
        plan.data,
        StudentConfig(teacher=str(teacher), num_layers=plan.student_layers, **experiment.student),
        experiment.objective,
        OptimConfig(
            **student_optim(plan, experiment.seed, {"threads": threads, **experiment.optim})
        ),
        folder,
        cache_dir=out / "runs" / experiment.task / "teacher_cache",  # shared: keyed by settings
    )
    scores = SCORES(Run(teacher), run, plan.explained_examples)
    predicted = run.predictions()["test"]
    if predicted.uids != scores["uids"]:
        raise WorkbenchError(f"{run.path}: predictions and scores cover different examples")
    loyalty = predicted.model_extra
    examples = {
        "predictions": compact(predicted.predictions),
        **{name: compact(loyalty[name]) for name in LOYALTY if name in loyalty},
        **scores["examples"],
    }
    test = {**run.results()["test"], **scores["means"]}
    return Scored(relative(run.path, out), test, examples, time.time() - started)


def tune_space(method: str, searched: Sequence[str], plan: TaskPlan) -> tuple[str, ...]:
    """``kdw tune --space`` overrides that search ``searched`` over the preset's default space and
    hold its other dimensions at the preset's values."""
    preset = ObjectiveConfig(preset=method)
    current = {name: p.read(preset) for name, p in PARAMETERS.items()}
    current["lr"] = plan.student_learning_rate
    space = PRESETS[method].space
    for name in searched:
        if name not in space:
            raise WorkbenchError(f"{method}: its preset has no default space for {name!r}")
    held = [n for n in space if n not in searched and current.get(n) is not None]
    return (*(f"{n}={space[n]}" for n in searched), *(f"{n}={current[n]:g}" for n in held))


def tuning_settings(suite: Suite, method: str) -> dict:
    """What a method's search depends on (no path): its record's key in ``results.json``."""
    task = suite.ablation_task
    plan = suite.plans[task]
    return {
        "method": method,
        "teacher": teacher_settings(plan),
        "data": data_settings(suite.tuning_data(task)),
        "space": list(tune_space(method, suite.tuned[method], plan)),
        "trials": suite.tune_trials,
        "student": {"layers": plan.student_layers, "epochs": plan.student_epochs},
        "batch_size": plan.batch_size,
        "learning_rate": plan.student_learning_rate,
    }


def choose_weights(out: Path, teacher: Path, suite: Suite, method: str, threads: int = 0) -> Search:
    """Search ``method``'s key weights on dev with ``kdw tune`` (the ablations' sample, seed 1).
    Runs in a worker under ``--jobs``."""
    task, settings = suite.ablation_task, tuning_settings(suite, method)
    plan = suite.plans[task]
    result = tune(
        suite.tuning_data(task),
        StudentConfig(teacher=str(teacher), num_layers=plan.student_layers),
        ObjectiveConfig(preset=method),
        OptimConfig(**student_optim(plan, 1), threads=threads),
        TuneConfig(trials=suite.tune_trials, space=tuple(settings["space"])),
        out / "tune" / method,
    )
    if result.best is None:
        raise WorkbenchError(f"kdw tune {method}: no trial finished (all pruned or stopped)")
    best = read_best(result.best)
    return Search(
        key=fingerprint(settings),
        task=task,
        searched=list(suite.tuned[method]),
        space=best.tuned.space,
        metric=best.tuned.metric,
        chosen=best.tuned.params,
        dev=best.tuned.dev,
        objective=best.objective,
        trials=result.rows,
    )


def measure_truncation(plan: TaskPlan) -> dict:
    """How much of the test split ``max_length`` cuts (teacher tokenizer, specials counted),
    counting texts up to 16 × ``max_length`` tokens (the share kept of a longer one is an upper
    bound)."""
    split = load_task(plan.data).splits["test"]
    tokenizer = load_tokenizer(plan.given_teacher or plan.teacher.model)
    limit = plan.data.max_length
    args, _ = prefixes(tokenizer, split.texts, split.pairs, 16 * limit)
    lengths = [len(ids) for ids in tokenizer(*args, truncation=False, verbose=False)["input_ids"]]
    return {
        "max_length": limit,
        "examples": len(lengths),
        "truncated_examples": sum(n > limit for n in lengths),
        "kept_tokens": sum(min(n, limit) for n in lengths) / sum(lengths),
        "median_tokens": sorted(lengths)[len(lengths) // 2],
    }


SPEED = ("parameters", "disk_mb", "latency_ms_median", "throughput_b32")  # kept, with ratios
SPEED_KEPT = (*SPEED, *(f"{k}_ratio" for k in SPEED))


def speed_key(
    teacher: TeacherRecord, students: Sequence[StudentRow], settings: BenchmarkSettings
) -> str:
    """What a task's speed record measured (not the threads, which follow ``--jobs``)."""
    return fingerprint(
        {
            "teacher": teacher.key or teacher.run,
            "students": [s.key or s.run for s in students],
            "examples": settings.examples,
            "batch_sizes": settings.batch_sizes,
        }
    )


def measure_speed(
    out: Path,
    data: DataConfig,
    teacher: TeacherRecord,
    students: Sequence[StudentRow],
    settings: BenchmarkSettings,
) -> Speed:
    """Size and speed of a task's ``students`` beside their ``teacher`` on ``data``'s test split,
    each with its ratio to the teacher's, with the machine and its load when it started."""
    load_before = os.getloadavg()[0]
    sources = [str(out / teacher.run), *(str(out / s.run) for s in students)]
    measured = benchmark(sources, settings, data)
    names = ["teacher", *(s.name for s in students)]
    return Speed(
        key=speed_key(teacher, students, settings),
        settings=measured["settings"],
        machine=measured["machine"],
        load_before=round(load_before, 1),
        rows=[
            {"name": name, **{k: row.get(k) for k in SPEED_KEPT}}
            for name, row in zip(names, measured["rows"], strict=True)
        ],
    )


def exit_with_parent(parent: int, interval: float = 1.0) -> None:
    """Worker initializer: end this worker once the process that started it is gone; the run it
    leaves resumes from its last checkpoint."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _parallel(
    function: Callable, calls: dict[int, tuple], jobs: int, done: Callable[[int, object], None]
) -> None:
    """``function(*call, threads)`` for every call, in ``jobs`` spawned processes (the CPU
    threads shared out) or in this one; ``done(index, result)`` as each finishes."""
    if jobs <= 1:
        for index, call in calls.items():
            done(index, function(*call))
        return
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with (
        mock.patch.dict(os.environ, TQDM_DISABLE="1"),  # workers inherit it: bars would interleave
        ProcessPoolExecutor(
            jobs,
            mp_context=get_context("spawn"),
            initializer=exit_with_parent,
            initargs=(os.getpid(),),
        ) as pool,
    ):
        futures = {pool.submit(function, *call, threads): index for index, call in calls.items()}
        try:
            for future in as_completed(futures):
                done(futures[future], future.result())
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


def shard_positions(suite: Suite, shard: Shard | None) -> list[int]:
    """The positions in :func:`experiments`' list that ``shard`` trains (all: None); a shard left
    without a student is a one-line error."""
    total = len(experiments(suite))
    if shard is None:
        return list(range(total))
    if shard.count > total:
        raise WorkbenchError(
            f"--shard {shard}: the suite has {total} students, so at most {total} shards"
        )
    return shard.positions(total)


def suite_fields(
    suite: Suite, truncation: dict[str, Truncation | None], shard: Shard | None
) -> dict:
    """The fields of a record that the suite (and the part of it trained) settles, with
    ``truncation``'s measures where it has them."""
    part = {} if shard is None else {"shard": {"index": shard.index, "count": shard.count}}
    data, sample = suite.ablation_data, None
    if data is not None:
        sizes = f"{limit(data.max_train_examples)} train / {limit(data.max_eval_examples)} test"
        sample = f"{sizes} examples, {data.max_length} tokens"
    return {
        FORMAT_KEY: RECORD_FORMAT,
        "suite": suite.description,
        "cuts": suite.cuts,
        "ablation_data": sample,
        "setup": {task: plan_summary(plan) for task, plan in suite.plans.items()},
        "truncation": {
            task: truncation.get(task) or measure_truncation(plan)
            for task, plan in suite.plans.items()
        },
        "tuned": bool(suite.tuned),
        "suite_key": suite_key(suite),
        **part,
    }


class SuiteCall:
    """One call of :func:`run_suite`: what the record held when it started, what it trains, and the
    record it writes (:meth:`record`)."""

    def __init__(
        self,
        out: Path,
        suite: Suite,
        announce: Callable[[str], None],
        jobs: int,
        shard: Shard | None,
    ) -> None:
        self.out, self.suite, self.announce, self.jobs = out, suite, announce, jobs
        self.mine = shard_positions(suite, shard)
        self.started = time.time()
        self.load_before = os.getloadavg()[0]  # what else ran beside this call
        self.previous = previous = read_results(out) or SuiteRecord(
            record_format=RECORD_FORMAT, suite=suite.description, teachers={}, students=[]
        )  # none yet
        self.recorded = {r.key: r for r in previous.students if r.key}
        self.teachers = {
            task: record
            for task, record in previous.teachers.items()
            if task in suite.plans
            and record.key == fingerprint(teacher_settings(suite.plans[task]))
        }
        self.tuning = {
            method: record
            for method, record in previous.tuning.items()
            if method in suite.tuned and record.key == fingerprint(tuning_settings(suite, method))
        }
        planned = experiments(suite)
        needed = {
            planned[i].name.removesuffix(CONTROL) for i in self.mine if planned[i].group == "main"
        }
        self.methods = [m for m in suite.tuned if m in needed]
        self.test_sets = dict(previous.test_sets)
        self.speed = dict(previous.speed)  # students timed beside their teacher
        self.fixed = {**suite_fields(suite, previous.truncation, shard), "jobs": jobs}
        self.runs: dict[str, Path] = {}  # each task's teacher
        self.retaught: set[str] = set()  # tasks whose teacher was trained again to other weights
        self.todo: list[Experiment] = []  # known once the weights are chosen
        self.keys: list[str] = []  # the todo's identities
        self.kept: list[StudentRow] = []  # recorded ablations this call does not plan
        self.scored: dict[int, StudentRow] = {}
        self.calls: dict[int, tuple] = {}
        self.searches: dict[int, tuple] = {}

    def record(self) -> SuiteRecord:
        """``results.json`` as it stands, with this call's wall clock so far."""
        suite, previous, todo = self.suite, self.previous, self.todo
        return SuiteRecord(
            **self.fixed,
            teachers={t: self.teachers[t] for t in suite.plans if t in self.teachers},
            tuning={m: self.tuning[m] for m in self.methods if m in self.tuning},
            planned_students=len(self.mine) if todo else previous.planned_students,
            test_sets=self.test_sets,
            speed={task: self.speed[task] for task in suite.plans if task in self.speed},
            students=[self.scored[i] for i in range(len(todo)) if i in self.scored] + self.kept
            if todo
            else previous.students,
            calls=[  # every call's wall clock: their sum is the suite's from an empty folder
                *previous.calls,
                {
                    "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.started)),
                    "seconds": round(time.time() - self.started),
                    "searches": len(self.searches),
                    "teachers": len(self.runs),
                    "students": sum(i in self.calls for i in self.scored),  # trained by it
                    "jobs": self.jobs,
                    "load_before": round(self.load_before, 1),
                },
            ],
        )

    def save(self) -> SuiteRecord:
        """Write :meth:`record` to ``results.json`` (``--report-only`` works mid-suite)."""
        record = self.record()
        atomic_write_json(self.out / "results.json", record.plain())
        return record

    def teacher_run(self, task: str) -> Path:
        """The task's teacher: trained or reopened once per call, or the given classifier."""
        if task not in self.runs:
            self.announce(f"teacher on {task}")
            plan = self.suite.plans[task]
            if plan.given_teacher:  # recorded by its absolute path: it lives outside the suite
                path, test = given_teacher(plan)
                where = str(path)
            else:
                run = task_teacher(self.out, task, plan)
                path, test, where = run.path, run.results()["test"], relative(run.path, self.out)
            self.runs[task] = path
            record = TeacherRecord(key=fingerprint(teacher_settings(plan)), run=where, test=test)
            if not plan.given_teacher:
                record.weights = weights_digest(path / "model")
            before = self.teachers.get(task)
            if before and not same_teacher(before, record):
                self.retaught.add(task)
                self.announce(
                    f"the teacher on {task} was trained again to other weights (test accuracy "
                    f"{before.test['accuracy'] * 100:.2f} → {test['accuracy'] * 100:.2f}): "
                    "the students recorded with the former one are trained again"
                )
            self.teachers[task] = record
            self.save()
        return self.runs[task]

    def taught_alike(self, row: StudentRow) -> bool:
        """Whether a recorded student learnt from its task's teacher as it is now (without recorded
        weights: unless the teacher was trained again in this call)."""
        if "teacher" in row.model_fields_set and row.task in self.runs:
            return row.teacher == (self.teachers[row.task].weights or None)
        return row.task not in self.retaught

    def tuned(self, index: int, record: Search) -> None:
        """A search finished: its method's chosen weights."""
        self.tuning[self.methods[index]] = record
        self.announce(f"weights chosen on dev for {self.methods[index]}: {record.chosen}")
        self.save()

    def finished(self, index: int, result: Scored) -> None:
        """A student finished: its row (and its test set's ids and labels, once)."""
        experiment = self.todo[index]
        test_set = fingerprint(data_settings(self.suite.plan_of(experiment).data))
        if test_set not in self.test_sets:
            predicted = Run(self.out / result.run).predictions()["test"]
            self.test_sets[test_set] = Sample(uids=predicted.uids, labels=compact(predicted.labels))
        self.scored[index] = StudentRow(
            key=self.keys[index],
            **{k: getattr(experiment, k) for k in ("task", "name", "group", "seed", "sweep")},
            run=result.run,
            teacher=self.teachers[experiment.task].weights or None,
            test=result.test,
            examples=Examples(test_set=test_set, **result.examples),
            seconds=round(result.seconds),
        )
        self.announce(
            f"[{len(self.scored)}/{len(self.mine)}] {experiment.task}: {experiment.name}, seed "
            f"{experiment.seed}: test accuracy {result.test['accuracy'] * 100:.1f} "
            f"({result.seconds:.0f} s)"
        )
        self.save()

    def plan_students(self) -> None:
        """The students under the chosen weights: those recorded kept, the rest to train."""
        suite, recorded = self.suite, self.recorded
        chosen = {m: from_dict(ObjectiveConfig, r.objective) for m, r in self.tuning.items()}
        self.todo = todo = experiments(suite, chosen)
        self.keys = keys = [identity(e, suite.plan_of(e), suite.plans[e.task]) for e in todo]
        self.kept = [  # a call without --ablations loses none that a call with it recorded
            recorded[key]
            for e in experiments(suite.with_ablations(), chosen)
            if (key := identity(e, suite.plan_of(e), suite.plans[e.task])) in recorded
            and key not in keys
        ]
        found = {i: recorded[keys[i]] for i in self.mine if keys[i] in recorded}
        for task in dict.fromkeys(todo[i].task for i in self.mine if i not in found):
            self.teacher_run(task)  # the teachers of what is left to train
        self.scored.update({i: row for i, row in found.items() if self.taught_alike(row)})
        self.calls |= {
            i: (self.out, self.runs[todo[i].task], suite.plan_of(todo[i]), todo[i], keys[i])
            for i in self.mine
            if i not in self.scored
        }
        for task in dict.fromkeys(todo[i].task for i in self.mine):  # a task with nothing
            if task not in self.teachers:  # left to train keeps its recorded teacher
                self.teacher_run(task)

    def time_students(self) -> None:
        """Time each task's first-seed students (each main-table method's, not the controls) beside
        their teacher where the record lacks it and their folders are here: ``speed_examples`` test
        texts, batch sizes 1 and 32, with the threads one of the ``jobs`` workers gets."""
        suite = self.suite
        if suite.speed_examples is None:
            return
        threads = max(1, (os.cpu_count() or 1) // max(self.jobs, 1))
        settings = BenchmarkSettings(
            split="test", examples=suite.speed_examples, batch_sizes="1,32", threads=threads
        )
        for task, plan in suite.plans.items():
            wanted = [
                i
                for i, e in enumerate(self.todo)
                if (e.task, e.group, e.seed) == (task, "main", plan.seeds[0])
                and CONTROL not in e.name
            ]
            if not wanted or task not in self.teachers or any(i not in self.scored for i in wanted):
                continue
            teacher, students = self.teachers[task], [self.scored[i] for i in wanted]
            timed = self.speed.get(task)
            if timed and timed.key == speed_key(teacher, students, settings):
                continue
            folders = [self.out / teacher.run, *(self.out / s.run for s in students)]
            absent = next((folder for folder in folders if not folder.is_dir()), None)
            if absent is not None:
                self.announce(f"{task}: students not timed, {absent} is not here")
                continue
            self.announce(
                f"{task}: timing the seed-{plan.seeds[0]} students beside the teacher on "
                f"{suite.speed_examples} test texts"
            )
            self.speed[task] = measure_speed(self.out, plan.data, teacher, students, settings)
            self.speed[task].seed = plan.seeds[0]
            self.save()

    def run(self) -> SuiteRecord:
        """Search, train, score and time what the record lacks; the final record."""
        try:
            self.searches |= {
                index: (self.out, self.teacher_run(self.suite.ablation_task), self.suite, m)
                for index, m in enumerate(self.methods)
                if m not in self.tuning
            }
            _parallel(choose_weights, self.searches, self.jobs, self.tuned)
            self.plan_students()
            if not self.calls:
                self.announce(
                    f"all {len(self.mine)} students are recorded in "
                    f"{self.out / 'results.json'}: none trained"
                )
            _parallel(train_and_score, self.calls, self.jobs, self.finished)
            self.time_students()
        finally:  # also when interrupted: what finished is kept, with this call's wall clock
            final = self.save()
        return final


def run_suite(
    out: Path,
    suite: Suite,
    announce: Callable[[str], None] = print,
    jobs: int = 1,
    shard: Shard | None = None,
) -> SuiteRecord:
    """Train what ``<out>/results.json`` lacks: the weights chosen on dev, then every student (and
    its teacher) scored on test in ``jobs`` processes (``shard``: its part), then the timings. The
    record is rewritten after every step and when interrupted."""
    return SuiteCall(out, suite, announce, jobs, shard).run()
