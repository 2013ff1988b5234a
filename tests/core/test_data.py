"""Data loaders: GLUE schema (local fixture through datasets), local files, the bundled sets."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import tiny_tokenizer
from workbench.core.config import DataConfig
from workbench.core.data import (
    Split,
    TaskData,
    TaskSpec,
    collate,
    encode,
    load_glue,
    load_local,
    load_task,
    pad_id,
    sample_split,
)
from workbench.core.data.bundled import TWEETS_VERSION
from workbench.core.errors import WorkbenchError


def _write_glue(root: Path, task: str, splits: dict[str, dict], features: datasets.Features):
    folder = root / task
    folder.mkdir(parents=True)
    for split, columns in splits.items():
        datasets.Dataset.from_dict(columns, features=features).to_parquet(
            str(folder / f"{split}-00000-of-00001.parquet")
        )


def test_glue_single_sentence_schema(tmp_path: Path):
    features = datasets.Features(
        {
            "sentence": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["negative", "positive"]),
            "idx": datasets.Value("int32"),
        }
    )
    train = {
        "sentence": [f"sentence number {i}" for i in range(100)],
        "label": [i % 2 for i in range(100)],
        "idx": list(range(100)),
    }
    validation = {"sentence": ["a fine film", "a dull film"], "label": [1, 0], "idx": [0, 1]}
    test = {"sentence": ["hidden"], "label": [-1], "idx": [0]}
    _write_glue(
        tmp_path, "sst2", {"train": train, "validation": validation, "test": test}, features
    )
    data = load_glue("sst2", seed=1, glue_dir=str(tmp_path))
    assert data.spec.label_names == ("negative", "positive")
    assert data.splits["test"].texts == ["a fine film", "a dull film"]  # GLUE validation
    assert len(data.splits["train"]) + len(data.splits["dev"]) == 100
    assert len(data.splits["dev"]) == 2  # capped at the validation size
    assert set(data.splits["train"].uids).isdisjoint(data.splits["dev"].uids)


def test_glue_pair_regression_and_mnli_mismatched(tmp_path: Path):
    pair = datasets.Features(
        {
            "sentence1": datasets.Value("string"),
            "sentence2": datasets.Value("string"),
            "label": datasets.Value("float32"),
            "idx": datasets.Value("int32"),
        }
    )
    rows = {
        "sentence1": ["a b", "c d", "e f"] * 10,
        "sentence2": ["x", "y", "z"] * 10,
        "label": [0.5, 2.25, 4.0] * 10,
        "idx": list(range(30)),
    }
    _write_glue(tmp_path, "stsb", {"train": rows, "validation": rows}, pair)
    data = load_glue("stsb", seed=0, glue_dir=str(tmp_path))
    assert data.spec.regression and data.spec.pair
    assert data.splits["test"].pairs[:3] == ["x", "y", "z"]
    assert data.splits["test"].labels[:3] == pytest.approx([0.5, 2.25, 4.0])

    nli = datasets.Features(
        {
            "premise": datasets.Value("string"),
            "hypothesis": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
            "idx": datasets.Value("int32"),
        }
    )
    rows = {
        "premise": [f"p{i}" for i in range(30)],
        "hypothesis": ["h"] * 30,
        "label": [i % 3 for i in range(30)],
        "idx": list(range(30)),
    }
    _write_glue(
        tmp_path,
        "mnli",
        {"train": rows, "validation_matched": rows, "validation_mismatched": rows},
        nli,
    )
    data = load_glue("mnli", seed=0, glue_dir=str(tmp_path))
    assert set(data.splits) == {"train", "dev", "test", "test-mismatched"}
    assert data.spec.num_labels == 3


def test_glue_missing_split_is_a_clear_error(tmp_path: Path):
    (tmp_path / "rte").mkdir()
    with pytest.raises(WorkbenchError, match="no parquet files"):
        load_glue("rte", seed=0, glue_dir=str(tmp_path))


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_local_file_formats_give_the_same_task(tmp_path: Path, suffix: str):
    frame = pd.DataFrame({"text": [f"text {i}" for i in range(60)], "label": ["b", "a", "c"] * 20})
    path = tmp_path / f"data{suffix}"
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".tsv":
        frame.to_csv(path, sep="\t", index=False)
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_parquet(path)
    data = load_task(DataConfig(task=str(path)))
    assert data.spec.label_names == ("a", "b", "c")
    assert [len(data.splits[s]) for s in ("train", "dev", "test")] == [48, 6, 6]
    for split in data.splits.values():  # stratified: every class in every split
        assert sorted(set(split.labels)) == [0, 1, 2]


def test_local_directory_pairs_and_regression(tmp_path: Path):
    frame = pd.DataFrame(
        {
            "text": [f"q {i}" for i in range(40)],
            "text_pair": [f"a {i}" for i in range(40)],
            "label": [i / 8 for i in range(40)],
        }
    )
    frame.iloc[:30].to_csv(tmp_path / "train.csv", index=False)
    frame.iloc[30:].to_csv(tmp_path / "test.csv", index=False)
    data = load_task(DataConfig(task=str(tmp_path)))
    assert data.spec.regression and data.spec.pair
    assert len(data.splits["test"]) == 10
    assert len(data.splits["train"]) + len(data.splits["dev"]) == 30


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (pd.DataFrame({"sentence": ["x"], "label": ["a"]}), r"missing column\(s\) \['text'\]"),
        (pd.DataFrame({"text": ["x", " \r\n "], "label": ["a", "b"]}), "empty text"),
        (pd.DataFrame({"text": ["x", "y"], "label": ["a", None]}), "missing label"),
    ],
)
def test_local_bad_input(tmp_path: Path, frame: pd.DataFrame, message: str):
    path = tmp_path / "bad.jsonl"
    frame.to_json(path, orient="records", lines=True)
    with pytest.raises(WorkbenchError, match=message):
        load_task(DataConfig(task=str(path)))


def test_unknown_label_in_dev_and_unknown_task(tmp_path: Path):
    pd.DataFrame({"text": ["a", "b"], "label": ["x", "y"]}).to_csv(tmp_path / "train.csv")
    pd.DataFrame({"text": ["c"], "label": ["z"]}).to_csv(tmp_path / "dev.csv")
    with pytest.raises(WorkbenchError, match=r"unknown label\(s\) \['z'\]"):
        load_task(DataConfig(task=str(tmp_path)))
    with pytest.raises(WorkbenchError, match="unknown task 'sst 3'"):  # not a hub name either
        load_task(DataConfig(task="sst 3"))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(WorkbenchError, match="unsupported file type"):
        load_task(DataConfig(task=str(tmp_path / "notes.txt")))


def test_encode_counts_truncation_and_collate_pads(tmp_path: Path):
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    frame = pd.DataFrame(
        {"text": ["good movie", "the film was very very very bad and sad"], "label": ["a", "b"]}
    )
    frame.to_csv(tmp_path / "x.csv", index=False)
    data = load_local(str(tmp_path / "x.csv"), seed=13)  # too small for load_task's checks
    split = data.splits["train"]
    encoded = encode(split, tokenizer, max_length=6)
    assert encoded.truncated == sum(len(t.split()) + 2 > 6 for t in split.texts)
    assert all(len(ids) <= 6 for ids in encoded.input_ids)
    batch = collate([encoded[i] for i in range(len(encoded))], tokenizer.pad_token_id)
    lengths = [len(ids) for ids in encoded.input_ids]
    assert batch["input_ids"].shape == (len(encoded), max(lengths))
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert (batch["input_ids"][batch["attention_mask"] == 0] == tokenizer.pad_token_id).all()
    assert batch["index"].tolist() == list(range(len(encoded)))


@pytest.mark.parametrize(
    ("task", "classes", "total"), [("tweets", 3, 37185), ("bbc-news", 5, 2125)]
)
def test_bundled_sets_clean_deterministic_stratified(task: str, classes: int, total: int):
    first = load_task(DataConfig(task=task))
    again = load_task(DataConfig(task=task))
    assert first.fingerprint() == again.fingerprint()
    assert first.spec.num_labels == classes
    sizes = {name: len(split) for name, split in first.splits.items()}
    assert sum(sizes.values()) == total
    assert sizes["train"] == pytest.approx(0.8 * total, abs=classes)
    every = [u for split in first.splits.values() for u in split.uids]
    assert len(every) == len(set(every)), "duplicates across or within splits"
    for split in first.splits.values():
        assert all(t and t == " ".join(t.split()) for t in split.texts)
        shares = torch.bincount(torch.tensor(split.labels), minlength=classes) / len(split)
        overall = (
            torch.bincount(torch.tensor(first.splits["train"].labels), minlength=classes)
            / sizes["train"]
        )
        assert torch.allclose(shares, overall, atol=0.01)
    other_seed = load_task(DataConfig(task=task, split_seed=99))
    assert other_seed.fingerprint() != first.fingerprint()


def test_subsample_is_stratified_and_deterministic():
    config = DataConfig(task="tweets", max_train_examples=600, max_eval_examples=90)
    data = load_task(config)
    assert len(data.splits["train"]) == 600
    assert len(data.splits["dev"]) == len(data.splits["test"]) == 90
    assert load_task(config).fingerprint() == data.fingerprint()
    full = torch.tensor(load_task(DataConfig(task="tweets")).splits["train"].labels)
    expected = (torch.bincount(full) / len(full) * 600).tolist()
    counts = torch.bincount(torch.tensor(data.splits["train"].labels)).tolist()
    assert counts == pytest.approx(expected, abs=2)


def test_sample_of_a_class_ordered_split_keeps_every_class():
    ordered = Split(
        texts=[f"text {i}" for i in range(300)],
        labels=[0] * 200 + [1] * 60 + [2] * 40,
        uids=[str(i) for i in range(300)],
    )
    sample = sample_split(ordered, 30, seed=0)
    assert torch.bincount(torch.tensor(sample.labels)).tolist() == [20, 6, 4]
    positions = [int(u) for u in sample.uids]
    assert positions == sorted(positions), "the split's order is kept"
    assert sample_split(ordered, 30, seed=0).uids == sample.uids
    assert sample_split(ordered, 30, seed=1).uids != sample.uids
    assert sample_split(ordered, 300, seed=0) is ordered
    assert sample_split(ordered, None, seed=0) is ordered


@pytest.mark.parametrize("pairs", [None, ["nice " * 3, "long " * 30, "a", "the " * 9]])
def test_encode_truncates_in_one_pass_like_two(tmp_path: Path, pairs):
    """One tokenizer call gives the ids of ``truncation=True`` and counts the texts it cut."""
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    texts = ["good " * 20, "bad film", "the plot " * 3, "very " * 7]
    split = Split(texts=texts, labels=[0, 1, 0, 1], uids=[str(i) for i in range(4)], pairs=pairs)
    encoded = encode(split, tokenizer, max_length=10)
    args = (texts,) if pairs is None else (texts, pairs)
    expected = tokenizer(*args, truncation=True, max_length=10)
    full = tokenizer(*args, truncation=False)["input_ids"]
    assert encoded.input_ids == expected["input_ids"]
    assert encoded.token_type_ids == expected["token_type_ids"]
    assert encoded.truncated == sum(len(ids) > 10 for ids in full) == (1 if pairs is None else 3)


def test_pad_id_is_the_tokenizers_or_zero(tmp_path: Path):
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    assert pad_id(tokenizer) == tokenizer.pad_token_id == 0
    tokenizer.add_special_tokens({"pad_token": "[UNK]"})
    assert pad_id(tokenizer) == 1
    tokenizer.pad_token = None
    assert pad_id(tokenizer) == 0


def test_tweets_v2_decodes_html_entities_and_keeps_the_split_sizes():
    data = load_task(DataConfig(task="tweets"))
    texts = [t for split in data.splits.values() for t in split.texts]
    entity = re.compile(r"&(?:amp|lt|gt|quot|apos|nbsp);|&#")
    assert not [t for t in texts if entity.search(t)]
    # escaped once (&amp;), twice (&amp;gt; for >) and numerically (&#39;)
    assert (
        "@united #Newarkliberty Airport need to indicate different gate#'s for terminals A&C. "
        "#Flyingainteasy" in texts
    )
    assert any(
        t.startswith("RT @BisonTactical: RT @CTFirearms: RT @AmyMek: #DeflateGate -> Get")
        for t in texts
    )
    assert any(t.startswith("Google's Unveils Its New Self-Driving Car") for t in texts)
    # decoding made no new duplicates: v1's sizes
    assert {name: len(split) for name, split in data.splits.items()} == {
        "train": 29748,
        "dev": 3719,
        "test": 3718,
    }
    assert data.version == TWEETS_VERSION and data.notes[0] == f"{TWEETS_VERSION} (1802 texts)"
    v1 = {"train": "6668bf0889517a8f", "dev": "ad8cb510f3b6a0ad", "test": "42ed737c70f43c04"}
    assert not set(data.fingerprint().values()) & set(v1.values())


def test_the_data_version_enters_the_fingerprint_only_where_there_is_one():
    split = Split(texts=["a", "b"], labels=[0, 1], uids=["u1", "u2"])
    spec = TaskSpec("t", ("x", "y"), ("accuracy",))
    plain = TaskData(spec, {"train": split}, "here")
    expected = hashlib.sha256(b"u1\t0\nu2\t1").hexdigest()[:16]  # as before versions existed
    assert plain.fingerprint() == {"train": expected}
    v2 = TaskData(spec, {"train": split}, "here", version="v2")
    assert v2.fingerprint() == {
        "train": hashlib.sha256(b"version\tv2\nu1\t0\nu2\t1").hexdigest()[:16]
    }


@pytest.mark.parametrize("limit", [31, 32, 33, 5])
def test_an_exact_sample_has_exactly_its_size_in_the_splits_order(limit):
    """Three classes of 100, 100 and 101: their rounded shares of 32 make 33 (or 31 of 31…);
    ``exact`` gives the size asked for, still deterministic and in order."""
    split = Split(
        texts=[f"text {i}" for i in range(301)],
        labels=[0] * 100 + [1] * 100 + [2] * 101,
        uids=[str(i) for i in range(301)],
    )
    sample = sample_split(split, limit, seed=0, exact=True)
    assert len(sample) == limit
    positions = [int(u) for u in sample.uids]
    assert positions == sorted(positions) and len(set(positions)) == limit
    assert sample_split(split, limit, seed=0, exact=True).uids == sample.uids
    counts = torch.bincount(torch.tensor(sample.labels), minlength=3).tolist()
    assert max(counts) - min(counts) <= 2


def _split_directly(labels, fractions, seed):
    """The stratified partition as its definition reads: each class's indices (classes sorted),
    shuffled in turn and cut by the fractions (examples × classes comparisons)."""
    rng = np.random.default_rng(seed)
    parts = [[] for _ in fractions]
    for value in sorted(set(labels)):
        shuffled = rng.permutation(np.flatnonzero(np.asarray(labels) == value))
        bounds = np.round(np.cumsum(fractions) * len(shuffled)).astype(int)
        for k, piece in enumerate(np.split(shuffled, bounds[:-1])):
            parts[k].extend(piece.tolist())
    return [sorted(p) for p in parts]


@pytest.mark.parametrize("kind", ["ints", "strings"])
def test_stratified_splits_equal_their_definition(kind):
    from workbench.core.data.splits import split_indices

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 7, 500).tolist()
    labels = labels if kind == "ints" else [f"class {v}" for v in labels]
    for fractions in ((0.8, 0.1, 0.1), (0.9, 0.1)):
        parts = split_indices(labels, fractions, 3, stratify=True)
        assert [p.tolist() for p in parts] == _split_directly(labels, fractions, 3)


@pytest.mark.slow
def test_a_hundred_thousand_classes_split_in_seconds():
    from workbench.core.data.splits import split_indices

    many = [i // 2 for i in range(200_000)]  # 100 000 classes of 2 examples
    start = time.perf_counter()
    parts = split_indices(many, (0.8, 0.1, 0.1), 0, stratify=True)
    assert time.perf_counter() - start < 10  # examples × classes: minutes
    assert sorted(np.concatenate(parts).tolist()) == list(range(200_000))
