"""The app on a teacher that is only a cache (``kdw cache``): a student distilled from it is
listed with the cache as its teacher, the Loyalty page scores both on the logits the cache holds
(as ``kdw evaluate`` does), the pages that need the teacher's weights show the students alone,
and a cache folder the app cannot use is one line in the sidebar."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kd.cli import main
from kd.training.evaluate import evaluate_runs
from kd.training.pipeline import distill, train_teacher
from tests.app.test_app import APP, _html, _ok, tiny_optim
from tests.conftest import write_tiny_workspace
from workbench.app.catalog import CACHE, discover_runs
from workbench.core.config import DataConfig, ObjectiveConfig, StudentConfig, TeacherConfig

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
    monkeypatch.setenv("KDW_RUNS", str(cache_runs))
    monkeypatch.setenv("KDW_DEMO", "off")
    return AppTest.from_file(APP, default_timeout=300)


def test_a_cache_is_a_teacher_and_its_student_is_listed_under_it(cache_runs):
    entries = {e.name: e for e in discover_runs(cache_runs)}
    assert set(entries) == {CACHE_NAME, STUDENT, "damaged-cache"}
    assert entries[CACHE_NAME].kind == CACHE and entries[CACHE_NAME].usable
    assert entries[STUDENT].teacher == str(cache_runs / CACHE_NAME)
    assert entries[STUDENT].teacher_changed is None
    assert "damaged-cache" in entries["damaged-cache"].problem
