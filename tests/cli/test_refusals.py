"""Refusals: damaged files, refused reruns that name the option, run records that open from any
working directory, and the table of ``kdw`` commands that must end in one line on stderr, exit
status 2 and nothing written (run in this process: an escaping exception fails the test)."""

from __future__ import annotations

import html
import json
import os
import shutil
from pathlib import Path

import pytest
import tomllib

from kd.cli import main
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.pipeline import distill, train_teacher
from tests.conftest import kdw_here, write_tiny_workspace
from workbench.analysis.heatmap_export import ExportSettings
from workbench.app.catalog import discover_runs
from workbench.app.launch import ENTRY
from workbench.core.config import DataConfig
from workbench.core.errors import WorkbenchError
from workbench.core.runs import Run

ROOT = Path(__file__).resolve().parents[2]
FAST = OptimConfig(epochs=0.1, batch_size=16, threads=1)


def _truncate(path: Path, keep: float = 0.5) -> None:
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A tiny model folder, a task, and a teacher and a student made with relative paths from
    ``work`` (the teacher's run recorded as ``--teacher teacher``)."""
    work = tmp_path_factory.mktemp("refusals")
    write_tiny_workspace(work)
    here = Path.cwd()
    os.chdir(work)
    try:
        data = DataConfig(task="task", max_length=16)
        train_teacher(data, TeacherConfig(model="tiny-bert"), FAST, "teacher")
        distill(data, StudentConfig(teacher="teacher", num_layers=2), _kd(), FAST, "student")
    finally:
        os.chdir(here)
    return work


def _kd():
    from kd.methods.config import ObjectiveConfig

    return ObjectiveConfig(preset="kd")


def _copy(work: Path, name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(work / name, target)
    (target / ".lock").unlink(missing_ok=True)
    return target


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes, but the lock a refused command takes."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p.name != ".lock"
    }


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("kdw: error: ")
    return err[0]


# --------------------------------------------------------------------------- damaged files


def test_a_truncated_model_is_one_line_naming_the_file(work, tmp_path, capsys):
    teacher = _copy(work, "teacher", tmp_path)
    weights = teacher / "model" / "model.safetensors"
    _truncate(weights)
    assert main(["evaluate", str(teacher)]) == 2
    line = _error(capsys)
    assert line.startswith(f"kdw: error: {weights} is damaged (")
    assert line.endswith("train the run again in a new --run-dir")
    student = tmp_path / "student"
    task = str(work / "task")
    assert (
        main(["distill", "--run-dir", str(student), "--task", task, "--teacher", str(teacher)]) == 2
    )
    assert f"{weights} is damaged" in _error(capsys)
    assert not student.exists()
    model = tmp_path / "model"
    shutil.copytree(work / "tiny-bert", model)
    _truncate(model / "model.safetensors", 0.9)
    run = tmp_path / "run"
    assert (
        main(["train-teacher", "--run-dir", str(run), "--task", task, "--model", str(model)]) == 2
    )
    assert _error(capsys).startswith(f"kdw: error: {model / 'model.safetensors'} is damaged (")
    assert not run.exists()


def test_a_damaged_checkpoint_names_the_file_and_deleting_it_restarts(work, tmp_path, capsys):
    teacher = _copy(work, "teacher", tmp_path)
    (teacher / "status.json").write_text('{"state": "running", "step": 1}')
    before = (teacher / "metrics.jsonl").read_text()
    _truncate(teacher / "checkpoint.pt")
    command = [
        "train-teacher",
        "--run-dir",
        str(teacher),
        "--task",
        str(work / "task"),
        "--model",
        str(work / "tiny-bert"),
        "--max-length",
        "16",
        "--epochs",
        "0.1",
        "--batch-size",
        "16",
        "--threads",
        "1",
    ]
    assert main(command) == 2
    assert _error(capsys) == (
        f"kdw: error: {teacher / 'checkpoint.pt'} is damaged (PytorchStreamReader failed reading "
        "zip archive: failed finding central directory): delete it to train this run again "
        "from step 0 (the same command), or choose another --run-dir"
    )
    assert (teacher / "metrics.jsonl").read_text() == before  # nothing lost by the refusal
    (teacher / "checkpoint.pt").unlink()
    assert main(command) == 0
    steps = [(r["split"], r["step"]) for r in Run(teacher).metrics()]
    assert len(steps) == len(set(steps))  # the old lines went with the checkpoint
    assert Run(teacher).status().state == "finished"


def test_rerunning_a_finished_run_whose_model_is_lost_says_so(work, tmp_path, capsys):
    """A finished run's command run again reports its results as its model's: a model file that
    became a pipe is refused in one line, the run's records untouched."""
    task, teacher_model = str(work / "task"), str(work / "tiny-bert")
    for name, command in (
        ("teacher", ["train-teacher", "--model", teacher_model]),
        ("student", ["distill", "--teacher", str(work / "teacher"), "--num-layers", "2"]),
    ):
        run = _copy(work, name, tmp_path)
        weights = run / "model" / "model.safetensors"
        weights.unlink()
        os.mkfifo(weights)
        before = {k: v for k, v in _files(run).items() if "model.safetensors" not in k}
        options = ["--max-length", "16", "--epochs", "0.1", "--batch-size", "16", "--threads", "1"]
        assert main([*command, "--run-dir", str(run), "--task", task, *options]) == 2
        assert _error(capsys) == (
            f"kdw: error: the model file {weights} is a pipe: the run's best model is lost: "
            "train the run again in a new --run-dir"
        )
        assert {k: v for k, v in _files(run).items() if "model.safetensors" not in k} == before


def test_a_corrupt_status_never_advises_deleting_an_intact_run(work, tmp_path, capsys):
    teacher = _copy(work, "teacher", tmp_path)
    (teacher / "status.json").write_text('{"state": "fini')
    with pytest.raises(WorkbenchError) as error:
        Run(teacher).status()
    assert "delete" not in str(error.value)
    assert "run the command that made the run again to rewrite it" in str(error.value)
    assert main(["evaluate", str(teacher), "--split", "dev"]) == 0  # the model is intact
    entries = {e.name: e for e in discover_runs(tmp_path)}
    assert entries["teacher"].usable
    assert entries["teacher"].state == "unknown (status.json unreadable)"
    info = json.loads((teacher / "run.json").read_text())["configs"]
    rerun = ["train-teacher", "--run-dir", str(teacher), "--task", info["data"]["task"]]
    rerun += ["--model", info["teacher"]["model"], "--max-length", "16", "--epochs", "0.1"]
    assert main([*rerun, "--batch-size", "16", "--threads", "1"]) == 0
    assert Run(teacher).status().state == "finished"


def test_the_catalog_lists_a_run_with_damaged_weights_as_broken(work, tmp_path):
    _copy(work, "teacher", tmp_path)
    damaged = _copy(work, "teacher", tmp_path / "more")
    _truncate(damaged / "model" / "model.safetensors")
    entries = {e.name: e for e in discover_runs(tmp_path)}
    assert entries["teacher"].usable
    assert not entries["more/teacher"].usable
    assert entries["more/teacher"].problem.startswith(
        f"{damaged / 'model' / 'model.safetensors'} is damaged ("
    )


def test_a_run_whose_model_config_nests_too_deep_is_listed_broken(work, tmp_path, capsys):
    teacher = _copy(work, "teacher", tmp_path)
    config = teacher / "model" / "config.json"
    config.write_text("[" * 100_000 + "]" * 100_000)
    line = f"the model config {config}: JSON nested too deep to read"
    (entry,) = discover_runs(tmp_path)
    assert not entry.usable and entry.problem == line
    assert main(["evaluate", str(teacher)]) == 2
    assert _error(capsys) == f"kdw: error: {line}"


def test_a_page_shows_a_damaged_run_as_a_message(work, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    damaged = _copy(work, "teacher", tmp_path)
    _truncate(damaged / "model" / "model.safetensors")
    monkeypatch.setenv("KDW_RUNS", str(tmp_path))
    at = AppTest.from_file(str(ENTRY), default_timeout=120).run()
    assert not at.exception
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "0 ready, 1 not" in captions and "is damaged" in captions


# --------------------------------------------------------------------------- reruns and paths


def test_a_refused_rerun_names_each_option_that_differs(work, tmp_path, capsys):
    teacher = _copy(work, "teacher", tmp_path)
    info = json.loads((teacher / "run.json").read_text())["configs"]
    before = _files(teacher)
    command = ["train-teacher", "--run-dir", str(teacher), "--task", info["data"]["task"]]
    command += ["--model", info["teacher"]["model"], "--max-length", "16", "--epochs", "0.1"]
    assert main([*command, "--batch-size", "8", "--learning-rate", "1e-3"]) == 2
    assert _error(capsys) == (
        f"kdw: error: {teacher} already holds a run with other settings (--batch-size 16 → 8; "
        "--learning-rate 5e-05 → 0.001): choose another --run-dir, or delete that folder"
    )
    assert _files(teacher) == before


def test_paths_are_recorded_absolute_so_runs_open_from_anywhere(work, tmp_path, monkeypatch):
    student = json.loads((work / "student" / "run.json").read_text())["configs"]
    assert student["student"]["teacher"] == str((work / "teacher").resolve())
    assert student["data"]["task"] == str((work / "task").resolve())
    teacher = json.loads((work / "teacher" / "run.json").read_text())["configs"]
    assert teacher["teacher"]["model"] == str((work / "tiny-bert").resolve())
    monkeypatch.chdir(tmp_path)  # another folder: the relative paths given no longer resolve
    out = tmp_path / "rows.json"
    assert main(["evaluate", str(work / "student"), "--split", "dev", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["run"] == "student" and 0 <= row["label_loyalty"] <= 1
    assert DataConfig(task="tweets").task == "tweets"  # a registered name stays a name


# --------------------------------------------------------------------------- the table


TEACHER = ["train-teacher", "--run-dir", "new", "--task", "task", "--model", "tiny-bert"]
TEACHER += ["--max-length", "16"]
DISTILL = ["distill", "--run-dir", "new", "--task", "{t}", "--teacher", "teacher"]
DISTILL += ["--max-length", "16", "--num-layers", "2"]
CASES = [  # (arguments, start of the message after "kdw: error: ", path that must not exist)
    (  # a width the heads do not divide: refused before training, not when the model is saved
        [
            *("distill", "--run-dir", "new", "--task", "{t}", "--teacher", "teacher"),
            *("--init", "random", "--num-layers", "1", "--num-heads", "3"),
        ],
        "hidden size 16 is not divisible by 3 heads: choose --num-heads and --hidden-size so "
        "that the heads divide the width",
        "new",
    ),
    (
        ["train-teacher", "--run-dir", "new", "--task", "task", "--model", "broken-model"],
        "{w}/broken-model/model.safetensors is damaged (",
        "new",
    ),
    (
        ["distill", "--run-dir", "new", "--task", "task", "--teacher", "broken-teacher"],
        "{w}/broken-teacher/model/model.safetensors is damaged (",
        "new",
    ),
    (
        ["evaluate", "broken-teacher"],
        "{w}/broken-teacher/model/model.safetensors is damaged (",
        None,
    ),
    (["evaluate", "teacher", "--json", "task"], "--json task is a folder", None),
    (["attribute", "teacher", "--out", "a-file", "--text", "good"], "--out a-file is a file", None),
    (
        ["attribute", "teacher", "--out", "new", "--text", "good", "--views", "9"],
        "views 9: not a class of this model (its classes are 0..2)",
        "new",
    ),
    (["export", "teacher", "--out", "a-file", "--text", "good"], "--out a-file is a file", None),
    (
        [*TEACHER[:2], "teacher", *TEACHER[3:-1], "32"],
        "teacher already holds a run with other settings (--max-length 16 → 32; ",
        None,
    ),
    # each setting is checked against the models before the run or study folder is created
    (
        [*TEACHER[:-1], "129"],
        "--max-length 129 exceeds the 128 tokens the model reads",
        "new",
    ),
    (
        [*DISTILL, "--max-length", "129"],
        "--max-length 129 exceeds the 128 tokens {w}/teacher reads",
        "new",
    ),
    ([*TEACHER, "--seed", "-1"], "--seed: -1 is not allowed (expected an integer in 0..", "new"),
    ([*DISTILL, "--split-seed", "4294967296"], "--split-seed: 4294967296 is not allowed", "new"),
    (
        [*DISTILL, "--num-layers", "1", "--preset", "pkd-last"],
        "Patient KD (and GKD-CLS) pair the student's intermediate layers 1..M−1",
        "new",
    ),
    (
        [*DISTILL, "--num-layers", "1", "--preset", "gkd-cls"],
        "Patient KD (and GKD-CLS) pair the student's intermediate layers 1..M−1",
        "new",
    ),
    (
        [*DISTILL, "--preset", "adkd", "--attr-top-k", "17"],
        "--attr-top-k 17 exceeds the teacher's 16 embedding dimensions",
        "new",
    ),
    (
        [*DISTILL, "--preset", "adkd", "--attr-views", "0,3"],
        "--attr-views 0,3: 3 is not a class of this task (its classes are 0..2)",
        "new",
    ),
    ([*DISTILL, "--preset", "adkd", "--attr-layer", "9"], "--attr-layer 9: unknown", "new"),
    (
        [*DISTILL, "--num-layers", "1", "--preset", "adkd", "--attr-layer", "penultimate"],
        "--attr-layer penultimate: 'penultimate' needs a model with at least 2 layers",
        "new",
    ),
    ([*DISTILL, "--device", "cuda:99"], "--device cuda:99", "new"),
    (
        ["tune", "--out", "new", *DISTILL[3:], "--num-layers", "1", "--preset", "pkd-last"],
        "Patient KD (and GKD-CLS) pair",
        "new",
    ),
    (["evaluate", "teacher", "--max-length", "20"], "--max-length set without --task", None),
]


@pytest.fixture(scope="module")
def table(work, tmp_path_factory) -> Path:
    """The module's runs and files beside a damaged model, a damaged teacher and a file."""
    folder = tmp_path_factory.mktemp("table")
    for name in ("teacher", "task", "tiny-bert"):
        shutil.copytree(work / name, folder / name)
    shutil.copytree(work / "tiny-bert", folder / "broken-model")
    _truncate(folder / "broken-model" / "model.safetensors")
    shutil.copytree(work / "teacher", folder / "broken-teacher")
    _truncate(folder / "broken-teacher" / "model" / "model.safetensors")
    (folder / "a-file").write_text("not a folder")
    return folder


@pytest.mark.parametrize(("arguments", "message", "absent"), CASES, ids=lambda c: None)
def test_each_case_is_one_line_exit_2_and_writes_nothing(work, table, arguments, message, absent):
    """``{t}`` in the arguments is the task the table's teacher was trained on."""
    before = _files(table)
    status, stderr = kdw_here([argument.format(t=work / "task") for argument in arguments], table)
    assert status == 2, stderr
    assert stderr.splitlines() == [stderr.strip()]
    expected = message.format(w=table.resolve())
    assert stderr.startswith(f"kdw: error: {expected}"), stderr
    assert absent is None or not (table / absent).exists()
    assert _files(table) == before


# --------------------------------------------------------------------------- the app's server


def test_the_app_watches_its_sources_without_inotify(monkeypatch):
    """The project's Streamlit config parses and picks the polling watcher, which watches the
    app's own files only, not the runs/ tree that trainings write to."""
    from streamlit import config
    from streamlit.watcher import path_watcher
    from streamlit.watcher.polling_path_watcher import PollingPathWatcher

    settings = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert settings["server"]["fileWatcherType"] == "poll"
    monkeypatch.chdir(ROOT)
    config.get_config_options(force_reparse=True)
    try:
        assert config.get_option("server.fileWatcherType") == "poll"
        assert path_watcher.get_default_path_watcher_class() is PollingPathWatcher
    finally:
        config.get_config_options(force_reparse=True)


# --------------------------------------------------------------------------- exports

LONG = " ".join(["good movie"] * 70)  # 140 words: more than the tiny model's 128 positions


def _text_chunks(path: Path) -> dict:
    from PIL import Image

    with Image.open(path) as image:
        return json.loads(image.text["Description"])


@pytest.mark.slow
def test_truncation_is_stated_in_every_format(work, tmp_path, capsys):
    from workbench.analysis.examples import Example
    from workbench.analysis.explanations import HeatmapSettings
    from workbench.analysis.heatmap_export import build_heatmaps, write_heatmaps
    from workbench.core.models import load_run

    loaded = load_run(work / "teacher")
    whole = len(loaded.tokenizer(LONG)["input_ids"])
    assert whole > loaded.model.config.max_position_embeddings == 128
    long, short = build_heatmaps([loaded], [Example(LONG), Example("good")], HeatmapSettings())
    limit = loaded.read_length  # the run's --max-length, as kdw evaluate scores it
    stated = f"teacher (WordPiece tokenizer) read the first {limit} of the text's {whole} tokens"
    assert long.metadata["truncated"] == stated and short.metadata["truncated"] == "no"
    assert len(long.rows[0].tokens) == limit == loaded.data.max_length
    write_heatmaps([long], tmp_path, ExportSettings())
    svg = (tmp_path / "heatmap-000.svg").read_text()
    assert (
        json.loads(svg.split("<metadata")[1].split(">", 1)[1].split("</metadata>")[0])["truncated"]
        == stated
    )
    page = (tmp_path / "heatmap-000.html").read_text()
    assert f'<meta name="truncated" content="{html.escape(stated)}" />' in page
    assert f"%   truncated: {stated}" in (tmp_path / "heatmap-000.tex").read_text()
    assert _text_chunks(tmp_path / "heatmap-000.png")["truncated"] == stated
    in_pdf = stated.replace("(", r"\(").replace(")", r"\)")  # a PDF string's escapes
    assert in_pdf.encode() in (tmp_path / "heatmap-000.pdf").read_bytes()
    out = tmp_path / "cli"
    assert (
        main(
            [
                "export",
                str(work / "teacher"),
                "--out",
                str(out),
                "--text",
                LONG,
                "--text",
                "good",
                "--formats",
                "svg",
            ]
        )
        == 0
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kdw")]
    assert err == [f"kdw: note: heatmap-000: the text was truncated: {stated}"]


def test_an_export_replaces_the_earlier_set_whole(tmp_path):
    from workbench.analysis.heatmap_export import write_heatmaps
    from workbench.export import Heatmap, HeatmapRow

    def heatmap(word: str) -> Heatmap:
        return Heatmap(
            [HeatmapRow("m", ["[CLS]", word, "[SEP]"], [0.0, 1.0, 0.0])], word, {"text": word}
        )

    (tmp_path / "notes.txt").write_text("mine")
    first = write_heatmaps(
        [heatmap(w) for w in ("good", "bad", "fine")],
        tmp_path,
        ExportSettings(formats="svg,png", dpi=20),
    )
    assert len(first) == 6
    second = write_heatmaps([heatmap("awful")], tmp_path, ExportSettings(formats="svg", dpi=20))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heatmap-000.svg", "notes.txt"]
    assert second == [tmp_path / "heatmap-000.svg"]
    assert "awful" in second[0].read_text() and "good" not in second[0].read_text()
    assert (tmp_path / "notes.txt").read_text() == "mine"


def _fonts_covering(character: str) -> list[str]:
    """Installed font files that have ``character`` (matplotlib's own placeholder font aside)."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    return [
        entry.fname
        for entry in font_manager.fontManager.ttflist
        if not entry.name.startswith("Last Resort")
        and ord(character) in FT2Font(entry.fname).get_charmap()
    ]


def test_hebrew_is_drawn_with_a_fallback_font_and_missing_characters_are_named(tmp_path):
    from workbench.export import Heatmap, HeatmapRow, export, font_fallback, undrawable_characters

    if not _fonts_covering("ש"):
        pytest.skip("no installed font covers Hebrew")
    hebrew = Heatmap([HeatmapRow("m", ["[CLS]", "שלום", "עולם", "[SEP]"], [0, 1, 0.5, 0])], "t", {})
    families, missing = font_fallback(["שלום"], "DejaVu Sans Mono")
    assert missing == [] and families[0] == "DejaVu Sans Mono" and len(families) == 2
    assert undrawable_characters(hebrew) == []
    pdf = export(hebrew, tmp_path / "hebrew.pdf").read_bytes()
    assert b"LastResort" not in pdf  # no glyph came from the box-drawing font
    fallback = Path(_fonts_covering("ש")[0]).stem.split("-")[0].encode()
    assert any(fallback in line for line in pdf.split(b"\n") if b"/FontName" in line)
    png = export(hebrew, tmp_path / "hebrew.png", dpi=50)
    assert "characters_not_drawn" not in _text_chunks(png)
    if _fonts_covering("中"):
        pytest.skip("an installed font covers CJK: nothing is left undrawn")
    mixed = Heatmap([HeatmapRow("m", ["שלום", "中文", "中"], [0, 1, 0.5])], "t", {})
    assert undrawable_characters(mixed) == ["中", "文"]
    assert _text_chunks(export(mixed, tmp_path / "mixed.png", dpi=50))["characters_not_drawn"] == (
        "中 (U+4E2D), 文 (U+6587)"
    )


def test_the_export_page_states_truncation(work, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    _copy(work, "teacher", tmp_path)
    monkeypatch.setenv("KDW_RUNS", str(tmp_path))
    at = AppTest.from_file(str(ENTRY), default_timeout=120).run()
    at.switch_page("exports.py")
    at.run()
    at.text_area(key="export.text").set_value(f"good movie\n{LONG}")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    warnings = [w.value.replace("\\", "") for w in at.warning]  # Markdown escapes undone
    assert len(warnings) == 1
    limit = json.loads((tmp_path / "teacher" / "run.json").read_text())["configs"]["data"]
    assert warnings[0].startswith(  # at the run's length
        "heatmap-001: the text was truncated: teacher (WordPiece tokenizer) read the first "
        f"{limit['max_length']} "
    )
