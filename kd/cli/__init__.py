"""The command line, ``kdw`` (``kd.cli:main``, or ``python -m kd.cli``): its parser and
commands are in :mod:`kd.cli.commands`.

The names are imported when first asked for, so that importing the package loads nothing but
itself."""

from __future__ import annotations

from workbench.core.lazy import lazy_names

__all__ = ["build_parser", "config_defaults", "main", "reproduce_suite"]

__getattr__ = lazy_names(__name__, dict.fromkeys(__all__, "kd.cli.commands"))
