"""MkDocs hook (``hooks:`` in ``mkdocs.yml``): renders the ``kdw`` reference from the CLI's own
parser at build time, so that the reference lists exactly the options ``kdw --help`` has.

A page holding the line ``<!-- kdw-reference -->`` gets, in its place and instead of what
follows it (a note for readers of the file outside the site), one section per subcommand of
:func:`kd.cli.build_parser`: its description, its usage, and a table per option group (the
config dataclass the options come from, with the class's first docstring line).
"""

from __future__ import annotations

import argparse
import html
import re

import kd.methods.objective  # noqa: F401  (registers the lists that help texts name)
from kd.cli import build_parser
from workbench.core.config import fill_help

MARKER = "<!-- kdw-reference -->"
USAGE_WIDTH = 76  # the width of the page's code blocks
UNTITLED = ("positional arguments", "options")  # argparse's own groups


def _text(value: str) -> str:
    """Help text as Markdown table-cell text: HTML and Markdown's special characters escaped,
    white space collapsed."""
    escaped = html.escape(" ".join(value.split()), quote=False)
    return re.sub(r"([\\`*_|\[\]])", r"\\\1", escaped)


def _option(action: argparse.Action) -> str:
    """The option's spellings, with its value's name where it says more than the option's
    (``--quantize int8``, not ``--epochs EPOCHS``)."""
    if not action.option_strings:  # a positional argument
        return f"`{action.metavar or action.dest}`" + (" …" if action.nargs in ("+", "*") else "")
    names = ", ".join(f"`{name}`" for name in action.option_strings)
    if action.nargs == 0 or action.metavar in (None, action.dest.upper()):
        return names
    return f"{names} `{action.metavar}`"


def _values(action: argparse.Action) -> str:
    """What the option takes: its choices, the kind of its value, or nothing (a switch)."""
    if action.nargs == 0:
        return "switch"
    if action.choices:
        return ", ".join(f"`{choice}`" for choice in action.choices)
    kind = getattr(action.type, "__name__", "")
    return {"int": "integer", "float": "number", "positive_int": "integer ≥ 1"}.get(kind, "text")


def _table(actions: list[argparse.Action]) -> list[str]:
    rows = ["| option | values | what it sets |", "|---|---|---|"]
    for action in actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        required = " (required)" if action.required and action.option_strings else ""
        said = "default" in action.help or action.default in (None, False, argparse.SUPPRESS)
        default = "" if said or not action.option_strings else f" (default: {action.default})"
        cells = (
            _option(action) + required,
            _values(action),
            _text(fill_help(action.help) + default),
        )
        rows.append("| {} | {} | {} |".format(*cells))
    return rows if len(rows) > 2 else []


def subcommand(name: str, parser: argparse.ArgumentParser) -> str:
    """One subcommand's section of the reference, as Markdown."""
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)  # not the terminal's
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, "")
    usage = formatter.format_help().strip()
    lines = [f"## kdw {name}", "", _text(parser.description or ""), "", "```text", usage, "```"]
    untitled = [g for g in parser._action_groups if g.title in UNTITLED]
    own = [action for group in untitled for action in group._group_actions]
    lines += ["", *_table(own)]
    for group in (g for g in parser._action_groups if g.title not in UNTITLED):
        table = _table(group._group_actions)
        if table:  # a config dataclass's options, headed by the class and its docstring
            lines += ["", f"**{group.title}** — {_text(group.description or '')}", "", *table]
    return "\n".join(lines)


def reference() -> str:
    """Every ``kdw`` subcommand's section, in the order of ``kdw --help``."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return "\n\n".join(subcommand(name, sub) for name, sub in commands.choices.items())


def on_page_markdown(markdown: str, **kwargs) -> str:
    """MkDocs event: put the reference in place of :data:`MARKER` and what follows it."""
    if MARKER not in markdown:
        return markdown
    return markdown[: markdown.index(MARKER)] + reference() + "\n"
