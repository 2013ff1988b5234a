"""The Python API refuses each damaged model folder of the shared table
(``tests/damaged_models.py``) with the line every door says; a deep config is refused from the
weights' header at once, and a checkpoint without a head gets a new one and says so."""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.damaged_models import IDS, build, error
from workbench.core.errors import WorkbenchError
from workbench.core.models import load_classifier, load_model
from workbench.core.verify import REMEDY


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("damaged-models"))


def test_the_undamaged_folder_loads(work):
    loaded = load_model(str(work / "good"))
    assert loaded.spec.label_names == ("negative", "neutral", "positive")


@pytest.mark.parametrize("case", IDS)
def test_the_python_api_refuses_it(work, case):
    with pytest.raises(WorkbenchError) as raised:
        load_model(str(work / "cases" / case))
    assert str(raised.value) == error(case, work)


@pytest.mark.parametrize("case", ["1000 layers", "100000 layers"])
def test_a_deep_config_is_refused_from_the_header_at_once(work, case):
    start = time.perf_counter()
    with pytest.raises(WorkbenchError, match=f"num_hidden_layers is {case.split()[0]}[,:]"):
        load_classifier(str(work / "cases" / case), 3)
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


@pytest.fixture(scope="module")
def sentencepiece_albert(tmp_path_factory) -> Path:
    """A tiny ALBERT classifier of 40 embedding rows whose tokenizer is a SentencePiece model
    alone (``spiece.model``, 30 pieces), written with the protobuf schema transformers ships."""
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.convert_slow_tokenizer import import_protobuf

    folder = tmp_path_factory.mktemp("albert")
    config = AutoConfig.for_model(
        "albert", vocab_size=40, hidden_size=16, embedding_size=8, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=32, num_labels=3,
    )  # fmt: skip
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    model = import_protobuf().ModelProto()
    specials = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    for index, piece in enumerate([*specials, *(f"\u2581w{i}" for i in range(25))]):
        added = model.pieces.add(piece=piece, score=-float(index))
        added.type = 2 if piece == "<unk>" else 3 if index < len(specials) else 1
    model.trainer_spec.unk_id = 1
    (folder / "spiece.model").write_bytes(model.SerializeToString())
    return folder


def test_a_sentencepiece_tokenizer_larger_than_the_embeddings_is_refused(
    sentencepiece_albert, tmp_path
):
    small = tmp_path / "small"
    shutil.copytree(sentencepiece_albert, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 20}))
    state = load_file(small / "model.safetensors")
    key = "albert.embeddings.word_embeddings.weight"
    save_file({**state, key: state[key][:20]}, small / "model.safetensors")
    with pytest.raises(WorkbenchError) as raised:
        load_model(str(small))
    assert str(raised.value) == (
        f"{small}/spiece.model gives token ids up to 29, but the model's embedding table has "
        f"20 rows (config.json: vocab_size 20): its tokenizer is not the model's; {REMEDY}"
    )


def test_a_sentencepiece_tokenizer_loads_or_names_the_package_it_needs(sentencepiece_albert):
    if importlib.util.find_spec("sentencepiece"):
        assert len(load_model(str(sentencepiece_albert)).tokenizer) == 30
        return
    with pytest.raises(WorkbenchError) as raised:
        load_model(str(sentencepiece_albert))
    assert str(raised.value) == (
        f"{sentencepiece_albert} keeps its tokenizer as a SentencePiece model only "
        "(spiece.model), which needs the sentencepiece package: pip install sentencepiece, or "
        "save the tokenizer with tokenizer.save_pretrained where it loads (that adds "
        "tokenizer.json)"
    )


def test_a_teacher_caches_embeddings_alone_pass_as_what_they_are(tmp_path):
    """A teacher cache keeps of an LLM's weights only its embedding stage (a small share of
    them): its teacher folder passes the model-folder check, while the same tensors as a model's
    weights are refused, and a stage whose shapes the config does not give still is."""
    import torch

    from tests.tiny_families import family_config, family_tokenizer
    from workbench.core.verify import EMBEDDINGS_FILE, check_model_folder

    tokenizer = family_tokenizer("llama")
    config = family_config("llama", tokenizer, ["a", "b", "c"], layers=12)
    config.hidden_size, config.intermediate_size, config.num_attention_heads = 1024, 4096, 8
    config.head_dim = 128
    folder = tmp_path / "teacher"
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    stage = {"model.embed_tokens.weight": torch.zeros(len(tokenizer), 1024)}
    save_file(stage, str(folder / EMBEDDINGS_FILE), metadata={"stage": '["model.embed_tokens"]'})
    check_model_folder(folder, config)  # 165M parameters described, the embeddings held

    other = tmp_path / "as-weights"
    shutil.copytree(folder, other)
    (other / EMBEDDINGS_FILE).rename(other / "model.safetensors")
    with pytest.raises(WorkbenchError, match=r"describes a model of .* parameters"):
        check_model_folder(other, config)
    wrong = {"model.embed_tokens.weight": torch.zeros(len(tokenizer), 512)}
    save_file(wrong, str(folder / EMBEDDINGS_FILE))
    with pytest.raises(WorkbenchError, match=r"does not describe the weights"):
        check_model_folder(folder, config)
