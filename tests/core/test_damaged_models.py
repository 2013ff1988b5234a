"""One table of damaged model folders, each refused in the same one line by every door a model
folder enters through — ``kdw evaluate``, ``kdw distill --teacher``, ``kdw train-teacher
--model``, the Python API — with exit status 2 and nothing written: no run folder, no cache.
Every folder is a tiny random classifier saved by transformers, then damaged."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import kdw_here, tiny_model, tiny_tokenizer, write_tiny_workspace
from workbench.app.catalog import discover_runs, model_entry
from workbench.core.errors import WorkbenchError
from workbench.core.models import load_classifier, load_model
from workbench.core.verify import REMEDY

LABELS = {"0": "negative", "1": "neutral", "2": "positive"}  # the tiny task's classes
LABELS_REMEDY = "correct id2label in config.json: ids 0..C-1, one distinct name each"


def _config(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        path = folder / "config.json"
        config = json.loads(path.read_text())
        change(config)
        path.write_text(json.dumps(config))

    return damage


def _weights(change: Callable[[dict], dict | None]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        path = folder / "model.safetensors"
        state = load_file(path)
        state = change(state) or state
        save_file(state, path, metadata={"format": "pt"})

    return damage


def _without(part: str) -> Callable[[Path], None]:
    return _weights(lambda state: {k: v for k, v in state.items() if part not in k})


def _set(key: str, value: float) -> Callable[[Path], None]:
    def change(state: dict) -> None:
        state[key].view(-1)[0] = value

    return _weights(change)


def _small_vocabulary(folder: Path) -> None:
    """Config and weights agree on 20 rows of embeddings; the tokenizer gives 40 ids."""
    torch.manual_seed(0)
    model = tiny_model()
    model.config.vocab_size = 20
    model.resize_token_embeddings(20)
    model.config.id2label = {int(k): v for k, v in LABELS.items()}
    model.config.label2id = {v: int(k) for k, v in LABELS.items()}
    model.save_pretrained(folder)


LAYER = "bert.encoder.layer"
# (id, damage, the error after "kdw: error: ", {d}: the folder)
CASES = [
    (
        "a layer missing",
        _without("layer.3."),
        f"{{d}}/config.json: num_hidden_layers is 4, but model.safetensors in {{d}} holds 3 "
        f"layers ({LAYER}.0 to {LAYER}.2): the config and the weights are of different models; "
        f"{REMEDY}",
    ),
    (
        "a weight missing",
        _without("layer.3.output.dense.weight"),
        f"the weights of {{d}} do not fit its config: 1 weight the architecture expects missing "
        f"({LAYER}.3.output.dense.weight), which would start from random values: {REMEDY}",
    ),
    (
        "an unused tensor",
        _weights(lambda state: {**state, "bert.extra.weight": torch.zeros(2)}),
        f"the weights of {{d}} do not fit its config: 1 tensor the architecture has no place for "
        f"(bert.extra.weight): {REMEDY}",
    ),
    (
        "another model type",
        _config(
            lambda c: c.update(
                model_type="roberta", architectures=["RobertaForSequenceClassification"]
            )
        ),
        "the weights of {d} do not fit its config (config.json says model_type 'roberta', the "
        "weights are named bert.…, classifier.…: another architecture's): 73 weights the "
        "architecture expects missing (classifier.dense.bias, classifier.dense.weight, "
        "classifier.out_proj.bias and 70 more), which would start from random values; 73 "
        "tensors the architecture has no place for (bert.embeddings.LayerNorm.bias, "
        "bert.embeddings.LayerNorm.weight, bert.embeddings.position_embeddings.weight and 70 "
        f"more): {REMEDY}",
    ),
    (
        "a wider config",
        _config(lambda c: c.update(hidden_size=64)),
        "{d}/config.json does not describe the weights of {d}/model.safetensors: "
        "bert.embeddings.LayerNorm.bias is [16] there, the config makes it [64] (config.json: "
        f"hidden_size 64): {REMEDY}",
    ),
    (
        "100000 layers",
        _config(lambda c: c.update(num_hidden_layers=100000)),
        f"{{d}}/config.json: num_hidden_layers is 100000, but model.safetensors in {{d}} holds 4 "
        f"layers ({LAYER}.0 to {LAYER}.3): the config and the weights are of different models; "
        f"{REMEDY}",
    ),
    (
        "a smaller vocabulary",
        _config(lambda c: c.update(vocab_size=20)),
        "{d}/config.json does not describe the weights of {d}/model.safetensors: "
        "bert.embeddings.word_embeddings.weight is [40, 16] there, the config makes it [20, 16] "
        f"(config.json: vocab_size 20): {REMEDY}",
    ),
    (
        "a tokenizer larger than the embeddings",
        _small_vocabulary,
        "{d}/tokenizer.json gives token ids up to 39, but the model's embedding table has 20 "
        f"rows (config.json: vocab_size 20): its tokenizer is not the model's; {REMEDY}",
    ),
    (
        "labels with a gap",
        _config(lambda c: c.update(id2label={"0": "a", "5": "b", "2": "c"})),
        "{d}/config.json: id2label has the ids 0, 2, 5, not 0..2 (one per class, without "
        f"gaps): {LABELS_REMEDY}",
    ),
    (
        "two labels of one name",
        _config(lambda c: c.update(id2label={"0": "neutral", "1": "Neutral", "2": "c"})),
        f"{{d}}/config.json: id2label gives two classes one name: 0 and 1 ('Neutral'): "
        f"{LABELS_REMEDY}",
    ),
    (
        "num_labels against id2label",
        _config(lambda c: c.update(num_labels=5)),
        f"{{d}}/config.json: num_labels is 5, but id2label names 3 classes: {LABELS_REMEDY}, "
        "num_labels 3",
    ),
    (
        "a 2-label config over a 3-row head",
        _config(lambda c: c.update(id2label={"0": "a", "1": "b"}, label2id={"a": 0, "b": 1})),
        "{d}/config.json does not describe the weights of {d}/model.safetensors: "
        "classifier.bias is [3] there, the config makes it [2] (config.json: num_labels 2, the "
        f"entries of id2label): {REMEDY}",
    ),
    (
        "a NaN weight",
        _set(f"{LAYER}.1.output.dense.weight", float("nan")),
        f"the weights of {{d}} are not finite: {LAYER}.1.output.dense.weight holds NaN or "
        f"infinite values: {REMEDY}",
    ),
    (
        "infinite weights",
        _weights(lambda state: {k: v.fill_(float("inf")) for k, v in state.items()}),
        "the weights of {d} are not finite: bert.embeddings.word_embeddings.weight, "
        "bert.embeddings.position_embeddings.weight, bert.embeddings.token_type_embeddings.weight "
        f"and 70 more hold NaN or infinite values: {REMEDY}",
    ),
]
IDS = [case[0] for case in CASES]
# found from config.json and the safetensors headers, before any weight is read
HEADER_CASES = [
    case
    for case in IDS
    if case not in ("a weight missing", "an unused tensor", "another model type", "a NaN weight")
    and case != "infinite weights"
]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The tiny task, a good classifier folder of its classes, and one damaged copy of it per
    case (``work/cases/<id>``)."""
    work = tmp_path_factory.mktemp("damaged-models")
    write_tiny_workspace(work)
    good = work / "good"
    tiny_tokenizer(good)
    model = tiny_model()
    model.config.id2label = {int(k): v for k, v in LABELS.items()}
    model.config.label2id = {v: int(k) for k, v in LABELS.items()}
    model.save_pretrained(good)
    for name, damage, _ in CASES:
        shutil.copytree(good, work / "cases" / name)
        damage(work / "cases" / name)
    return work


def _error(case: str, work: Path) -> str:
    message = next(message for name, _, message in CASES if name == case)
    return message.format(d=work / "cases" / case)


def test_the_undamaged_folder_loads(work):
    loaded = load_model(str(work / "good"))
    assert loaded.spec.label_names == ("negative", "neutral", "positive")


@pytest.mark.parametrize("case", IDS)
def test_the_python_api_refuses_it(work, case):
    with pytest.raises(WorkbenchError) as raised:
        load_model(str(work / "cases" / case))
    assert str(raised.value) == _error(case, work)


DOORS = {
    "evaluate": ["evaluate", "{d}", "--task", "{w}/task", "--max-length", "16"],
    "distill": ["distill", "--teacher", "{d}", "--task", "{w}/task", "--run-dir", "{o}/run"],
    "train-teacher": [
        "train-teacher",
        "--model",
        "{d}",
        "--task",
        "{w}/task",
        "--run-dir",
        "{o}/t",
    ],
}


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("case", IDS)
def test_every_command_refuses_it_in_one_line(work, tmp_path, monkeypatch, case, door):
    monkeypatch.setenv("KDW_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    out.mkdir()
    folder = work / "cases" / case
    arguments = [a.format(d=folder, w=work, o=out) for a in DOORS[door]]
    status, err = kdw_here(arguments, tmp_path)
    assert (status, err) == (2, f"kdw: error: {_error(case, work)}\n")
    assert list(out.iterdir()) == []  # no run folder, no teacher cache
    assert not (tmp_path / "cache").exists()  # no analysis cache


def test_a_deep_config_is_refused_from_the_header_at_once(work):
    start = time.perf_counter()
    with pytest.raises(WorkbenchError, match="num_hidden_layers is 100000"):
        load_classifier(str(work / "cases" / "100000 layers"), 3)
    assert time.perf_counter() - start < 5  # building 100000 layers takes minutes


def test_a_checkpoint_without_a_head_gets_a_new_one_and_says_so(work):
    notes: list[str] = []
    from workbench.core.verify import check_loaded

    model, info = _bare_load(work / "tiny-bert")
    check_loaded(model, info, "tiny-bert", True, notes.append)
    assert notes == [
        "tiny-bert has no classification head: a new one (classifier.bias, classifier.weight) "
        "starts from random values and is trained for the task"
    ]
    with pytest.raises(WorkbenchError, match="2 weights the architecture expects missing"):
        check_loaded(model, info, "tiny-bert", False)  # a classifier without its head: refused


def _bare_load(folder: Path):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(
        folder, num_labels=3, output_loading_info=True
    )


def test_the_catalog_lists_a_broken_folder_in_one_line_beside_the_others(work, tmp_path):
    """Every damaged folder under the runs root is listed; those found from the config and the
    weights' headers (no weights are read to list a folder) with their one line, in the sidebar
    and in "Add a model" alike."""
    root = tmp_path / "runs"
    shutil.copytree(work / "good", root / "good")
    for case in IDS:
        shutil.copytree(work / "cases" / case, root / case)
    entries = {entry.name: entry for entry in discover_runs(root)}
    assert sorted(entries) == sorted(["good", *IDS])
    assert entries["good"].usable
    for case in HEADER_CASES:
        expected = _error(case, work).replace(str(work / "cases"), str(root))
        assert entries[case].problem == expected
        assert model_entry(str(root / case)).problem == expected


@pytest.mark.slow
def test_every_page_draws_beside_damaged_model_folders(work, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    root = tmp_path / "runs"
    shutil.copytree(work / "good", root / "good")
    for case in IDS:
        shutil.copytree(work / "cases" / case, root / case)
    monkeypatch.setenv("KDW_RUNS", str(root))
    app = Path(__file__).resolve().parents[2] / "app.py"
    at = AppTest.from_file(str(app), default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    captions = " ".join(c.value for c in at.sidebar.caption).replace("\\", "")
    for case in HEADER_CASES:
        assert f"{case}: " in captions, case
    for page in ("geometry", "loyalty", "divergence", "exports", "train"):
        at.switch_page(f"workbench/app/{page}.py")
        at.run()
        assert not at.exception, (page, [e.value for e in at.exception])
    for case in ("good", *IDS):  # the train page's details of each folder
        at.selectbox(key="train.details").set_value(case).run()
        assert not at.exception, (case, [e.value for e in at.exception])
    at.selectbox(key="train.details").set_value("labels with a gap").run()
    shown = [m.value.replace("\\", "") for m in at.error]
    assert shown == [_error("labels with a gap", work).replace(str(work / "cases"), str(root))]
