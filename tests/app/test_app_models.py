"""The app on a teacher the workbench never trained: a RoBERTa classifier folder under the runs
root (and one added by its path in the sidebar), students distilled from it, every comparing
page, and a broken model folder listed with its problem in one line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kd.methods.config import ObjectiveConfig
from kd.training.config import StudentConfig
from kd.training.pipeline import distill
from tests.app.test_app import APP, _charts, _html, _ok, app_on, tiny_optim
from tests.conftest import make_sentences
from tests.tiny_families import save_family_model
from workbench.core.config import DataConfig

TEACHER = "my-classifier"
STUDENTS = ("from-folder-kd", "from-folder-pkd")


@pytest.fixture(scope="module")
def model_runs(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("app-models")
    root, task = work / "runs", work / "task"
    task.mkdir()
    frame = make_sentences(300)
    for name, part in (("train", frame[:200]), ("dev", frame[200:250]), ("test", frame[250:])):
        part.to_csv(task / f"{name}.csv", index=False)
    teacher = save_family_model("roberta", root / TEACHER, ["positive", "NEUTRAL", "negative"])
    data = DataConfig(task=str(task), max_length=16)
    for name, preset in zip(STUDENTS, ("kd", "pkd-skip"), strict=True):
        distill(
            data,
            StudentConfig(teacher=str(teacher), num_layers=2),
            ObjectiveConfig(preset=preset),
            tiny_optim(),
            root / name,
        )
    broken = root / "broken-model"
    shutil.copytree(teacher, broken)
    for file in broken.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens")):
            file.unlink()
    return root


@pytest.fixture
def app(model_runs, monkeypatch) -> AppTest:
    return app_on(model_runs, monkeypatch)


@pytest.mark.slow
def test_a_model_folder_is_a_teacher_and_a_broken_one_is_one_line(app):
    at = _ok(app.run())
    teacher = at.selectbox(key="case.teacher")
    assert f"{TEACHER} (model folder)" in teacher.options  # shown with where it came from
    teacher.set_value(TEACHER)
    _ok(at.run())
    assert set(at.multiselect(key="case.students").value) == set(STUDENTS)
    html = _html(at)
    assert html.count('class="kdw-row"') == 3  # the folder and its two students
    assert list(at.dataframe[0].value.index) == [TEACHER, *STUDENTS]
    problems = [c.value for c in at.sidebar.caption if "broken" in c.value]
    assert len(problems) == 1 and "has no tokenizer" in problems[0]
    # from a split of the students' task, through the folder applied to it
    at.radio(key="case.source").set_value("Pick from a split")
    _ok(at.run())
    at.selectbox(key="case.filter").set_value("teacher and a student disagree")
    _ok(at.run())
    assert "teacher" in at.dataframe[0].value.columns


@pytest.mark.slow
def test_loyalty_geometry_and_divergence_compare_with_a_model_folder(app):
    at = _ok(app.run())
    for page, key in (
        ("loyalty", "loyalty"),
        ("geometry", "geometry"),
        ("divergence", "divergence"),
    ):
        at.switch_page(f"{page}.py")
        _ok(at.run())
        at.selectbox(key=f"{key}.teacher").set_value(TEACHER)
        _ok(at.run())
        assert not at.error, (page, [e.value for e in at.error])
        if page == "loyalty":
            summary = at.dataframe[0].value
            assert list(summary.index) == ["teacher", *STUDENTS]
            assert all(0 <= float(v) <= 1 for v in summary.loc[list(STUDENTS), "LL"])
        if page == "geometry":
            assert "geometry.distances" in _charts(at)
        if page == "divergence":
            assert len(at.get("plotly_chart")) == 2


def test_a_model_added_by_its_path_is_listed(app, model_runs, tmp_path, monkeypatch):
    """A model folder typed into the sidebar is listed and compared; what loading a model notes
    (a decoder padded with its config's pad token) is shown on the page."""
    root = tmp_path / "runs"
    root.mkdir()
    monkeypatch.setenv("KDW_RUNS", str(root))
    at = _ok(AppTest.from_file(APP, default_timeout=300).run())
    at.sidebar.text_input(key="models.source").set_value(str(model_runs / TEACHER))
    _ok(at.run())
    teacher = at.selectbox(key="case.teacher")
    assert teacher.value == str(model_runs / TEACHER)
    assert teacher.options == [f"{model_runs / TEACHER} (model folder)"]
    assert _html(at).count('class="kdw-row"') == 1
    decoder = save_family_model("gpt2", tmp_path / "decoder", ["negative", "positive"])
    config = json.loads((decoder / "config.json").read_text())
    (decoder / "config.json").write_text(json.dumps({**config, "pad_token_id": 7}))
    at.sidebar.text_input(key="models.source").set_value(str(decoder))
    _ok(at.run())
    at.selectbox(key="case.teacher").set_value(str(decoder))
    _ok(at.run())
    assert (
        ":material/info: decoder: its tokenizer pads with id 0, its config's pad_token_id is 7 "
        "(the token its head reads past): batches are padded with 7"
    ) in [c.value.replace("\\", "") for c in at.caption]


def test_a_run_folder_added_from_outside_brings_its_teacher_and_stays(
    model_runs, tmp_path, monkeypatch
):
    """A student's run folder kept outside the runs root, added in the sidebar: its teacher (a
    model folder elsewhere, from the student's record) comes with it and they are compared; the
    addition survives a new session (a reload); a folder with nothing usable is one line."""
    root = tmp_path / "runs"
    root.mkdir()
    monkeypatch.setenv("KDW_RUNS", str(root))
    at = _ok(AppTest.from_file(APP, default_timeout=300).run())
    at.sidebar.text_input(key="models.source").set_value(str(model_runs / STUDENTS[0]))
    _ok(at.run())
    assert f"{model_runs / STUDENTS[0]}: 2 listed ({STUDENTS[0]}, {model_runs / TEACHER})" in [
        c.value.replace("\\", "") for c in at.sidebar.caption
    ]
    again = _ok(AppTest.from_file(APP, default_timeout=300).run())  # a reload: a new session
    assert again.selectbox(key="case.teacher").options == [f"{model_runs / TEACHER} (model folder)"]
    assert again.multiselect(key="case.students").value == [STUDENTS[0]]
    assert _html(again).count('class="kdw-row"') == 2  # the teacher and its student compared
    empty = tmp_path / "empty"
    empty.mkdir()
    again.sidebar.text_input(key="models.source").set_value(str(empty))
    _ok(again.run())
    captions = " ".join(c.value.replace("\\", "") for c in again.sidebar.caption)
    assert f"{empty}: {empty} holds no run folder (run.json) and no model folder" in captions


def test_several_runs_roots_are_listed_together(model_runs, tmp_path, monkeypatch):
    """``$KDW_RUNS`` with two folders (``kdw app --runs A B``): the runs of both are listed,
    the second's under its folder's name, and the sidebar counts them once."""
    first = tmp_path / "runs"
    first.mkdir()
    monkeypatch.setenv("KDW_RUNS", os.pathsep.join([str(first), str(model_runs)]))
    at = _ok(AppTest.from_file(APP, default_timeout=300).run())
    assert at.selectbox(key="case.teacher").options == [
        f"{model_runs.name}/{TEACHER} (model folder)"
    ]
    summary = at.sidebar.caption[0].value.replace("\\", "")
    assert summary.startswith(f"Runs in {first}, {model_runs} and added: 3 ready, 1 not")
