"""No input exhausts memory or blocks forever: a huge text is tokenised only as far as the model
reads it, --dpi, PNG sizes and --examples ranges are bounded before anything is built or
written, files read whole are size-checked before reading, and pipes or devices are refused
unopened."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import pytest

from kd.cli import main
from kd.experiments.tune import MAX_CONFIG_BYTES, load_config_file
from kd.training.config import OptimConfig, TeacherConfig
from kd.training.pipeline import train_teacher
from tests.conftest import (
    ROOT,
    WORDS,
    make_sentences,
    tiny_model,
    tiny_tokenizer,
    write_tiny_workspace,
)
from workbench.analysis.examples import MAX_UPLOAD_BYTES, MAX_UPLOAD_EXAMPLES, parse_indices
from workbench.analysis.heatmap_export import ExportSettings, write_heatmaps
from workbench.core.config import MAX_DPI, DataConfig
from workbench.core.data import Split, count_tokens, encode, load_local
from workbench.core.data import encoding as encoding_module
from workbench.core.data import splits as splits_module
from workbench.core.errors import WorkbenchError
from workbench.core.files import read_limited
from workbench.export import Heatmap, HeatmapRow, check_png_size


def words(count: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(count))


@contextmanager
def deadline(seconds: int):
    """Fail instead of hanging when a call blocks (an open() of a pipe that has no writer)."""

    def expired(*_):
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def one_line_error(capsys) -> str:
    error = capsys.readouterr().err.strip()
    assert error.startswith("kdw: error:") and "\n" not in error, error
    return error


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    """A tiny sequence classifier folder (not a run): what kdw export reads as a model."""
    folder = tmp_path_factory.mktemp("classifier")
    tiny_tokenizer(folder)
    tiny_model().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("work")
    write_tiny_workspace(work)
    train_teacher(
        DataConfig(task=str(work / "task"), max_length=16),
        TeacherConfig(model=str(work / "tiny-bert")),
        OptimConfig(epochs=1, batch_size=16, threads=1, learning_rate=1e-3),
        work / "teacher",
    )
    return work / "teacher"


# --------------------------------------------------------------------------- huge texts


def test_a_multi_megabyte_text_is_tokenised_only_as_far_as_the_model_reads(
    tokenizer, tmp_path, monkeypatch
):
    huge = words(800_000)  # 4 MB, 800,000 tokens: 50,000 chunks of 16 had they all been made
    frame = make_sentences(40)
    frame.loc[0, "text"] = huge
    frame.to_csv(tmp_path / "task.csv", index=False)
    split = load_local(str(tmp_path / "task.csv"), seed=0).splits["train"]
    assert max(len(t) for t in split.texts) == len(huge)  # loaded whole, cleaned unchanged
    seen = []  # the longest text each tokenizer call was given
    call = type(tokenizer).__call__

    def spy(self, text, *args, **kwargs):
        seen.append(max(map(len, [text] if isinstance(text, str) else text)))
        return call(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", spy)
    tracemalloc.start()
    try:
        encoded = encode(split, tokenizer, max_length=16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    row = split.texts.index(huge)
    assert (
        encoded.input_ids[row]
        == call(tokenizer, huge[:1000], truncation=True, max_length=16)["input_ids"]
    )
    assert encoded.truncated >= 1 and len(encoded) == len(split)
    assert max(seen) <= 16 * encoding_module.CHARS_PER_TOKEN  # never the whole text
    # every chunk materialised took 55 MiB of Python objects here (and gigabytes in Rust)
    assert peak < 2**20, f"{peak / 2**20:.1f} MiB"


@pytest.mark.parametrize(
    "text",
    [
        words(3000),  # cut at a whitespace: the same ids as the whole text
        "good" + " " * 5000 + " bad film",  # whitespace: the prefix grows until it holds enough
        "movie " + "x" * 300_000,  # one huge word (one [UNK]): read up to the cap, counted cut
    ],
)
@pytest.mark.parametrize("pair", [None, words(500, seed=1)])
def test_prefixes_give_the_ids_of_the_whole_text(tokenizer, text, pair):
    split = Split(
        texts=[text, "good"],
        labels=[0, 1],
        uids=["0", "1"],
        pairs=None if pair is None else [pair, "bad"],
    )
    encoded = encode(split, tokenizer, max_length=16)
    args = (split.texts,) if pair is None else (split.texts, split.pairs)
    whole = tokenizer(*args, truncation=True, max_length=16)
    full = tokenizer(*args, truncation=False, verbose=False)["input_ids"]
    assert encoded.input_ids == whole["input_ids"]
    assert encoded.token_type_ids == whole["token_type_ids"]
    counted = sum(len(ids) > 16 for ids in full)
    # the huge word is one token, yet read only up to the cap: counted as cut
    assert encoded.truncated == counted + (text.startswith("movie x") and pair is None)


def test_counting_tokens_goes_piece_by_piece_and_stops_at_a_bound(tokenizer, monkeypatch):
    monkeypatch.setattr(encoding_module, "COUNT_PIECE", 100)
    text = words(2000)
    whole = len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
    assert count_tokens(tokenizer, text) == (whole, False)
    count, more = count_tokens(tokenizer, text, most=1000)
    assert more and 100 < count < whole


def test_cleaning_a_long_text_a_chunk_at_a_time_collapses_whitespace_alike(monkeypatch):
    monkeypatch.setattr(splits_module, "CLEAN_CHUNK", 7)
    rng = random.Random(0)
    for _ in range(500):
        text = "".join(rng.choice("ab  \n\t\r") for _ in range(rng.randint(0, 60)))
        assert splits_module.clean_text(text) == " ".join(text.split()), repr(text)


def test_a_file_that_is_not_utf8_past_its_first_megabyte_names_the_byte(tmp_path):
    path = tmp_path / "late.csv"
    head = b"text,label\n" + b"good,a\n" * 200_000  # 1.4 MB
    path.write_bytes(head + b"caf\xe9,b\n")
    with pytest.raises(WorkbenchError, match=rf"byte {len(head) + 3} is b'\\xe9'"):
        load_local(str(path), seed=0)


# --------------------------------------------------------------------------- export bounds


def test_dpi_above_the_cap_is_refused_in_one_line_before_anything_is_written(
    classifier, tmp_path, capsys
):
    out = tmp_path / "out"
    for dpi in ("100000", "inf", "0"):
        code = main(["export", str(classifier), "--out", str(out), "--text", "good", "--dpi", dpi])
        error = one_line_error(capsys)
        assert code == 2 and "--dpi" in error and f"{MAX_DPI}" in error, error
        assert not out.exists()
    with pytest.raises(WorkbenchError, match="--dpi"):
        ExportSettings(dpi=MAX_DPI + 1)
    assert ExportSettings(dpi=MAX_DPI).dpi == MAX_DPI


@pytest.mark.slow
def test_a_png_of_too_many_pixels_is_refused_before_the_folder_is_made(tmp_path):
    rows = [HeatmapRow(f"model {i}", ["token"] * 300, [0.1] * 300) for i in range(40)]
    heatmap = Heatmap(rows)
    with pytest.raises(WorkbenchError, match=r"megapixels.*use a dpi of at most (\d+)") as error:
        check_png_size(heatmap, MAX_DPI)
    fits = int(str(error.value).split("at most ")[1].split(",")[0])
    check_png_size(heatmap, fits)  # the dpi it names fits
    out = tmp_path / "out"
    with pytest.raises(WorkbenchError, match="megapixels"):
        write_heatmaps([heatmap], out, ExportSettings(formats="svg,png", dpi=MAX_DPI))
    assert not out.exists()


def test_example_ranges_are_checked_before_they_are_listed():
    assert parse_indices("0,3,7-9", 10) == [0, 3, 7, 8, 9]
    refused = {
        "0-999999999": "the split has examples 0..9",
        "0-" + "9" * 5000: "the split has examples 0..9",  # more digits than int() takes
        "5-3": "runs backwards",
        "²": "use indices",
        "0-9," * 200: f"more than {MAX_UPLOAD_EXAMPLES} examples",
    }
    for text, message in refused.items():
        with pytest.raises(WorkbenchError, match=message):
            parse_indices(text, 10)
    with pytest.raises(WorkbenchError, match="more than 1000"):
        parse_indices("0-999999", 10**9)  # within the split, over the limit: never listed


def test_kdw_export_refuses_a_huge_examples_range_in_one_line(teacher_run, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(
        [
            *("export", str(teacher_run), "--out", str(out), "--split", "test"),
            *("--examples", "0-999999999", "--formats", "svg"),
        ]
    )
    error = one_line_error(capsys)
    assert code == 2 and "0-999999999" in error and "the split has examples 0.." in error
    assert not out.exists()


# --------------------------------------------------------------------------- files read whole


def test_an_oversized_texts_file_is_refused_without_reading_it(classifier, tmp_path, capsys):
    big = tmp_path / "texts.csv"
    with big.open("wb") as stream:
        stream.truncate(500 * 2**20)  # sparse: 500 MB that take no disk
    tracemalloc.start()
    try:
        with pytest.raises(WorkbenchError, match="the limit is 2,000,000 bytes"):
            read_limited(big, MAX_UPLOAD_BYTES, "--texts-file")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20
    out = tmp_path / "out"
    code = main(["export", str(classifier), "--out", str(out), "--texts-file", str(big)])
    error = one_line_error(capsys)
    assert code == 2 and "--texts-file" in error and "524,288,000 bytes" in error
    assert not out.exists()


def test_a_config_file_is_size_checked_and_pipes_are_refused_unopened(tmp_path):
    big = tmp_path / "best.json"
    big.write_text("{}")
    with big.open("r+b") as stream:
        stream.truncate(MAX_CONFIG_BYTES + 1)
    with pytest.raises(WorkbenchError, match=r"--config .* the limit is 1,000,000 bytes"):
        load_config_file(big)
    fifo = tmp_path / "best-fifo.json"
    os.mkfifo(fifo)
    with deadline(30), pytest.raises(WorkbenchError, match="is a pipe"):
        load_config_file(fifo)
    with deadline(30), pytest.raises(WorkbenchError, match="is a pipe"):
        read_limited(fifo, MAX_UPLOAD_BYTES, "--texts-file")
    with deadline(30), pytest.raises(WorkbenchError, match="is a device"):
        read_limited("/dev/zero", MAX_UPLOAD_BYTES, "--texts-file")


def test_a_pipe_or_a_device_as_task_is_refused_unopened(tmp_path):
    fifo = tmp_path / "task.csv"
    os.mkfifo(fifo)
    with deadline(30), pytest.raises(WorkbenchError, match=r"--task .*task\.csv is a pipe"):
        load_local(str(fifo), seed=0)
    folder = tmp_path / "task"
    folder.mkdir()
    make_sentences(40).to_csv(folder / "dev.csv", index=False)
    os.mkfifo(folder / "train.csv")
    with deadline(30), pytest.raises(WorkbenchError, match=r"--task train file .* is a pipe"):
        load_local(str(folder), seed=0)
    with deadline(30), pytest.raises(WorkbenchError, match="is a device"):
        load_local("/dev/zero", seed=0)


@pytest.mark.slow
def test_kdw_refuses_a_pipe_as_task_in_one_line_and_returns(tmp_path):
    fifo = tmp_path / "task.csv"
    os.mkfifo(fifo)
    result = subprocess.run(
        [sys.executable, "-m", "kd.cli", "baseline", "--task", str(fifo)],
        capture_output=True,
        text=True,
        timeout=300,  # blocked forever before; the imports take the time
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "is a pipe" in lines[0]
