"""Every command a model folder enters through — ``kdw evaluate``, ``kdw distill --teacher``,
``kdw train-teacher --model`` — refuses each damaged folder of the shared table
(``tests/damaged_models.py``) in its one line, exit status 2, with nothing written: no run
folder, no teacher cache, no analysis cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import kdw_fresh, kdw_here
from tests.damaged_models import FILE_CASES, IDS, build, error


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("damaged-models"))


DOORS = {
    "evaluate": ["evaluate", "{d}", "--task", "{w}/task", "--max-length", "16"],
    "distill": ["distill", "--teacher", "{d}", "--task", "{w}/task", "--run-dir", "{o}/run"],
    "train-teacher": [
        "train-teacher",
        "--model",
        "{d}",
        "--task",
        "{w}/task",
        "--run-dir",
        "{o}/t",
    ],
}


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("case", IDS)
def test_every_command_refuses_it_in_one_line(work, tmp_path, monkeypatch, case, door):
    monkeypatch.setenv("KDW_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    out.mkdir()
    folder = work / "cases" / case
    arguments = [a.format(d=folder, w=work, o=out) for a in DOORS[door]]
    status, err = kdw_here(arguments, tmp_path)
    assert (status, err) == (2, f"kdw: error: {error(case, work)}\n")
    assert list(out.iterdir()) == []  # no run folder, no teacher cache
    assert not (tmp_path / "cache").exists()  # no analysis cache


def test_a_damaged_file_is_refused_before_torch_loads(work, tmp_path):
    """The cases found from the folder's files alone, through every door, in a fresh
    interpreter: the line is said before torch or transformers is imported."""
    cases = [(case, door) for case in FILE_CASES for door in DOORS]
    commands = [
        [a.format(d=work / "cases" / case, w=work, o=tmp_path) for a in DOORS[door]]
        for case, door in cases
    ]
    for (case, door), result in zip(cases, kdw_fresh(commands), strict=True):
        assert result == (2, f"kdw: error: {error(case, work)}\n", []), (case, door)
    assert list(tmp_path.iterdir()) == []
