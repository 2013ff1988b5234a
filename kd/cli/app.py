"""``kdw app``: start the workbench's Streamlit app. The app's module is run in place of this
process, never imported: the CLI stays below the app's layer."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from kd.cli.common import positive_int


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "app",
        help="open the workbench in the browser (Streamlit)",
        description="Start the workbench's app from the installed package (the same as "
        "streamlit run app.py in a clone). Streamlit's own options go to streamlit run as it "
        "takes them (kdw app --server.headless true --server.address 127.0.0.1), as do the "
        "options after --.",
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


def streamlit_last(argv: Sequence[str]) -> list[str]:
    """``kdw app``'s command line with Streamlit's own options moved after ``--``, where the
    app hands them to ``streamlit run``: an option named ``--section.name`` (Streamlit's
    configuration options all are), given as ``--server.headless true`` or
    ``--server.headless=true``, so that ``kdw app`` takes them as ``streamlit run`` does."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    ours, theirs, i = [], [], 0
    while i < cut:
        word = argv[i]
        if word.startswith("--") and "." in word.split("=", 1)[0]:
            takes_value = "=" not in word and i + 1 < cut
            theirs += argv[i : i + 1 + takes_value]
            i += 1 + takes_value
        else:
            ours.append(word)
            i += 1
    rest = argv[cut + 1 :]
    return ours + (["--", *theirs, *rest] if theirs or rest else [])


def run(args: argparse.Namespace) -> None:
    if args.runs:
        os.environ["KDW_RUNS"] = os.pathsep.join(str(Path(r).resolve()) for r in args.runs)
    options = [f"--server.port={args.port}"] if args.port else []
    extra = args.streamlit[1:] if args.streamlit[:1] == ["--"] else args.streamlit
    os.execv(sys.executable, [sys.executable, "-m", "workbench.app.serve", *options, *extra])
