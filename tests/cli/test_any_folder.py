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


@pytest.mark.slow
def test_every_command_writes_where_relative_paths_say_from_another_folder(work, tmp_path):
    """Each command's writing options given relative to a folder that is neither the
    workspace nor the repository, its inputs named through a symlink to the workspace; what
    they record names the same places from anywhere."""
    (tmp_path / "link").symlink_to(work, target_is_directory=True)
    here = tmp_path / "elsewhere"
    here.mkdir()
    fast = ["--max-length", "16", "--epochs", "0.1", "--batch-size", "16", "--threads", "1"]
    task = ["--task", "../link/task"]
    commands = [
        ["train-teacher", "--model", "../link/tiny-bert", *task, *fast, "--run-dir", "out/t"],
        ["distill", "--teacher", "out/t", *task, *fast, "--num-layers", "2", "--run-dir", "out/s"],
        ["cache", "--teacher", "../link/teacher", *task, "--max-length", "16", "--out", "out/c"],
        ["evaluate", "out/s", "../link/student", "--json", "out/rows.json"],
        [
            "benchmark",
            "out/t",
            "out/s",
            "--examples",
            "8",
            "--repeats",
            "1",
            "--json",
            "out/b.json",
        ],
        [
            "faithfulness",
            "out/s",
            "--explainers",
            "grad",
            "--examples",
            "4",
            "--json",
            "out/f.json",
        ],
        [
            "export",
            "out/t",
            "../link/student",
            "--text",
            "good film",
            "--formats",
            "svg",
            "--out",
            "out/fig",
        ],
        ["attribute", "out/s", "--text", "good film", "--explainer", "grad", "--out", "out/att"],
        ["export-model", "out/s", "--out", "out/hf"],
    ]
    for command in commands:
        status, err = kdw_here(command, here)
        assert status == 0, (command, err)
    out = here / "out"
    for written in ("t/run.json", "s/run.json", "rows.json", "b.json", "f.json", "hf/config.json"):
        assert (out / written).is_file(), written
    assert (out / "c").is_dir() and list((out / "fig").glob("heatmap-000.svg"))
    assert [p.name for p in (out / "att").iterdir()] == ["s.jsonl"]
    recorded = json.loads((out / "s" / "run.json").read_text())["configs"]["student"]["teacher"]
    assert Path(recorded) == out / "t"  # absolute: the student finds its teacher from anywhere
    status, err = kdw_here(["evaluate", str(out / "s")], tmp_path.parent)
    assert status == 0, err
