"""Data checks before training: every bad file is a one-line error (exit 2) naming the rows or
the remedy, and nothing is written; files that only look odd (a stray quote in a TSV, UTF-16)
load as they are."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from kd.cli import main
from tests.conftest import make_sentences
from workbench.core.data import load_local, local
from workbench.core.errors import WorkbenchError


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


def test_a_field_or_a_row_over_the_limits_is_one_line_naming_the_line(tmp_path, monkeypatch):
    """A field of more than FIELD_LIMIT characters (quoted, across lines, in a CSV), or a row of
    more than COLUMN_LIMIT columns (in a TSV), is refused naming the file, the line and the
    limit; a field and a row of exactly the limits load."""
    monkeypatch.setattr(local, "FIELD_LIMIT", 1000)
    monkeypatch.setattr(local, "COLUMN_LIMIT", 50)
    rows = _rows(40)
    text = '"' + ("a, b\n" * 200)[:-1] + "c"  # 1000 characters on lines 22-221, quoted
    fits = tmp_path / "fits.csv"
    fits.write_text("\n".join(["text,label", *rows[:20], f'{text}",positive', *rows[20:]]))
    assert max(map(len, load_local(str(fits), seed=0).splits["train"].texts)) > 900
    over = tmp_path / "over.csv"
    over.write_text("\n".join(["text,label", *rows[:20], f'{text}x",positive', *rows[20:]]))
    with pytest.raises(WorkbenchError) as caught:
        load_local(str(over), seed=0)
    assert str(caught.value) == (
        f"{over}: line 221: a field over 1,000 characters, the most a line or a field of a data "
        "file may hold"
    )
    header = "\t".join(["text", "label", *(f"c{i}" for i in range(48))])  # 50 columns
    lines = [header, *(row.replace(",", "\t") for row in rows)]
    wide = tmp_path / "wide.tsv"
    wide.write_text("\n".join(lines))
    assert sum(len(split) for split in load_local(str(wide), seed=0).splits.values()) == 40
    lines[30] += "\t" * 49
    wide.write_text("\n".join(lines))
    with pytest.raises(WorkbenchError) as caught:
        load_local(str(wide), seed=0)
    assert str(caught.value) == (
        f"{wide}: line 31 has 51 columns, more than the 50 a data file may have"
    )


def test_an_all_nul_file_and_a_header_of_too_many_columns_are_one_line_at_once(tmp_path, capsys):
    """At the real limits: a file of FIELD_LIMIT + 1 NUL bytes (one field) and a header of
    COLUMN_LIMIT + 1 columns, each refused in one line within seconds and bounded memory."""
    nul = tmp_path / "nul.csv"
    with nul.open("wb") as stream:
        stream.truncate(local.FIELD_LIMIT + 1)  # sparse: NUL bytes that take no disk
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"c{i}" for i in range(local.COLUMN_LIMIT + 1)) + "\ntext,label\n")
    expected = {
        nul: f"{nul}: line 1: over {local.FIELD_LIMIT:,} characters, the most a line or a field "
        "of a data file may hold",
        wide: f"{wide}: line 1 has 10,001 columns, more than the 10,000 a data file may have",
    }
    for path, message in expected.items():
        tracemalloc.start()
        began = time.perf_counter()
        try:
            code = main(["baseline", "--task", str(path)])
            seconds, peak = time.perf_counter() - began, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        error = capsys.readouterr().err.strip()
        assert code == 2 and error == f"kdw: error: {message}", error
        assert seconds < 10 and peak < 6 * local.FIELD_LIMIT, (seconds, peak)
