"""The ``kdw`` parser, assembled from the subcommands' modules in the order ``kdw --help`` lists
them, and :func:`main`, which parses the command line and runs the subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kd.cli.app import streamlit_last
from kd.cli.common import Parser, check_local_models, check_local_task, config_defaults
from workbench.core.errors import WorkbenchError, one_line

# each subcommand's module (kdw train-teacher: kd.cli.train_teacher), in --help's order: its
# add(commands) adds the subcommand's parser to kdw's, its run(args) runs the parsed command
SUBCOMMANDS = [
    importlib.import_module(f"kd.cli.{name}")
    for name in (
        "train_teacher",
        "distill",
        "cache",
        "tune",
        "evaluate",
        "benchmark",
        "baseline",
        "demo",
        "methods",
        "app",
        "reproduce",
        "export",
        "attribute",
        "faithfulness",
        "export_model",
    )
]


def build_parser(distill_defaults: dict | None = None) -> argparse.ArgumentParser:
    """The ``kdw`` parser, ``distill_defaults`` (``--config``'s) replacing distill's defaults."""
    parser = Parser(
        prog="kdw", description="Distil BERT-style classifiers and see why each model decides."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add(commands)
    for module, command in zip(SUBCOMMANDS, commands.choices.values(), strict=True):
        command.set_defaults(handler=module.run)  # each runs its own module's run(args)
    commands.choices["distill"].set_defaults(**(distill_defaults or {}))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["app"]:  # Streamlit's own options, handed to streamlit run
        argv = streamlit_last(argv)
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "config", None):  # the file's settings become the defaults
            args = build_parser(config_defaults(args.config)).parse_args(argv)
        check_local_task(args)
        check_local_models(args)
        from workbench.core.models import quiet_library_output

        quiet_library_output()
        args.handler(args)
    except WorkbenchError as error:
        print(f"kdw: error: {one_line(str(error))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "kdw: interrupted; the run keeps its last checkpoint: run the same command to resume",
            file=sys.stderr,
        )
        return 130
    return 0
