"""Hub data sets and the column options: real ``datasets`` objects (ClassLabel, integer and
string labels, missing splits, GLUE-style hidden test labels, other column names) made into
tasks offline, through a folder written by ``save_to_disk`` and the function the hub loader
calls; a hub name without the hub is one line."""

from __future__ import annotations

import time
from pathlib import Path

import datasets
import pytest

from workbench.core import hub
from workbench.core.config import DataConfig, to_dict
from workbench.core.data import load_task
from workbench.core.data.hub_sets import task_from_dataset_dict
from workbench.core.data.local import Columns
from workbench.core.data.splits import split_indices
from workbench.core.errors import WorkbenchError

CLASSES = ["neg", "neu", "pos"]


def _dataset(rows: int, labels, feature, text="text", offset=0) -> datasets.Dataset:
    features = datasets.Features({text: datasets.Value("string"), "label": feature})
    texts = [f"review number {offset + i}" for i in range(rows)]
    return datasets.Dataset.from_dict({text: texts, "label": labels}, features=features)


def _classlabel_dict(test_labels=None) -> datasets.DatasetDict:
    feature = datasets.ClassLabel(names=CLASSES)
    return datasets.DatasetDict(
        {
            "train": _dataset(90, [i % 3 for i in range(90)], feature),
            "validation": _dataset(12, [i % 3 for i in range(12)], feature, offset=100),
            "test": _dataset(9, test_labels or [i % 3 for i in range(9)], feature, offset=200),
        }
    )


def test_classlabel_int_and_str_labels_name_the_same_classes():
    classlabel = task_from_dataset_dict(_classlabel_dict(), "x", "here", seed=0)
    assert classlabel.spec.label_names == ("neg", "neu", "pos")
    assert classlabel.splits["test"].labels == [i % 3 for i in range(9)]
    assert classlabel.splits["test"].texts[4] == "review number 204"
    assert classlabel.notes == []  # train, validation and test used as they are
    as_ints = datasets.DatasetDict(
        {s: d.cast_column("label", datasets.Value("int64")) for s, d in _classlabel_dict().items()}
    )
    ints = task_from_dataset_dict(as_ints, "x", "here", seed=0)
    assert ints.spec.label_names == ("0", "1", "2")
    strings = datasets.DatasetDict(
        {
            s: d.map(lambda r: {"name": f" {CLASSES[r['label']]} "})
            .remove_columns("label")
            .rename_column("name", "label")
            for s, d in _classlabel_dict().items()
        }
    )
    words = task_from_dataset_dict(strings, "x", "here", seed=0)
    assert words.spec.label_names == ("neg", "neu", "pos")  # whitespace stripped, sorted
    for other in (ints, words):  # the same examples, the same class of each
        assert other.fingerprint() == classlabel.fingerprint()


def test_a_classlabel_keeps_its_order_and_its_unseen_classes():
    feature = datasets.ClassLabel(names=["zebra", "apple", "never"])
    data = task_from_dataset_dict(
        datasets.DatasetDict({"train": _dataset(40, [0, 1] * 20, feature)}), "x", "here", seed=0
    )
    assert data.spec.label_names == ("zebra", "apple", "never")
    assert data.spec.num_labels == 3


def test_hidden_test_labels_and_missing_splits_are_made_from_train(tmp_path: Path):
    hidden = _classlabel_dict(test_labels=[-1] * 9)
    hidden.save_to_disk(str(tmp_path / "saved"))
    data = load_task(DataConfig(task=str(tmp_path / "saved"), split_seed=5))
    train = hidden["train"]
    rest, part = split_indices(train["label"], (0.9, 0.1), 5, stratify=True)
    assert data.splits["test"].texts == [train["text"][i] for i in part]
    assert data.splits["train"].texts == [train["text"][i] for i in rest]
    assert data.splits["dev"].texts == hidden["validation"]["text"]
    assert data.notes == [
        "saved: its test split has no labels: not used",
        "saved: no test split: test = 10% of train (stratified, seed 5)",
    ]
    assert data.source == str(tmp_path / "saved")
    only_train = datasets.DatasetDict({"train": hidden["train"], "unsupervised": hidden["test"]})
    data = task_from_dataset_dict(only_train, "imdb", "hub:imdb", seed=3)
    sizes = {name: len(split) for name, split in data.splits.items()}
    assert sizes == {"train": 72, "dev": 9, "test": 9}  # 80/10/10 of 30 per class
    assert data.notes == [
        "imdb: splits not used: unsupervised",
        "imdb: no dev or test split: train split 80/10/10 (stratified, seed 3)",
    ]


def test_other_column_names_for_hub_sets_and_local_files(tmp_path: Path):
    feature = datasets.ClassLabel(names=CLASSES)
    train = _dataset(60, [i % 3 for i in range(60)], feature, text="review")
    train = train.add_column("answer", [f"answer {i}" for i in range(60)])
    train = train.rename_column("label", "stars")
    loaded = datasets.DatasetDict({"train": train, "test": train.select(range(6))})
    columns = Columns(text="review", pair="answer", label="stars")
    data = task_from_dataset_dict(loaded, "x", "here", seed=0, columns=columns)
    assert data.spec.pair and data.spec.label_names == tuple(CLASSES)
    assert data.splits["test"].pairs == [f"answer {i}" for i in range(6)]
    with pytest.raises(WorkbenchError) as info:
        task_from_dataset_dict(loaded, "x", "here", seed=0)
    assert str(info.value) == (
        "here train split: missing column(s) ['text', 'label']; found ['review', 'stars', "
        "'answer'] (choose them with --text-column, --text-pair-column and --label-column)"
    )
    path = tmp_path / "reviews.csv"
    train.to_pandas().to_csv(path, index=False)
    config = DataConfig(task=str(path), text_column="review", label_column="stars")
    local = load_task(config)
    assert local.spec.label_names == ("0", "1", "2") and not local.spec.pair
    assert sorted(local.splits["train"].texts) == sorted(
        t for t in train["review"] if t in set(local.splits["train"].texts)
    )
    assert sum(len(s) for s in local.splits.values()) == 60
    assert to_dict(config)["text_column"] == "review"
    assert "task_config" not in to_dict(config) and "text_pair_column" not in to_dict(config)
    assert set(to_dict(DataConfig())) == {
        "task", "max_length", "max_train_examples", "max_eval_examples", "split_seed", "glue_dir"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (["Pos", "neg", "pos"] * 10, "labels 'Pos' and 'pos' differ only by case; make them one"),
        (["pos", None, "neg"] * 10, "missing label (empty or NaN) in 10 row(s) (row 1, 4, 7, 10,"),
    ],
)
def test_bad_labels_are_one_line_errors(labels, message):
    loaded = datasets.DatasetDict({"train": _dataset(30, labels, datasets.Value("string"))})
    with pytest.raises(WorkbenchError, match=None) as info:
        task_from_dataset_dict(loaded, "x", "here", seed=0)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_column_options_are_refused_where_they_do_not_apply():
    with pytest.raises(WorkbenchError, match=r"^--text-column: only for local files and hub"):
        load_task(DataConfig(task="tweets", text_column="body"))
    with pytest.raises(WorkbenchError, match=r"^--task-config: only for hub data sets"):
        load_task(DataConfig(task="sst2", task_config="sst2"))


@pytest.mark.parametrize("name", ["stanfordnlp/imdb", "imdb"])
def test_a_hub_name_without_the_hub_is_one_line(name, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no local folder of that name
    for variable in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(hub, "_endpoint_answers", lambda: False)
    loads = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: loads.append(a))
    start = time.monotonic()
    with pytest.raises(WorkbenchError) as info:
        load_task(DataConfig(task=name, task_config="plain_text"))
    assert time.monotonic() - start < 5 and not loads
    message = str(info.value)
    assert "\n" not in message
    local = " (no local file or folder of that name either)" if "/" in name else ""
    assert message.startswith(
        f"cannot load hub data set '{name}' (plain_text){local}: the hub is unreachable"
    )
    assert "save_to_disk" in message and "HF_HUB_OFFLINE=1" in message
