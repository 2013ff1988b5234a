"""``kdw reproduce``: the papers' experiments rerun on the bundled data, with a report.

The default suite is sized for a 2-core CPU (about an hour with ``--jobs 2``): the
3-layer students of every method on subsamples of ``tweets`` and ``bbc-news`` over seeds, the
loyalty table, and the ablations of AD-KD, GKD and CKD on ``tweets``. Every experiment is a run
folder under ``<out>/runs``, so an interrupted suite resumes where it stopped and finished runs
are reused. ``--full`` describes the papers' scale (GLUE, BERT-base teacher, 6-layer students) for
users with a GPU and the network.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path

from kd.pipeline import distill, train_teacher
from workbench.config import (
    DataConfig,
    ObjectiveConfig,
    OptimConfig,
    StudentConfig,
    TeacherConfig,
    config_key,
)
from workbench.errors import WorkbenchError
from workbench.files import atomic_write_json, atomic_write_text
from workbench.metrics import mean_and_std
from workbench.runs import Run

MAIN_METHODS = ("finetune", "kd", "pkd-skip", "pkd-last", "ckd", "adkd", "gkd", "gkd-cls")
ABLATED_METHODS = ("ckd", "adkd", "gkd")


@dataclass(frozen=True)
class TaskPlan:
    """How one task is run: its data subsample, model and training lengths, and seeds."""

    data: DataConfig
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    teacher_epochs: float = 3.0
    student_epochs: float = 3.0
    student_layers: int = 3
    seeds: tuple[int, ...] = (1, 2, 3)
    batch_size: int = 32
    teacher_learning_rate: float = 5e-5
    student_learning_rate: float = 1e-4
    top_k_sweep: tuple[int, ...] = (48, 96, 192)  # of MiniLM's 384 dimensions
    steps_sweep: tuple[int, ...] = (2, 4, 8)  # m = 1 is the main table's AD-KD


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


@dataclass(frozen=True)
class Suite:
    plans: dict[str, TaskPlan]
    ablation_task: str
    ablation_seeds: tuple[int, ...] = (1,)
    description: str = ""
    methods: tuple[str, ...] = MAIN_METHODS
    ablation_groups: tuple[str, ...] | None = None  # None: all
    cuts: str = ""  # what the suite leaves out of the papers' protocol, for the report
    ablation_data: DataConfig | None = None  # a smaller sample for the ablations (None: the
    # task's own); then the full methods are retrained on it as the ablations' reference
    extra: tuple[Experiment, ...] = ()  # more students, after the main table and ablations

    def plan_of(self, experiment: Experiment) -> TaskPlan:
        """The plan an experiment trains under: the ablations may use smaller data."""
        plan = self.plans[experiment.task]
        if experiment.group == "main" or self.ablation_data is None:
            return plan
        return replace(plan, data=self.ablation_data)


def ablations(task: str, plan: TaskPlan, seeds: Sequence[int]) -> list[Experiment]:
    """The papers' ablations: AD-KD terms, views, K, m and layer; GKD dropout; CKD terms."""
    adkd = ObjectiveConfig(preset="adkd")
    # the sweeps first: an interrupted suite then still has its figures
    rows: list[tuple[str, str, ObjectiveConfig, float | None]] = [
        (f"adkd K={k}", "adkd-k", replace(adkd, attr_top_k=k), float(k)) for k in plan.top_k_sweep
    ]
    rows += [
        (f"adkd m={m}", "adkd-m", replace(adkd, attr_steps=m), float(m)) for m in plan.steps_sweep
    ]
    rows += [
        ("adkd w/o attr", "adkd-terms", replace(adkd, weights="ce=0.1,kd=0.9"), None),
        ("adkd w/o ce", "adkd-terms", replace(adkd, weights="kd=0.9,attr=10"), None),
        ("adkd w/o kd", "adkd-terms", replace(adkd, weights="ce=0.1,attr=10"), None),
        ("adkd view pred", "adkd-views", replace(adkd, attr_views="pred"), None),
        ("adkd view gold", "adkd-views", replace(adkd, attr_views="gold"), None),
        ("adkd view class 0", "adkd-views", replace(adkd, attr_views="0"), None),
        ("adkd view sampled", "adkd-views", replace(adkd, attr_views="sample"), None),
        ("gkd w/ dropout", "gkd-dropout", ObjectiveConfig(preset="gkd", dropout=True), None),
        (
            "ckd w/o wr",
            "ckd-terms",
            ObjectiveConfig(preset="ckd", weights="ce=0.5,kd=0.5,ltr=1"),
            None,
        ),
        (
            "ckd w/o ltr",
            "ckd-terms",
            ObjectiveConfig(preset="ckd", weights="ce=0.5,kd=0.5,wr=1"),
            None,
        ),
        ("adkd layer first", "adkd-layer", replace(adkd, attr_layer="first"), None),
        ("adkd layer penultimate", "adkd-layer", replace(adkd, attr_layer="penultimate"), None),
    ]
    return [
        Experiment(task, name, group, objective, seed, sweep)
        for name, group, objective, sweep in rows
        for seed in seeds
    ]


def experiments(suite: Suite) -> list[Experiment]:
    """Main table first (every task, method and seed), then the ablations."""
    main = [
        Experiment(task, method, "main", ObjectiveConfig(preset=method), seed)
        for task, plan in suite.plans.items()
        for seed in plan.seeds
        for method in suite.methods
    ]
    extra = ablations(suite.ablation_task, suite.plans[suite.ablation_task], suite.ablation_seeds)
    if suite.ablation_groups is not None:
        extra = [e for e in extra if e.group in suite.ablation_groups]
    if suite.ablation_data is not None:
        extra = [
            Experiment(
                suite.ablation_task, method, "reference", ObjectiveConfig(preset=method), seed
            )
            for seed in suite.ablation_seeds
            for method in ABLATED_METHODS
        ] + extra
    return main + extra + list(suite.extra)


DEFAULT = Suite(
    plans={
        "tweets": TaskPlan(
            DataConfig(
                task="tweets", max_length=64, max_train_examples=1000, max_eval_examples=500
            ),
            teacher_epochs=3,
            student_epochs=2,
            seeds=(1, 2, 3),
            top_k_sweep=(96, 192),
            steps_sweep=(2, 4),
        ),
        "bbc-news": TaskPlan(
            DataConfig(
                task="bbc-news", max_length=64, max_train_examples=400, max_eval_examples=212
            ),
            teacher_epochs=3,
            student_epochs=2,
            seeds=(1,),
        ),
    },
    ablation_task="tweets",
    ablation_data=DataConfig(
        task="tweets", max_length=64, max_train_examples=300, max_eval_examples=200
    ),
    description="2-core CPU default: subsampled tweets (1,000 train / 500 test, 64 tokens) and "
    "BBC News (400 train / 212 test, first 64 tokens); 3-layer students cut from MiniLM-L6",
    cuts="a MiniLM-L6 teacher (22.7M parameters) instead of BERT-base; 3-layer students; "
    "1,000 training tweets and 400 BBC News articles cut to 64 tokens, 2 student epochs; seeds "
    "1–3 on tweets and seed 1 on BBC News (a single number in the tables); the ablations train "
    "on 300 tweets (tested on 200) with seed 1, against the full methods retrained on the same "
    "sample, K ∈ {96, 192, all 384} and m ∈ {1, 2, 4} (m = 8 left out: its student step costs "
    "several times an m = 1 step). At these sizes differences of a few points between methods "
    "or variants are within the noise between seeds: the suite shows the machinery and the "
    "trends, `--full` is for conclusions.",
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
        )
        for name in ("sst2", "mrpc", "qnli", "rte", "cola", "stsb", "qqp", "mnli")
    },
    ablation_task="mrpc",
    ablation_seeds=(1, 2, 3),
    description="papers' scale: GLUE, BERT-base teacher, 6-layer students (GPU and network)",
)


def _teacher(out: Path, task: str, plan: TaskPlan) -> Run:
    return train_teacher(
        plan.data,
        plan.teacher,
        OptimConfig(
            epochs=plan.teacher_epochs,
            batch_size=plan.batch_size,
            learning_rate=plan.teacher_learning_rate,
            seed=1,
        ),
        out / "runs" / task / "teacher",
    )


def _student(
    out: Path, teacher: Path, plan: TaskPlan, experiment: Experiment, threads: int = 0
) -> Run:
    folder = experiment.name.replace(" ", "_").replace("/", "-")
    if experiment.group != "main":
        folder = f"ablations/{folder}"
    return distill(
        plan.data,
        StudentConfig(
            teacher_run=str(teacher), num_layers=plan.student_layers, **experiment.student
        ),
        experiment.objective,
        OptimConfig(
            **{
                "epochs": plan.student_epochs,
                "batch_size": plan.batch_size,
                "learning_rate": plan.student_learning_rate,
                "seed": experiment.seed,
                "threads": threads,
                **experiment.optim,
            }
        ),
        out / "runs" / experiment.task / f"{folder}-seed{experiment.seed}",
    )


def train_and_score(
    out: Path, teacher: Path, plan: TaskPlan, experiment: Experiment, threads: int = 0
) -> tuple[str, dict, float]:
    """Train one student (or reuse its finished run): its run folder, its test results with
    saliency loyalty and attribution gap, and the seconds this took. Runs in a worker process
    under ``--jobs``."""
    started = time.time()
    run = _student(out, teacher, plan, experiment, threads)
    test = {**run.results()["test"], **AGREEMENT(Run(teacher), run)}
    return str(run.path), test, time.time() - started


def plan_summary(plan: TaskPlan) -> dict:
    """The sizes of one task's plan that the report states (what was cut from the papers)."""
    return {
        "teacher": plan.teacher.model,
        "max_train_examples": plan.data.max_train_examples,
        "max_eval_examples": plan.data.max_eval_examples,
        "max_length": plan.data.max_length,
        "teacher_epochs": plan.teacher_epochs,
        "student_layers": plan.student_layers,
        "student_epochs": plan.student_epochs,
        "seeds": list(plan.seeds),
        "batch_size": plan.batch_size,
        "student_learning_rate": plan.student_learning_rate,
    }


def exit_with_parent(parent: int, interval: float = 1.0) -> None:
    """Worker initializer: end this worker once the process that started it is gone (killed
    with SIGKILL, say) instead of training its student for nobody. The run it leaves resumes
    from its last checkpoint next time."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


@contextmanager
def _children_without_progress_bars() -> Iterator[None]:
    """Worker processes inherit ``TQDM_DISABLE``: bars of parallel runs would interleave."""
    previous = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TQDM_DISABLE"]
        else:
            os.environ["TQDM_DISABLE"] = previous


def run_suite(
    out: Path, suite: Suite, announce: Callable[[str], None] = print, jobs: int = 1
) -> dict:
    """Train every run of the suite (resuming or reusing what exists) and collect results.
    With ``jobs`` > 1 the students train in that many processes, the CPU threads split among
    them (teachers train first, in this process)."""
    started = time.time()
    todo = experiments(suite)
    teachers = {}
    for task, plan in suite.plans.items():
        announce(f"teacher on {task}")
        teachers[task] = _teacher(out, task, plan)
    calls = [(out, teachers[e.task].path, suite.plan_of(e), e) for e in todo]
    scored: dict[int, tuple[str, dict, float]] = {}

    fixed = {  # what does not change while the students train
        "suite": suite.description,
        "cuts": suite.cuts,
        "ablation_data": None
        if suite.ablation_data is None
        else (
            f"{_limit(suite.ablation_data.max_train_examples)} train / "
            f"{_limit(suite.ablation_data.max_eval_examples)} test examples, "
            f"{suite.ablation_data.max_length} tokens"
        ),
        "setup": {task: plan_summary(plan) for task, plan in suite.plans.items()},
        "teachers": {
            task: {"run": str(run.path), "test": run.results()["test"]}
            for task, run in teachers.items()
        },
        "planned_students": len(todo),
        "jobs": jobs,
    }

    def results() -> dict:
        return {
            **fixed,
            "students": [
                {
                    "task": e.task,
                    "name": e.name,
                    "group": e.group,
                    "seed": e.seed,
                    "sweep": e.sweep,
                    "run": scored[i][0],
                    "test": scored[i][1],
                    "seconds": round(scored[i][2]),
                }
                for i, e in enumerate(todo)
                if i in scored
            ],
            "seconds_this_invocation": round(time.time() - started),
        }

    def finished(index: int, result: tuple[str, dict, float]) -> None:
        scored[index] = result
        experiment, test = todo[index], result[1]
        announce(
            f"[{len(scored)}/{len(todo)}] {experiment.task}: {experiment.name}, seed "
            f"{experiment.seed}: test accuracy {test['accuracy'] * 100:.1f} "
            f"({result[2]:.0f} s)"
        )
        atomic_write_json(out / "results.json", results())  # --report-only works mid-suite

    if jobs <= 1:
        for index, call in enumerate(calls):
            finished(index, train_and_score(*call))
    else:
        threads = max(1, (os.cpu_count() or 1) // jobs)
        with (
            _children_without_progress_bars(),
            ProcessPoolExecutor(
                jobs,
                mp_context=get_context("spawn"),
                initializer=exit_with_parent,
                initargs=(os.getpid(),),
            ) as pool,
        ):
            futures = {
                pool.submit(train_and_score, *call, threads): index
                for index, call in enumerate(calls)
            }
            try:
                for future in as_completed(futures):
                    finished(futures[future], future.result())
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
    final = results()
    atomic_write_json(out / "results.json", final)
    return final


Summary = tuple[float, float, int]  # mean, sample std (0 for one value), number of seeds


def summarise(values: list[float]) -> Summary:
    return (*mean_and_std(values), len(values))


def aggregate(records: list[dict], metric: str) -> dict[tuple[str, str], Summary]:
    """Mean and std over seeds of ``metric`` per (task, name)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for record in records:
        value = record["test"].get(metric)
        if value is not None:
            groups.setdefault((record["task"], record["name"]), []).append(value)
    return {key: summarise(values) for key, values in groups.items()}


def paired_difference(
    records: list[dict], metric: str, reference: str
) -> dict[tuple[str, str], Summary]:
    """Mean and std over seeds of ``metric(method, seed) − metric(reference, seed)`` per
    (task, method), over the seeds both have."""
    by_seed = {(r["task"], r["name"], r["seed"]): r["test"][metric] for r in records}
    groups: dict[tuple[str, str], list[float]] = {}
    for (task, name, seed), value in by_seed.items():
        base = by_seed.get((task, reference, seed))
        if base is not None and name != reference:
            groups.setdefault((task, name), []).append(value - base)
    return {key: summarise(values) for key, values in groups.items()}


def full_method_records(records: list[dict]) -> list[dict]:
    """The full methods the ablations are compared with: those retrained on the ablations' own
    sample when the suite has one, else the main table's runs of the ablations' task and seeds."""
    ablation = [r for r in records if r["group"] not in ("main", "reference")]
    references = [r for r in records if r["group"] == "reference"]
    if references or not ablation:
        return references
    task, seeds = ablation[0]["task"], {r["seed"] for r in ablation}
    return [
        r
        for r in records
        if r["group"] == "main"
        and r["task"] == task
        and r["seed"] in seeds
        and r["name"] in ABLATED_METHODS
    ]


def _limit(value: int | None) -> str:
    return "all" if value is None else f"≤ {value:,}"


def setup_lines(results: dict) -> list[str]:
    """The report's account of the sizes used, against the papers' scale."""
    setup = results.get("setup", {})
    if not setup:
        return []

    lines = [
        "## Set-up and what was cut",
        "",
        "| task | teacher | train | test | tokens | teacher epochs | student | "
        "student epochs | seeds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task, plan in setup.items():
        lines.append(
            f"| {task} | {plan['teacher']} | {_limit(plan['max_train_examples'])} | "
            f"{_limit(plan['max_eval_examples'])} | {plan['max_length']} | "
            f"{plan['teacher_epochs']:g} | {plan['student_layers']} layers cut from the teacher | "
            f"{plan['student_epochs']:g} | {', '.join(map(str, plan['seeds']))} |"
        )
    lines += [
        "",
        "The papers distil BERT-base teachers into 6-layer students on the full GLUE "
        "training sets for 3–4 epochs at 128 tokens; `kdw reproduce --full` describes that "
        "scale (GPU and network needed).",
        "",
    ]
    if results.get("cuts"):
        lines += [f"What this suite cuts: {results['cuts']}", ""]
    if "seconds_this_invocation" in results:
        minutes = results["seconds_this_invocation"] / 60
        lines += [
            f"The call that wrote these results ran {minutes:.0f} minutes with `--jobs "
            f"{results.get('jobs', 1)}`, reusing any run an earlier call had finished.",
            "",
        ]
    return lines


def write_report(out: Path, results: dict, figures: dict[str, str]) -> Path:
    """``<out>/report.md``: tables of the main results, loyalty and ablations, and figures."""
    records = results["students"]
    tasks = list(results["teachers"])
    main = [r for r in records if r["group"] == "main"]

    def cell(stats: Summary | None, scale: float = 100) -> str:
        if stats is None:
            return "–"
        mean, std, seeds = stats
        return f"{mean * scale:.1f} ± {std * scale:.1f}" if seeds > 1 else f"{mean * scale:.1f}"

    accuracy, macro = aggregate(main, "accuracy"), aggregate(main, "macro_f1")
    gain = paired_difference(main, "accuracy", "kd")
    lines = [
        "# Reproduction report",
        "",
        f"Suite: {results['suite']}. Numbers are test-split percentages, mean ± std over seeds",
        "(a single number: one seed), as measured — including where a method does not beat",
        "vanilla KD. Raw values:",
        "`results.json`; every run folder is under `runs/`.",
        "",
        *setup_lines(results),
        *(
            [
                f"**Incomplete:** {len(records)} of the {results['planned_students']} planned "
                "students had finished when this report was written.",
                "",
            ]
            if len(records) < results.get("planned_students", len(records))
            else []
        ),
        "## Main table",
        "",
        "Δ kd: accuracy minus vanilla KD's with the same seed, mean ± std over seeds.",
        "",
        "| method | " + " | ".join(f"{t} acc | {t} macro-F1 | {t} Δ kd" for t in tasks) + " |",
        "|---|" + "---|---|---|" * len(tasks),
        "| teacher | "
        + " | ".join(
            f"{results['teachers'][t]['test']['accuracy'] * 100:.1f} | "
            f"{results['teachers'][t]['test']['macro_f1'] * 100:.1f} | –"
            for t in tasks
        )
        + " |",
    ]
    for method in MAIN_METHODS:
        lines.append(
            f"| {method} | "
            + " | ".join(
                f"{cell(accuracy.get((t, method)))} | {cell(macro.get((t, method)))} | "
                f"{cell(gain.get((t, method)))}"
                for t in tasks
            )
            + " |"
        )
    loyalty = {
        m: aggregate(main, m) for m in ("label_loyalty", "probability_loyalty", "saliency_loyalty")
    }
    lines += [
        "",
        "## Loyalty to the teacher (after GKD Table 3)",
        "",
        "| method | " + " | ".join(f"{t} LL | {t} PL | {t} SL" for t in tasks) + " |",
        "|---|" + "---|---|---|" * len(tasks),
    ]
    for method in MAIN_METHODS:
        lines.append(
            f"| {method} | "
            + " | ".join(
                " | ".join(cell(loyalty[m].get((t, method))) for m in loyalty) for t in tasks
            )
            + " |"
        )
    ablation = [r for r in records if r["group"] not in ("main", "reference")]
    if ablation:
        task, seeds = ablation[0]["task"], sorted({r["seed"] for r in ablation})
        rows = [("full method", r) for r in full_method_records(records)] + [
            (r["group"], r) for r in ablation
        ]
        shown = [record for _, record in rows]
        acc, macro_ablation = aggregate(shown, "accuracy"), aggregate(shown, "macro_f1")
        lines += [
            "",
            f"## Ablations ({task}, seed {', '.join(map(str, seeds))})",
            "",
            "Each variant against the full method trained on the same data with the same "
            "seeds"
            + (
                f" (the ablations' sample: {results['ablation_data']})."
                if results.get("ablation_data")
                else "."
            ),
            "",
            "| group | variant | accuracy | macro-F1 |",
            "|---|---|---|---|",
        ]
        seen = []
        for group, record in rows:
            key = (record["task"], record["name"])
            if key not in seen:
                seen.append(key)
                lines.append(
                    f"| {group} | {record['name']} | {cell(acc.get(key))} | "
                    f"{cell(macro_ablation.get(key))} |"
                )
    if figures:
        lines += ["", "## Figures", ""]
        lines += [f"![{title}]({path})" for title, path in figures.items()]
    path = out / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def make_figures(out: Path, results: dict) -> dict[str, str]:
    """Per-method bars with error bars for each task, and the K and m sweeps: PNG files under
    ``<out>/figures``; returns ``{title: relative path}``."""
    from matplotlib.figure import Figure

    folder = out / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    records = results["students"]
    figures = {}
    main = aggregate([r for r in records if r["group"] == "main"], "accuracy")
    tasks = list(results["teachers"])
    figure = Figure(figsize=(4.2 * len(tasks), 3.2), layout="constrained")
    for index, task in enumerate(tasks):
        axis = figure.add_subplot(1, len(tasks), index + 1)
        stats = [main.get((task, m), (float("nan"), 0.0, 0)) for m in MAIN_METHODS]
        axis.bar(
            range(len(MAIN_METHODS)),
            [s[0] * 100 for s in stats],
            yerr=[s[1] * 100 for s in stats],
            color="#5e3c99",
            capsize=3,
        )
        axis.axhline(
            results["teachers"][task]["test"]["accuracy"] * 100,
            color="#e66101",
            linestyle="--",
            label="teacher",
        )
        axis.set_xticks(range(len(MAIN_METHODS)), MAIN_METHODS, rotation=45, ha="right")
        axis.set_ylabel("test accuracy (%)")
        axis.set_title(task)
        low = min(s[0] for s in stats if s[0] == s[0]) * 100
        axis.set_ylim(max(0, low - 10), 100)
        axis.legend(loc="lower right")
    figure.savefig(folder / "methods.png", dpi=150)
    figures["Test accuracy per method (error bars: std over seeds)"] = "figures/methods.png"
    for group, label in (
        ("adkd-k", "top-K dimensions of the teacher map"),
        ("adkd-m", "IG steps m"),
    ):
        sweep = [r for r in records if r["group"] == group]
        if not sweep:
            continue
        seeds = {r["seed"] for r in sweep}
        default = [
            r["test"]["accuracy"]
            for r in full_method_records(records)
            if r["name"] == "adkd" and r["seed"] in seeds
        ]
        values: dict[float, list[float]] = {}
        for record in sweep:
            values.setdefault(record["sweep"], []).append(record["test"]["accuracy"])
        if group == "adkd-m" and default:  # the main table's AD-KD is m = 1
            values[1.0] = default
        points = sorted((x, *mean_and_std(ys)) for x, ys in values.items())
        figure = Figure(figsize=(4, 3), layout="constrained")
        axis = figure.add_subplot()
        axis.errorbar(
            [p[0] for p in points],
            [p[1] * 100 for p in points],
            yerr=[p[2] * 100 for p in points],
            marker="o",
            capsize=3,
            color="#5e3c99",
        )
        if group == "adkd-k" and default:
            axis.axhline(
                mean_and_std(default)[0] * 100,
                color="#5e3c99",
                linestyle=":",
                label="all dimensions (main table)",
            )
            axis.legend(loc="lower right")
        axis.set_xlabel(label)
        axis.set_ylabel("test accuracy (%)")
        axis.set_title(f"AD-KD: {label}")
        figure.savefig(folder / f"{group}.png", dpi=150)
        figures[f"AD-KD sweep: {label}"] = f"figures/{group}.png"
    return figures


class ExplanationAgreement:
    """Saliency loyalty (Pearson of Grad saliency, METHODS.md §6) and attribution gap (AD-KD
    Eq. 11) of students on the test split, the teacher's outputs computed once per teacher and
    test split. A student's scores are kept in its run folder (``agreement.json``), so a resumed
    suite does not recompute them."""

    STORED = "agreement.json"

    def __init__(self) -> None:
        self._teachers: dict[tuple[Path, str], tuple[object, object]] = {}

    def __call__(self, teacher: Run, student: Run) -> dict[str, float]:
        stored = student.path / self.STORED
        if stored.exists():
            scores = json.loads(stored.read_text())
            if scores.pop("teacher") == str(teacher.path):
                return scores
        scores = self._compute(teacher, student)
        atomic_write_json(stored, {"teacher": str(teacher.path), **scores})
        return scores

    def _compute(self, teacher: Run, student: Run) -> dict[str, float]:
        from workbench.analysis import explanation_agreement, split_outputs
        from workbench.data import load_task
        from workbench.models import load_run

        loaded = load_run(student.path)
        key = (teacher.path, config_key(loaded.data))
        if key not in self._teachers:  # the ablations may test on a smaller sample
            split = load_task(loaded.data).splits["test"]
            self._teachers[key] = split, split_outputs(load_run(teacher.path), split, maps=True)
        split, reference = self._teachers[key]  # the split is loaded once per data config too
        return explanation_agreement(reference, split_outputs(loaded, split, maps=True))


AGREEMENT = ExplanationAgreement()  # one per process: each keeps its teachers' outputs


def gallery_indices(labels: Sequence[int]) -> str:
    """The first test example of each class, as ``kdw export --indices`` reads them."""
    first: dict[int, int] = {}
    for index, label in enumerate(labels):
        first.setdefault(int(label), index)
    return ",".join(str(first[label]) for label in sorted(first))


def heatmap_gallery(out: Path, results: dict) -> dict[str, str]:
    """One test example of each class across each task's teacher and its seed-1 students: PNG
    heatmaps (and PDF for papers) under ``<out>/figures/gallery``."""
    from workbench.config import DataConfig, from_dict
    from workbench.data import load_task
    from workbench.heatmaps import ExportSettings, HeatmapSettings, export_runs

    figures = {}
    for task, teacher in results["teachers"].items():
        students = [
            r["run"]
            for r in results["students"]
            if r["task"] == task
            and r["group"] == "main"
            and r["seed"] == 1
            and r["name"] in ("kd", "adkd", "gkd")
        ]
        data = from_dict(DataConfig, Run.open(teacher["run"]).info()["configs"]["data"])
        folder = out / "figures" / "gallery" / task
        paths = export_runs(
            [teacher["run"], *students],
            folder,
            HeatmapSettings(),
            ExportSettings(formats="png,pdf", dpi=150),
            split="test",
            indices=gallery_indices(load_task(data).splits["test"].labels),
        )
        for path in sorted(p for p in paths if p.suffix == ".png"):
            figures[f"{task}: {path.stem}"] = str(path.relative_to(out))
    return figures


def reproduce(
    out: Path,
    suite: Suite = DEFAULT,
    announce: Callable[[str], None] = print,
    jobs: int = 1,
    report_only: bool = False,
) -> Path:
    """Run the suite (resuming), then write ``results.json``, the figures and ``report.md``;
    ``report_only``: only the figures and the report, from the runs ``results.json`` lists."""
    if report_only:
        if not (out / "results.json").exists():
            raise WorkbenchError(f"{out / 'results.json'} does not exist: run the suite first")
        results = json.loads((out / "results.json").read_text())
    else:
        results = run_suite(out, suite, announce, jobs)
    figures = make_figures(out, results) | heatmap_gallery(out, results)
    return write_report(out, results, figures)
