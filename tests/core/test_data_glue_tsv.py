"""GLUE from the original distribution's TSV files (``glue_data/SST-2/train.tsv``), with each task's
quirks, in tests/fixtures/glue_tsv/: CoLA without a header, MRPC with a byte-order mark, QQP and
MNLI with quote characters inside texts and a QQP train row with a missing field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from workbench.core.config import DataConfig
from workbench.core.data import load_glue, load_task, local
from workbench.core.errors import WorkbenchError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "glue_tsv"

# task: label names, GLUE dev.tsv (our test split) as texts / second texts / labels, train rows
# kept, and the first train row as (text, second text, label)
EXPECTED = {
    "cola": (
        ("unacceptable", "acceptable"),
        [
            "The sailors rode the breeze clear of the rocks.",
            "The more we study verbs, the crazier they get get.",
        ],
        None,
        [1, 0],
        6,
        ("The cat sat on the mat.", None, 1),
    ),
    "sst2": (
        ("negative", "positive"),
        ["it 's a charming and often affecting journey .", "unflinchingly bleak and desperate"],
        None,
        [1, 0],
        20,
        ("a warm and funny film number 0", None, 1),
    ),
    "mrpc": (
        ("not_equivalent", "equivalent"),
        ["He is 54 years old.", "Prices fell 2 percent."],
        ["He is aged 54.", "The index closed higher."],
        [1, 0],
        4,
        (
            "He said the foodservice pie business does not fit.",
            "The foodservice pie business does not fit, he said.",
            1,
        ),
    ),
    "qqp": (
        ("not_duplicate", "duplicate"),
        [
            '"Why are cats so independent?',
            "I want to pursue PhD in Computer Science about social network, what is the open "
            "problem in social networks?",
            "Is there a reason why we should travel alone?",
        ],
        [
            "Why are dogs so loyal?",
            'What is a "social network"?',
            "What are some reasons to travel alone?",
        ],
        [0, 0, 1],
        5,
        (
            "How is the life of a math student?",
            "Which level of prepration is enough for the exam jlpt5?",
            0,
        ),
    ),
    "stsb": (
        (),
        ["A man with a hard hat is dancing.", "A young child is riding a horse."],
        ["A man wearing a hard hat is dancing.", "A child is riding a horse."],
        [5.0, 4.75],
        4,
        ("A plane is taking off.", "An air plane is taking off.", 5.0),
    ),
    "mnli": (
        ("entailment", "neutral", "contradiction"),
        ["The new rights are nice enough", '"Not a chance," she said, and left.', "Cats and dogs."],
        ["Everyone really likes the newest benefits", "She agreed to stay.", "Only horses."],
        [1, 2, 2],
        6,
        (
            "Conceptually cream skimming has two basic dimensions.",
            "Product and geography are what make cream skimming work.",
            1,
        ),
    ),
    "qnli": (
        ("entailment", "not_entailment"),
        [
            "What came into force after the new constitution was herald?",
            "What is the first major city in the stream of the Rhine?",
        ],
        [
            "As of that day, the new constitution heralding the Second Republic came into force.",
            "The most important tributaries in this area are the Ill below of Strasbourg.",
        ],
        [0, 1],
        4,
        (
            "When did the third Digimon series begin?",
            "Unlike the two seasons before it, the third series was darker.",
            1,
        ),
    ),
    "rte": (
        ("entailment", "not_entailment"),
        [
            "Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at "
            "age 44.",
            "Yet, we now are discovering that antibiotics are losing their effectiveness.",
        ],
        ["Christopher Reeve had an accident.", "Bacteria is winning the war against antibiotics."],
        [1, 0],
        4,
        (
            "No Weapons of Mass Destruction Found in Iraq Yet.",
            "Weapons of Mass Destruction Found in Iraq.",
            1,
        ),
    ),
}


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_each_task_loads_from_the_glue_distribution(task: str):
    label_names, texts, pairs, labels, train_rows, first = EXPECTED[task]
    data = load_glue(task, seed=0, glue_dir=str(FIXTURES))
    assert data.spec.label_names == label_names
    assert data.spec.pair == (pairs is not None)
    test = data.splits["test"]  # GLUE's dev.tsv (MNLI: dev_matched.tsv)
    assert test.texts == texts
    assert test.pairs == pairs
    assert test.labels == pytest.approx(labels)
    assert all(isinstance(label, float if task == "stsb" else int) for label in test.labels)
    train, dev = data.splits["train"], data.splits["dev"]
    assert len(train) + len(dev) == train_rows  # dev is carved out of GLUE's train
    seconds = train.pairs + dev.pairs if data.spec.pair else [None] * train_rows
    assert first in zip(train.texts + dev.texts, seconds, train.labels + dev.labels, strict=True)


def test_quotes_inside_texts_are_text():
    """QQP and MNLI texts start with or hold a double quote. Read as CSV quotes, QQP's would
    swallow the rows after it and MNLI's would lose its quotes (the fixtures are checked to be
    such files)."""
    quoted = pd.read_csv(FIXTURES / "QQP" / "dev.tsv", sep="\t", on_bad_lines="skip")
    assert len(quoted) != 3
    quoted = pd.read_csv(FIXTURES / "MNLI" / "dev_matched.tsv", sep="\t")
    assert '"Not a chance," she said, and left.' not in quoted["sentence1"].tolist()
    qqp = load_glue("qqp", seed=0, glue_dir=str(FIXTURES))
    assert len(qqp.splits["test"]) == 3
    assert qqp.splits["test"].texts[0].startswith('"Why are cats')
    mnli = load_glue("mnli", seed=0, glue_dir=str(FIXTURES))
    assert len(mnli.splits["test"]) == 3
    assert '"Not a chance," she said, and left.' in mnli.splits["test"].texts


def test_qqp_rows_with_a_missing_field_are_skipped_and_noted():
    data = load_glue("qqp", seed=0, glue_dir=str(FIXTURES))
    train_texts = data.splits["train"].texts + data.splits["dev"].texts
    assert "How can I start an online shopping business?" not in train_texts
    assert "Why is the sky blue?" in train_texts  # the row after it is read
    assert any("skipped 1 rows of train.tsv" in note for note in data.notes)


def test_mnli_mismatched_and_the_split_convention():
    data = load_glue("mnli", seed=0, glue_dir=str(FIXTURES))
    assert set(data.splits) == {"train", "dev", "test", "test-mismatched"}
    assert data.splits["test-mismatched"].labels == [2, 0]
    assert data.splits["test-mismatched"].pairs[1] == "The film was shot in Italy."
    sst2 = load_task(DataConfig(task="sst2", glue_dir=str(FIXTURES)))
    dev, train = sst2.splits["dev"], sst2.splits["train"]
    assert sorted(dev.labels) == [0, 1]  # stratified: one of each class of the 20 rows
    assert set(dev.uids).isdisjoint(train.uids)


def _copy(task_folder: str, tmp_path: Path) -> Path:
    shutil.copytree(FIXTURES / task_folder, tmp_path / task_folder)
    return tmp_path / task_folder


def test_incomplete_or_wrong_layouts_are_one_line_errors(tmp_path: Path):
    folder = _copy("RTE", tmp_path)
    (folder / "dev.tsv").unlink()
    with pytest.raises(WorkbenchError, match=r"RTE/dev\.tsv is missing") as error:
        load_glue("rte", seed=0, glue_dir=str(tmp_path))
    assert "\n" not in str(error.value)
    (tmp_path / "SST-2").mkdir()
    with pytest.raises(WorkbenchError, match=r"SST-2/train\.tsv is missing"):
        load_glue("sst2", seed=0, glue_dir=str(tmp_path))
    folder = _copy("MNLI", tmp_path)
    (folder / "dev_mismatched.tsv").unlink()
    with pytest.raises(WorkbenchError, match=r"MNLI/dev_mismatched\.tsv is missing"):
        load_glue("mnli", seed=0, glue_dir=str(tmp_path))
    with pytest.raises(WorkbenchError, match=r"no qnli data: expected .*QNLI/train\.tsv"):
        load_glue("qnli", seed=0, glue_dir=str(tmp_path))


def test_wrong_files_name_the_column_or_line(tmp_path: Path):
    folder = _copy("QNLI", tmp_path)
    shutil.copy(folder / "test.tsv", folder / "dev.tsv")  # no label column
    with pytest.raises(WorkbenchError, match=r"dev\.tsv: no column\(s\) \['label'\]"):
        load_glue("qnli", seed=0, glue_dir=str(tmp_path))
    folder = _copy("SST-2", tmp_path)
    lines = (folder / "dev.tsv").read_text().splitlines()
    lines[2] = "a film\tpositive"
    (folder / "dev.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkbenchError, match=r"dev\.tsv, line 3: label 'positive' is not one of"):
        load_glue("sst2", seed=0, glue_dir=str(tmp_path))


def test_a_glue_field_or_row_over_the_limits_is_one_line_naming_the_line(tmp_path, monkeypatch):
    """The GLUE files are read under the limits of any data file: a field of more than
    FIELD_LIMIT characters or a row of more than COLUMN_LIMIT columns names the file and line."""
    monkeypatch.setattr(local, "FIELD_LIMIT", 1000)
    monkeypatch.setattr(local, "COLUMN_LIMIT", 5)
    folder = _copy("SST-2", tmp_path)
    lines = (folder / "dev.tsv").read_text().splitlines()
    lines[2] = "a" * 999 + "\t1"  # 1,002 characters with its newline: one line over the limit
    (folder / "dev.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkbenchError) as caught:
        load_glue("sst2", seed=0, glue_dir=str(tmp_path))
    assert str(caught.value) == (
        f"{folder / 'dev.tsv'}: line 3: over 1,000 characters, the most a line or a field of a "
        "data file may hold"
    )
    lines[2] = "a film" + "\t1" * 5
    (folder / "dev.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkbenchError) as caught:
        load_glue("sst2", seed=0, glue_dir=str(tmp_path))
    assert str(caught.value) == (
        f"{folder / 'dev.tsv'}: line 3 has 6 columns, more than the 5 a data file may have"
    )
