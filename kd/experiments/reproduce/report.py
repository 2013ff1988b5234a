"""The report: ``report.md`` and its figures, from ``results.json`` alone (run folders are
used only for the heatmap gallery, where present).

Every Δ against vanilla KD comes with a 95 % two-level bootstrap interval that resamples the
seeds both methods have, then the test examples within each (:mod:`workbench.analysis.stats`), and
is called significant only when the interval excludes 0. The verdicts on the papers' claims are
generated from those intervals, whatever they say, for the claims each method registers
(:class:`kd.methods.objective.Claim`); the methods' names and order are the registry's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kd.experiments.reproduce.runner import expand
from kd.experiments.reproduce.suite import CONTROL, ablated_methods, limit
from kd.methods.objective import PRESETS, Claim, display_name
from workbench.analysis.metrics import mean_and_std
from workbench.analysis.stats import (
    Interval,
    pair_predictions,
    pair_scores,
    seeds_needed,
    two_level_bootstrap,
)
from workbench.core.errors import WorkbenchError
from workbench.core.files import atomic_write_text
from workbench.core.runs import Run

Summary = tuple[float, float, int]  # mean, sample std (0 for one value), number of seeds
PER_EXAMPLE = ("saliency_loyalty", "attribution_gap", "aopc_comprehensiveness", "aopc_sufficiency")
# how the verdicts name a metric: its label, a short one, what it is (said where a claim about
# it is not about accuracy), and the unit of its differences (×100)
METRICS = {
    "accuracy": ("accuracy", "accuracy", "", " points"),
    "saliency_loyalty": (
        "saliency loyalty",
        "loyalty",
        "Pearson of Grad saliency with the teacher's, ×100",
        "",
    ),
    "attribution_gap": ("attribution gap", "gap", "", " (×100)"),
    "aopc_comprehensiveness": ("AOPC comprehensiveness", "comprehensiveness", "×100", ""),
    "aopc_sufficiency": ("AOPC sufficiency", "sufficiency", "×100", ""),
}
AOPC_NOTE = (
    "SL, gap and AOPC are measured on the first {n} test examples of each task (accuracy, "
    "LL and PL on the whole test split). AOPC (ERASER) of each student's own Grad saliency: "
    "comprehensiveness (higher: its top tokens matter) and sufficiency (lower: they suffice), "
    "tokens deleted, k = ⌈q·n⌉ of the n tokens ranked by signed score for q = 10 %–50 %. "
    "ferret-xai differs: k = ⌊q·n⌋, q = 10 %–100 %, positive scores only, and a fraction whose "
    "rationale repeats the previous one skipped; the values are not interchangeable with its."
)


def cell(stats: Summary | None, scale: float = 100, digits: int = 1) -> str:
    """``"mean ± std"`` over seeds (one seed: the value alone), scaled; ``"–"`` when absent."""
    if stats is None:
        return "–"
    mean, std, seeds = stats
    if seeds > 1:
        return f"{mean * scale:.{digits}f} ± {std * scale:.{digits}f}"
    return f"{mean * scale:.{digits}f}"


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
    (task, method), over the seeds both have (results without per-example values)."""
    by_seed = {(r["task"], r["name"], r["seed"]): r["test"][metric] for r in records}
    groups: dict[tuple[str, str], list[float]] = {}
    for (task, name, seed), value in by_seed.items():
        base = by_seed.get((task, reference, seed))
        if base is not None and name != reference:
            groups.setdefault((task, name), []).append(value - base)
    return {key: summarise(values) for key, values in groups.items()}


class Intervals:
    """Two-level bootstrap intervals of ``a − b`` between two main-table methods of a task, over
    the seeds both have and their test examples, from the per-example values in
    ``results.json`` (computed once each); :meth:`seeds_needed` for each."""

    def __init__(self, results: dict) -> None:
        self.test_sets = results.get("test_sets", {})
        self.rows = {
            (r["task"], r["name"], r["seed"]): r
            for r in results["students"]
            if r["group"] == "main" and "examples" in r
        }
        self._done: dict[tuple, Interval | None] = {}
        self._needed: dict[tuple, int | None] = {}

    def _units(self, row: dict, metric: str) -> dict:
        examples = row["examples"]
        test_set = self.test_sets[examples["test_set"]]
        if metric == "accuracy":
            return {
                "uids": test_set["uids"],
                "labels": expand(test_set["labels"]),
                "predictions": expand(examples["predictions"]),
            }
        scores = examples[metric]
        return {"uids": test_set["uids"][: len(scores)], "scores": scores}

    def __call__(self, task: str, a: str, b: str, metric: str = "accuracy") -> Interval | None:
        key = (task, a, b, metric)
        if key not in self._done:
            seeds = sorted(
                seed
                for (t, name, seed), row in self.rows.items()
                if t == task and name == a and (task, b, seed) in self.rows
            )
            pairs = [
                (self.rows[task, a, seed], self.rows[task, b, seed])
                for seed in seeds
                if metric == "accuracy" or metric in self.rows[task, a, seed]["examples"]
            ]
            interval = needed = None
            if pairs:
                left = [self._units(x, metric) for x, _ in pairs]
                right = [self._units(y, metric) for _, y in pairs]
                pair = pair_predictions if metric == "accuracy" else pair_scores
                groups = [g for g in pair(left, right, by_seed=True) if len(g[0])]
                if sum(len(a) for a, _ in groups) >= 2:
                    interval = two_level_bootstrap(groups)
                    needed = seeds_needed(groups, interval.difference)
            self._done[key], self._needed[key] = interval, needed
        return self._done[key]

    def seeds_needed(self, task: str, a: str, b: str, metric: str = "accuracy") -> int | None:
        """About how many seeds the interval of ``a − b`` would need to exclude 0 at the
        observed difference (:func:`workbench.analysis.stats.seeds_needed`)."""
        self(task, a, b, metric)
        return self._needed[(task, a, b, metric)]


def interval_cell(interval: Interval, scale: float = 100) -> str:
    """``+1.2 [+0.4, +2.0] *``: a difference with its interval, ``*`` when it excludes 0."""
    mark = " *" if interval.significant else ""
    return (
        f"{interval.difference * scale:+.1f} [{interval.low * scale:+.1f}, "
        f"{interval.high * scale:+.1f}]{mark}"
    )


def credit(total: Interval, regime: Interval, term: Interval) -> str:
    """Which part of a method a gain over vanilla KD belongs to: ``total`` = method − KD,
    ``regime`` = its control − KD, ``term`` = method − control."""
    if term.low > 0:
        return "its term's and its regime's" if regime.low > 0 else "its term's"
    if regime.low > 0:
        return "its regime's (no gain of its term shown)"
    if total.low > 0:
        return "a gain not resolved between its term and its regime"
    return "no gain over vanilla KD shown"


def control_lines(results: dict, tasks: Sequence[str], intervals: Intervals) -> list[str]:
    """The controls section: per task and method that has a control, the method and its control
    against vanilla KD and against each other, and which part the gain belongs to."""
    names = {r["name"] for r in results["students"] if r["group"] == "main"}
    methods = [m for m in PRESETS if m + CONTROL in names]
    rows = []
    for task in tasks:
        for method in methods:
            total = intervals(task, method, "kd")
            regime = intervals(task, method + CONTROL, "kd")
            term = intervals(task, method, method + CONTROL)
            if total is None or regime is None or term is None:
                continue
            cells = " | ".join(interval_cell(i) for i in (total, regime, term))
            rows.append(f"| {task} | {method} | {cells} | {credit(total, regime, term)} |")
    if not rows:
        return []
    return [
        "## Controls",
        "",
        "Each method against its control — the same objective, data, τ and student set-up "
        "with the method's own terms at weight 0 — and both against vanilla KD: test accuracy, "
        "points, 95 % two-level intervals (* : excludes 0). A gain is credited to the method's "
        "term only where the method beats its control.",
        "",
        "| task | method | method − KD | control − KD | method − control | the gain is |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _outcome(interval: Interval, claim: str) -> str:
    """Whether the interval supports ``claim`` (``>``, ``≥`` or ``<``)."""
    if claim == "<":
        return (
            "yes, significantly lower"
            if interval.high < 0
            else "no, significantly higher"
            if interval.low > 0
            else "not shown: the interval contains 0"
        )
    if interval.low > 0:
        return "yes, significantly higher"
    if interval.high < 0:
        return "no, significantly lower"
    if claim == "≥":
        return "not worse within the interval, but no gain shown (it contains 0)"
    return "not shown: the interval contains 0"


def verdicts(results: dict, tasks: Sequence[str], intervals: Intervals) -> list[str]:
    """One sentence per paper with its intervals (per task), generated from the numbers."""
    names = {r["name"] for r in results["students"] if r["group"] == "main"}

    def claim(method: str, metric: str, relation: str, scale: float, unit: str) -> str:
        parts = []
        for task in tasks:
            interval = intervals(task, method, "kd", metric)
            if interval is not None:
                needed = intervals.seeds_needed(task, method, "kd", metric)
                more = ""
                if not interval.significant and needed:
                    count = f"about {needed}" if needed <= 100 else "more than 100"
                    more = f" (a difference of this size would need {count} seeds)"
                parts.append(
                    f"on {task} {interval.describe(scale, unit)}: "
                    f"{_outcome(interval, relation)}{more}"
                )
        return "; ".join(parts) if parts else "not measured (no per-example values recorded)"

    def lowest(method: str, metric: str) -> str:
        parts = []
        for task in tasks:
            others = [
                (other, intervals(task, method, other, metric))
                for other in PRESETS
                if other in names and other != method
            ]
            others = [(m, i) for m, i in others if i is not None]
            if not others:
                continue
            closest, interval = max(others, key=lambda item: item[1].difference)
            smallest = all(i.high < 0 for _, i in others)
            parts.append(
                f"on {task} {'yes' if smallest else 'not shown'}: {display_name(method)}'s "
                f"{METRICS[metric][1]} is significantly below "
                f"{sum(i.high < 0 for _, i in others)} of the {len(others)} other students'; "
                f"against the closest, {display_name(closest)}, {display_name(method)} − it = "
                f"{interval.describe(100, METRICS[metric][3])}"
            )
        return "; ".join(parts) if parts else "not measured (no per-example values recorded)"

    def sentence(method: str, entry: Claim) -> str | None:
        label, _, meaning, unit = METRICS[entry.metric]
        name = display_name(method)
        if entry.relation == "lowest":
            if method not in names:
                return None
            return f"- **{name}'s {label} the smallest?** {lowest(method, entry.metric)}."
        if not {method, entry.than} <= names:
            return None
        than = display_name(entry.than)
        if entry.metric == "accuracy":
            question = f"{name} {entry.relation} {than} (accuracy)?** {name} − {than} "
        else:
            question = (
                f"{name}'s {label} {entry.relation} {than}'s?** {name} − {than} in {label} "
                f"({meaning}) "
            )
        relation = ">" if entry.relation == "≫" else entry.relation
        return f"- **{question}{claim(method, entry.metric, relation, 100, unit)}."

    # the claims against one method first, then those against every other student
    claims = [(m, c) for m, preset in PRESETS.items() for c in preset.claims]
    ordered = sorted(claims, key=lambda item: item[1].relation == "lowest")
    return [line for method, entry in ordered if (line := sentence(method, entry))]


def setup_lines(results: dict) -> list[str]:
    """The report's account of the sizes used, against the papers' scale."""
    setup = results.get("setup", {})
    if not setup:
        return []
    lines = [
        "## Set-up and what was cut",
        "",
        "| task | teacher | teacher's train | students' train | test | tokens | teacher epochs | "
        "student | student epochs | seeds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, plan in setup.items():
        students = plan.get("student_train_examples") or plan["max_train_examples"]
        lines.append(
            f"| {task} | {plan['teacher']} | {limit(plan['max_train_examples'])} | "
            f"{limit(students)} | {limit(plan['max_eval_examples'])} | {plan['max_length']} | "
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
    truncation = results.get("truncation", {})
    if truncation:
        lines += [
            "Truncation of the test split at each task's length (teacher tokenizer, [CLS] and "
            "[SEP] counted):",
            "",
            "| task | tokens | examples cut | tokens kept | median length |",
            "|---|---|---|---|---|",
        ]
        for task, cut in truncation.items():
            lines.append(
                f"| {task} | {cut['max_length']} | {cut['truncated_examples']:,} of "
                f"{cut['examples']:,} ({cut['truncated_examples'] / cut['examples']:.0%}) | "
                f"{cut['kept_tokens']:.0%} | {cut['median_tokens']} |"
            )
        lines.append("")
    if results.get("cuts"):
        lines += [f"What this suite cuts: {results['cuts']}", ""]
    return lines


def wall_clock_lines(results: dict) -> list[str]:
    """Every call's wall clock and their sum."""
    calls = results.get("calls", [])
    if not calls:
        return []
    lines = [
        f"Wall clock: {_duration(sum(c['seconds'] for c in calls))} in {len(calls)} "
        f"call{'s' if len(calls) > 1 else ''} of `kdw reproduce`, each resuming from "
        "`results.json` (the sum of the calls is the suite's time from an empty folder when "
        "the first call started from one):",
        "",
        "| started (UTC) | wall clock | searches | teachers trained or reopened "
        "| students trained | jobs | load before |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {c['started']} | {_duration(c['seconds'])} | {c['searches']} | {c['teachers']} "
            f"| {c['students']} | {c['jobs']} | {c['load_before']} |"
            for c in calls
        ),
        "",
    ]
    dropped = sum(c["students"] for c in calls) - len(results.get("students", []))
    if dropped > 0:
        lines += [
            f"{dropped} of the students these calls trained are no longer in the record "
            "(trained under settings the suite has since changed): the sum overstates the "
            "time from an empty folder.",
            "",
        ]
    return lines


def _duration(seconds: float) -> str:
    """``1 h 07 min`` or ``12 min``."""
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def tuning_lines(results: dict) -> list[str]:
    """The weights chosen on dev before the main table, with each search's trials."""
    tuning = results.get("tuning")
    if tuning is None:
        return []
    if not results.get("tuned", bool(tuning)):
        return ["## Weights", "", "`--fixed`: every method ran its preset's defaults.", ""]
    lines = [
        "## Weights chosen on dev",
        "",
        "Before the main table each method's key weights were chosen with `kdw tune` on the "
        "ablations' sample (its dev split; the test split is never looked at), seed 1; the "
        "method's other settings stay at its preset's values. The main table trains the "
        "chosen objective on every task and seed.",
        "",
        "| method | searched | space | chosen | best dev | trials (dev score, pruned: –) |",
        "|---|---|---|---|---|---|",
    ]
    for method, record in tuning.items():
        searched = record["searched"]
        trials = ", ".join(
            " ".join(f"{name}={t[name]:g}" for name in searched if name in t)
            + (": –" if t["dev"] is None else f": {t['dev'] * 100:.1f}")
            for t in record["trials"]
        )
        lines.append(
            f"| {method} | {', '.join(searched)} | "
            + "; ".join(f"{name} ∈ {{{record['space'][name]}}}" for name in searched)
            + " | "
            + ", ".join(f"{name}={record['chosen'][name]:g}" for name in searched)
            + f" | {record['metric']} {record['dev'] * 100:.1f} | {trials} |"
        )
    return [*lines, ""]


def write_report(
    out: Path, results: dict, figures: dict[str, str], intervals: Intervals | None = None
) -> Path:
    """``<out>/report.md``: verdicts, tables of the main results, loyalty and ablations, and
    figures."""
    records = results["students"]
    tasks = list(results["teachers"])
    main = [r for r in records if r["group"] == "main"]
    intervals = intervals or Intervals(results)

    def delta(task: str, method: str, metric: str, fallback: dict, scale: float = 100) -> str:
        if method == "kd":
            return "–"
        interval = intervals(task, method, "kd", metric)
        if interval is None:
            return cell(fallback.get((task, method)), scale)
        return interval_cell(interval, scale)

    accuracy, macro = aggregate(main, "accuracy"), aggregate(main, "macro_f1")
    gain = paired_difference(main, "accuracy", "kd")
    present = [m for m in PRESETS if any(r["name"] == m for r in main)]
    lines = [
        "# Reproduction report",
        "",
        f"Suite: {results['suite']}. Numbers are test-split percentages, mean ± std over seeds",
        "(a single number: one seed), as measured — including where a method does not beat",
        "vanilla KD. Raw values: `results.json` (the suite's record: a later call retrains",
        "none of its rows); run folders, where present, are under `runs/`.",
        "",
        *setup_lines(results),
        *wall_clock_lines(results),
        *tuning_lines(results),
        *(
            [
                f"**Incomplete:** {len(records)} of the {results['planned_students']} planned "
                "students had finished when this report was written.",
                "",
            ]
            if len(records) < results.get("planned_students", len(records))
            else []
        ),
    ]
    claims = verdicts(results, tasks, intervals)
    if claims:
        lines += [
            "## Verdicts",
            "",
            "Each difference against vanilla KD with its 95 % two-level bootstrap interval "
            "(10,000 resamples: the seeds both methods have, drawn with replacement, then each "
            "drawn seed's test examples; percentiles), so that it speaks of the method, not only "
            "of the students trained; significant only when the interval excludes 0. With few "
            "seeds these intervals are wide: where one contains 0, the sentence says about how "
            "many seeds a difference of the observed size would need (--seeds raises them).",
            "",
            *claims,
            "",
        ]
    lines += control_lines(results, tasks, intervals)
    lines += [
        "## Main table",
        "",
        "Δ kd: accuracy minus vanilla KD's in points, over the test examples of the seeds both "
        "have, with its 95 % two-level bootstrap interval (* : excludes 0); results recorded "
        "without per-example predictions show the mean ± std over seeds of the per-seed Δ.",
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
    for method in present:
        lines.append(
            f"| {method} | "
            + " | ".join(
                f"{cell(accuracy.get((t, method)))} | {cell(macro.get((t, method)))} | "
                f"{delta(t, method, 'accuracy', gain)}"
                for t in tasks
            )
            + " |"
        )
    loyalty = {
        "LL": "label_loyalty",
        "PL": "probability_loyalty",
        "SL": "saliency_loyalty",
        "gap": "attribution_gap",
        "AOPC comp": "aopc_comprehensiveness",
        "AOPC suff": "aopc_sufficiency",
    }
    shown = {
        label: metric for label, metric in loyalty.items() if any(metric in r["test"] for r in main)
    }
    if shown:
        lines += loyalty_lines(main, tasks, shown, results.get("setup", {}))
    lines += ablation_lines(results)
    if figures:
        lines += ["", "## Figures", ""]
        lines += [f"![{title}]({path})" for title, path in figures.items()]
    path = out / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def loyalty_lines(
    main: list[dict], tasks: Sequence[str], shown: dict[str, str], setup: dict
) -> list[str]:
    """The loyalty and faithfulness table (``shown``: column label → metric)."""
    means = {metric: aggregate(main, metric) for metric in shown.values()}
    lines = [
        "",
        "## Loyalty to the teacher and faithfulness (after GKD Table 3, AD-KD Eq. 11)",
        "",
        "LL, PL, SL: label, probability and saliency loyalty (×100); gap: the attribution gap "
        "‖Ã_teacher − Ã_student‖₂ over the normalised IG maps of every class (lower: closer); "
        "AOPC ×100. Mean ± std over seeds.",
        "",
        "| method | " + " | ".join(f"{t} {label}" for t in tasks for label in shown) + " |",
        "|---|" + "---|" * (len(tasks) * len(shown)),
    ]
    for method in PRESETS:
        if not any((t, method) in means[m] for t in tasks for m in shown.values()):
            continue
        lines.append(
            f"| {method} | "
            + " | ".join(
                cell(means[metric].get((t, method)), 1, 3)
                if metric == "attribution_gap"
                else cell(means[metric].get((t, method)))
                for t in tasks
                for metric in shown.values()
            )
            + " |"
        )
    if "aopc_comprehensiveness" in shown.values():
        sizes = sorted({p.get("explained_examples") or 0 for p in setup.values()})  # 0: all
        count = "all" if sizes == [0] else " / ".join(f"{s:,}" if s else "all" for s in sizes)
        lines += ["", AOPC_NOTE.format(n=count)]
    return lines


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
        and r["name"] in ablated_methods()
    ]


def ablation_lines(results: dict) -> list[str]:
    """The ablations' table: each variant against its full method on the same data."""
    records = results["students"]
    ablation = [r for r in records if r["group"] not in ("main", "reference")]
    if not ablation:
        return []
    task, seeds = ablation[0]["task"], sorted({r["seed"] for r in ablation})
    rows = [("full method", r) for r in full_method_records(records)] + [
        (r["group"], r) for r in ablation
    ]
    shown = [record for _, record in rows]
    acc, macro = aggregate(shown, "accuracy"), aggregate(shown, "macro_f1")
    lines = [
        "",
        f"## Ablations ({task}, seed {', '.join(map(str, seeds))})",
        "",
        "Each variant against the full method (its preset's defaults) trained on the same data "
        "with the same seeds"
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
                f"| {group} | {record['name']} | {cell(acc.get(key))} | {cell(macro.get(key))} |"
            )
    return lines


def delta_figure(folder: Path, results: dict, intervals: Intervals) -> str | None:
    """Each method's Δ accuracy against vanilla KD with its 95 % paired interval, a panel per
    task: ``<folder>/deltas.svg`` (vector); None when no interval was measured."""
    from matplotlib.figure import Figure

    tasks = list(results["teachers"])
    methods = [m for m in PRESETS if m != "kd"]
    panels = {
        task: [(m, intervals(task, m, "kd")) for m in methods if intervals(task, m, "kd")]
        for task in tasks
    }
    panels = {task: rows for task, rows in panels.items() if rows}
    if not panels:
        return None
    figure = Figure(figsize=(4.2 * len(panels), 3.4), layout="constrained")
    for index, (task, rows) in enumerate(panels.items()):
        axis = figure.add_subplot(1, len(panels), index + 1)
        for y, (_, interval) in enumerate(rows):
            colour = "#5e3c99" if interval.significant else "#999999"
            axis.errorbar(
                interval.difference * 100,
                y,
                xerr=[
                    [(interval.difference - interval.low) * 100],
                    [(interval.high - interval.difference) * 100],
                ],
                fmt="o",
                color=colour,
                capsize=3,
            )
        axis.axvline(0, color="#e66101", linestyle="--", linewidth=1)
        axis.set_yticks(range(len(rows)), [m for m, _ in rows])
        axis.invert_yaxis()
        axis.set_xlabel("Δ accuracy vs vanilla KD (points)")
        axis.set_title(task)
    folder.mkdir(parents=True, exist_ok=True)
    figure.savefig(folder / "deltas.svg")
    return "figures/deltas.svg"


def make_figures(out: Path, results: dict, intervals: Intervals) -> dict[str, str]:
    """The Δs against vanilla KD with their intervals (SVG), per-method accuracy bars for each
    task and the K and m sweeps (PNG) under ``<out>/figures``; returns ``{title: path}``
    relative to ``out``."""
    from matplotlib.figure import Figure

    folder = out / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    records = results["students"]
    figures = {}
    deltas = delta_figure(folder, results, intervals)
    if deltas:
        figures[
            "Δ test accuracy against vanilla KD, 95 % two-level bootstrap intervals over seeds "
            "and test examples (purple: excludes 0)"
        ] = deltas
    main = aggregate([r for r in records if r["group"] == "main"], "accuracy")
    tasks = list(results["teachers"])
    methods = [m for m in PRESETS if any((t, m) in main for t in tasks)]
    figure = Figure(figsize=(4.2 * len(tasks), 3.2), layout="constrained")
    for index, task in enumerate(tasks):
        axis = figure.add_subplot(1, len(tasks), index + 1)
        stats = [main.get((task, m), (float("nan"), 0.0, 0)) for m in methods]
        axis.bar(
            range(len(methods)),
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
        axis.set_xticks(range(len(methods)), methods, rotation=45, ha="right")
        axis.set_ylabel("test accuracy (%)")
        axis.set_title(task)
        measured = [s[0] for s in stats if s[0] == s[0]]
        axis.set_ylim(max(0, min(measured, default=0) * 100 - 10), 100)
        axis.legend(loc="lower right")
    figure.savefig(folder / "methods.png", dpi=150)
    figures["Test accuracy per method (error bars: std over seeds)"] = "figures/methods.png"
    for group, label in (
        ("adkd-k", "top-K dimensions of the teacher map"),
        ("adkd-m", "IG steps m"),
    ):
        sweep = [r for r in records if r["group"] == group]
        if not sweep:
            (folder / f"{group}.png").unlink(missing_ok=True)  # an earlier record's
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
        if group == "adkd-m" and default:  # the full method's AD-KD is m = 1
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
                label="all dimensions (full method)",
            )
            axis.legend(loc="lower right")
        axis.set_xlabel(label)
        axis.set_ylabel("test accuracy (%)")
        axis.set_title(f"AD-KD: {label}")
        figure.savefig(folder / f"{group}.png", dpi=150)
        figures[f"AD-KD sweep: {label}"] = f"figures/{group}.png"
    return figures


def gallery_indices(labels: Sequence[int]) -> str:
    """The first test example of each class, as ``kdw export --indices`` reads them."""
    first: dict[int, int] = {}
    for index, label in enumerate(labels):
        first.setdefault(int(label), index)
    return ",".join(str(first[label]) for label in sorted(first))


def heatmap_gallery(out: Path, results: dict) -> dict[str, str]:
    """One test example of each class across each task's teacher and its seed-1 students: PNG
    heatmaps (and PDF for papers) under ``<out>/figures/gallery``. Drawn from the run folders
    where they are all present; otherwise the gallery files already there are listed."""
    from workbench.analysis.heatmaps import ExportSettings, HeatmapSettings, export_runs
    from workbench.core.config import DataConfig, from_dict
    from workbench.core.data import load_task

    figures = {}
    for task, teacher in results["teachers"].items():
        runs = [teacher["run"]] + [
            r["run"]
            for r in results["students"]
            if r["task"] == task
            and r["group"] == "main"
            and r["seed"] == 1
            and r["name"] in ("kd", "adkd", "gkd")
        ]
        folder = out / "figures" / "gallery" / task
        paths = [out / run for run in runs]
        if all((path / "run.json").exists() for path in paths):
            data = from_dict(DataConfig, Run.open(paths[0]).info()["configs"]["data"])
            written = export_runs(
                [str(p) for p in paths],
                folder,
                HeatmapSettings(),
                ExportSettings(formats="png,pdf", dpi=150),
                split="test",
                indices=gallery_indices(load_task(data).splits["test"].labels),
            )
        else:
            written = list(folder.glob("*.png"))
        for path in sorted(p for p in written if p.suffix == ".png"):
            figures[f"{task}: {path.stem}"] = str(path.relative_to(out))
    return figures


def report(out: Path, results: dict) -> Path:
    """The figures and ``report.md`` of ``results``."""
    if "students" not in results or "teachers" not in results:
        raise WorkbenchError(f"{out / 'results.json'} is not a suite's record")
    intervals = Intervals(results)
    figures = make_figures(out, results, intervals) | heatmap_gallery(out, results)
    return write_report(out, results, figures, intervals)
