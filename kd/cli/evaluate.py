"""``kdw evaluate``: score runs and classifiers on a split, as a table: task metrics and the
students' loyalty to their teachers."""

from __future__ import annotations

import argparse
import json

from kd.cli.common import MODELS_HELP, add_task_options, note, prompted_models, task_data
from workbench.core.config import PromptConfig, add_arguments


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "evaluate",
        help="score runs on a split, as a table",
        description="Score one or more runs on a split: task metrics, and for students label and "
        "probability loyalty to their teacher. A run folder is scored on its own task; a "
        "classifier the workbench did not train on the task --task names (and the data options), "
        "or without --task on the task of the first run named beside it (with that run's "
        "columns, length and label map, said in one line), its classes matched to the task's by "
        "name.",
    )
    parser.add_argument("runs", nargs="+", help=MODELS_HELP)
    parser.add_argument("--split", default="test", help="split to score (default: test)")
    parser.add_argument(
        "--teacher",
        help="teacher for loyalty: a run folder or a classifier (default: the nearest teacher, "
        "teacher cache or model named before each student, else the student's own teacher)",
    )
    parser.add_argument(
        "--label-map",
        default="",
        help="for a classifier the workbench did not train: TASK_CLASS=MODEL_LABEL pairs "
        "where the names differ, e.g. positive=POS,negative=NEG",
    )
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument(
        "--terms",
        action="store_true",
        help="add what dominates each run's objective: every term's share of the gradient and "
        "weighted value at the first and last logged step (see --log-every)",
    )
    add_task_options(
        parser,
        "the task a classifier the workbench did not train is scored on (a run folder is scored "
        "on its own)",
    )
    add_arguments(parser, PromptConfig)


def run(args: argparse.Namespace) -> None:
    from kd.training.evaluate import evaluate_runs, format_table
    from workbench.core.files import check_output_file, write_output_file

    if args.json:  # before the minutes of scoring
        check_output_file(args.json, "--json")
    data = task_data(args, args.runs, own=("dedupe",))
    rows = evaluate_runs(
        prompted_models(args, args.runs, data),
        args.split,
        args.teacher,
        terms=args.terms,
        data=data,
        label_map=args.label_map,
        notify=note,
        dedupe=args.dedupe,
    )
    print(format_table(rows))
    if args.json:
        write_output_file(args.json, json.dumps(rows, indent=2), "--json")
