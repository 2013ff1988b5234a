"""Where any sequence classifier keeps the parts the workbench uses, found by what they are.

:func:`parts_of` finds, once per model, by one probe forward pass with hooks (eval mode, no
graph, the random state left as it was): the **site** (the module whose output the first layer
consumes), the **embedding stage**, the **layer list**, the **head output**, **what the head
reads** (first token, last non-pad token, or masked mean), and whether the forward pass takes
**token types** and derives **position ids** from the input ids (docs/models-and-data.md, "Any
architecture"). A part that cannot be found is None, and only the methods that need it refuse,
in one line naming the part (:func:`require`). :data:`OVERRIDES` holds what the probe cannot see.
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from workbench.core.errors import WorkbenchError

FIRST, LAST, MEAN = "first", "last", "mean"


@dataclass(frozen=True)
class Parts:
    """A classifier's parts as module paths from the model (``bert.embeddings``), None where
    none was found. ``stage``: the embedding stage's modules in the order they ran, ``site``
    the one whose output ``[B, L, d]`` the first layer consumes; ``layers`` the layer list;
    ``head`` the ``nn.Linear`` giving the logits ``[B, C]`` (one weight row per class);
    ``reads``: the position(s) whose state the head reads (:data:`FIRST`, :data:`LAST`,
    :data:`MEAN`); ``token_types``: whether the forward pass takes ``token_type_ids``;
    ``positions_from_ids``: whether position ids are counted over non-padding tokens;
    ``framed``: whether the model sets the input inside tokens of its own (a prompted
    classifier's template), so that its first token is no attention sink."""

    kind: str
    stage: tuple[str, ...] = ()
    site: str | None = None
    layers: str | None = None
    head: str | None = None
    reads: str = FIRST
    token_types: bool = False
    positions_from_ids: bool = False
    framed: bool = False


# What the probe cannot see: ALBERT applies one shared layer group N times (no list of N
# distinct layers to cut), after a projection from its embedding width to the hidden width.
OVERRIDES: dict[str, dict] = {
    "albert": {
        "layers": None,
        "stage": ("albert.embeddings", "albert.encoder.embedding_hidden_mapping_in"),
        "site": "albert.encoder.embedding_hidden_mapping_in",
    },
}

_FOUND: weakref.WeakKeyDictionary[nn.Module, Parts] = weakref.WeakKeyDictionary()


def _layer_list(model: PreTrainedModel) -> str | None:
    count = getattr(model.config, "num_hidden_layers", None)
    prefix = model.base_model_prefix
    for name, module in model.named_modules():
        if (
            isinstance(module, nn.ModuleList)
            and len(module) == count
            and name.startswith(prefix)
            and len({type(layer) for layer in module}) == 1
        ):
            return name
    return None


def _head(model: PreTrainedModel) -> str | None:
    prefix = f"{model.base_model_prefix}."
    found = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and module.out_features == model.config.num_labels
        and not name.startswith(prefix)
    ]
    return found[-1] if found else None


def _probe(
    model: PreTrainedModel, layers: str | None, head: str | None
) -> tuple[tuple[str, ...], str | None, list[torch.Size] | None]:
    """One forward pass on four tokens, hooked: the modules that finished before the first
    layer started (the embedding stage), which of them gave the tensor it consumed (the site),
    and the head's output shape (in a list; None without one)."""
    finished: list[tuple[str, object]] = []
    consumed: list[Tensor] = []
    head_shape: list[torch.Size] = []
    first = model.get_submodule(f"{layers}.0") if layers else None

    def done(name: str):
        def hook(_module, _inputs, output) -> None:
            if not consumed:
                finished.append((name, output[0] if isinstance(output, tuple) else output))

        return hook

    def entered(_module, args, kwargs) -> None:
        if not consumed:
            consumed.append(args[0] if args else kwargs.get("hidden_states"))

    handles = [
        module.register_forward_hook(done(name))
        for name, module in model.named_modules()
        if name and module is not first
    ]
    if first is not None:
        handles.append(first.register_forward_pre_hook(entered, with_kwargs=True))
    if head is not None:
        handles.append(
            model.get_submodule(head).register_forward_hook(
                lambda _m, _i, out: head_shape.append(out.shape)
            )
        )
    device = next(model.parameters()).device
    ids = (torch.arange(1, 5, device=device)[None] % model.config.vocab_size).long()
    training = model.training
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model.eval()
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    except Exception:  # an architecture whose forward needs more than ids: nothing is found
        return (), None, None
    finally:
        model.train(training)
        for handle in handles:
            handle.remove()
    site, stage = None, []
    if consumed:
        for name, output in finished:
            if isinstance(output, Tensor) and (
                output is consumed[0]
                or (output.shape == consumed[0].shape and torch.equal(output, consumed[0]))
            ):
                site = name
        top = [n for n, _ in finished if layers is None or not layers.startswith(f"{n}.")]
        stage = [n for n in top if not any(n.startswith(f"{o}.") for o in top if o != n)]
    return tuple(dict.fromkeys(stage)), site, head_shape[-1:] or None


def parts_of(model: PreTrainedModel) -> Parts:
    """The parts of ``model``, found once (then remembered for the model object); a model that
    declares its own (``workbench_parts``: a prompted classifier) has those."""
    if (found := _FOUND.get(model)) is not None:
        return found
    if isinstance(declared := getattr(model, "workbench_parts", None), Parts):
        return declared
    config = model.config
    override = OVERRIDES.get(config.model_type, {})
    layers = override.get("layers", _layer_list(model))
    head = _head(model)
    stage, site, shape = _probe(model, layers, head)
    if shape is not None and len(shape[0]) == 3:  # the head maps every position: decoders
        reads = LAST
    elif getattr(config, "classifier_pooling", None) == MEAN:
        reads = MEAN
    else:
        reads = FIRST
    first = model.get_submodule(stage[0]) if stage else None
    parts = Parts(
        kind=config.model_type,
        stage=stage,
        site=site,
        layers=layers,
        head=head,
        reads=reads,
        token_types="token_type_ids" in inspect.signature(model.forward).parameters
        and (getattr(config, "type_vocab_size", 0) or 0) > 0,
        positions_from_ids=hasattr(first, "create_position_ids_from_input_ids")
        and getattr(first, "padding_idx", None) is not None,
    )
    _FOUND[model] = replace(parts, **{k: v for k, v in override.items() if k != "layers"})
    return _FOUND[model]


def set_stage(model: PreTrainedModel, stage: tuple[str, ...]) -> None:
    """Remember ``stage`` as the embedding stage of ``model``: a model on the ``meta`` device,
    whose forward cannot be probed (a teacher cache's, its stage found on the live teacher)."""
    _FOUND[model] = replace(parts_of(model), stage=stage)


# the part each attribute names, for messages
PART_NAMES = {
    "site": "the tensor its first layer consumes (the embedding output)",
    "layers": "a list of distinct layers",
    "head": "a head output layer (a linear map to the {classes} classes)",
    "stage": "an embedding stage",
}


def require(model: PreTrainedModel, part: str, needed_by: str) -> str | tuple[str, ...]:
    """The path(s) of ``part`` (an attribute of :class:`Parts`), or a one-line error naming
    the part, the architecture and ``needed_by`` (what needs it)."""
    if not (value := getattr(parts_of(model), part)):
        what = PART_NAMES[part].format(classes=model.config.num_labels)
        raise WorkbenchError(
            f"{type(model).__name__} ({model.config.model_type}): the workbench cannot find "
            f"{what}, which {needed_by} needs"
        )
    return value


def embedding_modules(model: PreTrainedModel, needed_by: str = "this method") -> list[nn.Module]:
    """The embedding stage's modules of ``model``, in the order they run."""
    return [model.get_submodule(path) for path in require(model, "stage", needed_by)]


def embeddings_module(model: PreTrainedModel, needed_by: str = "attribution") -> nn.Module:
    """The module whose output ``[B, L, d]`` is the sequence the first layer consumes."""
    return model.get_submodule(require(model, "site", needed_by))


def encoder_layers(model: PreTrainedModel, needed_by: str = "this method") -> nn.ModuleList:
    """The model's layers, in order."""
    return model.get_submodule(require(model, "layers", needed_by))


def layer_count(model: PreTrainedModel) -> int:
    """How many layers the model applies (``hidden_states`` has one more entry): its config's
    ``num_hidden_layers``, under each architecture's name for it."""
    return int(model.config.num_hidden_layers)


def head_output(model: PreTrainedModel, needed_by: str) -> nn.Linear:
    """The classification head's output layer (one row of its weight per class)."""
    return model.get_submodule(require(model, "head", needed_by))


def head_positions(model: PreTrainedModel, batch: dict[str, Tensor]) -> Tensor | None:
    """The position ``[B]`` whose state the head reads: 0 for encoders, and for decoder
    classifiers the rightmost token that is not ``pad_token_id`` (Hugging Face's rule, left or
    right padding alike); None for a head that pools (the mean over real tokens)."""
    reads = parts_of(model).reads
    ids = batch["input_ids"]
    if reads == FIRST:
        return torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)
    if reads == MEAN:
        return None
    pad = model.config.pad_token_id
    real = torch.ones_like(ids) if pad is None else (ids != pad).long()
    return (torch.arange(ids.shape[1], device=ids.device) * real).argmax(-1)


def head_states(model: PreTrainedModel, hidden: Tensor, batch: dict[str, Tensor]) -> Tensor:
    """The states ``[B, d]`` of ``hidden`` ``[B, L, d]`` at what the head reads (Patient KD's
    [CLS] states: the first token, a decoder's last real token, or a pooling head's masked
    mean)."""
    if (positions := head_positions(model, batch)) is None:
        mask = batch["attention_mask"].to(hidden.dtype)[..., None]
        return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), positions]
