"""``python -m workbench.app.serve [streamlit options]``: the workbench's server from the
installed package (what ``kdw app`` runs), with the clone's server settings
(:data:`workbench.app.SERVER_OPTIONS`); options given override them."""

import os
import sys
from pathlib import Path

from workbench.app import SERVER_OPTIONS


def command(options: list[str]) -> list[str]:
    """The ``streamlit run`` command line of the server beside this module."""
    script = Path(__file__).resolve().with_name("server.py")
    defaults = [f"--{key}={str(value).lower()}" for key, value in SERVER_OPTIONS.items()]
    return [sys.executable, "-m", "streamlit", "run", str(script), *defaults, *options]


if __name__ == "__main__":
    os.execv(sys.executable, command(sys.argv[1:]))  # the server replaces this process
