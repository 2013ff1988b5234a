"""The "Where explanations diverge" page, driven with ``AppTest`` on tiny runs (a teacher and two
students): its charts and tables, the second visit from the cache, the explainer chosen (its
values equal the library's called with that explainer), and clear messages for a student whose
tokenizer differs and for a run folder that disappears."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest
from transformers import AutoTokenizer, BertTokenizerFast

from tests.app.test_app import APP, STUDENTS, build_tiny_runs, decoded
from workbench.analysis.attribution import ExplainerChoice
from workbench.analysis.explanation_divergence import divergence, word_table
from workbench.analysis.settings import DivergenceSettings
from workbench.core.data import load_task
from workbench.core.models import load_model

PAGE = "divergence.py"


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("divergence")
    build_tiny_runs(work / "runs", work)
    return work / "runs"


def _page(root: Path, monkeypatch) -> AppTest:
    monkeypatch.setenv("KDW_RUNS", str(root))
    monkeypatch.setenv("KDW_DEMO", "off")
    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page(PAGE).run()
    chosen = at.multiselect(key="divergence.students")
    if chosen.value != list(STUDENTS):  # not the teacher's own students (a copied folder)
        chosen.set_value(list(STUDENTS)).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.slow
def test_the_page_shows_the_scatter_the_tables_and_the_histograms(tiny_runs, monkeypatch):
    at = _page(tiny_runs, monkeypatch)
    assert at.title[0].value == "Where explanations diverge"
    assert not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) == 2  # the word scatter and the histograms
    assert len(at.dataframe) == 3  # over-, under-attributed words, the examples
    assert "examples of the test split" in at.caption[0].value
    assert "computed now for teacher" in at.caption[0].value
    at.radio(key="divergence.scope").set_value(at.radio(key="divergence.scope").options[1]).run()
    assert not at.exception and len(at.dataframe) == 3
    again = _page(tiny_runs, monkeypatch)  # a second visit: nothing is computed
    assert "kept from an earlier visit" in again.caption[0].value


def test_bad_runs_give_a_message_not_a_traceback(tiny_runs, tmp_path, monkeypatch):
    root = tmp_path / "runs"
    shutil.copytree(tiny_runs, root)
    model = root / STUDENTS[1] / "model"
    vocab = list(AutoTokenizer.from_pretrained(model).get_vocab())
    reordered = [*vocab[:5], *reversed(vocab[5:])]
    BertTokenizerFast(vocab={t: i for i, t in enumerate(reordered)}).save_pretrained(model)
    at = _page(root, monkeypatch)  # a student of another tokenizer: compared on words
    assert not at.exception and not at.error, [e.value for e in at.error]
    shutil.rmtree(root / STUDENTS[1])
    shutil.rmtree(root / STUDENTS[0])
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.error or at.info


@pytest.mark.slow
def test_the_chosen_explainer_makes_the_maps_the_tables_and_the_titles(
    tiny_runs, tmp_path, monkeypatch
):
    at = _page(tiny_runs, monkeypatch)
    by_ig = at.dataframe[2].value.set_index("example")
    at.selectbox(key="divergence.settings.explainer").set_value("occlusion").run()
    at.number_input(key="divergence.settings.occlusion.window").set_value(2)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert r"by Occlusion \(window 2, stride 1\)" in at.caption[0].value  # Markdown-escaped
    charts = {e.proto.id.split("-", 2)[2]: json.loads(e.proto.spec) for e in at.get("plotly_chart")}
    scatter = charts["divergence.scatter"]
    assert "Occlusion (window 2, stride 1)" in scatter["layout"]["title"]["text"]
    assert "Occlusion" in charts["divergence.histograms"]["layout"]["title"]["text"]
    shown = at.dataframe[2].value.set_index("example").sort_index()
    # the library called directly, on copies of the runs (nothing read from the page's caches)
    copies = tmp_path / "copies"
    names = ("teacher", *STUDENTS)
    for name in names:
        shutil.copytree(tiny_runs / name, copies / name, ignore=shutil.ignore_patterns("analysis*"))
    loaded = [load_model(str(copies / name)) for name in names]
    choice = ExplainerChoice("occlusion", {"window": 2})
    split = load_task(loaded[0].data).splits["test"]
    direct = divergence(loaded[0], loaded[1:], split, DivergenceSettings(), explainer=choice)
    assert direct.computed == ["teacher", *STUDENTS]
    expected = direct.examples
    for column in ("teacher comprehensiveness", "student-kd sufficiency", "student-kd gap"):
        np.testing.assert_allclose(shown[column], expected[column].loc[shown.index], atol=1e-6)
    assert not np.allclose(shown["student-kd gap"], by_ig.loc[shown.index, "student-kd gap"])
    words = word_table(direct, "student-kd")
    np.testing.assert_allclose(decoded(scatter["data"][0]["x"]), words["teacher"], atol=1e-6)
    np.testing.assert_allclose(decoded(scatter["data"][0]["y"]), words["student-kd"], atol=1e-6)
