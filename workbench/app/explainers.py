"""Which explainer to trust: for a model, the registered explainers ranked by faithfulness, AOPC
comprehensiveness (higher: better) and sufficiency (lower: better) with their 95 % bootstrap
intervals and the cost per example, as a table and a bar chart; explainers whose intervals overlap
are ties (:func:`workbench.analysis.faithfulness_report.explainer_ranking`). The ranking comes from
a ``kdw faithfulness`` JSON file the user names, or from a report computed on a small sample by a
background job (:mod:`workbench.app.jobs`, the runner's ``faithfulness`` kind), which writes its
report after each explainer and resumes where it stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from workbench.analysis.attribution.registry import EXPLAINERS, get_explainer
from workbench.analysis.faithfulness_report import (
    AOPC_MEASURES,
    MAX_REPORT_BYTES,
    FaithfulnessReport,
    check_report,
    explainer_ranking,
)
from workbench.analysis.settings import FaithfulnessSettings
from workbench.app import common
from workbench.app.catalog import RunEntry, runs_root
from workbench.app.forms import config_widgets
from workbench.app.jobs import job_for, launch
from workbench.app.runner import FAITHFULNESS, REPORT_FILE
from workbench.core.cache import key_digest
from workbench.core.config import to_dict
from workbench.core.errors import WorkbenchError
from workbench.core.files import read_json_file
from workbench.core.runs import Run

KEY = "explainers"
IN_APP, FROM_FILE = "computed in the app", "a kdw faithfulness JSON file"
REPORTS = "faithfulness"  # under a run's analysis_cache/: one folder per job
# a small sample, every explainer
SAMPLE = FaithfulnessSettings(explainers=",".join(EXPLAINERS), examples=20, resamples=2000)
LABELS = {"comprehensiveness": "comprehensiveness ↑", "sufficiency": "sufficiency ↓"}


def reports_folder(entry: RunEntry) -> Path:
    """Where the app's faithfulness jobs for a run keep their reports."""
    return Run(entry.path).analysis_dir / REPORTS


def _describe(report: FaithfulnessReport) -> str:
    settings = report.settings
    return (
        f"{report.examples} {settings.split} examples, {settings.explainers}, "
        f"{settings.rules} rules, removal {settings.removal}"
    )


def _compute(entry: RunEntry) -> None:
    """Settings for a report on a small sample and a button that starts it in the background;
    a job running for the run shows its last output."""
    settings = config_widgets(FaithfulnessSettings, f"{KEY}.compute", SAMPLE, columns=4)
    # each explainer with its default settings
    configs = {"runs": [str(entry.path)], "settings": to_dict(settings), "explainers": {}}
    folder = reports_folder(entry) / key_digest({"run": entry.key(), **configs})
    job = job_for(runs_root(), folder)
    if job is not None and job.alive:
        st.info("Computing in the background; the table shows each explainer once it is done.")
        st.code(job.log_tail(5) or "starting…", language=None)
        st.button("Refresh", key=f"{KEY}.refresh")
        return
    if st.button("Compute in the background", type="primary", key=f"{KEY}.launch"):
        for name in settings.names():  # an unknown explainer: a one-line error, no job
            get_explainer(name)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"faithfulness-{entry.name}-{folder.name}"
        launch(runs_root(), name, FAITHFULNESS, folder, json.dumps(configs))
        st.rerun()
    if job is not None and not (folder / REPORT_FILE).exists():
        st.warning(common.plain(f"The last computation stopped: {job.log_tail(1)}"))


def _app_report(entry: RunEntry) -> FaithfulnessReport | None:
    """A report the app computed for the run, chosen among them (None before there is one)."""
    with st.expander("Compute a ranking on a sample", expanded=False):
        _compute(entry)
    found = sorted(reports_folder(entry).glob(f"*/{REPORT_FILE}"), key=lambda p: p.stat().st_mtime)
    if not found:
        st.info("No ranking computed for this run yet: compute one above, or read a file.")
        return None
    reports = {str(p): check_report(read_json_file(p, MAX_REPORT_BYTES, "report")) for p in found}
    chosen = st.selectbox(
        "Report",
        list(reversed(reports)),
        format_func=lambda p: _describe(reports[p]),
        key=f"{KEY}.report",
    )
    return reports[chosen]


def _file_report() -> FaithfulnessReport | None:
    path = st.text_input(
        "Report file", key=f"{KEY}.path", help="the --json file of kdw faithfulness"
    ).strip()
    if not path:
        st.info("Name a report written by kdw faithfulness --json.")
        return None
    return check_report(read_json_file(path, MAX_REPORT_BYTES, "report"))


def ranking_figure(ranking: pd.DataFrame, title: str) -> go.Figure:
    """Per AOPC measure a bar per explainer (the ranking's order) with its 95 % interval; a
    bar's label is its rank, ``=`` marking a rank shared by overlapping intervals."""
    figure = make_subplots(1, 2, subplot_titles=[LABELS[m] for m in AOPC_MEASURES])
    for column, measure in enumerate(AOPC_MEASURES, start=1):
        ranks = ranking[f"{measure} rank"]
        shared = ranks.duplicated(keep=False)
        figure.add_trace(
            go.Bar(
                x=ranking["explainer"],
                y=ranking[measure],
                error_y={
                    "type": "data",
                    "array": (ranking[f"{measure} high"] - ranking[measure]).tolist(),
                    "arrayminus": (ranking[measure] - ranking[f"{measure} low"]).tolist(),
                },
                text=[f"={r}" if s else str(r) for r, s in zip(ranks, shared, strict=True)],
                name=LABELS[measure],
                showlegend=False,
                hovertemplate="%{x}: %{y:.4f}, rank %{text}<extra></extra>",
            ),
            1,
            column,
        )
    return figure.update_layout(title=title, height=380, margin={"t": 80})


def _show(report: FaithfulnessReport) -> None:
    models = [m.name for m in report.models]
    model = st.selectbox("Model", models, key=f"{KEY}.model")
    ranking = explainer_ranking(report, model)
    st.subheader(f"Explainers ranked by faithfulness to {model}")
    st.dataframe(ranking.style.format(precision=4, na_rep="—"), hide_index=True, key=f"{KEY}.table")
    if ranking[[f"{m} low" for m in AOPC_MEASURES]].isna().any(axis=None):
        st.caption("A row without an interval is compared by its mean alone.")
    title = f"Faithfulness to {model}: {_describe(report)}; overlapping intervals tie"
    st.plotly_chart(ranking_figure(ranking, title), key=f"{KEY}.chart")
    st.caption(
        common.plain(
            "AOPC over the top 10-50 % of tokens: comprehensiveness, the drop of the predicted "
            "class's probability when they are removed (higher: they matter); sufficiency, its "
            "drop when only they are kept (lower: they suffice). Bars: 95 % bootstrap intervals "
            "of the means over the examples. Rank: 1 + the explainers whose interval lies wholly "
            "on the better side; explainers whose intervals overlap tie (=). Seconds per "
            "example were measured under the load average shown: compare them within a report."
        )
    )


def render() -> None:
    st.title("Which explainer to trust")
    left, right = st.columns(2)
    source = left.radio("Ranking", [IN_APP, FROM_FILE], horizontal=True, key=f"{KEY}.source")
    try:
        if source == FROM_FILE:
            report = _file_report()
        else:
            entries = [e for e in common.runs() if e.kind in ("teacher", "student") and e.usable]
            if not entries:
                st.info("No trained run yet: the first-run demo build or the Train page makes one.")
                return
            by_path = {str(e.path): e for e in entries}  # two runs may share a folder name
            path = right.selectbox(
                "Run", list(by_path), format_func=lambda p: by_path[p].label, key=f"{KEY}.run"
            )
            report = _app_report(by_path[path])
    except WorkbenchError as error:
        st.error(common.plain(error))
        return
    if report is not None:
        _show(report)


if __name__ == "__main__":
    common.run_page(render)
