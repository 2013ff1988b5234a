"""A model folder is checked before its model is used (docs/safety.md, "A model folder is checked
before it is used"): its config against its weights and tokenizer, every expected weight present
and every tensor used, every floating weight finite.

The checks compare a folder with what transformers expects for the architecture its config names
(the model built on the ``meta`` device), never with a table of families. :func:`check_config_file`
and :func:`check_model_folder` run from ``config.json`` and the safetensors headers before the
model is allocated; :func:`check_loaded` checks what transformers reports of the load. A
checkpoint without a classification head gets a fresh one: the one exception, said in a note.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.core.errors import WorkbenchError, first_line, listed
from workbench.core.files import read_json_file, read_limited, regular_file
from workbench.core.names import PROMPT_FILE

CONFIG_LIMIT = 1 << 20  # bytes of a model's config.json
TOKENIZER_LIMIT = 64 << 20  # bytes of a tokenizer's vocabulary file (tokenizer.json, vocab.*)
REMEDY = "replace the folder with a complete copy of the model (save_pretrained)"
LABELS_REMEDY = "correct id2label in config.json: ids 0..C-1, one distinct name each"
# parameters a config may describe beyond what its weights hold (a fresh head, tied copies)
SPARE_PARAMETERS = 1 << 24
_LAYER_INDEX = re.compile(r"^(.+?)\.(\d+)\.")


def _count(items: Sequence[Any], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


# --------------------------------------------------------------------------- the folder's files

# the files of a model folder that the workbench or transformers opens, by name, and the most
# bytes each may hold (None: weights, mapped or streamed rather than read whole); the first
# pattern that matches a name counts, and other entries (a README, sub-folders) are not opened
MODEL_FILES = (
    ("config.json", CONFIG_LIMIT),
    ("*.safetensors", None),
    ("*.bin", None),
    ("*.pt", None),
    ("*.pth", None),
    ("*.json", TOKENIZER_LIMIT),  # tokenizer files, a weights index, the generation config
    ("*.txt", TOKENIZER_LIMIT),  # vocab.txt, merges.txt
    ("*.model", TOKENIZER_LIMIT),  # SentencePiece models
    ("*.jinja", TOKENIZER_LIMIT),  # a chat template
)


def check_model_files(folder: str | Path, remedy: str = REMEDY) -> None:
    """Refuse a model folder with a file the workbench or transformers would open
    (:data:`MODEL_FILES`) that is not a regular file (checked without opening it, which could
    block), holds more than its kind's limit, or is a safetensors file its header does not cover
    exactly; one line naming the file and ending in ``remedy``."""
    folder = Path(folder)
    if not folder.is_dir():  # no model saved yet: no file to open
        return
    for path in sorted(folder.iterdir()):
        limit = next(
            (limit for pattern, limit in MODEL_FILES if fnmatch.fnmatchcase(path.name, pattern)),
            False,
        )
        if limit is False or path.name.startswith("."):
            continue
        regular_file(path, "the model file", remedy)
        size = path.stat().st_size
        if limit is not None and size > limit:
            raise WorkbenchError(
                f"the model file {path} is {size:,} bytes: the limit is {limit:,} bytes: {remedy}"
            )
    for path in sorted(folder.glob("*.index.json")):
        index_shards(path)
    for path in sorted(folder.glob("*.safetensors")):
        safetensors_header(path, remedy)


# --------------------------------------------------------------------------- config.json

MAX_LABELS = 1_000_000  # the classes a config may give (num_labels)
MAX_LAYERS = 4096  # the layers a config may give (the deepest published models have about 130)
# the settings that give a layer count, wherever in the config they are (text_config.…)
LAYER_SETTINGS = frozenset(
    {
        "num_hidden_layers",
        "num_layers",
        "n_layer",
        "n_layers",
        "decoder_layers",
        "encoder_layers",
        "num_decoder_layers",
        "num_encoder_layers",
    }
)


def _items(value: Any) -> Iterable[tuple[str, Any]]:
    """Every value inside the JSON ``value``, itself included, with its dotted place
    (``rope_scaling.factor``; ``""`` for ``value``), walked without recursion (a value may nest
    as deep as the parser allowed)."""
    stack = [("", value)]
    while stack:
        name, item = stack.pop()
        yield name, item
        if isinstance(item, dict):
            stack += [(f"{name}.{key}" if name else str(key), v) for key, v in item.items()]
        elif isinstance(item, list):
            stack += [(f"{name}[{index}]", v) for index, v in enumerate(item)]


def _check_padding(path: Path, place: str, values: dict) -> None:
    """Refuse a ``pad_token_id`` that is no row of the embedding table ``vocab_size`` gives at
    the same ``place`` of the config (torch would stop on an assertion building the model)."""
    pad, size = values.get("pad_token_id"), values.get("vocab_size")
    whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (pad, size))
    if whole and not -size <= pad < size:
        at = f"{place}." if place else ""
        raise WorkbenchError(
            f"{path}: {at}pad_token_id is {pad}, not an id of the {size:,} rows of its "
            f"embeddings ({at}vocab_size {size}): {REMEDY}"
        )


def check_config_file(folder: str | Path) -> dict[str, Any]:
    """The JSON object of ``folder/config.json`` (read bounded: a regular file of at most
    :data:`CONFIG_LIMIT` bytes), its numbers finite, its layer counts at most
    :data:`MAX_LAYERS` (a model is built from it, on the meta device, to check its weights: a
    config of 100,000 layers would take minutes and gigabytes), its padding id one of its
    embeddings' rows and its labels checked:
    ``id2label`` maps the ids 0..C−1, without gaps, to distinct names, and ``num_labels``, where
    given, is C."""
    path = Path(folder) / "config.json"
    raw = read_json_file(path, CONFIG_LIMIT, "the model config")
    if not isinstance(raw, dict):
        raise WorkbenchError(f"{path} is not a model config (a JSON object): {REMEDY}")
    for name, value in _items(raw):
        if isinstance(value, dict):  # a padding id beside its table, nested ones too
            _check_padding(path, name, value)
        elif not isinstance(value, int | float) or isinstance(value, bool):
            continue
        elif not math.isfinite(value):  # NaN and Infinity parse as JSON numbers
            raise WorkbenchError(
                f"{path}: {name} is {value}, not a finite number: correct it in config.json"
            )
        elif name.rpartition(".")[2] in LAYER_SETTINGS and value > MAX_LAYERS:
            raise WorkbenchError(
                f"{path}: {name} is {value}, more layers than any model has (at most "
                f"{MAX_LAYERS:,}): {REMEDY}"
            )
    given = raw.get("num_labels")
    if given is not None and (
        not isinstance(given, int) or isinstance(given, bool) or not 1 <= given <= MAX_LABELS
    ):  # transformers would build a label map of every class before anything is checked
        raise WorkbenchError(
            f"{path}: num_labels is {given!r}, not a number of classes in 1..{MAX_LABELS:,}: "
            f"{LABELS_REMEDY}"
        )
    labels = raw.get("id2label")
    if labels is None:
        return raw
    if not isinstance(labels, dict) or not labels:
        raise WorkbenchError(f"{path}: id2label is not a map of ids to names: {LABELS_REMEDY}")
    try:
        ids = sorted(int(key) for key in labels)
    except (TypeError, ValueError):
        bad = [key for key in labels if not str(key).lstrip("-").isdigit()]
        raise WorkbenchError(
            f"{path}: id2label has keys that are not ids ({listed(map(repr, bad))}): "
            f"{LABELS_REMEDY}"
        ) from None
    count = len(labels)
    if ids != list(range(count)):
        raise WorkbenchError(
            f"{path}: id2label has the ids {listed(ids)}, not 0..{count - 1} (one per class, "
            f"without gaps): {LABELS_REMEDY}"
        )
    names = [str(labels[key]) for key in sorted(labels, key=int)]
    seen: dict[str, int] = {}
    repeated = []
    for index, name in enumerate(names):
        first = seen.setdefault(name.casefold(), index)
        if first != index:
            repeated.append(f"{first} and {index} ({name!r})")
    if repeated:
        raise WorkbenchError(
            f"{path}: id2label gives two classes one name: {listed(repeated)}: {LABELS_REMEDY}"
        )
    if given is not None and given != count:
        raise WorkbenchError(
            f"{path}: num_labels is {given!r}, but id2label names {count} classes: "
            f"{LABELS_REMEDY}, num_labels {count}"
        )
    return raw


# --------------------------------------------------------------------------- weights headers


def safetensors_header(path: Path, remedy: str = REMEDY) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{key: (shape, dtype)}`` of the safetensors file ``path`` (``dtype`` as the header names
    it: ``F32``, ``BF16``, ``I64``…), read from its header alone (the library maps the file and
    reads no tensor); a damaged file is one line ending in ``remedy``."""
    from safetensors import SafetensorError, safe_open

    regular_file(path, "the model file", remedy)  # a pipe would block the reader
    try:
        with safe_open(str(path), framework="numpy") as weights:  # numpy: torch not imported
            slices = {key: weights.get_slice(key) for key in weights.keys()}  # noqa: SIM118
            return {key: (tuple(s.get_shape()), s.get_dtype()) for key, s in slices.items()}
    except (SafetensorError, OSError) as error:
        raise WorkbenchError(f"{path} is damaged ({first_line(error)}): {remedy}") from None


def layer_blocks(keys: Iterable[str]) -> tuple[str, int]:
    """The prefix under which ``keys`` hold the most numbered blocks (``bert.encoder.layer``,
    ``transformer.h``), and how many: the layers a set of weights holds."""
    blocks: dict[str, set[int]] = {}
    for key in keys:
        match = _LAYER_INDEX.match(key)
        if match:
            blocks.setdefault(match[1], set()).add(int(match[2]))
    if not blocks:
        return "", 0
    prefix = max(blocks, key=lambda p: (len(blocks[p]), p))
    return prefix, len(blocks[prefix])


def _meta_model(config: Any):
    """The sequence classifier ``config`` describes, built on the meta device: its parameters
    have shapes and no storage."""
    import torch
    from transformers import AutoModelForSequenceClassification

    with torch.device("meta"):
        return AutoModelForSequenceClassification.from_config(config)


def _fields_of(config: Any, size: int, head: bool = False) -> str:
    """The config's settings whose value is ``size`` (which a wrong dimension comes from); for
    a tensor of the classification head (``head``), its classes."""
    if head and size == getattr(config, "num_labels", None):
        return f" (config.json: num_labels {size}, the entries of id2label)"
    names = [
        name
        for name, value in config.to_dict().items()
        if isinstance(value, int) and not isinstance(value, bool) and value == size
    ]
    return f" (config.json: {listed(f'{name} {size}' for name in names)})" if names else ""


def check_model_folder(folder: str | Path, config: Any) -> None:
    """Check ``folder`` and its parsed ``config`` against its safetensors headers and tokenizer
    files before the model is allocated: the layers, every tensor's shape, the parameters in all and
    the vocabulary. A folder that passed is not checked again until one of its files changes."""
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir() if p.is_file())
    stamp = (
        str(folder.resolve()),
        *((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files),
    )
    if stamp not in _PASSED:
        _check_model_folder(folder, config)
        _PASSED.add(stamp)


_PASSED: set[tuple] = set()  # folders that passed check_model_folder: each file's name, size, time
# a teacher cache's teacher folder keeps, of the weights, only the embedding stage in this file
EMBEDDINGS_FILE = "embeddings.safetensors"


def _check_model_folder(folder: Path, config: Any) -> None:
    check_config_file(folder)
    headers = {  # key: (shape, dtype, file name) over every safetensors file
        key: (shape, dtype, path.name)
        for path in sorted(folder.glob("*.safetensors"))
        for key, (shape, dtype) in safetensors_header(path).items()
    }
    if not headers:  # weights in another format: checked when loaded (check_loaded)
        return
    weights = ", ".join(sorted({file for *_, file in headers.values()}))
    where = f"{folder / 'config.json'}"
    stage = weights == EMBEDDINGS_FILE  # a teacher cache's: the embeddings alone, by design
    if not stage:
        _check_layers(config, headers, where, weights, folder)
    try:
        model = _meta_model(config)
    except Exception:  # an architecture transformers cannot build: said by the load itself
        return
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    prefix = getattr(model, "base_model_prefix", "")
    floating = {key for key, value in model.state_dict().items() if value.is_floating_point()}
    for key, (shape, dtype, file) in headers.items():
        # the model's name of the key: the same, or under the base model's prefix (a bare encoder's)
        name = next((k for k in (key, prefix and f"{prefix}.{key}") if k in expected), None)
        if name in floating and not dtype.startswith(("F", "BF")):  # F16, F32, BF16, F8_E4M3…
            raise WorkbenchError(
                f"{folder / file}: its header calls {key} {dtype}, but it is a floating-point "
                f"weight of the architecture: the file is not what it says; {REMEDY}"
            )
        if name is not None and expected[name] != shape:
            axis = next(
                (i for i, (a, b) in enumerate(zip(shape, expected[name], strict=False)) if a != b),
                0,
            )
            wanted = expected[name][axis] if axis < len(expected[name]) else 0
            raise WorkbenchError(
                f"{where} does not describe the weights of {folder / file}: {key} is "
                f"{list(shape)} there, the config makes it {list(expected[name])}"
                f"{_fields_of(config, wanted, not name.startswith(f'{prefix}.'))}: {REMEDY}"
            )
    held = sum(math.prod(shape) for shape, *_ in headers.values())  # a scalar's () counts 1
    described = sum(math.prod(shape) for shape in expected.values())
    if described > 2 * held + SPARE_PARAMETERS and not stage:
        raise WorkbenchError(
            f"{where} describes a model of {described:,} parameters, but {weights} hold "
            f"{held:,}: the config is not that of these weights; {REMEDY}"
        )
    _check_vocabulary(model, folder, config)


def _check_layers(
    config: Any, headers: Mapping[str, Any], where: str, weights: str, folder: Path
) -> None:
    """Refuse a config whose layer count differs from the layers in the weights, found from
    the headers and, when the config asks for more, a model of one layer more than the weights
    hold: a config of 100 000 layers is never built."""
    layers = getattr(config, "num_hidden_layers", None)
    prefix, held = layer_blocks(headers)
    if not isinstance(layers, int) or not held or layers == held:
        return
    probe = copy.deepcopy(config)
    try:
        probe.num_hidden_layers = min(layers, held + 1)
        model = _meta_model(probe)
    except Exception:
        return
    base = getattr(model, "base_model_prefix", "")  # the keys as a bare encoder's checkpoint
    built = layer_blocks(key.removeprefix(f"{base}.") for key in model.state_dict())[1]
    # shared layers (ALBERT) build no module per layer: a deeper config is no mismatch
    if (built <= held) if layers > held else (built >= held):
        return
    raise WorkbenchError(
        f"{where}: num_hidden_layers is {layers}, but {weights} in {folder} holds {held} layers "
        f"({prefix}.0 to {prefix}.{held - 1}): the config and the weights are of different "
        f"models; {REMEDY}"
    )


def tokenizer_ids(folder: Path) -> tuple[int, str] | None:
    """The number of ids the tokenizer saved in ``folder`` gives (its largest id + 1) and the
    file that says so, read from its vocabulary files (``tokenizer.json``; without it
    ``vocab.txt``, ``vocab.json`` and SentencePiece models; ``added_tokens.json``), None where
    there are none it can be read from."""
    found: list[tuple[int, str | None]] = [(-1, None)]  # (an id, the file giving it)

    def seen(ids: Iterable[Any], name: str) -> None:
        found.extend((i, name) for i in ids if isinstance(i, int) and not isinstance(i, bool))

    def json_ids(name: str, what: str) -> None:  # the ids of a JSON object's values
        if (folder / name).is_file():
            value = read_json_file(folder / name, TOKENIZER_LIMIT, what)
            if isinstance(value, dict):
                seen(value.values(), name)

    tokenizer = folder / "tokenizer.json"
    if tokenizer.is_file():
        value = read_json_file(tokenizer, TOKENIZER_LIMIT, "the tokenizer file")
        if isinstance(value, dict):
            vocab = (value.get("model") or {}).get("vocab")
            if isinstance(vocab, dict):
                seen(vocab.values(), tokenizer.name)
            elif isinstance(vocab, list):
                seen([len(vocab) - 1], tokenizer.name)
            added = value.get("added_tokens") or []
            seen([t.get("id") for t in added if isinstance(t, dict)], tokenizer.name)
    else:
        path = folder / "vocab.txt"
        if path.is_file():
            lines = read_limited(path, TOKENIZER_LIMIT, "the vocabulary").split(b"\n")
            seen([len(lines) - 1 - (lines[-1] == b"")], path.name)
        json_ids("vocab.json", "the vocabulary")
        for name in SENTENCEPIECE_FILES:
            if (folder / name).is_file():
                seen([sentencepiece_pieces(folder / name) - 1], name)
    json_ids("added_tokens.json", "the tokenizer's added tokens")
    largest, source = max(found, key=lambda pair: pair[0])  # the first file of the largest id
    return None if source is None else (largest + 1, source)


# the files a SentencePiece tokenizer keeps its model in (ALBERT, T5; CamemBERT, XLM-R; Llama)
SENTENCEPIECE_FILES = ("spiece.model", "sentencepiece.bpe.model", "tokenizer.model")


def sentencepiece_pieces(path: Path) -> int:
    """The number of pieces of the SentencePiece model ``path`` (read bounded, parsed with the
    protobuf schema transformers ships); a file that is no such model is one line."""
    from google.protobuf.message import DecodeError
    from transformers.convert_slow_tokenizer import import_protobuf

    model = import_protobuf().ModelProto()
    try:
        model.ParseFromString(read_limited(path, TOKENIZER_LIMIT, "the SentencePiece model"))
    except DecodeError as error:
        raise WorkbenchError(f"{path} is damaged ({first_line(error)}): {REMEDY}") from None
    return len(model.pieces)


def _check_vocabulary(model: Any, folder: Path, config: Any) -> None:
    """Refuse a tokenizer whose ids reach past the model's embedding table: the first text with
    such a token would index out of it in the middle of a training."""
    try:
        rows = model.get_input_embeddings().weight.shape[0]
    except (AttributeError, NotImplementedError, TypeError):
        return
    found = tokenizer_ids(folder)
    if found is None or found[0] <= rows:
        return
    ids, source = found
    raise WorkbenchError(
        f"{folder / source} gives token ids up to {ids - 1}, but the model's embedding table "
        f"has {rows} rows{_fields_of(config, rows)}: its tokenizer is not the model's; "
        f"{REMEDY}"
    )


# --------------------------------------------------------------------------- after the load


def check_loaded(
    model: Any,
    info: Mapping[str, Any],
    source: str,
    new_head: bool,
    notify: Callable[[str], None] | None = None,
) -> None:
    """Refuse a model that transformers loaded with keys missing, unexpected or of another shape
    (``info``: ``output_loading_info``), or with a weight that is not finite. With ``new_head`` (a
    checkpoint without a classification head) the fresh head's keys and another task's head's
    weights are said to ``notify``, not refused."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, "base_model", model)
    parts = {name for name, _ in base.named_children()} if base is not model else set()

    def in_base(key: str) -> bool:
        """Whether ``key`` (the model's name, or a bare-encoder checkpoint's) is the encoder's."""
        first = key.split(".")[0]
        return bool(prefix) and (first == prefix or first in parts)

    missing = sorted(info.get("missing_keys") or ())
    unexpected = sorted(info.get("unexpected_keys") or ())
    mismatched = sorted(
        str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys") or ()
    )
    fresh, left = [], []
    if new_head:  # the task's head, and a pooler a pretraining objective did not train
        fresh = [key for key in missing if not in_base(key) or "pooler" in key.split(".")]
        missing = [key for key in missing if key not in fresh]
        left = [key for key in unexpected if not in_base(key)]
        unexpected = [key for key in unexpected if key not in left]
    problems = []
    if missing:
        problems.append(
            f"{_count(missing, 'weight')} the architecture expects missing ({listed(missing)}), "
            "which would start from random values"
        )
    if unexpected:
        problems.append(
            f"{_count(unexpected, 'tensor')} the architecture has no place for "
            f"({listed(unexpected)})"
        )
    if mismatched:
        problems.append(f"{_count(mismatched, 'weight')} of another shape ({listed(mismatched)})")
    if problems:
        hint = ""
        if missing and unexpected and not any(in_base(key) for key in unexpected):
            model_type = getattr(model.config, "model_type", "?")
            named = sorted({key.split(".")[0] for key in unexpected})
            hint = (
                f" (config.json says model_type {model_type!r}, the weights are named "
                f"{listed(f'{name}.…' for name in named)}: another architecture's)"
            )
        raise WorkbenchError(
            f"the weights of {source} do not fit its config{hint}: {'; '.join(problems)}: {REMEDY}"
        )
    if new_head and notify is not None and (fresh or left):
        dropped = f"; the weights of its former head are left out ({listed(left)})" if left else ""
        notify(
            f"{source} has no classification head: a new one ({listed(fresh)}) starts from random "
            f"values and is trained for the task{dropped}"
        )
    check_finite(model, source)


def check_finite(model: Any, source: str) -> None:
    """Refuse a model with a floating weight that is NaN or infinite (a NaN model scores like
    chance and a NaN teacher teaches nothing)."""
    import torch

    bad = [
        key
        for key, value in model.state_dict().items()
        if value.is_floating_point()
        and value.device.type != "meta"
        and not bool(torch.isfinite(value).all())
    ]
    if bad:
        verb = "holds" if len(bad) == 1 else "hold"
        raise WorkbenchError(
            f"the weights of {source} are not finite: {listed(bad)} {verb} NaN or infinite "
            f"values: {REMEDY}"
        )


def check_onnx_graph(path: str | Path) -> None:
    """Refuse an ONNX graph with a floating initializer (a weight) that is NaN or infinite,
    naming the first few: such a graph scores like chance rather than failing."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    path = Path(path)
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # a truncated or foreign file: ONNX Runtime's refusal names it
        return
    bad = []
    for tensor in graph.initializer:
        try:
            values = numpy_helper.to_array(tensor)
        except Exception:  # external data left out, an unknown type: ONNX Runtime says so
            continue
        if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
            bad.append(tensor.name)
    if bad:
        raise WorkbenchError(
            f"{path}: the initializers {listed(bad)} hold NaN or infinite values: export the "
            "graph again from a model with finite weights (kdw export-model --onnx)"
        )


# the files a tokenizer is saved in (a run pins those of its teacher)
TOKENIZER_STATE = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    *SENTENCEPIECE_FILES,
)


def files_digest(paths: Iterable[Path]) -> str:
    """A short hash of the bytes of ``paths``, in the order given, read in blocks; each must be
    a regular file (:func:`~workbench.core.files.regular_file`: a pipe is never opened)."""
    digest = hashlib.sha256()
    for path in paths:
        with regular_file(path, "the model file", REMEDY).open("rb") as stream:
            for block in iter(functools.partial(stream.read, 1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def index_shards(index: Path) -> list[Path]:
    """The shards a weights index (``*.index.json``) names in its ``weight_map``, each a file of the
    index's own folder; one that reaches outside it, or is missing, is one line."""
    value = read_json_file(index, TOKENIZER_LIMIT, "the weights index")
    names = value.get("weight_map") if isinstance(value, dict) else None
    if not isinstance(names, dict) or not all(isinstance(n, str) for n in names.values()):
        raise WorkbenchError(f"{index}: no weight_map of tensor names to files: {REMEDY}")
    shards = []
    for name in sorted(set(names.values())):
        if Path(name).name != name or name in ("", ".", ".."):
            raise WorkbenchError(
                f"{index} names the shard {name!r}, outside the folder {index.parent}: {REMEDY}"
            )
        if not os.path.lexists(index.parent / name):
            raise WorkbenchError(
                f"{index} names the shard {name!r}, which is not in {index.parent}: {REMEDY}"
            )
        shards.append(index.parent / name)
    return shards


# the weights a model folder may be saved in (besides the shards an index names)
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "*.index.json")


def weight_files(folder: str | Path) -> list[Path]:
    """Every file of weights the model saved in ``folder`` may load, whatever its format: its
    ``*.safetensors`` and ``pytorch_model*.bin`` files, its weights indexes and each shard they
    name (:func:`index_shards`), sorted by name."""
    folder = Path(folder)
    found = {path for pattern in WEIGHT_FILES for path in folder.glob(pattern)}
    for index in sorted(folder.glob("*.index.json")):
        found.update(index_shards(index))
    return sorted(found)


def weights_digest(folder: Path) -> str:
    """A short hash of the weights a saved model folder holds (:func:`weight_files`): a
    teacher trained again with the same settings but other float rounding (another number of
    threads) hashes otherwise."""
    return files_digest(weight_files(folder))


def model_digest(folder: str | Path) -> dict[str, str]:
    """What a run pins of a model folder it learns from: the digests of its weights
    (:func:`weights_digest`), of its tokenizer's files and of its config's label map
    (``id2label``: the classes its logits are in)."""
    folder = Path(folder)
    if (folder / PROMPT_FILE).is_file():  # the prompt pins its base model's digest
        prompt = files_digest([folder / PROMPT_FILE])
        return {"weights": prompt, "tokenizer": prompt, "labels": prompt}
    tokenizer = [folder / name for name in TOKENIZER_STATE if os.path.lexists(folder / name)]
    labels = json.dumps(check_config_file(folder).get("id2label"), sort_keys=True)
    return {
        "weights": weights_digest(folder),
        "tokenizer": files_digest(tokenizer),
        "labels": hashlib.sha256(labels.encode()).hexdigest()[:16],
    }
