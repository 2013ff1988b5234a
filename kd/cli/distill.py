"""``kdw distill``: distil a student from a teacher with a method preset or explicit term weights;
the settings of a ``--config`` file become the defaults of its options."""

from __future__ import annotations

import argparse

from kd.cli.common import prompted_models, train_and_report
from kd.training.config import CONFIG_SECTIONS
from kd.training.tracking import TrackingConfig
from workbench.core.config import DataConfig, PromptConfig, add_arguments, from_arguments


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "distill",
        help="distil a student from a teacher",
        description="Distil a student from a fine-tuned teacher (a run folder, or a sequence "
        "classifier the workbench did not train: a Hugging Face folder or hub id, used as it "
        "is) with a method preset or explicit term weights. The teacher's outputs are computed "
        "once and cached in the run folder. Rerunning the same command resumes an interrupted "
        "run.",
    )
    parser.add_argument("--run-dir", required=True, help="run folder to write (or resume)")
    parser.add_argument(
        "--config",
        help="JSON file of settings (data, student, objective, optim sections), such as kdw tune's "
        "best.json; options given on the command line override it",
    )
    for cls in (*CONFIG_SECTIONS.values(), TrackingConfig, PromptConfig):
        add_arguments(parser, cls)


def run(args: argparse.Namespace) -> None:
    from kd.training.pipeline import distill

    if args.teacher:  # a causal language model prompted: its folder is the teacher
        (args.teacher,) = prompted_models(args, [args.teacher], from_arguments(DataConfig, args))
    train_and_report(args, distill, CONFIG_SECTIONS.values())
