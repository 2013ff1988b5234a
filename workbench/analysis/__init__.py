"""Analysis: attribution (attribution/), loyalty over a split (loyalty), agreement, faithfulness
and its report, layer geometry, metrics, evaluation, paired statistics, heatmaps of runs, the
baseline, divergence, the benchmark and deployment. It imports neither distillation (kd) nor the
front ends.

What a user explains and compares runs with is importable from here (:mod:`.heatmaps`); it is
imported when first asked for, so that importing the package loads neither torch nor
transformers."""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "Example": "workbench.analysis.heatmaps",
    "HeatmapSettings": "workbench.analysis.heatmaps",
    "agreement": "workbench.analysis.heatmaps",
    "explain": "workbench.analysis.heatmaps",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_NAMES[name]), name)
