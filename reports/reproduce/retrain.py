"""Students of the committed suite, retrained from its record alone, against their recorded
test metrics: behaviour unchanged by a restructuring if every metric agrees to 1e-9.

    python reports/reproduce/retrain.py                    # tweets kd and adkd, seed 1
    python reports/reproduce/retrain.py --names ckd gkd --task bbc-news

Each named main-table student's settings are rebuilt from the default suite and the weights its
record chose on dev; its identity must equal the recorded row's (else the suite's settings
changed and there is nothing to compare). It is trained again in a fresh folder with the threads
the suite gave it, against the suite's teacher run when that folder is present, else against a
teacher trained again (then its test metrics are compared too). Writes ``retrain.json`` beside
``results.json`` (or ``--json``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from kd.experiments.reproduce import DEFAULT, experiments, identity
from kd.experiments.reproduce.record import read_results
from kd.experiments.reproduce.runner import task_teacher, train_and_score
from kd.methods.config import ObjectiveConfig
from workbench.core.config import from_dict
from workbench.core.files import atomic_write_json
from workbench.core.runs import Run

TOLERANCE = 1e-9


def largest_difference(recorded: dict, again: dict) -> float:
    """The largest absolute difference between two dicts of test metrics (None: undefined)."""
    if recorded.keys() != again.keys():
        raise SystemExit(f"different metrics: {sorted(recorded)} vs {sorted(again)}")
    return max(
        0.0 if a is None and b is None else abs(a - b)
        for name in recorded
        for a, b in [(recorded[name], again[name])]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, default=Path(__file__).parent)
    parser.add_argument("--task", default="tweets")
    parser.add_argument("--names", nargs="+", default=["kd", "adkd"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--json",
        type=Path,
        help="where to write the checks (default: retrain.json beside results.json)",
    )
    args = parser.parse_args()

    results = read_results(args.suite)
    chosen = {m: from_dict(ObjectiveConfig, r.objective) for m, r in results.tuning.items()}
    rows = {r.key: r for r in results.students}
    threads = max(1, (os.cpu_count() or 1) // results.jobs)
    checks = []
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        plan = DEFAULT.plans[args.task]
        teacher = args.suite / results.teachers[args.task].run
        if not (teacher / "run.json").exists():
            teacher = task_teacher(out, args.task, plan).path
            again = Run(teacher).results()["test"]
            recorded = results.teachers[args.task].test
            checks.append(
                {"student": "teacher", "largest_difference": largest_difference(recorded, again)}
            )
        for experiment in experiments(DEFAULT, chosen):
            if (experiment.task, experiment.group, experiment.seed) != (
                args.task,
                "main",
                args.seed,
            ) or experiment.name not in args.names:
                continue
            student_plan = DEFAULT.plan_of(experiment)  # the students' data, not the teacher's
            key = identity(experiment, student_plan, plan)
            if key not in rows:
                raise SystemExit(f"{key}: no such row in {args.suite / 'results.json'}")
            scored = train_and_score(out, teacher, student_plan, experiment, key, threads)
            difference = largest_difference(rows[key].test, scored.test)
            checks.append({"student": key, "largest_difference": difference})
            print(f"{key}: largest difference {difference:.3g} over {len(scored.test)} metrics")
    atomic_write_json(
        args.json or args.suite / "retrain.json",
        {"tolerance": TOLERANCE, "threads": threads, "checks": checks},
    )
    if any(c["largest_difference"] > TOLERANCE for c in checks):
        raise SystemExit(f"a retrained model differs from its record by more than {TOLERANCE}")


if __name__ == "__main__":
    main()
