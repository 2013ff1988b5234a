"""One table of damaged model folders, shared by the tests of each door a model folder enters
through — the Python API (``tests/core/test_damaged_models.py``), the commands
(``tests/cli/test_damaged_models_cli.py``) and the app (``tests/app/test_damaged_models_app.py``):
each case is refused in the same one line everywhere. Every folder is a tiny random classifier
saved by transformers, then damaged."""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.conftest import tiny_model, tiny_tokenizer, write_tiny_workspace
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


def _cut(folder: Path) -> None:
    """The weights file cut short within its header, as an interrupted copy leaves it."""
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:20])


def _special(name: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    """``name`` replaced by a file that is not a regular one (``make`` makes it)."""

    def damage(folder: Path) -> None:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        make(path)

    return damage


def _config_text(entry: str) -> Callable[[Path], None]:
    """config.json with ``entry`` (JSON text that Python's parser reads: ``NaN``) in place of
    its own setting of that name."""

    def damage(folder: Path) -> None:
        path = folder / "config.json"
        key = entry.split(":")[0]
        lines = [line for line in path.read_text().splitlines() if key not in line]
        path.write_text("\n".join([lines[0], f"  {entry},", *lines[1:]]))

    return damage


def _trillion_labels(config: dict) -> None:
    """num_labels 10¹² without a label map (transformers would make one of every class)."""
    del config["id2label"], config["label2id"]
    config["num_labels"] = 10**12


def _deep(folder: Path) -> None:
    """config.json nested 100 000 deep: JSON that Python's parser cannot recurse into."""
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)


LOOP = "[Errno 40] Too many levels of symbolic links"
K = "bert.encoder.layer.0.output.dense.weight"  # a float weight
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
        "1000 layers",
        _config(lambda c: c.update(num_hidden_layers=1000)),
        f"{{d}}/config.json: num_hidden_layers is 1000, but model.safetensors in {{d}} holds 4 "
        f"layers ({LAYER}.0 to {LAYER}.3): the config and the weights are of different models; "
        f"{REMEDY}",
    ),
    (
        "100000 layers",
        _config(lambda c: c.update(num_hidden_layers=100000)),
        "{d}/config.json: num_hidden_layers is 100000, more layers than any model has (at most "
        f"4,096): {REMEDY}",
    ),
    (
        "a smaller vocabulary",
        _config(lambda c: c.update(vocab_size=20)),
        "{d}/config.json does not describe the weights of {d}/model.safetensors: "
        "bert.embeddings.word_embeddings.weight is [40, 16] there, the config makes it [20, 16] "
        f"(config.json: vocab_size 20): {REMEDY}",
    ),
    (
        "a padding id past the vocabulary",
        _config(lambda c: c.update(pad_token_id=10**6)),
        "{d}/config.json: pad_token_id is 1000000, not an id of the 40 rows of its embeddings "
        f"(vocab_size 40): {REMEDY}",
    ),
    (
        "a tokenizer larger than the embeddings",
        _small_vocabulary,
        "{d}/tokenizer.json gives token ids up to 39, but the model's embedding table has 20 "
        f"rows (config.json: vocab_size 20): its tokenizer is not the model's; {REMEDY}",
    ),
    (
        "a cut weights file",
        _cut,
        "{d}/model.safetensors is damaged (Error while deserializing header: invalid header "
        f"length): {REMEDY}",
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
    (
        "a float weight its header calls I32",
        _weights(lambda state: state.update({K: state[K].view(torch.int32)})),
        f"{{d}}/model.safetensors: its header calls {K} I32, but it is a floating-point weight "
        f"of the architecture: the file is not what it says; {REMEDY}",
    ),
    (
        "a NaN layer_norm_eps",
        _config_text('"layer_norm_eps": NaN'),
        "{d}/config.json: layer_norm_eps is nan, not a finite number: correct it in config.json",
    ),
    (
        "an infinite layer_norm_eps",
        _config_text('"layer_norm_eps": Infinity'),
        "{d}/config.json: layer_norm_eps is inf, not a finite number: correct it in config.json",
    ),
    (
        "a trillion labels",
        _config(_trillion_labels),
        "{d}/config.json: num_labels is 1000000000000, not a number of classes in 1..1,000,000: "
        f"{LABELS_REMEDY}",
    ),
    (
        "weights that are a pipe",
        _special("model.safetensors", os.mkfifo),
        f"the model file {{d}}/model.safetensors is a pipe: {REMEDY}",
    ),
    (
        "weights in a link loop",
        _special("model.safetensors", lambda path: path.symlink_to(path.name)),
        f"the model file {{d}}/model.safetensors: cannot read it ({LOOP}: "
        f"'{{d}}/model.safetensors'): {REMEDY}",
    ),
    (
        "a tokenizer linked to dev-zero",
        _special("tokenizer.json", lambda path: path.symlink_to("/dev/zero")),
        f"the model file {{d}}/tokenizer.json is a device: {REMEDY}",
    ),
    (
        "a tokenizer that is a folder",
        _special("tokenizer.json", lambda path: path.mkdir()),
        f"the model file {{d}}/tokenizer.json is a folder: {REMEDY}",
    ),
    (
        "a vocabulary that is a pipe",
        _special("vocab.txt", os.mkfifo),
        f"the model file {{d}}/vocab.txt is a pipe: {REMEDY}",
    ),
    (
        "a config linked to dev-urandom",
        _special("config.json", lambda path: path.symlink_to("/dev/urandom")),
        f"the model file {{d}}/config.json is a device: {REMEDY}",
    ),
    (
        "a config nested too deep",
        _deep,
        "the model config {d}/config.json: JSON nested too deep to read",
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
# found from config.json and the safetensors headers alone, without building a model: refused
# before torch and transformers are imported
SPECIAL_CASES = [
    "weights that are a pipe",
    "weights in a link loop",
    "a tokenizer linked to dev-zero",
    "a tokenizer that is a folder",
    "a vocabulary that is a pipe",
    "a config linked to dev-urandom",
]
FILE_CASES = [
    "a cut weights file",
    "labels with a gap",
    "two labels of one name",
    "num_labels against id2label",
    *SPECIAL_CASES,
    "a config nested too deep",
    "a NaN layer_norm_eps",
    "an infinite layer_norm_eps",
    "a trillion labels",
    "a padding id past the vocabulary",
]


def _copy_entry(source: str, target: str) -> None:
    """A file of a damaged folder copied as it is: a pipe made anew (copying would open it)."""
    if stat.S_ISFIFO(os.stat(source).st_mode):
        os.mkfifo(target)
    else:
        shutil.copy2(source, target)


def copy_case(source: Path, target: Path) -> None:
    """A copy of the (damaged) folder ``source`` at ``target``: links stay links (a link to
    ``/dev/zero`` is never read) and pipes stay pipes."""
    shutil.copytree(source, target, symlinks=True, copy_function=_copy_entry)


def build(work: Path) -> Path:
    """In ``work``: the tiny task, a good classifier folder of its classes, and one damaged copy
    of it per case (``work/cases/<id>``)."""
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


def error(case: str, work: Path) -> str:
    """The one line that refuses ``case`` (its folder under ``work/cases``)."""
    message = next(message for name, _, message in CASES if name == case)
    return message.format(d=work / "cases" / case)
