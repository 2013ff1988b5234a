"""``kdw export``: token attribution heatmaps of runs, as files (SVG, PDF, PNG, LaTeX, HTML)."""

from __future__ import annotations

import argparse

from kd.cli.common import add_explainer, add_sources, note, text_sources
from workbench.analysis.explanations import HeatmapSettings
from workbench.analysis.heatmap_export import ExportSettings
from workbench.core.config import add_arguments, from_arguments


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export",
        help="token attribution heatmaps of runs, as files",
        description="Explain texts (typed, from a CSV/JSONL file, or examples of a split) under "
        "one or more runs and write one heatmap per example, a row per run, as SVG, PDF, PNG, "
        "LaTeX and HTML, with the settings, model names and run ids embedded in each file "
        "(with --anonymous, for double-blind review, the models' roles and no path or run id). "
        "A previous export in --out is replaced as a whole set (its heatmap-NNN files go, other "
        "files stay). Each file states whether its text was truncated to the model's maximum "
        "length; texts cut short, and characters no installed font can draw in PNG/PDF, are "
        "also reported on stderr.",
    )
    add_sources(parser, "explain")
    for cls in (HeatmapSettings, ExportSettings):
        add_arguments(parser, cls)
    add_explainer(parser)


def run(args: argparse.Namespace) -> None:
    from workbench.analysis.heatmap_export import export_runs

    settings = (from_arguments(cls, args) for cls in (HeatmapSettings, ExportSettings))
    paths = export_runs(args.runs, args.out, *settings, notify=note, **text_sources(args))
    print("\n".join(str(path) for path in paths))
