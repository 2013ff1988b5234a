"""The command line, ``kdw`` (``kd.cli:main``, or ``python -m kd.cli``): fine-tune teachers, distil
students, evaluate runs, run the demo.

Every option comes from a config dataclass (built with :mod:`workbench.core.config`), so the CLI,
the Python API (:mod:`kd.training.pipeline`) and the app read the same settings. Problems with
the input end in one line on stderr and exit status 2; an interrupted training keeps its last
checkpoint and resumes when the same command is run again.

Each subcommand is a module of its own (docs/architecture.md), assembled by :mod:`kd.cli.commands`.
The names are imported when first asked for, so that importing the package loads only itself."""

from __future__ import annotations

from workbench.core.lazy import lazy_names

__all__ = ["build_parser", "config_defaults", "main", "reproduce_suite"]

__getattr__ = lazy_names(
    __name__,
    {
        "build_parser": "kd.cli.commands",
        "config_defaults": "kd.cli.common",
        "main": "kd.cli.commands",
        "reproduce_suite": "kd.cli.reproduce",
    },
)
