"""Which explainer is faithful to which model: what ``kdw faithfulness`` computes
(docs/explainers.md, "Which explainer is faithful").

Per model (the first a run whose task gives the examples, the others scored on the same texts)
and registered explainer, on a fixed stratified sample explaining each model's predicted class:
AOPC comprehensiveness and sufficiency (:func:`workbench.analysis.faithfulness.aopc`) with BCa
95 % intervals, the leave-one-out Kendall τ, seconds per example, the ranks per measure and
overall, and for every later model paired bootstrap intervals of model − first. An earlier
report of the same examples is extended by the explainers it lacks, handed on after each one.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from pydantic import Field
from tqdm.auto import tqdm

from workbench.analysis.attribution import ExplainerChoice, explain_batch
from workbench.analysis.attribution.records import special_ids
from workbench.analysis.attribution.registry import EXPLAINERS
from workbench.analysis.faithfulness import aopc, kendall_per_example, leave_one_out
from workbench.analysis.metrics import nan_mean
from workbench.analysis.settings import FaithfulnessSettings
from workbench.analysis.stats import paired_bootstrap
from workbench.core.config import to_dict
from workbench.core.data import batches, encode, load_task, pad_id, sample_split
from workbench.core.errors import WorkbenchError
from workbench.core.files import FORMAT_KEY, RECORD_FORMAT, check_format
from workbench.core.models import LoadedModel, load_model
from workbench.core.records import Record, RecordProblem, checked

__all__ = [
    "AOPC_MEASURES",
    "MEASURES",
    "check_report",
    "explainer_faithfulness",
    "explainer_ranking",
    "format_faithfulness",
]

# measure → whether higher is better
MEASURES = {"comprehensiveness": True, "sufficiency": False, "loo_kendall_tau": True}
AOPC_MEASURES = ("comprehensiveness", "sufficiency")  # the rows give their means' intervals


def _prepared(loaded: LoadedModel, part, settings: FaithfulnessSettings) -> list[tuple]:
    """A model's sample in batches, each with its inputs and its leave-one-out drops ``[B, L]``
    (computed once, whatever the explainers)."""
    dataset = encode(part, loaded.tokenizer, loaded.max_length)
    options = {"removal": settings.removal, "special_ids": special_ids(loaded.tokenizer)}
    out = []
    for batch in batches(
        dataset, range(len(dataset)), settings.batch_size, pad_id(loaded.tokenizer)
    ):
        inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        out.append((batch, inputs, leave_one_out(loaded.model, *inputs, **options)))
    return out


def _scores(
    loaded: LoadedModel,
    prepared: list[tuple],
    choice: ExplainerChoice,
    settings: FaithfulnessSettings,
    bar: tqdm,
) -> dict[str, list[float] | float]:
    """One explainer on one model: the per-example values of each measure and the seconds."""
    model, special = loaded.model, special_ids(loaded.tokenizer)
    options = {"rules": settings.rules, "removal": settings.removal, "special_ids": special}
    values: dict = {m: [] for m in MEASURES} | {"seconds": 0.0}
    for batch, inputs, drops in prepared:
        start = time.perf_counter()
        scores = explain_batch(model, batch, choice, special_ids=special)
        values["seconds"] += time.perf_counter() - start
        faithful = aopc(model, *inputs, scores=scores, **options)
        values["comprehensiveness"] += faithful.comprehensiveness.tolist()
        values["sufficiency"] += faithful.sufficiency.tolist()
        values["loo_kendall_tau"] += kendall_per_example(scores, drops).tolist()
        bar.update(len(batch["input_ids"]))
    return values


def _row(model: str, explainer: str, values: dict, settings: FaithfulnessSettings) -> dict:
    """A row of the report: the means, with BCa intervals of the two AOPC means, how many τ
    were undefined, seconds per example and the load and threads it ran under."""
    tau, undefined = nan_mean(torch.tensor(values["loo_kendall_tau"]))
    examples = len(values["comprehensiveness"])
    row = {
        "model": model,
        "explainer": explainer,
        "loo_kendall_tau": tau,
        "tau_undefined": undefined,
        "seconds_per_example": values["seconds"] / examples,
        "load_average": list(os.getloadavg()),
        "threads": torch.get_num_threads(),
    }
    for measure in AOPC_MEASURES:  # the mean's BCa interval: the values paired with zeros
        zeros = [0.0] * len(values[measure])
        interval = paired_bootstrap(values[measure], zeros, resamples=settings.resamples)
        row |= {
            measure: interval.difference,
            f"{measure}_low": interval.low,
            f"{measure}_high": interval.high,
        }
    return row


def _ranked(rows: list[dict], models: Sequence[str], explainers: Sequence[str]) -> list[dict]:
    """``rows`` ordered by model (as ``models``), then explainer (as ``explainers``), each row
    given its rank among its model's explainers per measure (1: best) and overall (by the mean
    of the three ranks, ties in the order given)."""
    out = []
    for name in models:
        model_rows = sorted(
            (r for r in rows if r["model"] == name), key=lambda r: explainers.index(r["explainer"])
        )
        for measure, higher in MEASURES.items():
            ordered = sorted(  # an undefined mean ranks last
                model_rows,
                key=lambda r: (np.isnan(r[measure]), -r[measure] if higher else r[measure]),
            )
            for rank, row in enumerate(ordered, 1):
                row[f"rank_{measure}"] = rank
        mean = {id(r): np.mean([r[f"rank_{m}"] for m in MEASURES]) for r in model_rows}
        for rank, row in enumerate(sorted(model_rows, key=lambda r: mean[id(r)]), 1):
            row["rank"] = rank
        out += model_rows
    return out


MAX_REPORT_BYTES = 50_000_000  # a report read back: its rows and intervals
# what the rows of one report share: a merge keeps them all equal
MERGED_SETTINGS = ("split", "examples", "rules", "removal", "resamples")


def _check_mergeable(
    previous: FaithfulnessReport, settings: FaithfulnessSettings, first: str
) -> None:
    """Refuse, in one line, to merge into a report computed on other examples, rules or
    resamples."""
    for name in MERGED_SETTINGS:
        if getattr(previous.settings, name) != getattr(settings, name):
            raise WorkbenchError(
                f"the file to merge into has {name} {getattr(previous.settings, name)!r}, this "
                f"run {getattr(settings, name)!r}: give the same to merge"
            )
    reference = previous.models[0].name
    if reference != first:
        raise WorkbenchError(
            f"the file to merge into compares with {reference}, this run with {first}: give "
            f"{reference} first"
        )


def _check_sources(previous: FaithfulnessReport, models: Sequence[LoadedModel]) -> None:
    """Refuse, in one line, a model named as one of ``previous``'s that is another model (a
    run folder of the same name elsewhere): rows are merged by name."""
    sources = {m.name: m.source for m in previous.models}
    for model in models:
        given = Path(sources.get(model.name, model.source))
        if given.resolve() != Path(model.source).resolve():
            raise WorkbenchError(
                f"the file to merge into has {model.name} from {sources[model.name]}, this run "
                f"{model.name} from {model.source}: rename one run folder, or merge into "
                "another file"
            )


def _pending(
    previous: FaithfulnessReport | None,
    choices: Sequence[ExplainerChoice],
    names: Sequence[str],
    notify: Callable[[str], None],
    recompute: bool,
) -> list[ExplainerChoice]:
    """The explainers ``previous`` lacks for some model of ``names`` (all of them with
    ``recompute``); an explainer it has under other settings is refused."""
    if previous is None:
        return list(choices)
    pending = []
    for choice in choices:
        done = {r.model for r in previous.rows if r.explainer == choice.name}
        kept = previous.explainers.get(choice.name)
        if done and kept != to_dict(choice.settings):
            raise WorkbenchError(
                f"the file to merge into has {choice.name} with the settings {kept}: give the "
                "same settings, or another file"
            )
        if set(names) <= done and not recompute:
            notify(f"{choice.name}: kept from the file merged into")
        else:
            pending.append(choice)
    return pending


def _report(
    models: Sequence[LoadedModel],
    examples: int,
    settings: FaithfulnessSettings,
    choices: Sequence[ExplainerChoice],
    rows: list[dict],
    intervals: list[dict],
    previous: FaithfulnessReport | None,
) -> dict:
    """The report of what is done so far, merged into ``previous``: its rows, intervals and
    explainers replaced where this run gives them."""
    done = {(r["model"], r["explainer"]) for r in rows}
    replaced = {(i["model"], i["explainer"], i["measure"]) for i in intervals}
    old_models, old_rows, old_intervals = (
        (previous.models, previous.rows, previous.intervals) if previous else ([], [], [])
    )
    listed = list(dict.fromkeys([*(m.name for m in old_models), *(m.name for m in models)]))
    # a model already in the file keeps the source it names there
    sources = {m.name: m.source for m in models} | {m.name: m.source for m in old_models}
    given = {c.name: to_dict(c.settings) for c in choices}
    earlier = previous.explainers if previous else {}
    named = previous.settings.explainers.split(",") if previous else []
    order = dict.fromkeys([*named, *earlier, *given])  # the file's order first
    explainers = {name: (earlier | given)[name] for name in order}
    kept_rows = [r.plain() for r in old_rows if (r.model, r.explainer) not in done]
    kept_intervals = [
        i.plain() for i in old_intervals if (i.model, i.explainer, i.measure) not in replaced
    ]
    return {
        FORMAT_KEY: RECORD_FORMAT,
        "models": [{"name": name, "source": sources[name]} for name in listed],
        "examples": examples,
        "settings": to_dict(settings) | {"explainers": ",".join(explainers)},
        "explainers": explainers,
        "load_average": previous.load_average if previous else list(os.getloadavg()),
        "cpu_count": os.cpu_count(),
        # copies of this run's rows: ranking them again would change a report handed on
        "rows": _ranked(kept_rows + [dict(r) for r in rows], listed, list(explainers)),
        "intervals": kept_intervals + intervals,
    }


def explainer_faithfulness(
    runs: Sequence[str | Path],
    settings: FaithfulnessSettings,
    choices: Sequence[ExplainerChoice],
    notify: Callable[[str], None] = lambda note: None,
    previous: dict | None = None,
    checkpoint: Callable[[dict], None] = lambda report: None,
    recompute: bool = False,
) -> dict:
    """What ``kdw faithfulness`` computes: a JSON-ready report with ``rows`` (per model × explainer:
    the means, the BCa 95 % intervals of the AOPC means, undefined τ, seconds per example, load
    average, threads and ranks), ``intervals`` (model − first, per explainer and measure) and the
    settings.

    ``previous``: a report to merge into (checked, :func:`check_report`): the explainers it has for
    every model given are not computed again (unless ``recompute``), the others' rows and intervals
    added or put in place of its own. ``checkpoint`` is given the report after each explainer."""
    if not choices:
        raise WorkbenchError("--explainers names no explainer")
    first = load_model(str(runs[0]))
    if first.data is None:
        raise WorkbenchError(
            f"{runs[0]} is not a run folder: give a run first, whose task's --split is explained"
        )
    if first.spec.regression:
        raise WorkbenchError("faithfulness needs a classification task (AOPC, class probabilities)")
    merged_into = check_report(previous) if previous is not None else None
    if merged_into is not None:
        _check_mergeable(merged_into, settings, first.name)
    models = [first, *(load_model(str(r), first.spec, notify=notify) for r in runs[1:])]
    names = [m.name for m in models]
    if len(set(names)) < len(names):
        raise WorkbenchError(f"two models are named alike ({names}): rename one run folder")
    if merged_into is not None:
        _check_sources(merged_into, models)
    pending = _pending(merged_into, choices, names, notify, recompute)
    data = load_task(first.data, notify=notify)
    if settings.split not in data.splits:
        raise WorkbenchError(f"no split {settings.split!r}: the task has {sorted(data.splits)}")
    part = sample_split(data.splits[settings.split], settings.examples, first.data.split_seed)
    rows: list[dict] = []
    intervals: list[dict] = []
    done: list[ExplainerChoice] = []
    if not pending:
        return _report(models, len(part), settings, done, rows, intervals, merged_into)
    prepared = {m.name: _prepared(m, part, settings) for m in models}
    total = len(part) * len(models) * len(pending)
    with tqdm(total=total, desc="explaining", unit="example×explainer") as bar:
        for choice in pending:
            per_model = {}
            for loaded in models:
                bar.set_postfix_str(f"{loaded.name}, {choice.name}")
                per_model[loaded.name] = _scores(
                    loaded, prepared[loaded.name], choice, settings, bar
                )
                rows.append(_row(loaded.name, choice.name, per_model[loaded.name], settings))
            for name in names[1:]:
                for measure in MEASURES:
                    a, b = (np.asarray(per_model[n][measure]) for n in (name, names[0]))
                    kept = ~(np.isnan(a) | np.isnan(b))
                    interval = paired_bootstrap(a[kept], b[kept], resamples=settings.resamples)
                    intervals.append(
                        {"model": name, "reference": names[0], "explainer": choice.name}
                        | {"measure": measure}
                        | asdict(interval)
                    )
            done.append(choice)
            checkpoint(_report(models, len(part), settings, done, rows, intervals, merged_into))
    return _report(models, len(part), settings, done, rows, intervals, merged_into)


def format_faithfulness(report: FaithfulnessReport) -> str:
    """The report as two plain-text tables: the rows, then the intervals."""
    lines = [
        f"{'model':<16} {'explainer':<11} {'compr.↑':>8} {'suff.↓':>8} {'LOO τ↑':>8} "
        f"{'s/example':>10} {'rank':>5}"
    ]
    for row in report.rows:
        lines.append(
            f"{row.model:<16} {row.explainer:<11} {row.comprehensiveness:>8.4f} "
            f"{row.sufficiency:>8.4f} {row.loo_kendall_tau:>8.4f} "
            f"{row.seconds_per_example:>10.4f} {row.rank:>5}"
        )
    if report.intervals:
        lines += ["", "model − reference (paired bootstrap, BCa 95 %)"]
        for item in report.intervals:
            lines.append(
                f"{item.model:<16} {item.explainer:<11} {item.measure:<18} "
                f"{item.difference:+.4f} [{item.low:+.4f}, {item.high:+.4f}] n = {item.pairs}"
            )
    lines.append(f"{report.examples} examples; load average {report.load_average}")
    return "\n".join(lines)


# what each number of a report's rows can be: AOPC means of probability drops, Kendall's τ,
# counts and times
VALUE_DOMAINS = {
    **{
        f"{measure}{end}": (-1.0, 1.0) for measure in AOPC_MEASURES for end in ("", "_low", "_high")
    },
    "loo_kendall_tau": (-1.0, 1.0),
    "tau_undefined": (0, math.inf),
    "seconds_per_example": (0.0, math.inf),
    "threads": (1, math.inf),
}


class ReportModel(Record):
    name: str
    source: str  # a run folder, a model folder or a hub id


class ReportRow(Record):
    """A row of a report: a model and an explainer, its means (NaN: undefined on every
    example), the AOPC means' intervals, seconds per example, what it ran under, its ranks."""

    model: str
    explainer: str
    comprehensiveness: float
    sufficiency: float
    loo_kendall_tau: float
    seconds_per_example: float
    rank: int
    comprehensiveness_low: float = math.nan
    comprehensiveness_high: float = math.nan
    sufficiency_low: float = math.nan
    sufficiency_high: float = math.nan
    tau_undefined: int = 0
    load_average: list[float] = Field(default_factory=lambda: [math.nan])
    threads: int | None = None


class ReportInterval(Record):
    """Model − reference on one explainer and measure, over the examples paired."""

    model: str
    reference: str
    explainer: str
    measure: str
    difference: float
    low: float
    high: float
    pairs: int


class ReportSettings(Record):
    """What the rows of a report share (a merge keeps them equal), and its explainers."""

    explainers: str
    split: str
    examples: int
    rules: str
    removal: str
    resamples: int


class FaithfulnessReport(Record):
    """A ``kdw faithfulness`` report, as :func:`explainer_faithfulness` writes it."""

    models: list[ReportModel] = Field(min_length=1)
    rows: list[ReportRow]
    settings: ReportSettings
    explainers: dict[str, dict[str, Any]]
    intervals: list[ReportInterval]
    load_average: list[float]
    examples: int


REQUIRED = ("models", "rows", "settings", "explainers", "intervals", "load_average")


def check_report(report: object) -> FaithfulnessReport:
    """``report`` (as read from its file) if it is a ``kdw faithfulness`` report (named models,
    rows of a model and an explainer, the settings and explainers it ran with, each number of
    a row inside its domain), else a one-line error."""
    if not isinstance(report, dict) or not set(REQUIRED) <= set(report):
        raise WorkbenchError(f"not a kdw faithfulness report: it needs {', '.join(REQUIRED)}")
    check_format(report, "the kdw faithfulness report", "run kdw faithfulness again")
    try:
        checked_report = checked(report, FaithfulnessReport, "the report")
    except RecordProblem as problem:
        raise WorkbenchError(
            f"not a kdw faithfulness report: its models, rows or settings are damaged ({problem})"
        ) from None
    for number, row in enumerate(checked_report.rows, start=1):
        for key, (low, high) in VALUE_DOMAINS.items():
            value = getattr(row, key)
            if value is not None and not math.isnan(value) and not low <= value <= high:
                raise WorkbenchError(
                    f"not a kdw faithfulness report: row {number} ({row.model}, "
                    f"{row.explainer}): {key} {value!r} is outside [{low:g}, {high:g}]"
                )
    return checked_report


def _tied_ranks(means: np.ndarray, low: np.ndarray, high: np.ndarray, higher: bool) -> list:
    """Per explainer: its rank, 1 + how many explainers' intervals lie wholly on the better
    side of its own (overlapping intervals tie), and the explainers it ties with (indices)."""
    better = high[None, :] < low[:, None] if not higher else low[None, :] > high[:, None]
    overlap = ~(better | better.T)
    np.fill_diagonal(overlap, False)
    return [(1 + int(better[i].sum()), list(np.flatnonzero(overlap[i]))) for i in range(len(means))]


def explainer_ranking(report: FaithfulnessReport, model: str) -> pd.DataFrame:
    """``model``'s explainers in a ``kdw faithfulness`` report ranked by faithfulness: per AOPC
    measure (comprehensiveness ↑, sufficiency ↓) the mean, its 95 % interval (a row without one
    counts as its mean alone), its rank with overlapping intervals tied (1 + the explainers wholly
    better) and the explainers it ties with; then seconds per example and the load average (NaN
    where not recorded). Sorted by the two ranks, then comprehensiveness."""
    rows = [r for r in report.rows if r.model == model]
    if not rows:
        names = [m.name for m in report.models]
        raise WorkbenchError(f"the report has no model {model!r}: it has {names}")
    names = [r.explainer for r in rows]
    frame = pd.DataFrame(
        {
            "explainer": names,
            "title": [EXPLAINERS[n].title if n in EXPLAINERS else n for n in names],
        }
    )
    for measure in AOPC_MEASURES:
        means, low, high = (
            np.array([getattr(r, measure + end) for r in rows], dtype=float)
            for end in ("", "_low", "_high")
        )
        bounds = (np.where(np.isnan(bound), means, bound) for bound in (low, high))
        ranked = _tied_ranks(means, *bounds, MEASURES[measure])
        frame[measure], frame[f"{measure} low"], frame[f"{measure} high"] = means, low, high
        frame[f"{measure} rank"] = [rank for rank, _ in ranked]
        frame[f"{measure} ties"] = [", ".join(names[j] for j in tied) for _, tied in ranked]
    frame["seconds per example"] = [r.seconds_per_example for r in rows]
    frame["load average"] = [r.load_average[0] for r in rows]
    order = frame.assign(minus=-frame["comprehensiveness"]).sort_values(
        ["comprehensiveness rank", "sufficiency rank", "minus"], kind="stable"
    )
    return frame.loc[order.index].reset_index(drop=True)
