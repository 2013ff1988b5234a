"""The report: ``report.md`` and its figures, from ``results.json`` alone (run folders are used only
for the heatmap gallery, where present), rendered from the packaged template
``templates/report.md.j2`` fed by :func:`report_data`.

Every Δ against vanilla KD comes with a 95 % two-level bootstrap interval over the seeds both
methods have and their test examples (:mod:`workbench.analysis.stats`), significant only when it
excludes 0. The verdicts on the claims each method registers (:class:`kd.methods.objective.Claim`)
follow from those intervals. A method trained beside its control has each difference from vanilla KD
split into its own term (method − control) and its regime (control − vanilla KD).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined

from kd.experiments.reproduce.record import StudentRow, SuiteRecord, Trial
from kd.experiments.reproduce.runner import expand
from kd.experiments.reproduce.suite import CONTROL, ablated_methods, limit
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import PRESETS, Claim, Sweep, display_name
from workbench.analysis.metrics import mean_and_std
from workbench.analysis.stats import (
    Interval,
    pair_predictions,
    pair_scores,
    seeds_needed,
    two_level_bootstrap,
)
from workbench.core.config import to_dict
from workbench.core.errors import WorkbenchError
from workbench.core.files import (
    RECORD_LIMIT,
    atomic_write_json,
    atomic_write_text,
    json_text,
    read_json_file,
)
from workbench.core.records import checked
from workbench.core.runs import Run

Summary = tuple[float, float, int]  # mean, sample std (0 for one value), number of seeds
REFERENCE = "kd"  # vanilla KD: the method every Δ, verdict and control is measured against


@dataclass(frozen=True)
class Measure:
    """How the report names a metric: its label, a short one, what it is, the unit of its
    differences (×100), and which way is closer to the teacher or better."""

    label: str
    short: str
    meaning: str
    unit: str
    better: str = "higher"


METRICS = {
    "accuracy": Measure("accuracy", "accuracy", "", " points"),
    "label_loyalty": Measure(
        "label loyalty", "LL", "share of test examples given the teacher's class, ×100", " points"
    ),
    "probability_loyalty": Measure(
        "probability loyalty", "PL", "1 − √JSD to the teacher's class probabilities, ×100", ""
    ),
    "saliency_loyalty": Measure(
        "saliency loyalty", "loyalty", "Pearson of Grad saliency with the teacher's, ×100", ""
    ),
    "attribution_gap": Measure("attribution gap", "gap", "", " (×100)", "lower"),
    "aopc_comprehensiveness": Measure("AOPC comprehensiveness", "comprehensiveness", "×100", ""),
    "aopc_sufficiency": Measure("AOPC sufficiency", "sufficiency", "×100", "", "lower"),
}
LOYALTY_COLUMNS = {  # the loyalty table's column label → metric
    "LL": "label_loyalty",
    "PL": "probability_loyalty",
    "SL": "saliency_loyalty",
    "gap": "attribution_gap",
    "AOPC comp": "aopc_comprehensiveness",
    "AOPC suff": "aopc_sufficiency",
}
TEMPLATE = "report.md.j2"  # in kd/experiments/reproduce/templates (package data)


def cell(stats: Summary | None, scale: float = 100, digits: int = 1) -> str:
    """``"mean ± std"`` over seeds (one seed: the value alone), scaled; ``"–"`` when absent."""
    if stats is None:
        return "–"
    mean, std, seeds = stats
    if seeds > 1:
        return f"{mean * scale:.{digits}f} ± {std * scale:.{digits}f}"
    return f"{mean * scale:.{digits}f}"


def _summaries(pairs) -> dict[tuple[str, str], Summary]:
    """A :data:`Summary` of the values of each key of ``(key, value)`` pairs."""
    groups: dict[tuple[str, str], list[float]] = {}
    for key, value in pairs:
        groups.setdefault(key, []).append(value)
    return {key: (*mean_and_std(values), len(values)) for key, values in groups.items()}


def aggregate(records: list[StudentRow], metric: str) -> dict[tuple[str, str], Summary]:
    """Mean and std over seeds of ``metric`` per (task, name)."""
    return _summaries(
        ((r.task, r.name), r.test[metric]) for r in records if r.test.get(metric) is not None
    )


def paired_difference(
    records: list[StudentRow], metric: str, reference: str
) -> dict[tuple[str, str], Summary]:
    """Mean and std over seeds of ``metric(method, seed) − metric(reference, seed)`` per
    (task, method), over the seeds both have (results without per-example values)."""
    by_seed = {(r.task, r.name, r.seed): r.test[metric] for r in records}
    return _summaries(
        ((task, name), value - by_seed[task, reference, seed])
        for (task, name, seed), value in by_seed.items()
        if by_seed.get((task, reference, seed)) is not None and name != reference
    )


class Intervals:
    """Two-level bootstrap intervals of ``a − b`` between two main-table methods of a task, from the
    per-example values in ``results.json`` (each computed once), and :meth:`seeds_needed`."""

    def __init__(self, results: SuiteRecord) -> None:
        self.test_sets = results.test_sets
        self.rows = {
            (r.task, r.name, r.seed): r
            for r in results.students
            if r.group == "main" and r.examples is not None
        }
        self._done: dict[tuple, tuple[Interval | None, int | None]] = {}  # and the seeds needed

    def _units(self, row: StudentRow, metric: str) -> dict:
        examples = row.examples
        test_set = self.test_sets[examples.test_set]
        if metric == "accuracy":
            labels, predictions = expand(test_set.labels), expand(examples.predictions)
            return {"uids": test_set.uids, "labels": labels, "predictions": predictions}
        scores = expand(examples.model_extra[metric])  # the first examples of the split, or all
        return {"uids": test_set.uids[: len(scores)], "scores": scores}

    def __call__(self, task: str, a: str, b: str, metric: str = "accuracy") -> Interval | None:
        key = (task, a, b, metric)
        if key not in self._done:
            pairs = [
                (row, other)
                for (t, name, seed), row in sorted(self.rows.items())
                if (t, name) == (task, a) and (other := self.rows.get((task, b, seed)))
                if metric == "accuracy"
                or all(metric in r.examples.model_extra for r in (row, other))
            ]
            interval = needed = None
            if pairs:
                left = [self._units(x, metric) for x, _ in pairs]
                right = [self._units(y, metric) for _, y in pairs]
                pair = pair_predictions if metric == "accuracy" else pair_scores
                groups = [g for g in pair(left, right, by_seed=True) if len(g[0])]
                if sum(len(examples) for examples, _ in groups) >= 2:
                    interval = two_level_bootstrap(groups)
                    needed = seeds_needed(groups, interval.difference)
            self._done[key] = interval, needed
        return self._done[key][0]

    def seeds_needed(self, task: str, a: str, b: str, metric: str = "accuracy") -> int | None:
        """About how many seeds the interval of ``a − b`` would need to exclude 0
        (:func:`workbench.analysis.stats.seeds_needed`)."""
        self(task, a, b, metric)
        return self._done[task, a, b, metric][1]


def interval_cell(interval: Interval, scale: float = 100) -> str:
    """``+1.2 [+0.4, +2.0] *``: a difference with its interval, ``*`` when it excludes 0."""
    mark = " *" if interval.significant else ""
    return (
        f"{interval.difference * scale:+.1f} [{interval.low * scale:+.1f}, "
        f"{interval.high * scale:+.1f}]{mark}"
    )


def direction(interval: Interval) -> str | None:
    """``"higher"`` or ``"lower"`` where the interval excludes 0 (a real difference), else
    None."""
    return "higher" if interval.low > 0 else "lower" if interval.high < 0 else None


def control_rows(results: SuiteRecord, tasks: Sequence[str], intervals: Intervals) -> list[dict]:
    """Per task, method with a control and measure with per-example values: ``total`` (method − KD),
    ``regime`` (control − KD) and ``term`` (method − control), and (``credit``) the direction of
    each where its interval excludes 0."""
    names = {r.name for r in results.students if r.group == "main"}
    methods = [m for m in PRESETS if m + CONTROL in names]
    rows = []
    for task in tasks:
        for method in methods:
            for metric, measure in METRICS.items():
                parts = {
                    "total": intervals(task, method, REFERENCE, metric),
                    "regime": intervals(task, method + CONTROL, REFERENCE, metric),
                    "term": intervals(task, method, method + CONTROL, metric),
                }
                if None not in parts.values():
                    credit = {part: direction(i) for part, i in parts.items()}
                    row = {"task": task, "method": method, "measure": measure, **parts}
                    rows.append({**row, "credit": credit})
    return rows


def outcome(interval: Interval, relation: str) -> str:
    """Whether the interval supports a claim of ``relation`` (``>``, ``≥`` or ``<``): ``yes``,
    ``no``, ``not worse`` (``≥`` within the interval) or ``not shown``."""
    found = direction(interval)
    if found is None:
        return "not worse" if relation == "≥" else "not shown"
    return "yes" if (found == "lower") == (relation == "<") else "no"


def claim_record(
    method: str, entry: Claim, names: set[str], tasks: Sequence[str], intervals: Intervals
) -> dict | None:
    """One registered claim's verdict: per task the interval of the method against the preset the
    claim names (``lowest``: against every other student) and its outcome; None where a method it
    needs was not trained."""
    record = {
        "method": display_name(method),
        "measure": METRICS[entry.metric],
        "metric": entry.metric,
        "relation": entry.relation,
        "tasks": [],
    }
    if entry.relation == "lowest":
        if method not in names:
            return None
        for task in tasks:
            others = [
                (other, interval)
                for other in PRESETS
                if other in names and other != method
                if (interval := intervals(task, method, other, entry.metric)) is not None
            ]
            if others:
                closest, interval = max(others, key=lambda item: item[1].difference)
                below = sum(i.high < 0 for _, i in others)
                record["tasks"].append(
                    {
                        "task": task,
                        "smallest": below == len(others),
                        "below": below,
                        "others": len(others),
                        "closest": display_name(closest),
                        "interval": interval,
                    }
                )
        return {**record, "kind": "lowest"}
    if not {method, entry.than} <= names:
        return None
    checked = ">" if entry.relation == "≫" else entry.relation
    for task in tasks:
        interval = intervals(task, method, entry.than, entry.metric)
        if interval is not None:
            needed = intervals.seeds_needed(task, method, entry.than, entry.metric)
            record["tasks"].append(
                {
                    "task": task,
                    "interval": interval,
                    "outcome": outcome(interval, checked),
                    "direction": direction(interval),
                    "seeds_needed": None if interval.significant else needed,
                }
            )
    return {**record, "kind": "against", "than": display_name(entry.than)}


def verdicts(results: SuiteRecord, tasks: Sequence[str], intervals: Intervals) -> list[dict]:
    """A record per registered claim (:attr:`kd.methods.objective.Preset.claims`) whose methods were
    trained: the claims against one method first, then those against every other student."""
    names = {r.name for r in results.students if r.group == "main"}
    claims = [(m, c) for m, preset in PRESETS.items() for c in preset.claims]
    ordered = sorted(claims, key=lambda item: item[1].relation == "lowest")
    records = [claim_record(m, c, names, tasks, intervals) for m, c in ordered]
    return [record for record in records if record is not None]


def setup_data(results: SuiteRecord) -> dict | None:
    """The sizes used per task, the truncation of each test split, and the suite's cuts."""
    if not results.setup:
        return None
    return {
        "rows": [
            plan.model_dump()
            | {
                "task": task,
                "teacher_train": limit(plan.max_train_examples),
                "student_train": limit(plan.student_train_examples or plan.max_train_examples),
                "test": limit(plan.max_eval_examples),
                "tokens": plan.max_length,
            }
            for task, plan in results.setup.items()
        ],
        "truncation": [
            {"task": task, **cut.model_dump()} for task, cut in results.truncation.items() if cut
        ],
        "cuts": results.cuts,
    }


def calls_data(results: SuiteRecord) -> dict | None:
    """Every call's wall clock, their sum, and how many of the students they trained are no
    longer in the record."""
    calls = results.calls
    if not calls:
        return None
    return {
        "rows": calls,
        "seconds": sum(c.seconds for c in calls),
        "dropped": max(0, sum(c.students for c in calls) - len(results.students)),
    }


def duration(seconds: float) -> str:
    """``1 h 07 min`` or ``12 min``."""
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def tuning_data(results: SuiteRecord) -> dict | None:
    """The weights chosen on dev before the main table, with each search's trials (``fixed``:
    the presets' defaults were run)."""
    given, tuning = results.model_fields_set, results.tuning
    if "tuning" not in given:
        return None
    if not (results.tuned if "tuned" in given else tuning):
        return {"fixed": True, "rows": []}
    return {
        "fixed": False,
        "rows": [
            {
                "method": method,
                "searched": record.searched,
                "space": {name: record.space[name] for name in record.searched},
                "chosen": {name: record.chosen[name] for name in record.searched},
                "metric": record.metric,
                "dev": record.dev,
                "trials": searched_points(record.searched, record.trials),
            }
            for method, record in tuning.items()
        ],
    }


def searched_points(searched: list[str], trials: list[Trial]) -> list[dict]:
    """Each distinct setting of ``searched`` a search tried, once, in the order first tried: ``dev``
    (None: pruned before a score) and ``failed`` (unless the setting was tried again)."""
    points: dict[tuple, dict] = {}
    for trial in trials:
        columns = trial.model_extra  # the trial's state and settings, by name
        settings = {name: columns[name] for name in searched if name in columns}
        key = tuple(sorted(settings.items()))
        if key not in points or points[key]["failed"]:
            failed = columns.get("state") == "fail"
            points[key] = {"settings": settings, "dev": trial.dev, "failed": failed}
    return list(points.values())


def main_data(results: SuiteRecord, tasks: Sequence[str], intervals: Intervals) -> dict:
    """The main table: the teacher's and each method's accuracy and macro-F1 per task, and each
    method's Δ against vanilla KD (an :class:`Interval`, or without per-example values the mean ±
    std of the per-seed Δ; None for vanilla KD itself)."""
    main = [r for r in results.students if r.group == "main"]
    accuracy, macro = aggregate(main, "accuracy"), aggregate(main, "macro_f1")
    fallback = paired_difference(main, "accuracy", REFERENCE)

    def delta(task: str, method: str) -> Interval | Summary | None:
        if method == REFERENCE:
            return None
        return intervals(task, method, REFERENCE) or fallback.get((task, method))

    return {
        "teacher": [results.teachers[t].test for t in tasks],
        "rows": [
            {
                "method": method,
                "cells": [
                    {
                        "accuracy": accuracy.get((t, method)),
                        "macro_f1": macro.get((t, method)),
                        "delta": delta(t, method),
                    }
                    for t in tasks
                ],
            }
            for method in PRESETS
            if any(r.name == method for r in main)
        ],
    }


def loyalty_data(results: SuiteRecord, tasks: Sequence[str]) -> dict | None:
    """The loyalty and faithfulness table: a column per task and measure recorded, a row per
    method (mean ± std over seeds), and how many test examples the explanations cover."""
    main = [r for r in results.students if r.group == "main"]
    shown = {
        k: metric for k, metric in LOYALTY_COLUMNS.items() if any(metric in r.test for r in main)
    }
    if not shown:
        return None
    means = {metric: aggregate(main, metric) for metric in shown.values()}
    columns = [
        {"task": t, "label": label, "metric": metric, "gap": metric == "attribution_gap"}
        for t in tasks
        for label, metric in shown.items()
    ]
    explained = None
    if "aopc_comprehensiveness" in shown.values():
        sizes = sorted({p.explained_examples or 0 for p in results.setup.values()})
        explained = " / ".join(f"{s:,}" if s else "all" for s in sizes)
    return {
        "columns": columns,
        "rows": [
            {
                "method": method,
                "cells": [means[c["metric"]].get((c["task"], method)) for c in columns],
            }
            for method in PRESETS
            if any((t, method) in means[m] for t in tasks for m in shown.values())
        ],
        "explained": explained,
    }


def full_method_records(records: list[StudentRow]) -> list[StudentRow]:
    """The full methods the ablations are compared with: those retrained on the ablations' own
    sample when the suite has one, else the main table's runs of the ablations' task and seeds."""
    ablation = [r for r in records if r.group not in ("main", "reference")]
    references = [r for r in records if r.group == "reference"]
    if references or not ablation:
        return references
    task, seeds = ablation[0].task, {r.seed for r in ablation}
    return [
        r
        for r in records
        if r.group == "main" and r.task == task and r.seed in seeds and r.name in ablated_methods()
    ]


def speed_data(results: SuiteRecord) -> list[dict]:
    """Per task timed, the size and speed of its models, each with its test accuracy
    (:func:`kd.experiments.reproduce.runner.measure_speed`)."""
    main = [r for r in results.students if r.group == "main"]
    accuracy = {(r.task, r.name, r.seed): r.test.get("accuracy") for r in main}
    return [
        {
            **measured.model_dump(),
            "task": task,
            "rows": [
                {
                    **row.model_dump(),
                    "accuracy": results.teachers[task].test.get("accuracy")
                    if index == 0
                    else accuracy.get((task, row.name, measured.seed)),
                }
                for index, row in enumerate(measured.rows)
            ],
        }
        for task, measured in results.speed.items()
        if task in results.teachers
    ]


def ablation_data(results: SuiteRecord) -> dict | None:
    """The ablations' table: each variant against its full method on the same data."""
    records = results.students
    ablation = [r for r in records if r.group not in ("main", "reference")]
    if not ablation:
        return None
    full = full_method_records(records)
    rows = [("full method", r) for r in full] + [(r.group, r) for r in ablation]
    shown = [record for _, record in rows]
    acc, macro = aggregate(shown, "accuracy"), aggregate(shown, "macro_f1")
    seen: dict[tuple[str, str], str] = {}  # (task, variant) → its group, in order
    for group, record in rows:
        seen.setdefault((record.task, record.name), group)
    return {
        "task": ablation[0].task,
        "seeds": sorted({r.seed for r in ablation}),
        "data": results.ablation_data,
        "rows": [
            {
                "group": group,
                "variant": key[1],
                "accuracy": acc.get(key),
                "macro_f1": macro.get(key),
            }
            for key, group in seen.items()
        ],
    }


def delta_figure(folder: Path, results: SuiteRecord, intervals: Intervals) -> dict[str, str]:
    """Each method's Δ accuracy against vanilla KD with its 95 % interval, a panel per task:
    ``<folder>/deltas.svg`` as ``{title: path}``; none without an interval."""
    from matplotlib.figure import Figure

    panels = {}
    for task in results.teachers:
        rows = [(m, i) for m in PRESETS if m != REFERENCE if (i := intervals(task, m, REFERENCE))]
        if rows:
            panels[task] = rows
    if not panels:
        return {}
    figure = Figure(figsize=(4.2 * len(panels), 3.4), layout="constrained")
    for index, (task, rows) in enumerate(panels.items()):
        axis = figure.add_subplot(1, len(panels), index + 1)
        for y, (_, interval) in enumerate(rows):
            colour = "#5e3c99" if interval.significant else "#999999"
            middle = interval.difference
            xerr = [[(middle - interval.low) * 100], [(interval.high - middle) * 100]]
            axis.errorbar(middle * 100, y, xerr=xerr, fmt="o", color=colour, capsize=3)
        axis.axvline(0, color="#e66101", linestyle="--", linewidth=1)
        axis.set_yticks(range(len(rows)), [m for m, _ in rows])
        axis.invert_yaxis()
        axis.set_xlabel("Δ accuracy vs vanilla KD (points)")
        axis.set_title(task)
    figure.savefig(folder / "deltas.svg")
    title = (
        "Δ test accuracy against vanilla KD, 95 % two-level bootstrap intervals over seeds "
        "and test examples (purple: excludes 0)"
    )
    return {title: "figures/deltas.svg"}


def make_figures(out: Path, results: SuiteRecord, intervals: Intervals) -> dict[str, str]:
    """The Δs against vanilla KD (SVG), per-method accuracy bars per task and the presets' sweeps
    (PNG) under ``<out>/figures``: ``{title: path relative to out}``."""
    from matplotlib.figure import Figure

    folder = out / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    records = results.students
    figures = delta_figure(folder, results, intervals)
    main = aggregate([r for r in records if r.group == "main"], "accuracy")
    tasks = list(results.teachers)
    methods = [m for m in PRESETS if any((t, m) in main for t in tasks)]
    figure = Figure(figsize=(4.2 * len(tasks), 3.2), layout="constrained")
    for index, task in enumerate(tasks):
        axis = figure.add_subplot(1, len(tasks), index + 1)
        stats = [main.get((task, m), (float("nan"), 0.0, 0)) for m in methods]
        means, stds = [s[0] * 100 for s in stats], [s[1] * 100 for s in stats]
        axis.bar(range(len(methods)), means, yerr=stds, color="#5e3c99", capsize=3)
        teacher = results.teachers[task].test["accuracy"] * 100
        axis.axhline(teacher, color="#e66101", linestyle="--", label="teacher")
        axis.set_xticks(range(len(methods)), methods, rotation=45, ha="right")
        axis.set_ylabel("test accuracy (%)")
        axis.set_title(task)
        measured = [s[0] for s in stats if s[0] == s[0]]
        axis.set_ylim(max(0, min(measured, default=0) * 100 - 10), 100)
        axis.legend(loc="lower right")
    figure.savefig(folder / "methods.png", dpi=150)
    figures["Test accuracy per method (error bars: std over seeds)"] = "figures/methods.png"
    for method, preset in PRESETS.items():
        for sweep in (a for a in preset.ablations if isinstance(a, Sweep)):
            figures.update(sweep_figure(folder, records, method, sweep))
    return figures


def sweep_figure(
    folder: Path, records: list[StudentRow], method: str, sweep: Sweep
) -> dict[str, str]:
    """The figure of ``sweep`` of the preset ``method``: test accuracy (mean ± std over seeds)
    against the swept values, the full method at the preset's own value (a line where the preset
    leaves it unset); none (an earlier record's removed) without its students."""
    from matplotlib.figure import Figure

    rows = [r for r in records if r.group == sweep.group]
    path = folder / f"{sweep.group}.png"
    if not rows:
        path.unlink(missing_ok=True)  # an earlier record's
        return {}
    seeds = {r.seed for r in rows}
    full = [r for r in full_method_records(records) if r.name == method and r.seed in seeds]
    default = [r.test["accuracy"] for r in full]
    values: dict[float, list[float]] = {}
    for record in rows:
        values.setdefault(record.sweep, []).append(record.test["accuracy"])
    own = to_dict(ObjectiveConfig(preset=method))[sweep.setting]
    if own is not None and default:
        values[float(own)] = default
    points = sorted((x, *mean_and_std(ys)) for x, ys in values.items())
    figure = Figure(figsize=(4, 3), layout="constrained")
    axis = figure.add_subplot()
    means, stds = [p[1] * 100 for p in points], [p[2] * 100 for p in points]
    axis.errorbar([p[0] for p in points], means, yerr=stds, marker="o", capsize=3, color="#5e3c99")
    if own is None and default:
        label = f"{sweep.unset} (full method)"
        axis.axhline(mean_and_std(default)[0] * 100, color="#5e3c99", linestyle=":", label=label)
        axis.legend(loc="lower right")
    axis.set_xlabel(sweep.axis)
    axis.set_ylabel("test accuracy (%)")
    name = display_name(method)
    axis.set_title(f"{name}: {sweep.axis}")
    figure.savefig(path, dpi=150)
    return {f"{name} sweep: {sweep.axis}": f"figures/{sweep.group}.png"}


def gallery_indices(labels: Sequence[int]) -> str:
    """The first test example of each class, as ``kdw export --indices`` reads them."""
    first = {int(label): index for index, label in reversed(list(enumerate(labels)))}
    return ",".join(str(first[label]) for label in sorted(first))


GALLERY_DRAWN = ".drawn.json"  # a gallery folder's record: the models it was drawn from


def heatmap_gallery(out: Path, results: SuiteRecord) -> dict[str, str]:
    """One test example of each class across each task's teacher and its seed-1 students: PNG and
    PDF heatmaps under ``<out>/figures/gallery``, drawn where the run folders are all present and
    their models or the examples are not those the gallery was last drawn from
    (:data:`GALLERY_DRAWN`: the models' digests, :func:`~workbench.core.verify.model_digest`);
    else the files already there are listed."""
    from workbench.analysis.explanations import HeatmapSettings
    from workbench.analysis.heatmap_export import ExportSettings, export_runs
    from workbench.core.config import DataConfig, from_dict
    from workbench.core.data import load_task
    from workbench.core.verify import model_digest

    gallery = {name for name, preset in PRESETS.items() if preset.gallery}
    figures = {}
    for task, teacher in results.teachers.items():
        seed_1 = [r for r in results.students if (r.task, r.group, r.seed) == (task, "main", 1)]
        runs = [teacher.run, *(r.run for r in seed_1 if r.name in gallery)]
        folder = out / "figures" / "gallery" / task
        paths = [out / run for run in runs]
        drawn = _drawn(folder)
        if not all((path / "run.json").exists() for path in paths):
            written = list(folder.glob("*.png"))
        else:
            data = from_dict(DataConfig, Run.open(paths[0]).info().configs["data"])
            indices = gallery_indices(load_task(data).splits["test"].labels)
            models = {
                run: model_digest(Run.open(path).model_dir)
                for run, path in zip(runs, paths, strict=True)
            }
            source = {"indices": indices, "models": models}
            if all(drawn.get(key) == value for key, value in source.items()) and all(
                (folder / name).is_file() for name in drawn["files"]
            ):
                written = [folder / name for name in drawn["files"]]
            else:
                written = export_runs(
                    [str(p) for p in paths],
                    folder,
                    HeatmapSettings(),
                    ExportSettings(formats="png,pdf", dpi=150),
                    split="test",
                    indices=indices,
                )
                files = sorted(path.name for path in written)
                atomic_write_json(folder / GALLERY_DRAWN, source | {"files": files})
        for path in sorted(p for p in written if p.suffix == ".png"):
            figures[f"{task}: {path.stem}"] = str(path.relative_to(out))
    return figures


def _drawn(folder: Path) -> dict:
    """What ``folder``'s :data:`GALLERY_DRAWN` says it was drawn from; empty where it has none or
    one that is not a JSON object (the gallery is drawn again)."""
    try:
        drawn = read_json_file(folder / GALLERY_DRAWN, RECORD_LIMIT, "the gallery's record")
    except WorkbenchError:
        return {}
    files = drawn.get("files") if isinstance(drawn, dict) else None
    return drawn if isinstance(files, list) and all(isinstance(f, str) for f in files) else {}


def report_data(results: SuiteRecord, figures: dict[str, str], intervals: Intervals) -> dict:
    """What ``report.md`` shows, as plain data for its template: the record's tables as rows
    of values (summaries over seeds, :class:`Interval` s), the verdicts as records."""
    students = results.students
    tasks = list(results.teachers)
    planned = results.planned_students or len(students)
    incomplete = {"done": len(students), "planned": planned} if len(students) < planned else None
    return {
        "suite": results.suite,
        "tasks": tasks,
        "setup": setup_data(results),
        "calls": calls_data(results),
        "tuning": tuning_data(results),
        "incomplete": incomplete,
        "verdicts": verdicts(results, tasks, intervals),
        "controls": control_rows(results, tasks, intervals),
        "main": main_data(results, tasks, intervals),
        "loyalty": loyalty_data(results, tasks),
        "speed": speed_data(results),
        "ablations": ablation_data(results),
        "figures": [{"title": title, "path": path} for title, path in figures.items()],
    }


def environment() -> Environment:
    """The Jinja environment of the report's template, with its formatting filters."""
    env = Environment(
        loader=PackageLoader("kd.experiments.reproduce"),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # Markdown, not HTML
    )
    env.filters |= {
        "cell": cell,
        "ci": interval_cell,
        "describe": Interval.describe,
        "duration": duration,
        "fmt": lambda value, spec: spec.format(value),
    }
    env.tests["interval"] = lambda value: isinstance(value, Interval)
    return env


def write_report(
    out: Path, results: SuiteRecord, figures: dict[str, str], intervals: Intervals | None = None
) -> Path:
    """``<out>/report.md``: verdicts, controls, tables of the main results, loyalty and
    ablations, and figures."""
    data = report_data(results, figures, intervals or Intervals(results))
    atomic_write_text(out / "report.md", environment().get_template(TEMPLATE).render(data))
    return out / "report.md"


def report(out: Path, results: SuiteRecord) -> Path:
    """The figures and ``report.md`` of ``results`` as it is stored (keys sorted), so that a call
    and ``--report-only`` draw the same report."""
    results = checked(json.loads(json_text(results.plain())), SuiteRecord)
    intervals = Intervals(results)
    figures = make_figures(out, results, intervals) | heatmap_gallery(out, results)
    return write_report(out, results, figures, intervals)
