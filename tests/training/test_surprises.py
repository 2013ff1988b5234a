"""No silent surprises: dev and test examples that repeat a training example are counted and said
at load time (and recorded in the run), ``--dedupe`` drops exactly them; a teacher run that has
not finished is refused by ``kdw distill`` and ``kdw tune`` unless ``--allow-unfinished``, and
``kdw evaluate`` says that it scores such a run's best dev model so far; labels that differ only
by surrounding spaces are one class, only by case an error."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import BertModel

from kd.cli import build_parser, main
from kd.experiments.config import TuneConfig
from kd.experiments.tune import tune
from kd.methods.config import ObjectiveConfig
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.pipeline import train_teacher
from tests.conftest import kill_at_step, make_sentences, tiny_config, write_tiny_workspace
from workbench.app.catalog import discover_runs
from workbench.core.config import DataConfig, to_dict
from workbench.core.data import load_local, load_task
from workbench.core.errors import WorkbenchError
from workbench.core.runs import Run

FAST = OptimConfig(epochs=0.1, batch_size=16, threads=1)


def _repeat_train_rows(work: Path) -> Path:
    """``work/overlap``: the tiny task with training rows repeated in dev (5, two of them with
    extra spaces) and test (3), and a training text in test whose case differs (not a repeat:
    case is kept)."""
    folder = work / "overlap"
    folder.mkdir()
    train = pd.read_csv(work / "task" / "train.csv")
    dev = pd.read_csv(work / "task" / "dev.csv")
    test = pd.read_csv(work / "task" / "test.csv")
    repeats = train.iloc[:5].copy()
    repeats.iloc[0, 0] = "  " + repeats.iloc[0, 0].replace(" ", "   ") + " "
    repeats.iloc[1, 0] = repeats.iloc[1, 0] + "\t"
    cased = train.iloc[20:21].copy()
    cased.iloc[0, 0] = cased.iloc[0, 0].upper()
    train.to_csv(folder / "train.csv", index=False)
    pd.concat([dev.iloc[:10], repeats, dev.iloc[10:]]).to_csv(folder / "dev.csv", index=False)
    pd.concat([test, train.iloc[10:13], cased]).to_csv(folder / "test.csv", index=False)
    return folder


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A tiny model and task, the task with repeats (``overlap``), and a finished teacher."""
    work = tmp_path_factory.mktemp("surprises")
    write_tiny_workspace(work)
    _repeat_train_rows(work)
    train_teacher(
        DataConfig(task=str(work / "task"), max_length=16),
        TeacherConfig(model=str(work / "tiny-bert")),
        FAST,
        work / "teacher",
    )
    return work


def _normalised(path: Path) -> pd.Series:
    """The texts of a CSV file with every run of whitespace made one space, by pandas."""
    return pd.read_csv(path)["text"].str.split().str.join(" ")


def _expected_repeats(folder: Path) -> dict[str, pd.Series]:
    """Per dev and test file, which rows repeat a training text: computed from the files
    apart from the workbench's loader."""
    train = set(_normalised(folder / "train.csv"))
    return {split: _normalised(folder / f"{split}.csv").isin(train) for split in ("dev", "test")}


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if "note:" in line]


def test_repeats_across_splits_are_counted_and_said_once(work, capsys):
    folder = work / "overlap"
    expected = _expected_repeats(folder)
    assert expected["dev"].sum() == 5 and expected["test"].sum() == 3  # the case variant is not
    assert main(["baseline", "--task", str(folder)]) == 0
    (note,) = _notes(capsys.readouterr().err)
    sizes = {split: len(expected[split]) for split in ("dev", "test")}
    assert (
        f"5 of {sizes['dev']} dev and 3 of {sizes['test']} test examples repeat a training "
        "example (texts compared with whitespace collapsed, case kept): scores on dev and test "
        "are inflated by them (--dedupe drops them)"
    ) in note
    data = load_task(DataConfig(task=str(folder)), notify=lambda text: None)
    assert data.overlap == {"train/dev": 5, "train/test": 3, "dev/test": 0}
    assert data.deduped is None
    clean = load_task(DataConfig(task=str(work / "task")))  # no repeats: nothing said
    assert clean.overlap == {"train/dev": 0, "train/test": 0, "dev/test": 0}
    assert _notes(capsys.readouterr().err) == []


def test_dedupe_drops_exactly_the_repeated_dev_and_test_rows(work, capsys):
    folder = work / "overlap"
    expected = _expected_repeats(folder)
    said: list[str] = []
    plain = load_task(DataConfig(task=str(folder)), said.append)
    deduped = load_task(DataConfig(task=str(folder), dedupe=True), said.append)
    assert deduped.deduped == {"dev": 5, "test": 3}
    assert deduped.overlap == {"train/dev": 0, "train/test": 0, "dev/test": 0}
    assert deduped.splits["train"].uids == plain.splits["train"].uids  # train is left alone
    for split in ("dev", "test"):
        kept = _normalised(folder / f"{split}.csv")[~expected[split]]
        assert deduped.splits[split].texts == kept.tolist()
    assert said[-1] == (
        "overlap: --dedupe dropped 5 dev and 3 test examples that repeat a training example "
        "(texts compared with whitespace collapsed, case kept)"
    )
    assert len(said) == 2  # the overlap of the plain load, the drop of the deduped one
    assert main(["baseline", "--task", str(folder), "--dedupe"]) == 0
    (note,) = _notes(capsys.readouterr().err)
    assert "--dedupe dropped 5 dev and 3 test examples" in note


def test_a_run_records_the_repeats_and_dedupe_only_where_set(work, tmp_path, capsys):
    assert "dedupe" not in to_dict(DataConfig())  # at its default: a suite row keeps its identity
    assert "allow_unfinished" not in to_dict(StudentConfig())
    run_dir = tmp_path / "teacher"
    common = ["train-teacher", "--model", str(work / "tiny-bert"), "--task", str(work / "overlap")]
    options = ["--max-length", "16", "--epochs", "0.1", "--threads", "1"]
    assert main([*common, "--run-dir", str(run_dir), *options]) == 0
    note, head = _notes(capsys.readouterr().err)  # the data's, then the model's
    assert "has no classification head: a new one" in head
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["split_overlap"] == {"train/dev": 5, "train/test": 3, "dev/test": 0}
    assert note.removeprefix("note: ") in manifest["data_notes"]
    assert "dedupe" not in Run(run_dir).info().configs["data"]
    deduped = tmp_path / "deduped"
    assert main([*common, "--run-dir", str(deduped), *options, "--dedupe"]) == 0
    manifest = json.loads((deduped / "manifest.json").read_text())
    assert manifest["deduped"] == {"dev": 5, "test": 3}
    assert manifest["split_sizes"]["dev"] == len(pd.read_csv(work / "overlap" / "dev.csv")) - 5
    assert Run(deduped).info().configs["data"]["dedupe"] is True
    rows = tmp_path / "rows.json"  # a run scored on its own task, deduplicated
    test_rows = len(pd.read_csv(work / "overlap" / "test.csv"))
    for extra, examples in (((), test_rows), (("--dedupe",), test_rows - 3)):
        assert main(["evaluate", str(run_dir), "--json", str(rows), *extra]) == 0
        assert json.loads(rows.read_text())[0]["examples"] == examples


def _unfinished_copy(work: Path, tmp_path: Path, state: str = "stopped") -> Path:
    """The finished teacher, copied, its status set back as a stopped training's."""
    folder = tmp_path / f"{state}-teacher"
    shutil.copytree(work / "teacher", folder)
    Run(folder).set_status(state, step=1, total=8)
    return folder


def _distill(work: Path, teacher: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        "distill",
        "--teacher",
        str(teacher),
        "--run-dir",
        str(run_dir),
        "--task",
        str(work / "task"),
        "--max-length",
        "16",
        "--epochs",
        "0.1",
        "--num-layers",
        "1",
        "--threads",
        "1",
        *extra,
    ]


def _kdw_lines(capsys) -> list[str]:
    return [
        line for line in capsys.readouterr().err.splitlines() if line.startswith(("kdw:", "note:"))
    ]


def test_an_unfinished_teacher_is_refused_unless_allowed(work, tmp_path, capsys):
    teacher = _unfinished_copy(work, tmp_path)
    refused = tmp_path / "refused"
    assert main(_distill(work, teacher, refused)) == 2
    (error,) = _kdw_lines(capsys)
    best = Run(teacher).best_dev()
    snapshot = f"its best dev model so far (step {best['step']}, dev accuracy "
    assert error.startswith(
        f"kdw: error: the teacher {teacher} has not finished training (stopped at step 1/8): "
        "resume it to the end (run its command again), or pass --allow-unfinished to distil "
        f"from {snapshot}"
    ), error
    assert not refused.exists()
    allowed = tmp_path / "allowed"
    assert main(_distill(work, teacher, allowed, "--allow-unfinished")) == 0
    (note,) = [line for line in _kdw_lines(capsys) if "teacher" in line]
    assert note.startswith(
        f"note: the teacher {teacher} has not finished training (stopped at step 1/8): "
        f"distilling from {snapshot}"
    ), note
    manifest = json.loads((allowed / "manifest.json").read_text())
    assert manifest["unfinished_teacher"] == {"state": "stopped at step 1/8", "model": best}
    assert Run(allowed).info().configs["student"]["allow_unfinished"] is True
    assert main(_distill(work, work / "teacher", tmp_path / "finished")) == 0  # as before
    assert not [line for line in _kdw_lines(capsys) if "has not finished" in line]


def test_tune_refuses_an_unfinished_teacher_before_writing(work, tmp_path):
    teacher = _unfinished_copy(work, tmp_path, "diverged")
    out = tmp_path / "study"
    with pytest.raises(WorkbenchError, match=r"has not finished training \(diverged at step 1/8\)"):
        tune(
            DataConfig(task=str(work / "task"), max_length=16),
            StudentConfig(teacher=str(teacher), num_layers=1),
            ObjectiveConfig(preset="kd"),
            FAST,
            TuneConfig(trials=1),
            out,
        )
    assert not out.exists()


def test_evaluate_says_a_run_is_unfinished_and_marks_its_row(work, tmp_path, capsys):
    teacher = _unfinished_copy(work, tmp_path)
    rows_file = tmp_path / "rows.json"
    assert main(["evaluate", str(work / "teacher"), str(teacher), "--json", str(rows_file)]) == 0
    notes = [line for line in _kdw_lines(capsys) if "has not finished" in line]
    assert notes == [
        f"kdw: note: {teacher.name} has not finished training (stopped at step 1/8): scored "
        f"with {Run(teacher).snapshot()}"
    ]
    finished, unfinished = json.loads(rows_file.read_text())
    assert "unfinished" not in finished
    assert unfinished["unfinished"] == "stopped at step 1/8"
    assert unfinished["accuracy"] == finished["accuracy"]  # the same best model, scored
    (entry,) = [e for e in discover_runs(tmp_path) if e.path == teacher]
    assert entry.label == f"{teacher.name} (unfinished: stopped at step 1/8)"  # the app's lists


# slow: a kdw process importing torch trains, evaluating every step, until killed at step 2
@pytest.mark.slow
def test_a_killed_teacher_is_said_killed_and_refused(work, tmp_path, capsys):
    """A training killed mid-way: its status still says running, no process holds it; its
    best dev model so far exists (evaluated every step)."""
    killed = tmp_path / "killed"
    command = ["train-teacher", "--run-dir", str(killed), "--model", str(work / "tiny-bert")]
    command += ["--task", str(work / "task"), "--max-length", "16", "--threads", "1"]
    command += ["--epochs", "1", "--batch-size", "16", "--eval-every", "1"]
    state = kill_at_step([*command, "--checkpoint-every", "1"], killed, 2)
    assert state["state"] == "running" and (killed / "model" / "config.json").exists()
    expected = (
        f"running at step {Run(killed).status().step}/{state['total']} (no process is "
        "training it: interrupted or killed)"
    )
    assert Run(killed).unfinished() == expected
    assert main(["evaluate", str(killed), "--split", "dev"]) == 0
    assert any(expected in line for line in _kdw_lines(capsys))
    assert main(_distill(work, killed, tmp_path / "student")) == 2
    (error,) = _kdw_lines(capsys)
    assert f"({expected})" in error and "--allow-unfinished" in error


def test_dedupe_and_allow_unfinished_are_options_of_the_commands():
    parser = build_parser()
    for command in (["baseline"], ["evaluate", "run"], ["train-teacher", "--run-dir", "r"]):
        assert parser.parse_args([*command, "--dedupe"]).dedupe is True
    for command in (["distill", "--run-dir", "r"], ["tune", "--out", "o"]):
        args = parser.parse_args([*command, "--allow-unfinished", "--dedupe"])
        assert args.allow_unfinished is True and args.dedupe is True


def _label_file(tmp_path: Path, labels: list[str]) -> Path:
    frame = make_sentences(120)
    frame["label"] = [labels[i % len(labels)] for i in range(len(frame))]
    path = tmp_path / "labels.csv"
    frame.to_csv(path, index=False)
    return path


def test_labels_differing_by_surrounding_spaces_are_one_class(tmp_path):
    data = load_local(
        str(_label_file(tmp_path, ["positive ", " positive", "negative", "negative\t"])), 13
    )
    assert data.spec.label_names == ("negative", "positive")


def test_labels_differing_only_by_case_are_a_one_line_error(tmp_path, capsys):
    path = _label_file(tmp_path, ["positive", "Positive", "negative"])
    assert main(["baseline", "--task", str(path)]) == 2
    (error,) = capsys.readouterr().err.strip().splitlines()
    assert error == (
        f"kdw: error: {path}: labels 'Positive' and 'positive' differ only by case; make them "
        "one label"
    )


@pytest.mark.slow
def test_commands_on_a_run_read_its_task_as_it_recorded(work, tmp_path, capsys):
    """A teacher of 32 positions trained at 16 tokens on a file whose columns are ``review``
    and ``rating``: ``kdw evaluate`` of the run and of its saved model on that file needs no
    column or length option (the run's record is the default, and says so: the default 128
    tokens would exceed the model's 32); settings given override the record, and that is said
    too."""
    reviews = tmp_path / "reviews"
    reviews.mkdir()
    for split in ("train", "dev", "test"):
        frame = pd.read_csv(work / "task" / f"{split}.csv")
        frame = frame.rename(columns={"text": "review", "label": "rating"})
        frame["title"] = frame["review"].str.split().str[:3].str.join(" ")
        frame.to_csv(reviews / f"{split}.csv", index=False)
    data = DataConfig(task=str(reviews), text_column="review", label_column="rating")
    short = tmp_path / "short-bert"
    shutil.copytree(work / "tiny-bert", short)
    config = tiny_config()
    config.max_position_embeddings = 32
    torch.manual_seed(0)
    BertModel(config).save_pretrained(short)
    teacher = train_teacher(
        replace(data, max_length=16),
        TeacherConfig(model=str(short)),
        FAST,
        tmp_path / "teacher",
    )
    capsys.readouterr()
    table = tmp_path / "rows.json"
    command = ["evaluate", str(teacher.path / "model"), str(teacher.path), "--task", str(reviews)]
    assert main([*command, "--json", str(table)]) == 0
    err = capsys.readouterr().err
    said = f"kdw: note: {reviews} is read as {teacher.path} recorded: --text-column review, "
    assert said + "--label-column rating, --max-length 16\n" in err
    rows = json.loads(table.read_text())
    assert rows[0]["accuracy"] == pytest.approx(rows[1]["accuracy"])
    assert rows[1]["accuracy"] == pytest.approx(teacher.results()["test"]["accuracy"])

    assert main([*command, "--max-length", "24", "--text-column", "title"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "recorded" in line]
    assert notes == [
        f"kdw: note: {reviews} is read as {teacher.path} recorded: --label-column rating",
        f"kdw: note: --text-column title, --max-length 24 given: {teacher.path} recorded "
        "--text-column review, --max-length 16",
    ]
