"""The Compression page on tiny runs (a teacher and two 2-layer students): the benchmark's table
and scatter (its figure checked against the report it draws), measured only when the button is
pressed, and a click on a point showing the run behind it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.elements.plotly_chart import PlotlyState
from streamlit.testing.v1 import AppTest

from tests.app.test_app import APP, STUDENTS, build_tiny_runs
from workbench.analysis.benchmark import BenchmarkSettings, benchmark
from workbench.app.catalog import discover_runs
from workbench.app.compression import compression_table, methods_of
from workbench.app.figures import compression_scatter

PAGE = "compression.py"
MODELS = ("teacher", *STUDENTS)


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("compression")
    build_tiny_runs(work / "runs", work)
    return work / "runs"


@pytest.fixture(scope="module")
def report(tiny_runs) -> dict:
    settings = BenchmarkSettings(examples=8, batch_sizes="1,4", warmup=0, repeats=1, threads=1)
    return benchmark([str(tiny_runs / name) for name in MODELS], settings)


@pytest.mark.slow
def test_the_scatter_draws_the_reports_numbers(report, tiny_runs):
    entries = discover_runs(tiny_runs)
    methods = methods_of(report, entries)
    assert [methods[row["source"]] for row in report["rows"]] == ["finetune", "kd", "pkd-skip"]
    for metric in ("accuracy", "label_loyalty"):
        figure = compression_scatter(report, metric, methods)
        points = {
            index[0]: (x, y, hover)
            for trace in figure.data
            for index, x, y, hover in zip(
                trace.customdata, trace.x, trace.y, trace.hovertext, strict=True
            )
        }
        assert sorted(points) == [0, 1, 2]  # one point per model (one engine)
        for index, row in enumerate(report["rows"]):
            x, y, hover = points[index]
            assert x == row["latency_ms_median"] and y == row[metric]
            assert row["name"] in hover and f"method: {methods[row['source']]}" in hover
            assert "parameters:" in hover and "×)" in hover
    assert figure.layout.yaxis.title.text == "label loyalty"

    table = compression_table(report, methods)
    assert list(table["model"]) == list(MODELS)
    assert list(table["method"]) == ["finetune", "kd", "pkd-skip"]
    assert list(table["parameters"]) == [row["parameters"] for row in report["rows"]]
    assert table["parameters ×"].iloc[0] == 1.0 and table["parameters ×"].iloc[1] < 1
    assert list(table["examples/s (batch 4) ×"].notna()) == [True] * 3
    for column in ("accuracy", "macro f1", "label loyalty", "probability loyalty"):
        assert table[column].notna().all(), column


def test_the_page_measures_when_asked_and_shows_a_clicked_run(tiny_runs, monkeypatch):
    monkeypatch.setenv("KDW_RUNS", str(tiny_runs))
    monkeypatch.setenv("KDW_DEMO", "off")
    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("loyalty.py").run()
    assert not at.exception, [e.value for e in at.exception]
    links = [e.proto.page for e in at.get("page_link")]
    assert any(link.endswith("compression") for link in links), links  # reached from Loyalty
    at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Compression"
    assert set(at.multiselect(key="compression.students").value) == set(STUDENTS)
    assert not at.dataframe  # nothing is measured before the button is pressed
    examples = next(f for f in at.number_input if f.key.startswith("compression.examples"))
    assert (examples.value, examples.max) == (50, 50)  # the default 64, bounded by the split
    examples.set_value(6).run()
    at.button(key="compression.measure").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    table = at.dataframe[0].value
    assert list(table["model"]) == list(MODELS)
    assert list(table["method"]) == ["finetune", "kd", "pkd-skip"]
    caption = " ".join(c.value for c in at.caption)
    assert "texts of test" in caption and "1 warm-up and 5 timed rounds" in caption
    assert "torch threads" in caption
    charts = [json.loads(e.proto.spec) for e in at.get("plotly_chart")]
    assert sum(len(trace["x"]) for trace in charts[0]["data"]) == len(MODELS)
    at.selectbox(key="compression.metric").set_value("label_loyalty").run()  # a rerun: kept
    assert not at.exception and list(at.dataframe[0].value["model"]) == list(MODELS)
    selection = {"points": [{"customdata": [1]}], "point_indices": [1], "box": [], "lasso": []}
    at.session_state["compression.scatter"] = PlotlyState(selection=selection)  # a click
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.subheader[-1].value == "student-kd (pytorch fp32)"
    details = at.dataframe[1].value.iloc[0]
    assert details["method"] == "kd" and details["layers"] == 2 and details["kind"] == "student"
    assert list(at.dataframe[0].value["model"]) == list(MODELS)  # the report is kept
