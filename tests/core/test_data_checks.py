"""Data checks before training: every bad file is a one-line error (exit 2) naming the rows or
the remedy, and nothing is written; files that only look odd (a stray quote in a TSV, UTF-16)
load as they are."""

from __future__ import annotations

import pytest

from kd.cli import main
from tests.conftest import make_sentences
from workbench.core.data import load_local


def _rows(count: int) -> list[str]:
    frame = make_sentences(count * 3).iloc[:count]
    return [f"{text},{label}" for text, label in zip(frame["text"], frame["label"], strict=True)]


CASES = {
    "header only": ("text,label\n", "no rows (a header only"),
    "too few rows": ("text,label\n" + "\n".join(_rows(5)) + "\n", "too few examples in dev"),
    "empty label": (
        "text,label\ngood film,positive\nbad film,\n" + "\n".join(_rows(60)),
        "missing label (empty or NaN) in 1 row(s) (line 3)",
    ),
    "NaN label": (
        "text,label\ngood film,positive\nbad film,NaN\n" + "\n".join(_rows(60)),
        "missing label (empty or NaN) in 1 row(s) (line 3)",
    ),
    "one class": (
        "text,label\n" + "\n".join(f"film {i},positive" for i in range(60)),
        "every label is 'positive': a classifier needs at least two classes",
    ),
    "regression with a word": (
        "text,label\n" + "\n".join(f"film {i},{i / 7:.3f}" for i in range(60)) + "\nodd,high\n",
        "the labels have fractions (a regression target) but 1 are not numbers: 'high' (line 62)",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_data_is_a_one_line_error_and_writes_nothing(case, tmp_path, tiny_model_dir, capsys):
    content, message = CASES[case]
    path = tmp_path / "data.csv"
    path.write_text(content)
    run = tmp_path / "run"
    code = main(
        [
            "train-teacher",
            "--run-dir",
            str(run),
            "--task",
            str(path),
            "--model",
            str(tiny_model_dir),
            "--threads",
            "1",
        ]
    )
    error = capsys.readouterr().err.strip()
    assert code == 2, error
    assert message in error and len(error.splitlines()) == 1, error
    assert "Traceback" not in error and not run.exists()


def test_latin1_file_names_the_remedy(tmp_path, capsys):
    path = tmp_path / "data.csv"
    path.write_bytes(("text,label\ncafé crème,positive\n" + "\n".join(_rows(40))).encode("latin-1"))
    code = main(["baseline", "--task", str(path)])
    error = capsys.readouterr().err.strip()
    assert code == 2 and "not UTF-8" in error and "iconv" in error, error


def test_utf16_and_stray_quotes_load_as_written(tmp_path):
    rows = _rows(40)
    utf16 = tmp_path / "utf16.csv"
    utf16.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-16")
    data = load_local(str(utf16), seed=13)
    assert sum(len(split) for split in data.splits.values()) == 40
    # a TSV whose texts hold unmatched quotes: every line stays one row (no quote processing)
    lines = [row.replace(",", "\t") for row in rows]
    lines[1] = '"' + lines[1]
    lines[9] = lines[9].replace("\t", '"\t', 1)
    tsv = tmp_path / "quotes.tsv"
    tsv.write_text("text\tlabel\n" + "\n".join(lines) + "\n")
    data = load_local(str(tsv), seed=13)
    texts = [t for split in data.splits.values() for t in split.texts]
    assert len(texts) == 40
    assert any(t.startswith('"') for t in texts)
