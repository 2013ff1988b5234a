"""Input that used to end in a traceback, a silent choice or a line of 89 KB ends in one short
line, exit status 2, and nothing written: a column named twice, texts that are not strings,
``--json`` to a full device, a ``--run-dir`` under a file, a refusal listing 10 000 classes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import (
    kdw_fresh,
    kdw_here,
    make_sentences,
    tiny_model,
    tiny_tokenizer,
    write_tiny_workspace,
)
from workbench.core.errors import WorkbenchError
from workbench.core.models import class_order

FAST = ["--max-length", "16", "--epochs", "0.1", "--batch-size", "16", "--threads", "1"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The tiny workspace, a classifier folder of the tiny task's classes, and damaged data."""
    work = tmp_path_factory.mktemp("one-line")
    write_tiny_workspace(work)
    tiny_tokenizer(work / "classifier")
    model = tiny_model()
    model.config.id2label = dict(enumerate(["negative", "neutral", "positive"]))
    model.config.label2id = {v: k for k, v in model.config.id2label.items()}
    model.save_pretrained(work / "classifier")
    frame = make_sentences(60)
    data = work / "data"
    data.mkdir()
    lines = ["text,text,label", *(f"{t},other words,{y}" for t, y in frame.to_numpy())]
    (data / "twice.csv").write_text("\n".join(lines) + "\n")
    rows = [{"text": t, "label": y} for t, y in frame.to_numpy()]
    rows[6]["text"] = {"nested": "object"}
    (data / "objects.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    texts = [["a", "list", str(i)] for i in range(len(frame))]  # list<string> cells
    pd.DataFrame({"text": texts, "label": list(frame["label"])}).to_parquet(data / "lists.parquet")
    rows = [{"text": t, "label": y} for t, y in frame.to_numpy()]
    rows[2]["label"] = {"class": "positive"}  # would become the class "{'class': 'positive'}"
    (data / "label-objects.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    texts = [t.encode() for t in frame["text"]]  # a binary column: texts "b'…'"
    pd.DataFrame({"text": texts, "label": list(frame["label"])}).to_parquet(data / "bytes.parquet")
    (data / "file.csv").write_text("text,label\n")
    return work


DATA = {
    "a column named twice": (
        "twice.csv",
        "{d}/twice.csv: the header names the column(s) ['text'] more than once: give each "
        "column its own name",
    ),
    "a JSON object as a text": (
        "objects.jsonl",
        "{d}/objects.jsonl: text is not a text but a dict in 1 row(s) (line 8: {{'nested': "
        "'object'}}); give each text as a string",
    ),
    "a list cell as a text": (
        "lists.parquet",
        "{d}/lists.parquet: text is not a text but a ndarray in 60 row(s) (line 2, 3, 4, 5, 6, "
        "...: ['a', 'list', '0']); give each text as a string",
    ),
    "a JSON object as a label": (
        "label-objects.jsonl",
        "{d}/label-objects.jsonl: label is not a single value but a dict in 1 row(s) (line 4: "
        "{{'class': 'positive'}}); give each label as a number or a string",
    ),
    "bytes as texts": (
        "bytes.parquet",
        "{d}/bytes.parquet: text is not a text but a bytes in 60 row(s) (line 2, 3, 4, 5, 6, "
        "...: {first}); give each text as a string",
    ),
}


@pytest.mark.parametrize("case", DATA, ids=list(DATA))
def test_data_that_is_not_what_it_seems_is_refused(work, tmp_path, case):
    name, said = DATA[case]
    command = ["train-teacher", "--model", str(work / "tiny-bert")]
    command += ["--task", str(work / "data" / name), "--run-dir", str(tmp_path / "run"), *FAST]
    status, err = kdw_here(command, tmp_path)
    assert (status, err) == (2, f"kdw: error: {_said(said, work)}\n")
    assert not (tmp_path / "run").exists()


def _said(said: str, work: Path) -> str:
    """A case's line for ``work``'s data (``{first}``: the first bytes text, cut as shown)."""
    first = repr(make_sentences(60)["text"].iloc[0].encode())
    return said.format(d=work / "data", first=first[:40] + ("…" if len(first) > 40 else ""))


def test_a_bad_data_file_is_refused_before_torch_loads(work, tmp_path):
    """Every case above, through train-teacher, distill and tune, in a fresh interpreter: the
    line is said before torch or transformers is imported (a second, not a minute)."""
    commands = []
    for name, said in DATA.values():
        task = ["--task", str(work / "data" / name)]
        commands += [
            (["train-teacher", "--model", str(work / "tiny-bert"), *task], said),
            (["distill", "--teacher", str(work / "classifier"), *task], said),
            (["tune", "--teacher", str(work / "classifier"), *task, "--trials", "1"], said),
        ]
    arguments = [[*c, "--run-dir", str(tmp_path / "run")] for c, _ in commands]
    arguments = [a if a[0] != "tune" else [*a[:-2], "--out", a[-1]] for a in arguments]
    results = kdw_fresh(arguments)
    for (command, said), (status, err, loaded) in zip(commands, results, strict=True):
        assert (status, err) == (2, f"kdw: error: {_said(said, work)}\n"), command
        assert loaded == [], command
    assert not (tmp_path / "run").exists()


def test_json_to_a_full_device_is_one_line(work, tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    command = ["evaluate", str(work / "classifier"), "--task", str(work / "task")]
    status, err = kdw_here([*command, "--max-length", "16", "--json", "/dev/full"], tmp_path)
    assert status == 2
    assert (
        err
        == "kdw: error: --json /dev/full: cannot write it ([Errno 28] No space left on device)\n"
    )


def test_a_run_or_study_folder_under_a_file_is_one_line(work, tmp_path):
    run = work / "data" / "file.csv" / "sub"
    command = ["train-teacher", "--model", str(work / "tiny-bert"), "--task", str(work / "task")]
    status, err = kdw_here([*command, "--run-dir", str(run), *FAST], tmp_path)
    assert (status, err) == (
        2,
        f"kdw: error: {run}: {run.parent} is a file, not a folder: choose another --run-dir\n",
    )
    assert (work / "data" / "file.csv").read_text() == "text,label\n"
    out = work / "data" / "file.csv" / "study"  # a study's folder likewise
    tune = ["tune", "--teacher", str(work / "classifier"), "--task", str(work / "task")]
    status, err = kdw_here([*tune, "--trials", "1", "--out", str(out), *FAST], tmp_path)
    assert (status, err) == (
        2,
        f"kdw: error: {out}: {out.parent} is a file, not a folder: choose another --out\n",
    )
    assert (work / "data" / "file.csv").read_text() == "text,label\n"


def test_a_refusal_of_ten_thousand_classes_is_short():
    model = [f"class {i}" for i in range(10_000)]
    task = [f"c{i}" for i in range(10_000)]
    with pytest.raises(WorkbenchError) as raised:
        class_order(model, task, {}, "big")
    message = str(raised.value)
    assert len(message) < 400, len(message)
    assert message.startswith(
        "big has the classes ['class 0', 'class 1', 'class 2', 'class 3', 'class 4', 'class 5', "
        "'class 6', 'class 7' and 9992 more], the task ['c0', "
    )
    assert message.endswith(
        "--label-map c0=class 0,c1=class 1,c2=class 2,c3=class 3,c4=class 4,c5=class 5,"
        "c6=class 6,c7=class 7,… (task class=model label)"
    )
