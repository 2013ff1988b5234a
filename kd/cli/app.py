"""``kdw app``: start the workbench's Streamlit app. The app's module is run in place of this
process, never imported: the CLI stays below the app's layer."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kd.cli.common import positive_int


def add(commands: argparse._SubParsersAction) -> None:
    """``kdw app``'s parser, added to ``commands``."""
    parser = commands.add_parser(
        "app",
        help="open the workbench in the browser (Streamlit)",
        description="Start the workbench's app from the installed package (the same as "
        "streamlit run app.py in a clone). Options after -- go to streamlit run, e.g. "
        "kdw app -- --server.address 127.0.0.1.",
    )
    parser.add_argument(
        "--runs",
        nargs="+",
        metavar="DIR",
        help="the runs roots: each folder's runs are listed, the first is where the app trains "
        "(default: $KDW_RUNS, folders separated by ':', or runs/)",
    )
    parser.add_argument("--port", type=positive_int, help="the server's port")
    parser.add_argument(
        "--headless", action="store_true", help="do not open a browser (on a server)"
    )
    parser.add_argument("streamlit", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> None:
    if args.runs:
        os.environ["KDW_RUNS"] = os.pathsep.join(str(Path(r).resolve()) for r in args.runs)
    options = [f"--server.port={args.port}"] if args.port else []
    extra = args.streamlit[1:] if args.streamlit[:1] == ["--"] else args.streamlit
    os.execv(sys.executable, [sys.executable, "-m", "workbench.app.serve", *options, *extra])
