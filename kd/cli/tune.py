"""``kdw tune``: search a method's weights on the dev split (Optuna) and write ``best.json`` for
``kdw distill --config``."""

from __future__ import annotations

import argparse

from kd.experiments.config import TuneConfig
from kd.training.config import CONFIG_SECTIONS
from kd.training.tracking import TrackingConfig
from workbench.core.config import add_arguments, from_arguments


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "tune",
        help="choose a method's weights on dev (Optuna)",
        description="Search a method's hyperparameters on the dev split as the papers did: TPE "
        "sampling over the method's default space (the papers' grids) or --space overrides, "
        "poor trials pruned from their dev curves, every trial a resumable run folder, the "
        "study in <out>/study.db so that a killed search resumes. Writes <out>/best.json for "
        "kdw distill --config. With --storage URL (PostgreSQL, MySQL, SQLite) several workers, "
        "on one machine or several, share one study: each setting is tried once across them, "
        "and each worker writes the same best.json once the study is done.",
    )
    parser.add_argument(
        "--out", required=True, help="folder for the study, its trials and best.json"
    )
    for cls in (*CONFIG_SECTIONS.values(), TuneConfig, TrackingConfig):
        add_arguments(parser, cls)


def run(args: argparse.Namespace) -> None:
    from kd.experiments.tune import tune
    from kd.training.evaluate import format_table

    result = tune(
        *(from_arguments(cls, args) for cls in (*CONFIG_SECTIONS.values(), TuneConfig)),
        args.out,
        tracking_config=from_arguments(TrackingConfig, args),
    )
    print(format_table(result.rows))
    if result.best is not None:
        print(
            f"best configuration: {result.best} (train it with kdw distill --config "
            f"{result.best} --run-dir DIR)"
        )
