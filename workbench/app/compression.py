"""Compression: what a student buys. The teacher and its students measured by ``kdw benchmark``
(:func:`workbench.analysis.benchmark.benchmark`) when asked: parameters, weights on disk, latency at
batch 1 and throughput at the largest batch, each as a ratio to the teacher, beside the task
metrics and the students' loyalty to the teacher, as a table and as a scatter of a metric
against latency where a click shows the run behind a point."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
import streamlit as st

from workbench.analysis.benchmark import BenchmarkSettings, benchmark
from workbench.app import common
from workbench.app.catalog import RunEntry
from workbench.app.figures import compression_scatter
from workbench.core.config import DataConfig, config_key, from_dict
from workbench.core.machine import describe
from workbench.core.models import quiet_library_output

KEY = "compression"
REPORTS = "compression.reports"  # session key: the reports measured, by what was measured
LOYALTY = ("label_loyalty", "probability_loyalty")
SAMPLE = 64  # examples timed and scored by default


@st.cache_data(show_spinner=False, max_entries=8)
def _measure(models: tuple[tuple[str, int], ...], settings_json: str, data_json: str) -> dict:
    """The benchmark of the models (their paths and :meth:`RunEntry.stamp`, so new weights are
    measured anew), computed once per server for these settings."""
    quiet_library_output()
    data = from_dict(DataConfig, json.loads(data_json)) if data_json else None
    settings = from_dict(BenchmarkSettings, json.loads(settings_json))
    return benchmark([path for path, _ in models], settings, data)


def _same(source: str, path: Path) -> bool:
    return Path(source).resolve() == Path(path).resolve()


def methods_of(report: dict, entries: Sequence[RunEntry]) -> dict[str, str]:
    """Each row's method by its ``source``, from the run record of the entry at that path (a
    model the workbench did not train: where it came from)."""
    return {
        row["source"]: entry.method or entry.origin or "model"
        for row in report["rows"]
        for entry in entries
        if _same(row["source"], entry.path)
    }


def compression_table(report: dict, methods: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The report as a table, one row per model and engine: size, latency at batch 1 and
    throughput at the largest batch, each with its ratio to the first model (the teacher),
    then the task metrics and the loyalty to the teacher."""
    methods = methods or {}
    settings = report["settings"]
    largest = max(settings["batch_sizes"])
    measures = [
        ("parameters", "parameters"),
        ("disk_mb", "MB on disk"),
        ("latency_ms_median", "latency ms (median, batch 1)"),
        ("latency_ms_p95", "latency ms (p95, batch 1)"),
        (f"throughput_b{largest}", f"examples/s (batch {largest})"),
    ]
    rows = []
    for row in report["rows"]:
        shown = {
            "model": row["name"],
            "engine": row["engine"],
            "method": methods.get(row["source"], "–"),
        }
        for field, label in measures:
            if field in row:
                shown[label] = row[field]
                shown[f"{label} ×"] = row.get(f"{field}_ratio")
        for metric in (*settings["metrics"], *LOYALTY):
            if metric in row:
                shown[metric.replace("_", " ")] = row[metric]
        rows.append(shown)
    return pd.DataFrame(rows)


def _settings_caption(report: dict) -> str:
    """What the benchmark did and on what, for Markdown (names and the machine escaped)."""
    settings, machine = report["settings"], report["machine"]
    plain = common.plain
    return (
        f"Measured on {settings['examples']} texts of {settings['split']}, batch sizes "
        f"{', '.join(map(str, settings['batch_sizes']))}: {settings['warmup']} warm-up and "
        f"{settings['repeats']} timed rounds, each timing every model in turn, on "
        f"{settings['threads']} torch threads ({plain(settings['device'])}, "
        f"{plain(machine['cuda'] or describe(machine))}, torch "
        f"{plain(machine['versions']['torch'])}). Ratios "
        f"(×) are to the first model, {plain(report['reference'])}; latency excludes "
        "tokenisation. The app's own process measures, so other work on the machine shows in "
        "the timings."
    )


def _details(entry: RunEntry | None, row: dict) -> None:
    """The run behind a clicked point: its method, layers, size and record."""
    st.subheader(f"{row['name']} ({row['engine']})")
    if entry is None:
        st.text(row["source"])
        return
    config = common.load(entry).model.config
    facts = {
        "kind": entry.kind or "–",
        "method": entry.method or entry.origin or "–",
        "layers": getattr(config, "num_hidden_layers", "–"),
        "hidden size": getattr(config, "hidden_size", "–"),
        "parameters": f"{row['parameters']:,}",
    }
    st.dataframe(pd.DataFrame([facts]), hide_index=True)
    st.caption(common.plain(entry.path))
    if entry.info is not None:
        with st.expander("its configs and results"):
            st.json(entry.info.configs, expanded=1)
            if entry.results():
                st.json(entry.results(), expanded=1)


def render() -> None:
    st.title("Compression")
    st.caption(
        "What a student buys: its size and speed beside the teacher's (kdw benchmark), with its "
        "accuracy and its loyalty to the teacher. Measured only when asked."
    )
    picked = common.teacher_and_students(KEY)
    if picked is None:
        return
    teacher, students = picked
    defaults = BenchmarkSettings()
    left, right = st.columns(2)
    split = common.split_choice(KEY, left)
    help_text = (
        f"texts timed and scored; batch sizes {defaults.batch_sizes}, {defaults.warmup} "
        f"warm-up and {defaults.repeats} timed rounds"
    )
    examples, _ = common.sample_size(right, KEY, teacher, split, SAMPLE, help_text)
    settings = BenchmarkSettings(split=split, examples=examples)
    alone = (
        "its size and speed need them: the students are measured alone (ratios and loyalty to "
        "the first)"
    )
    entries = students if common.weightless(teacher, alone) else [teacher, *students]
    data = common.load(teacher).data if teacher.kind == "model" else None
    models = tuple((str(e.path), e.stamp()) for e in entries)
    request = (models, config_key(settings), config_key(data) if data else "")
    reports = st.session_state.setdefault(REPORTS, {})
    if st.button("Measure size and speed", key=f"{KEY}.measure", type="primary"):
        with st.spinner(f"Timing {len(entries)} models on {examples} texts…"):
            reports[json.dumps(request)] = _measure(*request)
    report = reports.get(json.dumps(request))
    if report is None:
        st.info(
            "Press Measure size and speed to time these models (seconds to minutes: every "
            "model runs every text at each batch size, once per round)."
        )
        return
    methods = methods_of(report, entries)
    st.dataframe(compression_table(report, methods), hide_index=True)
    st.caption(_settings_caption(report))
    rows = report["rows"]
    metrics = [m for m in (*report["settings"]["metrics"], *LOYALTY) if m in rows[0]]
    metric = st.selectbox(
        "Plotted against latency",
        metrics,
        format_func=lambda m: m.replace("_", " "),
        key=f"{KEY}.metric",
    )
    st.caption("Click a point to see its run.")
    chosen = common.selected_points(
        compression_scatter(report, metric, methods), f"{KEY}.scatter", "points"
    )
    if chosen:
        row = rows[chosen[0]]
        entry = next((e for e in entries if _same(row["source"], e.path)), None)
        _details(entry, row)


if __name__ == "__main__":
    common.run_page(render)
