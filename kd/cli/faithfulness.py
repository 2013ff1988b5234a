"""``kdw faithfulness``: which explainer is faithful to which model (AOPC, leave-one-out τ, seconds
per example), as a table and a report that later calls extend."""

from __future__ import annotations

import argparse

from kd.cli.common import MODELS_HELP, add_explainer_settings, explainer_choices, note
from workbench.analysis.settings import FaithfulnessSettings
from workbench.core.config import add_arguments, from_arguments
from workbench.core.errors import WorkbenchError
from workbench.core.files import read_json_file


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "faithfulness",
        help="which explainer is faithful to which model (AOPC, leave-one-out τ, time)",
        description="Explain a fixed stratified sample of a split under each model and each "
        "explainer (each model's predicted class) and score the explanations: AOPC "
        "comprehensiveness and sufficiency, Kendall's τ between the scores and the drop of the "
        "predicted class's probability when each token alone is removed, and seconds per "
        "example; each explainer's rank per model. Give the teacher first: every later model "
        "(its students) gets paired bootstrap intervals of model − teacher per explainer. The "
        "first model must be a run folder: its task gives the examples.",
    )
    parser.add_argument("runs", nargs="+", help=MODELS_HELP)
    parser.add_argument("--json", help="also write the report to this file")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="extend the --json report (same split, examples, rules, removal, first model): "
        "compute only the explainers it lacks, add or replace their rows, and rewrite the file "
        "after each explainer, so an interrupted run resumes",
    )
    parser.add_argument(
        "--recompute",
        action="store_true",
        help="with --merge: compute the explainers named even where the file has them (same "
        "settings), replacing their rows",
    )
    add_arguments(parser, FaithfulnessSettings)
    add_explainer_settings(
        parser.add_argument_group("explainer settings", "for the explainers that take them"), set()
    )


def run(args: argparse.Namespace) -> None:
    from workbench.analysis.faithfulness_report import (
        MAX_REPORT_BYTES,
        check_report,
        explainer_faithfulness,
        format_faithfulness,
    )
    from workbench.core.files import check_output_file, json_text, write_output_file

    if args.merge and not args.json:
        raise WorkbenchError("--merge needs --json FILE: the report to extend")
    if args.recompute and not args.merge:
        raise WorkbenchError("--recompute replaces rows of a --merge FILE: give --merge")
    previous = None
    if args.json:  # before the minutes of explaining
        path = check_output_file(args.json, "--json")
        if args.merge and path.is_file():
            previous = read_json_file(path, MAX_REPORT_BYTES, "--json")

    def write(report: dict) -> None:
        if args.json:
            write_output_file(args.json, json_text(report), "--json")

    settings = from_arguments(FaithfulnessSettings, args)
    report = explainer_faithfulness(
        args.runs,
        settings,
        explainer_choices(args, settings.names()),
        notify=note,
        previous=previous,
        checkpoint=write if args.merge else lambda report: None,
        recompute=args.recompute,
    )
    print(format_faithfulness(check_report(report)))
    write(report)
