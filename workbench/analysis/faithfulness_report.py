"""Which explainer is faithful to which model: what ``kdw faithfulness`` computes.

For each model (the first a run folder whose task gives the examples; the others scored on the
same texts, each through its own tokenizer) and each registered explainer, on a fixed
stratified sample of a split, explaining each model's own predicted class:

- AOPC comprehensiveness (higher: better) and sufficiency (lower: better) of the explainer's
  scores, ranked as they come (:func:`workbench.analysis.faithfulness.aopc`: signed scores rank the
  evidence *for* the class first; IG's map is non-negative);
- the leave-one-out rank correlation: Kendall's τ between the scores and the drop of the
  predicted class's probability when each token alone is removed (higher: better;
  :func:`~workbench.analysis.faithfulness.leave_one_out` and
  :func:`~workbench.analysis.faithfulness.kendall_per_example`);
- seconds per example (the explainer alone, wall clock; the machine's load average is
  recorded beside it);
- each explainer's rank per model on each of the three measures, and overall (the order of the
  mean of the three ranks);
- for every model after the first (give the teacher first, then its students): paired
  bootstrap intervals (:func:`workbench.analysis.stats.paired_bootstrap`, BCa 95 %) of model − first
  per explainer and measure, over the examples.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from workbench.analysis.attribution import ExplainerChoice, explain_batch
from workbench.analysis.faithfulness import aopc, kendall_per_example, leave_one_out
from workbench.analysis.metrics import nan_mean
from workbench.analysis.stats import paired_bootstrap
from workbench.core.config import FaithfulnessSettings, to_dict
from workbench.core.data import batches, encode, load_task, pad_id, sample_split
from workbench.core.errors import WorkbenchError
from workbench.core.models import LoadedModel, load_model

__all__ = ["MEASURES", "explainer_faithfulness", "format_faithfulness"]

# measure → whether higher is better
MEASURES = {"comprehensiveness": True, "sufficiency": False, "loo_kendall_tau": True}


def _special_ids(loaded: LoadedModel) -> set[int]:
    tokenizer = loaded.tokenizer
    return {i for i in (tokenizer.cls_token_id, tokenizer.sep_token_id) if i is not None}


def _scores(
    loaded: LoadedModel,
    part,
    choices: Sequence[ExplainerChoice],
    settings: FaithfulnessSettings,
    bar: tqdm,
) -> dict[str, dict[str, list[float] | float]]:
    """Per explainer: the per-example values of each measure and the seconds per example."""
    model, tokenizer = loaded.model, loaded.tokenizer
    dataset = encode(part, tokenizer, loaded.max_length)
    order = list(range(len(dataset)))
    special = _special_ids(loaded)
    out = {c.name: {m: [] for m in MEASURES} | {"seconds": 0.0} for c in choices}
    for batch in batches(dataset, order, settings.batch_size, pad_id(tokenizer)):
        inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        drops = leave_one_out(
            model, *inputs, removal=settings.removal, special_ids=special, batch_size=64
        )
        for choice in choices:
            start = time.perf_counter()
            scores = explain_batch(model, batch, choice, special_ids=special)
            out[choice.name]["seconds"] += time.perf_counter() - start
            faithful = aopc(
                model,
                *inputs,
                scores=scores,
                rules=settings.rules,
                removal=settings.removal,
                special_ids=special,
            )
            values = out[choice.name]
            values["comprehensiveness"] += faithful.comprehensiveness.tolist()
            values["sufficiency"] += faithful.sufficiency.tolist()
            values["loo_kendall_tau"] += kendall_per_example(scores, drops).tolist()
            bar.update(len(batch["input_ids"]))
    return out


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


def explainer_faithfulness(
    runs: Sequence[str | Path],
    settings: FaithfulnessSettings,
    choices: Sequence[ExplainerChoice],
    notify: Callable[[str], None] = lambda note: None,
) -> dict:
    """What ``kdw faithfulness`` computes (see the module's docstring): a JSON-ready report with
    ``rows`` (a row per model × explainer: the means, how many τ were undefined, seconds per
    example and the ranks), ``intervals`` (model − first, per explainer and measure), the
    settings, the explainers' settings and the machine's load average."""
    if not choices:
        raise WorkbenchError("--explainers names no explainer")
    first = load_model(str(runs[0]))
    if first.data is None:
        raise WorkbenchError(
            f"{runs[0]} is not a run folder: give a run first, whose task's --split is explained"
        )
    if first.spec.regression:
        raise WorkbenchError("faithfulness needs a classification task (AOPC, class probabilities)")
    models = [first, *(load_model(str(r), first.spec, notify=notify) for r in runs[1:])]
    names = [m.name for m in models]
    if len(set(names)) < len(names):
        raise WorkbenchError(f"two models are named alike ({names}): rename one run folder")
    data = load_task(first.data, notify=notify)
    if settings.split not in data.splits:
        raise WorkbenchError(f"no split {settings.split!r}: the task has {sorted(data.splits)}")
    part = sample_split(data.splits[settings.split], settings.examples, first.data.split_seed)
    per_model = {}
    total = len(part) * len(models) * len(choices)
    with tqdm(total=total, desc="explaining", unit="example×explainer") as bar:
        for loaded in models:
            bar.set_postfix_str(loaded.name)
            per_model[loaded.name] = _scores(loaded, part, choices, settings, bar)
    rows = []
    for name, explained in per_model.items():
        model_rows = []
        for choice in choices:
            values = explained[choice.name]
            tau, undefined = nan_mean(torch.tensor(values["loo_kendall_tau"]))
            model_rows.append(
                {
                    "model": name,
                    "explainer": choice.name,
                    "comprehensiveness": float(np.mean(values["comprehensiveness"])),
                    "sufficiency": float(np.mean(values["sufficiency"])),
                    "loo_kendall_tau": tau,
                    "tau_undefined": undefined,
                    "seconds_per_example": values["seconds"] / len(part),
                }
            )
        _ranks(model_rows)
        rows += model_rows
    intervals = []
    for name in names[1:]:
        for choice in choices:
            for measure in MEASURES:
                a = np.asarray(per_model[name][choice.name][measure])
                b = np.asarray(per_model[names[0]][choice.name][measure])
                kept = ~(np.isnan(a) | np.isnan(b))
                interval = paired_bootstrap(a[kept], b[kept], resamples=settings.resamples)
                intervals.append(
                    {"model": name, "reference": names[0], "explainer": choice.name}
                    | {"measure": measure}
                    | asdict(interval)
                )
    return {
        "models": [{"name": m.name, "source": m.source} for m in models],
        "examples": len(part),
        "settings": to_dict(settings),
        "explainers": {c.name: to_dict(c.settings) for c in choices},
        "load_average": list(os.getloadavg()),
        "cpu_count": os.cpu_count(),
        "rows": rows,
        "intervals": intervals,
    }


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
