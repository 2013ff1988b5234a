"""``kdw baseline``: a TF-IDF + logistic-regression classifier trained on the task's train split
and scored on ``--split``."""

from __future__ import annotations

import argparse
import json

from workbench.core.config import DataConfig, add_arguments, from_arguments


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "baseline",
        help="TF-IDF + logistic regression on the same split",
        description="Train a TF-IDF + logistic-regression classifier on the task's train split "
        "and score it on --split.",
    )
    add_arguments(parser, DataConfig)
    parser.add_argument("--split", default="test", help="split to score (default: test)")


def run(args: argparse.Namespace) -> None:
    from workbench.analysis.tfidf_baseline import tfidf_baseline
    from workbench.core.data import load_task

    metrics = tfidf_baseline(load_task(from_arguments(DataConfig, args)), args.split)
    print(json.dumps(metrics, indent=2))
