"""The app on a teacher that is only a cache (``kdw cache``): a student distilled from it is
listed with the cache as its teacher, the Loyalty page scores both on the logits the cache holds
(as ``kdw evaluate`` does), the pages that need the teacher's weights show the students alone,
and a cache folder the app cannot use is one line in the sidebar."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kd.cli import main
from kd.methods.config import ObjectiveConfig
from kd.training.config import StudentConfig, TeacherConfig
from kd.training.evaluate import evaluate_runs
from kd.training.pipeline import distill, train_teacher
from tests.app.test_app import _charts, _html, _ok, app_on, tiny_optim
from tests.conftest import write_tiny_workspace
from workbench.app.catalog import CACHE, discover_runs
from workbench.core.config import DataConfig

CACHE_NAME, STUDENT = "cache", "from-cache"


@pytest.fixture(scope="module")
def cache_runs(tmp_path_factory) -> Path:
    """A runs root holding a teacher cache of a tiny teacher run (trained elsewhere, then
    removed: no weights on this machine), a student distilled from the cache, and a damaged
    cache folder."""
    work = tmp_path_factory.mktemp("app-cache")
    root = work / "runs"
    write_tiny_workspace(work)
    data = DataConfig(task=str(work / "task"), max_length=16)
    teacher = train_teacher(
        data, TeacherConfig(model=str(work / "tiny-bert")), tiny_optim(0.2), work / "teacher"
    )
    task = ["--task", str(work / "task"), "--max-length", "16"]
    student = ["--preset", "kd", "--init", "random", "--num-layers", "2"]
    out = ["--out", str(root / CACHE_NAME)]
    assert main(["cache", "--teacher", str(teacher.path), *task, *student, *out]) == 0
    shutil.rmtree(teacher.path)
    distill(
        data,
        StudentConfig(teacher_cache=str(root / CACHE_NAME), init="random", num_layers=2),
        ObjectiveConfig(preset="kd"),
        tiny_optim(0.5),
        root / STUDENT,
    )
    (root / "damaged-cache").mkdir()
    (root / "damaged-cache" / "cache.json").write_text("{ not json")
    return root


@pytest.fixture
def app(cache_runs, monkeypatch) -> AppTest:
    return app_on(cache_runs, monkeypatch)


def test_a_cache_is_a_teacher_and_its_student_is_listed_under_it(cache_runs):
    entries = {e.name: e for e in discover_runs(cache_runs)}
    assert set(entries) == {CACHE_NAME, STUDENT, "damaged-cache"}
    assert entries[CACHE_NAME].kind == CACHE and entries[CACHE_NAME].usable
    assert entries[STUDENT].teacher == str(cache_runs / CACHE_NAME)
    assert entries[STUDENT].teacher_changed is None
    assert "damaged-cache" in entries["damaged-cache"].problem


def _captions(at: AppTest) -> list[str]:
    return [c.value.replace("\\", "") for c in at.caption]


def test_a_damaged_cache_is_one_line_in_the_sidebar(app):
    at = _ok(app.run())
    captions = [c.value.replace("\\", "") for c in at.sidebar.caption]
    problems = [c for c in captions if "damaged-cache:" in c]
    assert len(problems) == 1 and "cache.json" in problems[0]
    assert at.selectbox(key="case.teacher").options == [f"{CACHE_NAME} ({CACHE})"]


def test_a_student_whose_cache_holds_another_teacher_now_is_marked(cache_runs, tmp_path):
    """The cache a student learnt from, rebuilt since with another teacher: the student says
    its teacher changed (the cache's record against the student's pin)."""
    root = tmp_path / "runs"
    for name in (CACHE_NAME, STUDENT):
        shutil.copytree(cache_runs / name, root / name)
    record = json.loads((root / CACHE_NAME / "cache.json").read_text())
    record["teacher"]["weights"] = "0" * len(record["teacher"]["weights"])
    (root / CACHE_NAME / "cache.json").write_text(json.dumps(record))
    run = json.loads((root / STUDENT / "run.json").read_text())
    run["configs"]["student"]["teacher_cache"] = str(root / CACHE_NAME)
    (root / STUDENT / "run.json").write_text(json.dumps(run))
    entries = {e.name: e for e in discover_runs(root)}
    assert "its weights" in entries[STUDENT].teacher_changed
    unchanged = {e.name: e for e in discover_runs(cache_runs)}[STUDENT]
    assert unchanged.teacher_changed is None  # the cache it learnt from, as it was


@pytest.mark.parametrize("split", ["test", "dev"])
def test_the_loyalty_page_scores_students_on_the_caches_logits(app, cache_runs, split):
    at = _ok(app.run())
    at.switch_page("loyalty.py")
    _ok(at.run())
    assert at.selectbox(key="loyalty.teacher").value == CACHE_NAME
    assert at.multiselect(key="loyalty.students").value == [STUDENT]
    at.selectbox(key="loyalty.split").set_value(split)
    _ok(at.run())
    assert not at.error, [e.value for e in at.error]
    assert any(f"{CACHE_NAME} is a teacher cache" in c for c in _captions(at))
    table = at.dataframe[0].value
    rows = evaluate_runs([str(cache_runs / CACHE_NAME), str(cache_runs / STUDENT)], split)
    assert list(table.index) == [CACHE_NAME, STUDENT]
    assert table.loc[CACHE_NAME, "kind"] == CACHE
    for row in rows:
        for column, value in row.items():
            if column == "run":  # the table's index
                continue
            shown = table.loc[row["run"], column]
            if isinstance(value, float):  # the app computes on 1 thread: float32 rounding
                assert shown == pytest.approx(value, abs=1e-6), column
            elif value is not None:
                assert shown == value, column
    assert 0 <= table.loc[STUDENT, "label_loyalty"] <= 1


def test_the_pages_that_need_the_teachers_weights_show_the_student_alone(app):
    at = _ok(app.run())  # the case study: the student's map, the cache said in one caption
    assert not at.error, [e.value for e in at.error]
    assert _html(at).count('class="kdw-row"') == 1
    assert list(at.dataframe[0].value.index) == [STUDENT]
    assert sum(f"{CACHE_NAME} is a teacher cache" in c for c in _captions(at)) == 1
    at.radio(key="case.source").set_value("Pick from a split")
    _ok(at.run())
    assert at.selectbox(key="case.filter").options == ["all examples"]
    at.switch_page("geometry.py")
    _ok(at.run())
    assert not at.error, [e.value for e in at.error]
    assert any(f"{CACHE_NAME} is a teacher cache" in c for c in _captions(at))
    distances = _charts(at)["geometry.distances"]
    assert [a["text"] for a in distances["layout"]["annotations"]][:1] == ["student layer 2"]
    at.switch_page("divergence.py")
    _ok(at.run())
    assert not at.error and any(f"{CACHE_NAME} is a teacher cache" in c for c in _captions(at))


def test_a_student_added_from_outside_brings_its_cache(cache_runs, tmp_path, monkeypatch):
    root = tmp_path / "runs"
    root.mkdir()
    at = _ok(app_on(root, monkeypatch).run())
    at.sidebar.text_input(key="models.source").set_value(str(cache_runs / STUDENT))
    _ok(at.run())
    cache = cache_runs / CACHE_NAME
    assert f"{cache_runs / STUDENT}: 2 listed ({STUDENT}, {cache})" in [
        c.value.replace("\\", "") for c in at.sidebar.caption
    ]
    assert at.selectbox(key="case.teacher").options == [f"{cache} ({CACHE})"]
    assert at.multiselect(key="case.students").value == [STUDENT]


@pytest.mark.slow  # a cache of a tiny Llama teacher and a student from it: seconds
def test_an_llm_teachers_cache_is_listed_with_its_student_and_loyalty(tmp_path, monkeypatch):
    """The LLM walk in small: a Llama classifier's cache, a student of another tokenizer
    distilled from it, both listed in the app, the cache's row and the student's on Loyalty. A
    real LLM's embedding stage is a small share of its weights, as a tiny model's is without the
    check's spare parameters."""
    import workbench.core.verify as verify
    from tests.tiny_families import save_family_model

    monkeypatch.setattr(verify, "SPARE_PARAMETERS", 0)
    write_tiny_workspace(tmp_path)
    save_family_model("llama", tmp_path / "llama", ["negative", "neutral", "positive"], seed=1)
    root = tmp_path / "runs"
    task = ["--task", str(tmp_path / "task"), "--max-length", "16", "--preset", "kd"]
    student = ["--init", "pretrained", "--pretrained", str(tmp_path / "tiny-bert")]
    cache = ["cache", "--teacher", str(tmp_path / "llama"), *task, *student]
    assert main([*cache, "--out", str(root / "llama-cache")]) == 0
    optim = ["--epochs", "0.3", "--batch-size", "16", "--threads", "1"]
    distill = ["distill", "--teacher-cache", str(root / "llama-cache"), *task, *student, *optim]
    assert main([*distill, "--run-dir", str(root / "student")]) == 0
    entries = {e.name: e for e in discover_runs(root)}
    assert entries["llama-cache"].usable, entries["llama-cache"].problem
    at = _ok(app_on(root, monkeypatch).run())
    at.switch_page("loyalty.py")
    _ok(at.run())
    assert at.selectbox(key="loyalty.teacher").value == "llama-cache"
    assert at.multiselect(key="loyalty.students").value == ["student"]
    assert list(at.dataframe[0].value.index) == ["llama-cache", "student"]
