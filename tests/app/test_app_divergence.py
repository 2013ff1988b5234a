"""The "Where explanations diverge" page, driven with ``AppTest`` on tiny runs (a teacher and two
students): its charts and tables, the second visit from the cache, and clear messages for a
student whose tokenizer differs and for a run folder that disappears."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from transformers import AutoTokenizer, BertTokenizerFast

from tests.app.test_app import APP, STUDENTS, build_tiny_runs

PAGE = "workbench/app/divergence.py"


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
    at = _page(root, monkeypatch)
    assert any("tokenises the texts differently" in e.value for e in at.error)
    shutil.rmtree(root / STUDENTS[1])
    shutil.rmtree(root / STUDENTS[0])
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.error or at.info
