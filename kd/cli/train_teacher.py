"""``kdw train-teacher``: fine-tune a teacher classifier into a run folder, resumed when the same
command is run again."""

from __future__ import annotations

import argparse

from kd.cli.common import train_and_report
from kd.training.config import OptimConfig, TeacherConfig
from kd.training.tracking import TrackingConfig
from workbench.core.config import DataConfig, add_arguments


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "train-teacher",
        help="fine-tune a teacher classifier",
        description="Fine-tune a teacher (cross-entropy; MSE for regression) into a run folder. "
        "Rerunning the same command resumes an interrupted run.",
    )
    parser.add_argument("--run-dir", required=True, help="run folder to write (or resume)")
    for cls in (DataConfig, TeacherConfig, OptimConfig, TrackingConfig):
        add_arguments(parser, cls)


def run(args: argparse.Namespace) -> None:
    from kd.training.pipeline import train_teacher

    train_and_report(args, train_teacher, (DataConfig, TeacherConfig, OptimConfig))
