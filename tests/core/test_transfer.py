"""A transfer set (``--transfer``): texts without labels appended to the train split with their
labels withheld, each dropped text counted by why, the run's fingerprint changed by them, and every
bad source one line before anything is read further."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import make_sentences
from workbench.core.config import DataConfig
from workbench.core.data import load_task
from workbench.core.data.transfer import add_transfer
from workbench.core.errors import WorkbenchError
from workbench.core.names import UNLABELLED

COLUMNS = ("text", None, "label")


@pytest.fixture
def task(tiny_task_dir: Path) -> DataConfig:
    return DataConfig(task=str(tiny_task_dir), max_train_examples=100)


def _add(config: DataConfig, source: str, limit: int | None = None):
    data, notes = load_task(config, notify=lambda _: None), []
    whole = DataConfig(task=config.task)
    full = lambda: load_task(whole, notify=lambda _: None).splits["train"]  # noqa: E731
    add_transfer(data, source, limit, config.split_seed, COLUMNS, full, notes.append)
    return data, notes


def test_texts_are_appended_unlabelled_and_every_dropped_one_counted(task, tmp_path):
    data = load_task(task, notify=lambda _: None)
    test_text, train_text = data.splits["test"].texts[0], data.splits["train"].texts[0]
    fresh = [t for t in make_sentences(60, seed=9).text if t not in set(load_all(task))][:20]
    lines = [*fresh, f"  {test_text}  ", train_text, fresh[0], "", fresh[1].replace(" ", "\t")]
    source = tmp_path / "unlabelled.txt"
    source.write_text("\n".join(lines) + "\n")
    before = data.fingerprint()["train"]

    data, notes = _add(task, str(source))
    train = data.splits["train"]
    assert len(train) == 100 + 20 and train.texts[100:] == fresh
    assert train.labels[:100] == load_task(task, notify=lambda _: None).splits["train"].labels
    assert all(label == UNLABELLED for label in train.labels[100:])
    assert data.transfer["dropped"] == {
        "dev or test": 1,  # whitespace collapsed, as the splits' overlap compares
        "labelled": 1,
        "repeated": 2,  # fresh[0] again, and fresh[1] with tabs
        "empty": 1,
        "past the limit": 0,
    }
    assert (data.transfer["read"], data.transfer["used"]) == (len(lines), 20)
    assert data.fingerprint()["train"] != before  # a cache or a resume sees the transfer set
    assert notes[-1].startswith("transfer set: 20 texts of") and "1 dev or test" in notes[-1]


def load_all(config: DataConfig) -> list[str]:
    data = load_task(DataConfig(task=config.task), notify=lambda _: None)
    return [text for split in data.splits.values() for text in split.texts]


def test_a_table_gives_its_text_column_a_label_column_is_ignored_and_said(task, tmp_path):
    frame = make_sentences(300, seed=4)
    source = tmp_path / "more.csv"
    frame.to_csv(source, index=False)
    data, notes = _add(task, str(source), limit=30)
    assert data.transfer["used"] == 30 and data.transfer["dropped"]["past the limit"] > 0
    assert any("'label' column is ignored" in note for note in notes)
    again, _ = _add(task, str(source), limit=30)  # the split seed's sample: the same texts
    assert again.splits["train"].texts == data.splits["train"].texts


def test_the_tasks_own_texts_past_the_labelled_ones(task):
    data, _ = _add(task, "task")
    whole = load_task(DataConfig(task=task.task), notify=lambda _: None).splits["train"]
    transfer = data.splits["train"].texts[100:]
    assert len(transfer) == len(whole) - 100 - data.transfer["dropped"]["repeated"]
    assert not set(transfer) & set(data.splits["train"].texts[:100])


def test_regression_withholds_a_label_as_nan(tmp_path):
    frame = make_sentences(80).assign(label=lambda f: [i / 7 for i in range(len(f))])
    frame.to_csv(tmp_path / "scores.csv", index=False)
    (tmp_path / "more.txt").write_text("good fine day\nbad awful night\n")
    data, _ = _add(DataConfig(task=str(tmp_path / "scores.csv")), str(tmp_path / "more.txt"))
    tail = data.splits["train"].labels[-2:]
    assert all(math.isnan(label) for label in tail)


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b"", "no texts"),
        (b"a text\nan\x00other\n", "NUL byte"),
        (b"\xff\xfe\x00", "not utf-16"),  # UTF-16 broken off
        (b"\xc3\x28 latin\n", "not UTF-8"),
    ],
)
def test_a_bad_text_file_is_one_line(task, tmp_path, content, error):
    source = tmp_path / "bad.txt"
    source.write_bytes(content)
    with pytest.raises(WorkbenchError, match=error):
        _add(task, str(source))


def test_bad_sources_are_one_line(task, tmp_path):
    pd.DataFrame({"body": ["a b c"]}).to_csv(tmp_path / "other.csv", index=False)
    with pytest.raises(WorkbenchError, match=r"no column 'text'; found \['body'\]"):
        _add(task, str(tmp_path / "other.csv"))
    test_texts = load_task(task, notify=lambda _: None).splits["test"].texts
    (tmp_path / "held.txt").write_text("\n".join(test_texts[:3]))
    with pytest.raises(WorkbenchError, match=r"all 3 texts were dropped \(3 dev or test"):
        _add(task, str(tmp_path / "held.txt"))
    with pytest.raises(WorkbenchError, match="no such file or folder"):
        _add(task, str(tmp_path / "missing.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkbenchError, match=r"no \.txt, \.csv"):
        _add(task, str(tmp_path / "empty"))
    with pytest.raises(WorkbenchError, match=r"every training text .* is labelled"):
        _add(DataConfig(task=task.task), "task")


def test_a_saved_data_set_gives_its_splits_texts(task, tmp_path):
    import datasets

    texts = [t for t in make_sentences(80, seed=21).text if t not in set(load_all(task))]
    parts = {"train": texts[:30], "unsupervised": texts[30:40]}
    datasets.DatasetDict(
        {name: datasets.Dataset.from_dict({"text": part}) for name, part in parts.items()}
    ).save_to_disk(str(tmp_path / "saved"))
    data, _ = _add(task, str(tmp_path / "saved"))
    assert data.splits["train"].texts[100:] == texts[:40]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "dataset_dict.json").write_text("{ not json")
    with pytest.raises(WorkbenchError, match="cannot read the saved data set"):
        _add(task, str(tmp_path / "broken"))
