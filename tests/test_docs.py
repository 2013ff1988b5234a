"""The documentation: the MkDocs site builds strictly with the CLI reference rendered from the
parser, the README stays a short user's README whose quickstarts run as written (on a tiny
model), and no tracked file narrates the project's development."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kd.cli import build_parser, main
from tests.conftest import ROOT, write_tiny_workspace

README = ROOT / "README.md"
TINY = {"minilm-l6": "tiny-bert", "tweets": "task"}  # README's model and task → the tiny ones


def marked_blocks(text: str) -> dict[str, str]:
    """The fenced code blocks preceded by a ``<!-- test: NAME -->`` line, by name."""
    pattern = re.compile(r"^<!-- test: (\w+) -->\n```\w*\n(.*?)^```", re.M | re.S)
    return {name: body for name, body in pattern.findall(text)}


def commands(block: str) -> list[list[str]]:
    """A shell block's commands, continuation lines joined, each split as the shell would."""
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.fixture
def one_thread():
    """Torch on one thread while a quickstart runs, as the other tiny trainings of the tests
    (``write_tiny_runs``): the README's commands leave the thread count to torch, and on a
    busy machine two threads of tiny models wait on each other several times longer."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


# slow: mkdocs builds the whole site in a process of its own
@pytest.mark.slow
def test_site_builds_strictly_with_every_option_in_the_reference(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml")]
    result = subprocess.run([*build, "-d", str(site)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    reference = (site / "cli" / "index.html").read_text()
    assert "kdw-reference" not in reference and "this page ends here" not in reference
    for name, parser in subcommands().items():
        assert f'id="kdw-{name}"' in reference, name
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue  # what --help leaves out (former option names), and -h
            for option in action.option_strings:
                assert f"<code>{option}</code>" in reference, (name, option)
    assert (site / "screenshots" / "case-study.png").is_file()  # the app page's screenshots


def test_readme_is_a_short_users_readme_with_the_ci_test_command():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    test_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert test_command in lines  # .ci/run runs exactly the README's test command


def test_every_docs_page_named_in_tracked_files_exists():
    named = set()
    for path in tracked_text_files():
        named |= set(re.findall(r"\bdocs/[\w-]+\.md\b", path.read_text(errors="replace")))
    missing = sorted(page for page in named if not (ROOT / page).is_file())
    assert not missing


@pytest.mark.slow
def test_readme_cli_quickstart_runs_as_written(tmp_path, monkeypatch, one_thread):
    write_tiny_workspace(tmp_path)
    monkeypatch.chdir(tmp_path)
    lines = commands(marked_blocks(README.read_text())["cli"])
    assert {word for line in lines for word in line} >= set(TINY)  # README's model and task
    outputs = {}
    for line in lines:
        assert line[0] == "kdw", line
        argv = [str(tmp_path / TINY[word]) if word in TINY else word for word in line[1:]]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(argv) == 0, line
        outputs[line[1]] = (argv, printed.getvalue())
    runs = [
        Path(argv[argv.index("--run-dir") + 1])
        for argv, _ in outputs.values()
        if "--run-dir" in argv
    ]
    for run in runs:
        assert (run / "results.json").is_file() and (run / "model" / "config.json").is_file()
    table = outputs["evaluate"][1]
    assert all(run.name in table for run in runs)
    argv = outputs["export"][0]
    first, last = map(int, argv[argv.index("--examples") + 1].split("-"))
    heatmaps = sorted(Path(argv[argv.index("--out") + 1]).glob("heatmap-*.svg"))
    assert len(heatmaps) == last - first + 1
    from transformers import pipeline

    argv = outputs["export-model"][0]
    classify = pipeline("text-classification", model=argv[argv.index("--out") + 1])
    assert classify("the movie was good")[0]["label"] in {"negative", "neutral", "positive"}


@pytest.mark.slow
def test_readme_python_quickstart_runs_as_written(tmp_path, monkeypatch, one_thread):
    write_tiny_workspace(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = marked_blocks(README.read_text())["python"]
    for name, tiny in TINY.items():
        assert f'"{name}"' in code
        code = code.replace(f'"{name}"', repr(str(tmp_path / tiny)))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    runs = sorted(set(re.findall(r'"(runs/[\w-]+)"', code)))
    assert len(runs) == 2
    for run in runs:
        assert (tmp_path / run / "results.json").is_file()
    table, explained = printed.getvalue().strip().rsplit("\n", 1)
    assert all(Path(run).name in table for run in runs)
    teacher, _, student, _, loyalty = explained.split()  # "neutral 0.40 neutral 0.38 0.52"
    assert {teacher, student} <= {"negative", "neutral", "positive"}
    assert -1 <= float(loyalty) <= 1


NARRATION = re.compile(
    r"\bsessions? \d+"  # the word, then a number
    r"|\b(?:this|that|every|any|each|an earlier|a previous|the previous|the last|the next|"
    r"earlier|previous|later|past) sessions?\b"
    r"|\bsessions? ago\b"
    r"|\bearlier defaults? (?:was|were)\b",
    re.I,
)


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    paths = []
    for name in listed.stdout.splitlines():
        path = ROOT / name
        if path.is_file() and path.suffix not in {".png", ".pdf", ".pt", ".db", ".parquet"}:
            with contextlib.suppress(UnicodeDecodeError):
                path.read_text()
                paths.append(path)
    return paths


def test_no_tracked_file_narrates_development():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in tracked_text_files()
        if path != Path(__file__).resolve()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if NARRATION.search(line)
    ]
    assert not found


def test_narration_pattern_catches_what_it_is_for():
    assert NARRATION.search("No GPU was lent in any session")
    assert NARRATION.search(f"measured in {'session'} {12}")  # not written out: it would match
    assert NARRATION.search("the earlier defaults were beta = 10")
    assert not NARRATION.search("st.session_state['x']; start_new_session=True")
    assert not NARRATION.search("Models load once per browser session")
