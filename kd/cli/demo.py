"""``kdw demo``: the end-to-end demo on the bundled tweets (a teacher, its students, the table)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="end-to-end demo on the bundled tweets",
        description="Fine-tune the MiniLM-L6 teacher on the bundled tweets, distil 3-layer "
        "students (vanilla KD, Patient KD) and a student without a teacher, print the table.",
    )
    parser.add_argument("--root", default="runs/demo", help="folder for the demo's runs")
    parser.add_argument("--quick", action="store_true", help="a much smaller demo (minutes)")


def run(args: argparse.Namespace) -> None:
    from kd.training.demo import run_demo

    run_demo(Path(args.root), quick=args.quick)
