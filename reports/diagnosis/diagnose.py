"""Why AD-KD (Eq. 9 at β = 10) and GKD-CLS (its [CLS]-gradient term at weight 1) collapse in the
reproduction suite, and what their presets do instead.

The reproduction suite's setting (MiniLM-L6 teachers; 3-layer students cut from them; 1,000
training tweets and 400 BBC News articles at 64 tokens, 2 epochs) with the objective
diagnostics logged every 3 steps. Writes ``results.json`` (every student, as ``kdw reproduce``
does) and ``report.md``: test accuracy against vanilla KD's with a paired bootstrap interval over
(seed, example) pairs, macro-F1, the recall of the weakest class, loyalty, saliency loyalty and
attribution gap, and each term's share of the gradient at the first and last step.

    python reports/diagnosis/diagnose.py --jobs 2      # resumable; run folders under runs/
    python reports/diagnosis/diagnose.py --report-only # report.md from results.json

The tuned rows train ``best.json`` of the ``kdw tune`` studies in ``tune/`` (AD-KD) and
``tune-kd/`` (vanilla KD, the same search budget, the fair reference for a tuned AD-KD), when
those files are here (see docs/results.md for the commands). The rows of those two settings are
named "old default" in the record, which identifies a student by its name.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from kd.experiments.reproduce import DEFAULT, Experiment, Suite, run_suite
from kd.methods.config import ObjectiveConfig
from kd.training.diagnostics import summarise
from kd.training.evaluate import format_table
from workbench.analysis.stats import pair_predictions, paired_bootstrap
from workbench.core.config import from_dict
from workbench.core.files import atomic_write_text
from workbench.core.runs import Run

HERE = Path(__file__).resolve().parent
SEEDS = (1, 2, 3)
ADKD_EQ9 = ObjectiveConfig(preset="adkd", weights="ce=0.1,kd=0.9,attr=10").with_settings(
    attr_reduction="paper"
)
GKD_CLS_UNIT = ObjectiveConfig(preset="gkd-cls", weights="ce=0.5,kd=0.5,pkd=1,grad=1,cls_grad=1")


def tuned(study: str) -> tuple[ObjectiveConfig, dict] | None:
    """The objective and learning rate ``kdw tune`` chose (``<study>/best.json`` beside this
    script), if it ran."""
    best = HERE / study / "best.json"
    if not best.exists():
        return None
    chosen = json.loads(best.read_text())
    return (
        from_dict(ObjectiveConfig, chosen["objective"]),
        {"learning_rate": chosen["optim"]["learning_rate"]},
    )


def suite() -> Suite:
    """Vanilla KD over the seeds on both tasks (the main table), then the presets over the
    seeds, the two collapsing settings, the tuned AD-KD when ``best.json`` exists, and one seed
    of every other method for the attribution gaps."""
    adkd, gkd_cls = ObjectiveConfig(preset="adkd"), ObjectiveConfig(preset="gkd-cls")
    extra = [Experiment("tweets", "adkd", "diagnosis", adkd, seed) for seed in SEEDS]
    extra += [Experiment("bbc-news", "gkd-cls", "diagnosis", gkd_cls, seed) for seed in SEEDS]
    extra += [
        Experiment("tweets", "adkd old default", "diagnosis", ADKD_EQ9, 1),
        Experiment("bbc-news", "gkd-cls old default", "diagnosis", GKD_CLS_UNIT, 1),
    ]
    for name, study in (("adkd tuned", "tune"), ("kd tuned", "tune-kd")):
        chosen = tuned(study)
        if chosen is not None:  # vanilla KD tuned the same way is the fair reference
            extra += [
                Experiment("tweets", name, "diagnosis", chosen[0], seed, optim=chosen[1])
                for seed in SEEDS
            ]
    extra += [
        Experiment(
            "tweets", "adkd sampled view", "diagnosis", adkd.with_settings(attr_views="sample"), 1
        )
    ]
    extra += [
        Experiment("tweets", method, "diagnosis", ObjectiveConfig(preset=method), 1)
        for method in ("finetune", "pkd-skip", "pkd-last", "ckd", "gkd", "gkd-cls")
    ]
    extra += [
        Experiment("bbc-news", "gkd", "diagnosis", ObjectiveConfig(preset="gkd"), seed)
        for seed in SEEDS
    ]
    plans = {task: replace(plan, seeds=SEEDS) for task, plan in DEFAULT.plans.items()}
    return Suite(
        plans=plans,
        ablation_task="tweets",
        ablation_groups=(),
        methods=("kd",),
        extra=tuple(extra),
        description="AD-KD / GKD-CLS diagnosis at the reproduction suite's scale",
        cuts=DEFAULT.cuts,
    )


def _predictions(record: dict) -> dict:
    return json.loads((HERE / record["run"] / "predictions.json").read_text())["test"]


def _tasks(results: dict) -> list[str]:
    """The tasks in the suite's order (``results.json`` stores them sorted), so that
    ``--report-only`` writes the report the full call wrote."""
    return [task for task in DEFAULT.plans if task in results["teachers"]]


REFERENCE = {"adkd tuned": "kd tuned"}  # a tuned method against vanilla KD tuned alike


def rows(results: dict) -> list[dict]:
    """One row per (task, student name): means over its seeds, and Δ accuracy against its
    reference (vanilla KD; for a tuned method, vanilla KD tuned alike) with a paired bootstrap
    interval over the seeds both have."""
    students = results["students"]
    table = []
    for task in _tasks(results):
        names = list(dict.fromkeys(r["name"] for r in students if r["task"] == task))
        by_name = {
            name: {r["seed"]: r for r in students if r["task"] == task and r["name"] == name}
            for name in names
        }
        for name in names:
            records = sorted(
                (r for r in students if r["task"] == task and r["name"] == name),
                key=lambda r: r["seed"],
            )

            def mean(key: str, scale: float = 100.0, digits: int = 1, records=records) -> str:
                value = scale * sum(r["test"][key] for r in records) / len(records)
                return f"{value:.{digits}f}"

            recalls = [
                min(v for k, v in r["test"].items() if k.startswith("recall/")) for r in records
            ]
            row = {
                "task": task,
                "student": name,
                "seeds": len(records),
                "accuracy": mean("accuracy"),
                "macro-F1": mean("macro_f1"),
                "weakest recall": f"{100 * sum(recalls) / len(recalls):.1f}",
                "LL": mean("label_loyalty"),
                "SL": mean("saliency_loyalty"),
                "attribution gap": mean("attribution_gap", 1.0, 3),
            }
            reference = REFERENCE.get(name, "kd")
            if name != "kd" and by_name.get(reference):
                paired = [
                    (r, by_name[reference][r["seed"]])
                    for r in records
                    if r["seed"] in by_name[reference]
                ]
                a, b = pair_predictions(
                    [_predictions(r) for r, _ in paired], [_predictions(k) for _, k in paired]
                )
                row["Δ accuracy (paired)"] = f"vs {reference}: {paired_bootstrap(a, b).describe()}"
            first = HERE / records[0]["run"]
            summary = summarise(Run(first).metrics("train"))
            for moment in ("start", "end"):
                shares = {
                    k.removeprefix("grad_share/"): v
                    for k, v in summary.get(moment, {}).items()
                    if k.startswith("grad_share/")
                }
                row[f"grad share, {moment}"] = " · ".join(
                    f"{k} {v:.0%}" for k, v in sorted(shares.items(), key=lambda i: -i[1])
                )
            table.append(row)
    return table


def write_report(results: dict) -> Path:
    table = rows(results)
    teachers = ", ".join(
        f"{task} {results['teachers'][task]['test']['accuracy'] * 100:.1f}"
        for task in _tasks(results)
    )
    text = "\n".join(
        [
            "# AD-KD and GKD-CLS at the reproduction suite's scale",
            "",
            f"Teachers (test accuracy): {teachers}. Test split: 500 tweets, 212 BBC News articles. "
            "Accuracy, macro-F1, the weakest class's recall, label loyalty (LL), saliency loyalty "
            "(SL, ×100) and attribution gap (AD-KD Eq. 11, lower is closer) are means over the "
            "seeds; Δ accuracy is against vanilla KD (the tuned AD-KD against vanilla KD tuned "
            "with the same search) paired by seed and example (95 % BCa bootstrap interval, "
            "significant only when it excludes 0). Gradient shares are seed 1's first and last "
            "logged step (`kd/training/diagnostics.py`).",
            "",
            format_table(table),
            "",
            f"Written by `python reports/diagnosis/diagnose.py` "
            f"({results['seconds_this_invocation'] // 60} minutes for its last call).",
            "",
        ]
    )
    path = HERE / "report.md"
    atomic_write_text(path, text)
    (HERE / "summary.json").write_text(json.dumps(table, indent=1) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    if args.report_only:
        results = json.loads((HERE / "results.json").read_text())
    else:
        results = run_suite(HERE, suite(), jobs=args.jobs).plain()
    print(write_report(results))


if __name__ == "__main__":
    main()
