"""A run's record is the default for the commands on it and for the models named beside it;
every path a user types works from any folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import kdw_here, write_tiny_runs


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A tiny model, a task, a teacher run and a student run (max length 16), recorded with
    absolute paths."""
    work = tmp_path_factory.mktemp("any-folder")
    write_tiny_runs(work)
    return work


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("kdw")]


def test_a_model_beside_a_run_takes_the_runs_task_said_in_one_line(work, tmp_path):
    model = str(work / "teacher" / "model")  # a classifier folder, not a run
    status, err = kdw_here(["evaluate", model, "student", "--json", "rows.json"], work)
    assert status == 0, err
    task = str(work / "task")
    assert _notes(err) == [
        f"kdw: note: {model} is not a run: scored on {task}, the task student recorded "
        "(--max-length 16); --task names another"
    ]
    beside = json.loads((work / "rows.json").read_text())[0]
    status, err = kdw_here(
        ["evaluate", model, "--task", task, "--max-length", "16", "--json", "given.json"], work
    )
    assert status == 0, err
    given = json.loads((work / "given.json").read_text())[0]
    assert beside == given  # the same rows as with the task and its length given
    status, err = kdw_here(["evaluate", model], tmp_path)
    assert status == 2 and "is not a run folder, so it has no task of its own" in err
