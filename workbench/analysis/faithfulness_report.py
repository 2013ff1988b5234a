"""Which explainer is faithful to which model: what ``kdw faithfulness`` computes.

For each model (the first a run folder whose task gives the examples; the others scored on the
same texts, each through its own tokenizer) and each registered explainer, on a fixed
stratified sample of a split, explaining each model's own predicted class:

- AOPC comprehensiveness (higher: better) and sufficiency (lower: better) of the explainer's
  scores, ranked as they come (:func:`workbench.analysis.faithfulness.aopc`: signed scores rank the
  evidence *for* the class first; IG's map is non-negative), each mean with its BCa 95 %
  bootstrap interval over the examples (:func:`workbench.analysis.stats.mean_interval`);
- the leave-one-out rank correlation: Kendall's τ between the scores and the drop of the
  predicted class's probability when each token alone is removed (higher: better;
  :func:`~workbench.analysis.faithfulness.leave_one_out` and
  :func:`~workbench.analysis.faithfulness.kendall_per_example`);
- seconds per example (the explainer alone, wall clock; the machine's load average and the
  torch threads are recorded beside it);
- each explainer's rank per model on each of the three measures, and overall (the order of the
  mean of the three ranks);
- for every model after the first (give the teacher first, then its students): paired
  bootstrap intervals (:func:`workbench.analysis.stats.paired_bootstrap`, BCa 95 %) of model − first
  per explainer and measure, over the examples.

A report can be extended: given an earlier report of the same examples, only the explainers it
lacks are computed and merged into it, and the merged report is handed on after each explainer
(``kdw faithfulness --json FILE --merge`` rewrites FILE then, so an interrupted run resumes).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.analysis.attribution import ExplainerChoice, explain_batch
from workbench.analysis.attribution.registry import EXPLAINERS
from workbench.analysis.faithfulness import aopc, kendall_per_example, leave_one_out
from workbench.analysis.metrics import nan_mean
from workbench.analysis.stats import mean_interval, paired_bootstrap
from workbench.core.config import FaithfulnessSettings, to_dict
from workbench.core.data import batches, encode, load_task, pad_id, sample_split
from workbench.core.errors import WorkbenchError
from workbench.core.files import FORMAT_KEY, RECORD_FORMAT, check_format
from workbench.core.models import LoadedModel, load_model

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


def _special_ids(loaded: LoadedModel) -> set[int]:
    tokenizer = loaded.tokenizer
    return {i for i in (tokenizer.cls_token_id, tokenizer.sep_token_id) if i is not None}


def _prepared(loaded: LoadedModel, part, settings: FaithfulnessSettings) -> list[tuple]:
    """A model's sample in batches, each with its leave-one-out drops ``[B, L]`` (computed
    once, whatever the explainers)."""
    dataset = encode(part, loaded.tokenizer, loaded.max_length)
    special = _special_ids(loaded)
    out = []
    for batch in batches(
        dataset, range(len(dataset)), settings.batch_size, pad_id(loaded.tokenizer)
    ):
        inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        drops = leave_one_out(
            loaded.model, *inputs, removal=settings.removal, special_ids=special, batch_size=64
        )
        out.append((batch, drops))
    return out


def _scores(
    loaded: LoadedModel,
    prepared: list[tuple],
    choice: ExplainerChoice,
    settings: FaithfulnessSettings,
    bar: tqdm,
) -> dict[str, list[float] | float]:
    """One explainer on one model: the per-example values of each measure and the seconds."""
    model, special = loaded.model, _special_ids(loaded)
    values: dict = {m: [] for m in MEASURES} | {"seconds": 0.0}
    for batch, drops in prepared:
        inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        start = time.perf_counter()
        scores = explain_batch(model, batch, choice, special_ids=special)
        values["seconds"] += time.perf_counter() - start
        faithful = aopc(
            model,
            *inputs,
            scores=scores,
            rules=settings.rules,
            removal=settings.removal,
            special_ids=special,
        )
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
    for measure in AOPC_MEASURES:
        interval = mean_interval(values[measure], resamples=settings.resamples)
        row |= {
            measure: interval.difference,
            f"{measure}_low": interval.low,
            f"{measure}_high": interval.high,
        }
    return row


def _ranks(rows: list[dict]) -> None:
    """Each row's rank among its model's explainers per measure (1: best) and overall (by
    the mean of the three ranks, ties in the order given)."""
    for measure, higher in MEASURES.items():
        ordered = sorted(  # an undefined mean ranks last
            rows, key=lambda r: (np.isnan(r[measure]), -r[measure] if higher else r[measure])
        )
        for rank, row in enumerate(ordered, 1):
            row[f"rank_{measure}"] = rank
    mean = {id(r): np.mean([r[f"rank_{m}"] for m in MEASURES]) for r in rows}
    for rank, row in enumerate(sorted(rows, key=lambda r: mean[id(r)]), 1):
        row["rank"] = rank


def _ranked(rows: list[dict], models: Sequence[str], explainers: Sequence[str]) -> list[dict]:
    """``rows`` ordered by model (as ``models``), then explainer (as ``explainers``), each
    model's rows ranked."""
    out = []
    for name in models:
        model_rows = sorted(
            (r for r in rows if r["model"] == name), key=lambda r: explainers.index(r["explainer"])
        )
        _ranks(model_rows)
        out += model_rows
    return out


MAX_REPORT_BYTES = 50_000_000  # a report read back: its rows and intervals
# what the rows of one report share: a merge keeps them all equal
MERGED_SETTINGS = ("split", "examples", "rules", "removal", "resamples")


def _check_mergeable(previous: dict, settings: FaithfulnessSettings, first: str) -> None:
    """Refuse, in one line, to merge into a report computed on other examples, rules or
    resamples."""
    check_report(previous)
    for name in MERGED_SETTINGS:
        if previous["settings"][name] != getattr(settings, name):
            raise WorkbenchError(
                f"the file to merge into has {name} {previous['settings'][name]!r}, this run "
                f"{getattr(settings, name)!r}: give the same to merge"
            )
    reference = previous["models"][0]["name"]
    if reference != first:
        raise WorkbenchError(
            f"the file to merge into compares with {reference}, this run with {first}: give "
            f"{reference} first"
        )


def _check_sources(previous: dict, models: Sequence[LoadedModel]) -> None:
    """Refuse, in one line, a model named as one of ``previous``'s that is another model (a
    run folder of the same name elsewhere): rows are merged by name."""
    sources = {m["name"]: m["source"] for m in previous["models"]}
    for model in models:
        given = Path(sources.get(model.name, model.source))
        if given.resolve() != Path(model.source).resolve():
            raise WorkbenchError(
                f"the file to merge into has {model.name} from {sources[model.name]}, this run "
                f"{model.name} from {model.source}: rename one run folder, or merge into "
                "another file"
            )


def _pending(
    previous: dict | None,
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
        done = {r["model"] for r in previous["rows"] if r["explainer"] == choice.name}
        kept = previous["explainers"].get(choice.name)
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
    previous: dict | None,
) -> dict:
    """The report of what is done so far, merged into ``previous``: its rows, intervals and
    explainers replaced where this run gives them."""
    done = {(r["model"], r["explainer"]) for r in rows}
    replaced = {(i["model"], i["explainer"], i["measure"]) for i in intervals}
    old = previous or {"models": [], "rows": [], "intervals": [], "explainers": {}}
    listed = list(dict.fromkeys([*(m["name"] for m in old["models"]), *(m.name for m in models)]))
    # a model already in the file keeps the source it names there
    sources = {m.name: m.source for m in models} | {m["name"]: m["source"] for m in old["models"]}
    given = {c.name: to_dict(c.settings) for c in choices}
    earlier = previous["settings"]["explainers"].split(",") if previous else []
    order = dict.fromkeys([*earlier, *old["explainers"], *given])  # the file's order first
    explainers = {name: (old["explainers"] | given)[name] for name in order}
    kept_rows = [r for r in old["rows"] if (r["model"], r["explainer"]) not in done]
    kept_intervals = [
        i for i in old["intervals"] if (i["model"], i["explainer"], i["measure"]) not in replaced
    ]
    return {
        FORMAT_KEY: RECORD_FORMAT,
        "models": [{"name": name, "source": sources[name]} for name in listed],
        "examples": examples,
        "settings": to_dict(settings) | {"explainers": ",".join(explainers)},
        "explainers": explainers,
        "load_average": previous["load_average"] if previous else list(os.getloadavg()),
        "cpu_count": os.cpu_count(),
        "rows": _ranked(
            [dict(r) for r in kept_rows + rows], listed, list(explainers)
        ),  # copies: ranks change
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
    """What ``kdw faithfulness`` computes (see the module's docstring): a JSON-ready report with
    ``rows`` (a row per model × explainer: the means, the BCa 95 % intervals of the two AOPC
    means, how many τ were undefined, seconds per example, the load average and torch threads
    it ran under, and the ranks), ``intervals`` (model − first, per explainer and measure), the
    settings, the explainers' settings and the machine's load average.

    ``previous``: a report to merge into (same split, examples, rules and removal; the same
    first model): the explainers it already has for every model given are not computed again,
    and the others' rows and intervals are added to it, or replace its own; with ``recompute``
    every explainer given is computed and replaces its rows. ``checkpoint`` is given the report
    after each explainer, so that a run writing it can resume."""
    if not choices:
        raise WorkbenchError("--explainers names no explainer")
    first = load_model(str(runs[0]))
    if first.data is None:
        raise WorkbenchError(
            f"{runs[0]} is not a run folder: give a run first, whose task's --split is explained"
        )
    if first.spec.regression:
        raise WorkbenchError("faithfulness needs a classification task (AOPC, class probabilities)")
    if previous is not None:
        _check_mergeable(previous, settings, first.name)
    models = [first, *(load_model(str(r), first.spec, notify=notify) for r in runs[1:])]
    names = [m.name for m in models]
    if len(set(names)) < len(names):
        raise WorkbenchError(f"two models are named alike ({names}): rename one run folder")
    if previous is not None:
        _check_sources(previous, models)
    pending = _pending(previous, choices, names, notify, recompute)
    data = load_task(first.data, notify=notify)
    if settings.split not in data.splits:
        raise WorkbenchError(f"no split {settings.split!r}: the task has {sorted(data.splits)}")
    part = sample_split(data.splits[settings.split], settings.examples, first.data.split_seed)
    rows: list[dict] = []
    intervals: list[dict] = []
    done: list[ExplainerChoice] = []
    if not pending:
        return _report(models, len(part), settings, done, rows, intervals, previous)
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
                    a = np.asarray(per_model[name][measure])
                    b = np.asarray(per_model[names[0]][measure])
                    kept = ~(np.isnan(a) | np.isnan(b))
                    interval = paired_bootstrap(a[kept], b[kept], resamples=settings.resamples)
                    intervals.append(
                        {"model": name, "reference": names[0], "explainer": choice.name}
                        | {"measure": measure}
                        | asdict(interval)
                    )
            done.append(choice)
            checkpoint(_report(models, len(part), settings, done, rows, intervals, previous))
    return _report(models, len(part), settings, done, rows, intervals, previous)


def format_faithfulness(report: dict) -> str:
    """The report as two plain-text tables: the rows, then the intervals."""
    lines = [
        f"{'model':<16} {'explainer':<11} {'compr.↑':>8} {'suff.↓':>8} {'LOO τ↑':>8} "
        f"{'s/example':>10} {'rank':>5}"
    ]
    for row in report["rows"]:
        lines.append(
            f"{row['model']:<16} {row['explainer']:<11} {row['comprehensiveness']:>8.4f} "
            f"{row['sufficiency']:>8.4f} {row['loo_kendall_tau']:>8.4f} "
            f"{row['seconds_per_example']:>10.4f} {row['rank']:>5}"
        )
    if report["intervals"]:
        lines += ["", "model − reference (paired bootstrap, BCa 95 %)"]
        for item in report["intervals"]:
            lines.append(
                f"{item['model']:<16} {item['explainer']:<11} {item['measure']:<18} "
                f"{item['difference']:+.4f} [{item['low']:+.4f}, {item['high']:+.4f}] "
                f"n = {item['pairs']}"
            )
    lines.append(f"{report['examples']} examples; load average {report['load_average']}")
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


def check_report(report: object) -> dict:
    """``report`` if it is a ``kdw faithfulness`` report (named models, rows of a model and an
    explainer, the settings and explainers it ran with), else a one-line error."""
    keys = {"models", "rows", "settings", "explainers", "intervals", "load_average"}
    if not isinstance(report, dict) or not keys <= set(report):
        raise WorkbenchError(f"not a kdw faithfulness report: it needs {', '.join(sorted(keys))}")
    check_format(report, "the kdw faithfulness report", "run kdw faithfulness again")
    models, rows, settings = report["models"], report["rows"], report["settings"]
    if not (
        isinstance(models, list)
        and models
        and all(isinstance(m, dict) and {"name", "source"} <= set(m) for m in models)
        and isinstance(rows, list)
        and all(isinstance(r, dict) and {"model", "explainer"} <= set(r) for r in rows)
        and isinstance(settings, dict)
        and set(MERGED_SETTINGS) | {"explainers"} <= set(settings)
    ):
        raise WorkbenchError(
            "not a kdw faithfulness report: its models, rows or settings are damaged"
        )
    for number, row in enumerate(rows, start=1):
        for key, (low, high) in VALUE_DOMAINS.items():
            value = row.get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue  # not measured (a τ undefined on every example)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (low <= value <= high)
            ):
                raise WorkbenchError(
                    f"not a kdw faithfulness report: row {number} ({row['model']}, "
                    f"{row['explainer']}): {key} {value!r} is outside [{low:g}, {high:g}]"
                )
    return report


def _tied_ranks(means: np.ndarray, low: np.ndarray, high: np.ndarray, higher: bool) -> list:
    """Per explainer: its rank, 1 + how many explainers' intervals lie wholly on the better
    side of its own (overlapping intervals tie), and the explainers it ties with (indices)."""
    better = high[None, :] < low[:, None] if not higher else low[None, :] > high[:, None]
    overlap = ~(better | better.T)
    np.fill_diagonal(overlap, False)
    return [(1 + int(better[i].sum()), list(np.flatnonzero(overlap[i]))) for i in range(len(means))]


def explainer_ranking(report: dict, model: str) -> pd.DataFrame:
    """``model``'s explainers in a ``kdw faithfulness`` report ranked by faithfulness: per AOPC
    measure (comprehensiveness ↑, sufficiency ↓) the mean, its 95 % interval (a row without
    one counts as its mean alone), its
    rank with overlapping intervals tied (1 + the explainers wholly better) and the explainers
    it ties with; then seconds per example and the 1-minute load average it ran under (NaN
    where not recorded). Sorted by comprehensiveness rank, then sufficiency rank, then
    comprehensiveness."""
    rows = [r for r in check_report(report)["rows"] if r["model"] == model]
    if not rows:
        names = [m["name"] for m in report["models"]]
        raise WorkbenchError(f"the report has no model {model!r}: it has {names}")
    names = [r["explainer"] for r in rows]
    frame = pd.DataFrame(
        {
            "explainer": names,
            "title": [EXPLAINERS[n].title if n in EXPLAINERS else n for n in names],
        }
    )
    for measure in AOPC_MEASURES:
        means = np.array([r[measure] for r in rows], dtype=float)
        low = np.array([r.get(f"{measure}_low", np.nan) for r in rows], dtype=float)
        high = np.array([r.get(f"{measure}_high", np.nan) for r in rows], dtype=float)
        ranked = _tied_ranks(
            means,
            np.where(np.isnan(low), means, low),
            np.where(np.isnan(high), means, high),
            MEASURES[measure],
        )
        frame[measure] = means
        frame[f"{measure} low"] = low
        frame[f"{measure} high"] = high
        frame[f"{measure} rank"] = [rank for rank, _ in ranked]
        frame[f"{measure} ties"] = [", ".join(names[j] for j in tied) for _, tied in ranked]
    frame["seconds per example"] = [r["seconds_per_example"] for r in rows]
    frame["load average"] = [r.get("load_average", [np.nan])[0] for r in rows]
    order = frame.assign(minus=-frame["comprehensiveness"]).sort_values(
        ["comprehensiveness rank", "sufficiency rank", "minus"], kind="stable"
    )
    return frame.loc[order.index].reset_index(drop=True)
