"""Loading classifiers, and the adaptor that gives every model one output record.

Methods never reach into ``model.bert``: they call :func:`forward` (logits, hidden states with the
embedding output first, attentions on request) and, to run the encoder from a given embedding
output, pass ``embedding_output`` — a forward hook on the embeddings module swaps it in, the same
mechanism Captum's layer attributions use.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pickle
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from workbench.core.assembly import (
    ADAPTER_CONFIG,
    adapter_base,
    adapter_model,
    builtin_model,
    gguf_file,
    gguf_model,
    sha256,
)
from workbench.core.config import DataConfig, PromptConfig, parse_label_map
from workbench.core.data import Split, TaskData, TaskSpec, load_task
from workbench.core.data.splits import METRICS_CLASSIFICATION
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import (
    atomic_write_json,
    local_path,
    regular_file,
    user_cache,
    with_format,
)
from workbench.core.hub import hub_reachable, hub_unreachable
from workbench.core.names import BUILTIN_MODELS, PROMPT_FILE
from workbench.core.parts import LAST, embedding_modules, embeddings_module, head_output, parts_of
from workbench.core.parts import encoder_layers as encoder_layers  # public here too
from workbench.core.parts import layer_count as layer_count
from workbench.core.prompted import (
    PROMPTED,
    PromptedClassifier,
    PromptRecord,
    PromptTokens,
    plain_text_tokens,
    prompt_record,
    record_digest,
)
from workbench.core.records import read_record_file
from workbench.core.runs import Run, same_task
from workbench.core.verify import (
    SENTENCEPIECE_FILES,
    TOKENIZER_STATE,
    check_config_file,
    check_loaded,
    check_model_files,
    check_model_folder,
    listed,
    weight_files,
)

ATTENTION = "eager"  # attention maps and double backward (AD-KD, GKD) need the eager kernel


def quiet_library_output() -> None:
    """Silence transformers' load reports and progress bars: the workbench reports itself."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def resolve_model(name: str, adapters: tuple[Path, ...] = ()) -> str:
    """A built-in name, a local directory (a run folder's ``model/`` too), a GGUF file (or a
    folder of one), a PEFT adapter folder or a hub id, as a path or id that ``from_pretrained``
    accepts; a path that does not exist is an error at once. A GGUF model and an adapter
    merged into its base are assembled once in the user's cache (:mod:`workbench.core.assembly`).
    ``adapters``: the adapter folders whose bases led here (one met again is a cycle)."""
    if name in BUILTIN_MODELS:  # the packaged ones assembled in the user's cache on first use
        return str(builtin_model(name))
    path = local_path(name, hub_ids=True)
    if path is None:
        return name
    if (path / "model" / "config.json").exists():
        return str(path / "model")
    if (path / PROMPT_FILE).is_file():  # a prompted classifier: read by load_prompted
        return str(path)
    if os.path.lexists(path / ADAPTER_CONFIG):  # a pipe or a device there: refused by name
        if path.resolve() in adapters:
            chain = " → ".join(str(a) for a in (*adapters, path.resolve()))
            raise WorkbenchError(f"the adapters name each other as base models ({chain})")
        base = adapter_base(path)
        try:
            resolved = resolve_model(base, (*adapters, path.resolve()))
        except WorkbenchError as error:
            if adapters:  # said once, by the adapter first named
                raise
            raise WorkbenchError(f"the adapter {name}'s base model {base}: {error}") from None
        return str(adapter_model(path, resolved))
    if (gguf := gguf_file(path)) is not None:
        return str(gguf_model(gguf))
    if not (path / "config.json").exists():
        raise WorkbenchError(f"{name} has no config.json: not a model directory")
    return str(path)


def _without_code(config: PretrainedConfig) -> PretrainedConfig:
    """``config`` without ``auto_map``, its pointer to remote code: the workbench builds
    transformers' own classes only, so nothing it saves from a loaded model (a run, a cache, an
    export) names code that is not there."""
    config.__dict__.pop("auto_map", None)
    return config


def _from_pretrained(
    load, name: str, what: str, notify: Callable[[str], None] | None = None, **options
):
    """``load(source, **options)`` for the model ``name``; a hub id while the hub cannot be
    asked comes from the local cache only (no minute of retries), and a miss is one line. A
    model's load is checked (:func:`check_loaded`), a fresh head said to ``notify``."""
    source = resolve_model(name)
    if Path(source).is_dir():
        check_model_files(source)
        check_config_file(source)
    cache_only = not Path(source).exists() and not hub_reachable()
    try:
        if load == AutoTokenizer.from_pretrained:
            return load(source, local_files_only=cache_only, **options)
        config = _without_code(AutoConfig.from_pretrained(source, local_files_only=cache_only))
        if Path(source).is_dir():  # the config against the weights, before they are read
            check_model_folder(source, config)
        if load == AutoConfig.from_pretrained:
            return config
        model, info = load(source, local_files_only=cache_only, output_loading_info=True, **options)
        _without_code(model.config)
        check_loaded(model, info, name, not has_head(config), notify)
        return model
    except WorkbenchError:
        raise
    except OSError as error:
        if cache_only:
            raise hub_unreachable(
                f"{what} {name!r}",
                "it is not in the local cache either: pass a local directory with config.json "
                f"and weights, or the built-in {', '.join(BUILTIN_MODELS)}",
            ) from None
        raise WorkbenchError(f"cannot load {what} {name!r}: {first_line(error)}") from None
    except pickle.UnpicklingError:  # torch's own advice would run the pickle: not repeated
        raise WorkbenchError(
            f"cannot load {what} {name!r}: its pickled weights hold objects beyond tensors, "
            "which loading would run as code, and are refused; convert them to safetensors "
            "where they were made, from a source you trust"
        ) from None
    except Exception as error:  # a damaged file of the folder: the library's errors vary
        raise WorkbenchError(
            f"cannot load {what} {name!r} ({type(error).__name__}: {first_line(error)}): a file "
            "of the folder is damaged; replace it with a complete copy (save_pretrained)"
        ) from None


def has_head(config: PretrainedConfig) -> bool:
    """Whether a checkpoint's config is that of a sequence classifier."""
    return any(a.endswith("ForSequenceClassification") for a in config.architectures or [])


def is_language_model(config: PretrainedConfig) -> bool:
    """Whether a checkpoint's config is that of a causal language model (``…ForCausalLM``),
    which a prompt makes a classifier (:func:`prompted_model`)."""
    return any(a.endswith("ForCausalLM") for a in config.architectures or [])


def load_classifier(
    name: str,
    spec: TaskSpec | int,
    label_map: Mapping[str, str] | None = None,
    notify: Callable[[str], None] | None = None,
) -> PreTrainedModel:
    """A sequence classifier for the task ``spec`` (or for that many generically named classes)
    from a built-in model, a directory or a hub id.

    A checkpoint that is already a sequence classifier keeps its head, its classes matched to
    the task's (:func:`class_order`; ``notify`` hears of a match by position) and reordered to
    the task's order; one without a classification head (an encoder, a masked or causal
    language model) gets a fresh head with the task's outputs (1 for regression).
    """
    if isinstance(spec, int):  # classes named as Hugging Face names them by default
        spec = TaskSpec("classes", tuple(f"LABEL_{i}" for i in range(spec)), METRICS_CLASSIFICATION)
    config = load_config(name)
    check_classifier(config, name, head=False)
    order, options = list(range(spec.num_labels)), {}
    if not has_head(config):  # a fresh head: the task's outputs
        problem = "regression" if spec.regression else "single_label_classification"
        options = {"num_labels": spec.num_labels, "problem_type": problem}
    elif spec.regression != (config.num_labels == 1):
        kind = "a regression" if spec.regression else "a classification"
        raise WorkbenchError(
            f"{name} is a classifier with {config.num_labels} outputs, but the task "
            f"{spec.name!r} is {kind} task"
        )
    elif not spec.regression:
        labels = [config.id2label[i] for i in range(config.num_labels)]
        order, note = class_order(labels, spec.label_names, label_map or {}, name)
        if note and notify:
            notify(note)
    load = AutoModelForSequenceClassification.from_pretrained
    model = _from_pretrained(load, name, "model", notify, attn_implementation=ATTENTION, **options)
    reorder_classes(model, order)
    return model


def set_label_names(model: PreTrainedModel, spec: TaskSpec) -> None:
    """Name the model's outputs after the task's classes (``id2label``/``label2id`` in its
    config), so a saved checkpoint answers with them in ``transformers.pipeline``; a regression
    model keeps its single output."""
    if spec.label_names:
        model.config.id2label = dict(enumerate(spec.label_names))
        model.config.label2id = {name: index for index, name in enumerate(spec.label_names)}


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; otherwise the named device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise WorkbenchError(f"unknown device {name!r}: use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise WorkbenchError(f"--device {name} was asked for, but torch sees no CUDA device")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise WorkbenchError(
            f"--device {name}: torch sees {torch.cuda.device_count()} CUDA devices, "
            f"cuda:0..cuda:{torch.cuda.device_count() - 1}"
        )
    return device


def model_device(model: nn.Module) -> torch.device:
    """Where a model's parameters live."""
    return next(model.parameters()).device


def fingerprint(model: nn.Module) -> str:
    """A short hash of a model's parameters and buffers (keys of caches of its outputs)."""
    digest = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


@dataclass
class ModelOutput:
    """What every model yields, whatever its architecture.

    logits: ``[B, C]``; hidden_states: ``(layers + 1)`` tensors ``[B, L, d]``, the embedding
    output first; attentions: ``layers`` tensors ``[B, heads, L, L]``; attention_mask ``[B, L]``.
    """

    logits: Tensor
    attention_mask: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


def output_replaced(module: nn.Module, replacement: Tensor) -> RemovableHandle:
    """Within the context (the hook's handle), ``module`` (the embeddings module, an encoder
    layer) returns ``replacement`` instead of its output — as the first element when its output is
    a tuple."""

    def hook(_module: nn.Module, _inputs: tuple, output: Tensor | tuple) -> Tensor | tuple:
        return (replacement, *output[1:]) if isinstance(output, tuple) else replacement

    return module.register_forward_hook(hook)


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


def model_inputs(model: PreTrainedModel, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The tensors of ``batch`` that ``model``'s forward pass takes: token types only for an
    architecture that reads them (DistilBERT and decoders have no such input); a batch of
    several texts is checked by :func:`check_pad`."""
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    if not parts_of(model).token_types:
        inputs.pop("token_type_ids", None)
    if len(batch["input_ids"]) > 1:
        check_pad(model)
    return inputs


def check_pad(model: PreTrainedModel, name: str | None = None) -> None:
    """A decoder classifier without ``pad_token_id`` is a one-line error: its head reads each
    text's last token that is not padding, which it cannot find in a padded batch."""
    if parts_of(model).reads == LAST and model.config.pad_token_id is None:
        raise WorkbenchError(
            f"{name or type(model).__name__} is a decoder classifier without pad_token_id: its "
            "head reads each text's last token that is not padding, so batches of several texts "
            "need one; set pad_token_id in its config.json (e.g. its tokenizer's pad or end "
            "token)"
        )


def match_pad(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    name: str,
    notify: Callable[[str], None] | None = None,
) -> None:
    """Set a decoder classifier's tokenizer to pad with the config's ``pad_token_id``, the token
    its head reads past (``notify`` hears of it when the tokenizer padded with another id), so
    that a text's logits in a padded batch are its logits alone. One line when that id is not
    in the tokenizer's table."""
    pad = model.config.pad_token_id
    if parts_of(model).reads != LAST or pad is None or tokenizer.pad_token_id == pad:
        return
    if not 0 <= pad < len(tokenizer):
        raise WorkbenchError(
            f"{name}: its config's pad_token_id {pad} is not a token of its tokenizer "
            f"({len(tokenizer)} tokens): set pad_token_id in its config.json to its tokenizer's "
            "pad or end token"
        )
    before = tokenizer.pad_token_id
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(int(pad))
    if before is not None and notify:
        notify(
            f"{name}: its tokenizer pads with id {before}, its config's pad_token_id is {pad} "
            f"(the token its head reads past): batches are padded with {pad}"
        )


def _at_least_float32(x: Tensor) -> Tensor:
    """``x`` in float32 when it is of half precision, else as it is (float64 kept)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def forward(
    model: PreTrainedModel,
    batch: Mapping[str, Tensor],
    *,
    hidden_states: bool = False,
    attentions: bool = False,
    embedding_output: Tensor | None = None,
) -> ModelOutput:
    """Run ``model`` on a batch (``input_ids``, ``attention_mask``, optional ``token_type_ids``,
    each ``[B, L]``); with ``embedding_output`` ``[B, L, d]`` the encoder consumes that tensor
    instead of the embeddings module's output. Logits and hidden states of half precision
    (bf16/fp16 autocast) come back in float32, so that the losses and maps computed from them
    (softmaxes, distances of nearly equal values) keep float32's precision; float32 and float64
    stay as they are."""
    inputs = model_inputs(model, batch)
    context = (
        nullcontext()
        if embedding_output is None
        else output_replaced(embeddings_module(model), embedding_output)
    )
    with context:
        out = model(**inputs, output_hidden_states=hidden_states, output_attentions=attentions)
    return ModelOutput(
        logits=_at_least_float32(out.logits),
        attention_mask=batch["attention_mask"],
        hidden_states=tuple(map(_at_least_float32, out.hidden_states)) if hidden_states else None,
        attentions=out.attentions if attentions else None,
    )


class _Captured(Exception):
    """Raised by :func:`embed`'s hook: the forward pass goes no further than the embeddings."""


def embed(model: PreTrainedModel, batch: Mapping[str, Tensor]) -> Tensor:
    """The embedding output ``[B, L, d]`` of a batch: what the encoder consumes, as the model's
    own forward pass computes it (DeBERTa's padding mask, ELECTRA's projection, RoBERTa's
    position ids), stopped once the embedding stage has run."""
    captured: list[Tensor] = []

    def hook(_module: nn.Module, _inputs: tuple, output: Tensor | tuple) -> None:
        captured.append(output[0] if isinstance(output, tuple) else output)
        raise _Captured

    with embeddings_module(model).register_forward_hook(hook), suppress(_Captured):
        model(**model_inputs(model, batch))
    return captured[0]


def max_tokens(model: PreTrainedModel) -> int:
    """The longest sequence the model reads: its position table, less the positions an
    architecture that counts from the padding index never uses (RoBERTa: ``pad_token_id + 1``)."""
    config = model.config
    unused = config.pad_token_id + 1 if parts_of(model).positions_from_ids else 0
    return getattr(config, "max_position_embeddings", 1 << 20) - unused


def check_max_length(model: PreTrainedModel, max_length: int, who: str) -> None:
    """A ``--max-length`` beyond what ``model`` (named ``who`` in the message) reads is a
    one-line error: its position table would be indexed out of range at the first long text."""
    if max_length > max_tokens(model):
        raise WorkbenchError(
            f"--max-length {max_length} exceeds the {max_tokens(model)} tokens {who} reads (its "
            f"position table): use --max-length {max_tokens(model)} or less"
        )


def input_positions(model: PreTrainedModel, batch: Mapping[str, Tensor]) -> Tensor | None:
    """The position ids ``[B, L]`` a family that derives them from the input ids gives the batch
    (RoBERTa, XLM-R: counted over real tokens from the padding index + 1), or None for the
    families whose positions do not depend on the ids."""
    if not parts_of(model).positions_from_ids:
        return None
    embeddings = embedding_modules(model)[0]
    return embeddings.create_position_ids_from_input_ids(batch["input_ids"], embeddings.padding_idx)


GENERIC_LABEL = re.compile(r"LABEL_\d+")
SHOWN = 8  # classes a refusal lists before "and N more"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def class_order(
    model_labels: Sequence[str],
    task_labels: Sequence[str],
    label_map: Mapping[str, str],
    source: str,
) -> tuple[list[int], str | None]:
    """For each of the task's classes, the index of the model output that holds it, and a note
    when the match was made by position.

    Names match case-insensitively; ``label_map`` (task class → model label) names the
    correspondence where the names differ. A model whose labels are all generic (``LABEL_0``…)
    is matched by index, with a note. Another number of classes, or a class of either side left
    unmatched, is a one-line error listing both sides and naming ``--label-map``.
    """
    model_labels, task_labels = [str(x) for x in model_labels], [str(x) for x in task_labels]
    unknown = sorted(set(label_map) - set(task_labels))
    if unknown:
        raise WorkbenchError(
            f"--label-map names {unknown}, which are not classes of the task {task_labels}"
        )
    pairs = [f"{t}={m}" for t, m in zip(task_labels, model_labels, strict=False)]
    example = ",".join(pairs[:SHOWN]) + (",…" if len(pairs) > SHOWN else "")
    mismatch = (
        f"{source} has the classes [{listed(map(repr, model_labels), SHOWN)}], the task "
        f"[{listed(map(repr, task_labels), SHOWN)}]: name the correspondence with --label-map "
        f"{example} (task class=model label)"
    )
    if len(model_labels) != len(task_labels):
        raise WorkbenchError(mismatch)
    generic = all(GENERIC_LABEL.fullmatch(label) for label in model_labels)
    if generic and not label_map:
        return list(range(len(task_labels))), (
            f"{source} names its classes {model_labels[0]}…: matched to the task's "
            f"{task_labels} by position (give --label-map to match them otherwise)"
        )
    index = {label.casefold(): i for i, label in enumerate(model_labels)}
    order = [index.get(label_map.get(t, t).casefold()) for t in task_labels]
    if None in order or len(set(order)) != len(order):
        raise WorkbenchError(mismatch)
    return order, None


def reorder_classes(model: PreTrainedModel, order: Sequence[int]) -> None:
    """Permute the head's output rows so that output ``c`` is the model's output ``order[c]``:
    the logits come in the task's class order."""
    if list(order) == list(range(len(order))):
        return
    output = head_output(model, "matching its classes to the task's")
    with torch.no_grad():
        index = torch.tensor(list(order), device=output.weight.device)
        output.weight.copy_(output.weight[index])
        if output.bias is not None:
            output.bias.copy_(output.bias[index])


def check_classifier(config: PretrainedConfig, name: str, head: bool = True) -> None:
    """Refuse a model whose head is for another task type (``BertForTokenClassification``; a
    pretraining head — masked or causal language modelling — is none); with ``head``, also one
    without a classification head (a bare encoder, which cannot be a teacher before it is
    fine-tuned)."""
    if has_head(config):
        return
    architectures = config.architectures or []
    heads = r"For(?!Masked|Causal|Pre|Sequence)[A-Z]\w+$"
    other = next((a for a in architectures if re.search(heads, a)), None)
    if other is not None:
        raise WorkbenchError(
            f"{name} is a {other}: the workbench distils and explains sequence classifiers "
            "(…ForSequenceClassification)"
        )
    if head:
        shown = ", ".join(architectures) or config.model_type
        raise WorkbenchError(
            f"{name} ({shown}) has no sequence-classification head: fine-tune it first "
            f"(kdw train-teacher --model {name})"
            + (", or prompt it (--prompt … --verbalizer …)" if is_language_model(config) else "")
        )


def check_tokenizer_files(name: str) -> None:
    """A local model folder must carry a tokenizer that loads here: one line if it does not
    (none saved, or a SentencePiece model alone without the package that reads it)."""
    if (folder := prompted_folder(name)) is not None:  # its base model's tokenizer
        check_tokenizer_files(read_prompt(folder).base)
        return
    source = Path(resolve_model(name))
    if not source.is_dir():
        return
    if not any((source / f).exists() for f in TOKENIZER_FILES):
        raise WorkbenchError(
            f"{name} has no tokenizer (none of {', '.join(TOKENIZER_FILES[:4])}…): save it "
            "into the folder with tokenizer.save_pretrained"
        )
    kept = [f for f in SENTENCEPIECE_FILES if (source / f).is_file()]
    readable = (source / "tokenizer.json").exists() or importlib.util.find_spec("sentencepiece")
    if kept and not readable:
        raise WorkbenchError(
            f"{name} keeps its tokenizer as a SentencePiece model only ({kept[0]}), which needs "
            "the sentencepiece package: pip install sentencepiece, or save the tokenizer with "
            "tokenizer.save_pretrained where it loads (that adds tokenizer.json)"
        )


def load_config(name: str) -> PretrainedConfig:
    """The config of a built-in model, a directory or a hub id; of a prompted classifier, its
    base model's, naming the classes of its verbalizer."""
    if (folder := prompted_folder(name)) is not None:
        record = read_prompt(folder)
        config = _from_pretrained(AutoConfig.from_pretrained, record.base, "the config of")
        labels = list(record.verbalizer)
        config.update(
            {
                "architectures": [PROMPTED],
                "num_labels": len(labels),
                "id2label": dict(enumerate(labels)),
                "label2id": {label: i for i, label in enumerate(labels)},
            }
        )
        return config
    return _from_pretrained(AutoConfig.from_pretrained, name, "the config of")


def prompted_folder(name: str) -> Path | None:
    """The folder of the prompted classifier ``name`` names (one with ``prompt.json``), None
    for any other model."""
    path = Path(resolve_model(name))
    return path if (path / PROMPT_FILE).is_file() else None


def read_prompt(folder: Path) -> PromptRecord:
    """A prompted classifier's ``prompt.json``, checked."""
    remedy = "write it again: the model with --prompt and --verbalizer"
    return read_record_file(
        folder / PROMPT_FILE, PromptRecord, "a prompt record", remedy, "prompt file", remedy
    )


def base_digest(source: str) -> str:
    """What pins a prompted classifier's base model: the sha256 of a folder's weights, config
    and tokenizer files (each a regular file; read once per process while they keep their size
    and time, :func:`~workbench.core.assembly.sha256`), a hub id's name."""
    folder = Path(source)
    if not folder.is_dir():
        return source
    kept = [folder / name for name in ("config.json", *TOKENIZER_STATE)]
    files = [*weight_files(folder), *(path for path in kept if os.path.lexists(path))]
    return sha256([regular_file(path, "the model file") for path in files], folder.name)


def write_prompted(record: PromptRecord) -> str:
    """The folder of the prompted classifier ``record`` in the user's cache, written once under
    the digest of what it says (later uses find it there)."""
    folder = user_cache() / "prompted" / record_digest(record)[:16]
    if not (folder / PROMPT_FILE).is_file():
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / PROMPT_FILE, with_format(record.plain()))
    return str(folder)


def prompted_model(
    base: str, config: PromptConfig, spec: TaskSpec, train: Split | None, seed: int
) -> str:
    """The folder of the causal language model ``base`` prompted as ``config`` says for the
    task ``spec`` (shots drawn from ``train`` with ``seed``); a base that is a classifier
    already, or not a language model, is a one-line error."""
    if spec.regression or spec.pair:
        kind = "a regression" if spec.regression else "a task of text pairs"
        raise WorkbenchError(
            f"--prompt reads class words for one text; {spec.name} is {kind}: fine-tune the "
            "model instead (kdw train-teacher)"
        )
    base_config = load_config(base)
    if not is_language_model(base_config):
        shown = ", ".join(base_config.architectures or []) or "no architecture"
        raise WorkbenchError(
            f"--prompt reads the answer of a causal language model (…ForCausalLM); {base} is "
            f"{shown}, not one"
        )
    source = resolve_model(base)
    pool = None if train is None else (train.texts, train.labels)
    record = prompt_record(base, base_digest(source), config, spec.label_names, pool, seed)
    PromptTokens.of(_text_tokenizer(base), record, base_config)  # refused before it is written
    return write_prompted(record)


def load_prompted(
    folder: Path, notify: Callable[[str], None] | None = None
) -> tuple[PromptedClassifier, PreTrainedTokenizerBase]:
    """The prompted classifier of ``folder`` and the tokenizer of the texts it reads, in eval
    mode; a base model that changed since the folder was written is a one-line error."""
    record = read_prompt(folder)
    if prompted_folder(record.base) is not None:
        raise WorkbenchError(f"{folder}: its base model {record.base} is prompted itself")
    if base_digest(resolve_model(record.base)) != record.base_digest:
        raise WorkbenchError(
            f"{folder}: its base model {record.base} has changed since the prompt was written; "
            "write the prompt again (the base model with --prompt and --verbalizer)"
        )
    load = AutoModelForCausalLM.from_pretrained
    lm = _from_pretrained(load, record.base, "model", notify, attn_implementation=ATTENTION)
    tokenizer = load_tokenizer(str(folder))
    return PromptedClassifier(lm, tokenizer, record).eval(), tokenizer


def _text_tokenizer(base: str) -> PreTrainedTokenizerBase:
    """The tokenizer a prompted classifier of ``base`` reads its texts with: the base's, adding
    no special token around a text, padding on the right (its rows: text, then padding)."""
    tokenizer = load_tokenizer(base)
    plain_text_tokens(tokenizer)
    tokenizer.padding_side = "right"
    return tokenizer


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a built-in model, a directory or a hub id. One without a pad token
    (GPT-2's, Llama's) pads with the model's ``pad_token_id``, so that a decoder classifier
    finds each text's last real token by its own rule."""
    if (folder := prompted_folder(name)) is not None:
        return _text_tokenizer(read_prompt(folder).base)
    check_tokenizer_files(name)
    tokenizer = _from_pretrained(AutoTokenizer.from_pretrained, name, "the tokenizer of")
    if tokenizer.pad_token_id is None:
        pad = load_config(name).pad_token_id
        if pad is not None and pad < len(tokenizer):
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(int(pad))
    return tokenizer


@dataclass
class LoadedModel:
    """A classifier with its tokenizer and task: the best model of a run folder, or a model the
    workbench did not train (a Hugging Face checkpoint folder or hub id).

    ``run`` is None for the latter, and ``data`` is the task it is applied to (None when it is
    only asked about typed texts). ``origin`` says where it came from, for pages and tables.
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    spec: TaskSpec
    data: DataConfig | None
    name: str
    source: str
    origin: str
    run: Run | None = None

    @property
    def max_length(self) -> int:
        """The tokens per text this model is applied with: its run's, else the task's given."""
        return self.data.max_length if self.data is not None else DataConfig().max_length

    @property
    def read_length(self) -> int:
        """The tokens of a text this model reads when it is explained: a run's recorded
        ``--max-length`` (as ``kdw evaluate`` scores it), else its position table's."""
        limit = max_tokens(self.model)
        return min(self.max_length, limit) if self.run is not None else limit

    @property
    def analysis_dir(self) -> Path:
        """Where analyses of the model are cached: its run's ``analysis_cache/``, or for a model
        the workbench did not train (whose folder is left as it is) a folder per source under
        the user's cache (:func:`user_cache`); every file there is keyed by the model's weights
        and the settings."""
        if self.run is not None:
            return self.run.analysis_dir
        return user_cache() / "analysis" / hashlib.sha256(self.source.encode()).hexdigest()[:16]


def load_run(path: str | Path) -> LoadedModel:
    """The best model of a run, in eval mode, with eager attention."""
    run = Run.open(path)
    if not (run.model_dir / "config.json").exists():
        state = run.status().state
        raise WorkbenchError(f"{run.path} has no trained model yet (status: {state})")
    run.check_model()
    try:
        config = AutoConfig.from_pretrained(run.model_dir)
        check_model_folder(run.model_dir, config)
        model, info = AutoModelForSequenceClassification.from_pretrained(
            run.model_dir, attn_implementation=ATTENTION, output_loading_info=True
        )
        check_loaded(model, info, str(run.model_dir), False)
        tokenizer = AutoTokenizer.from_pretrained(run.model_dir)
    except WorkbenchError:
        raise
    except Exception as error:  # a damaged file: transformers' errors have no common type
        raise WorkbenchError(
            f"{run.model_dir} cannot be loaded ({type(error).__name__}: {first_line(error)}): "
            "a file of the model is damaged; train the run again"
        ) from None
    task = run.task()
    spec = TaskSpec(task.name, tuple(task.label_names), tuple(task.metrics), task.pair)
    data = run.config(DataConfig, "data")
    return LoadedModel(model.eval(), tokenizer, spec, data, run.name, str(run.path), "run", run)


def is_run(source: str | Path) -> bool:
    """Whether ``source`` names a run folder (one with ``run.json``, which its reader checks)."""
    return (Path(source) / "run.json").exists()


def load_model(
    source: str,
    spec: TaskSpec | None = None,
    data: DataConfig | None = None,
    label_map: Mapping[str, str] | None = None,
    notify: Callable[[str], None] | None = None,
) -> LoadedModel:
    """A run folder (:func:`load_run`), or a sequence classifier the workbench did not train: a
    Hugging Face checkpoint folder (config, weights, tokenizer), a PEFT adapter folder of one
    (merged into its base, :func:`resolve_model`), a built-in name or a hub id,
    in eval mode with eager attention.

    For the latter, ``spec`` is the task it is applied to (its classes matched and its head
    reordered as :func:`load_classifier` does; ``notify`` hears of a match made by position);
    without ``spec``, the task is the model's own label set."""
    if is_run(source):
        return load_run(source)
    if (folder := prompted_folder(source)) is not None:
        return _load_prompted_model(source, folder, spec, data, label_map, notify)
    config = load_config(source)
    check_classifier(config, source)
    tokenizer = load_tokenizer(source)
    path = Path(resolve_model(source))
    name = path.name if path.exists() else source
    if spec is None:
        labels = tuple(str(config.id2label[i]) for i in range(config.num_labels))
        regression = config.num_labels == 1
        spec = TaskSpec(
            name,
            () if regression else labels,
            ("spearman", "pearson") if regression else METRICS_CLASSIFICATION,
        )
    model = load_classifier(source, spec, label_map, notify)
    match_pad(model, tokenizer, name, notify)
    set_label_names(model, spec)
    origin = "model folder" if path.exists() else "hub"
    return LoadedModel(model.eval(), tokenizer, spec, data, name, source, origin)


def _load_prompted_model(
    source: str,
    folder: Path,
    spec: TaskSpec | None,
    data: DataConfig | None,
    label_map: Mapping[str, str] | None,
    notify: Callable[[str], None] | None,
) -> LoadedModel:
    """:func:`load_model` of a prompted classifier: its classes matched to the task's by name
    (its verbalizer's order permuted to the task's)."""
    model, tokenizer = load_prompted(folder, notify)
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    if spec is None:
        spec = TaskSpec(folder.name, tuple(labels), METRICS_CLASSIFICATION)
    order, note = class_order(labels, spec.label_names, label_map or {}, source)
    if note and notify:
        notify(note)
    model.reorder(order)
    set_label_names(model, spec)
    return LoadedModel(model, tokenizer, spec, data, folder.name, source, "prompted model")


def load_for_task(
    source: str,
    data: DataConfig | None,
    label_map: str = "",
    notify: Callable[[str], None] | None = None,
) -> tuple[LoadedModel, TaskData]:
    """A model and the task it is applied to: a run folder and its own task (``data``, when
    given, must name it, and is then the task's data as sampled), or a classifier the
    workbench did not train and ``data``'s task, its classes matched to the task's
    (``label_map``: :func:`~workbench.core.config.parse_label_map`'s syntax). Checked before
    anything is written."""
    if is_run(source):
        if label_map:
            raise WorkbenchError(
                f"--label-map is for a model the workbench did not train: {source} is a run "
                "folder, whose classes are its task's"
            )
        loaded = load_run(source)
        if data is not None:
            if not same_task(loaded.data.task, data.task):
                raise WorkbenchError(
                    f"{source} was trained on {loaded.data.task!r}, not {data.task!r}: "
                    f"pass --task {loaded.data.task}"
                )
            check_max_length(loaded.model, data.max_length, source)
        return loaded, load_task(loaded.data if data is None else data, notify)
    resolve_model(source)  # a path that does not exist: said as such
    if data is None:
        raise WorkbenchError(
            f"{source} is not a run folder, so it has no task of its own: name one with --task"
        )
    task = load_task(data, notify)
    loaded = load_model(source, task.spec, data, parse_label_map(label_map), notify)
    check_max_length(loaded.model, data.max_length, source)
    check_pad(loaded.model, source)
    return loaded, task
