"""The command line, ``kdw`` (``kd.cli:main``, or ``python -m kd.cli``): its parser and
commands are in :mod:`kd.cli.commands`.

The names are imported when first asked for, so that importing the package loads nothing but
itself."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["build_parser", "config_defaults", "main", "reproduce_suite"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("kd.cli.commands"), name)
