"""``kdw reproduce``: the papers' experiments rerun on the bundled data, with a report
(docs/reproduce.md).

The suite as data (:mod:`~kd.experiments.reproduce.suite`), the runner
(:mod:`~kd.experiments.reproduce.runner`: ``results.json`` as the record a later call resumes
from; ``--shard I/N`` trains one part, :mod:`~kd.experiments.reproduce.merge` joins the parts) and
the report (:mod:`~kd.experiments.reproduce.report`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kd.experiments.reproduce.merge import merge_results
from kd.experiments.reproduce.record import read_results
from kd.experiments.reproduce.report import gallery_indices, report, write_report
from kd.experiments.reproduce.runner import ExampleScores, exit_with_parent, run_suite
from kd.experiments.reproduce.suite import (
    DEFAULT,
    FULL,
    MAIN_METHODS,
    Experiment,
    Suite,
    TaskPlan,
    ablated_methods,
    experiments,
    identity,
)
from workbench.core.errors import WorkbenchError
from workbench.core.shards import Shard

__all__ = [
    "DEFAULT",
    "FULL",
    "MAIN_METHODS",
    "ExampleScores",
    "Experiment",
    "Shard",
    "Suite",
    "TaskPlan",
    "ablated_methods",
    "exit_with_parent",
    "experiments",
    "gallery_indices",
    "identity",
    "merge",
    "reproduce",
    "run_suite",
    "write_report",
]


def reproduce(
    out: Path,
    suite: Suite = DEFAULT,
    announce: Callable[[str], None] = print,
    jobs: int = 1,
    report_only: bool = False,
    shard: Shard | None = None,
) -> Path:
    """Run the suite (resuming from ``<out>/results.json`` and any run folders), then write the
    figures and ``report.md``; ``report_only``: only those, from ``results.json``; ``shard``: only
    that part of the suite."""
    if report_only:
        results = read_results(out)
        if results is None:
            raise WorkbenchError(f"{out / 'results.json'} does not exist: run the suite first")
    else:
        results = run_suite(out, suite, announce, jobs, shard)
    return report(out, results)


def merge(
    out: Path, folders: list[Path], suite: Suite = DEFAULT, announce: Callable[[str], None] = print
) -> Path:
    """Join the records of ``suite``'s shards in ``folders`` into ``<out>/results.json``
    (:func:`~kd.experiments.reproduce.merge.merge_results`), then write the figures and
    ``report.md``."""
    return report(out, merge_results(out, folders, suite, announce))
