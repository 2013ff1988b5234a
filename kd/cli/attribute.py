"""``kdw attribute``: token attributions of runs, saved as reloadable JSONL files."""

from __future__ import annotations

import argparse

from kd.cli.common import add_explainer, add_sources, text_sources
from workbench.analysis.attribution.registry import AttributionSettings
from workbench.core.config import add_arguments, from_arguments


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "attribute",
        help="token attributions of runs, saved reloadable (JSONL)",
        description="Attribute texts (typed, from a CSV/JSONL file, or examples of a split) "
        "under each run and write <out>/<run>.jsonl: tokens, maps per view, prediction, "
        "probabilities and settings per text "
        "(workbench.analysis.attribution.load_attributions reads it). "
        "Texts over --max-length tokens are truncated and flagged.",
    )
    add_sources(parser, "attribute")
    add_arguments(parser, AttributionSettings)
    add_explainer(parser)


def run(args: argparse.Namespace) -> None:
    from workbench.analysis.heatmap_export import attribute_runs

    settings = from_arguments(AttributionSettings, args)
    paths = attribute_runs(args.runs, args.out, settings, **text_sources(args))
    print("\n".join(str(path) for path in paths))
