"""Encoder families: where each kind of sequence classifier keeps the parts the workbench uses.

One :class:`Family` per ``model_type``, as data: the modules of the embedding stage, the one whose
output the first encoder layer consumes (the site of AD-KD's IG and GKD's gradients), the layer
list, the output layer of the classification head, and how the family reads token types and
positions. :mod:`workbench.core.models` reaches into a model only through this table, so a family is
added by one entry here (and a tiny model of it in the tests).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from workbench.core.errors import WorkbenchError


@dataclass(frozen=True)
class Family:
    """Where a family's parts are, as attribute paths.

    ``embeddings``: the embedding stage's modules under the backbone (``model.base_model``), in
    order; those absent from a model (ELECTRA's projection when its embedding width equals the
    hidden width) are skipped, and the last present one's output ``[B, L, d]`` is what the
    encoder consumes. ``layers``: the ``nn.ModuleList`` of transformer layers under the
    backbone. ``head_output``: the ``nn.Linear`` under the classifier that yields the logits
    ``[B, C]``, one row per class. ``token_types``: whether the forward pass takes
    ``token_type_ids``. ``positions_from_ids``: whether position ids are derived from the input
    ids (counted over non-padding tokens, after the padding index), so that a sequence of
    [PAD]s changes them. ``first_token``: the position whose state the head reads.
    """

    name: str
    embeddings: tuple[str, ...] = ("embeddings",)
    layers: str = "encoder.layer"
    head_output: str = "classifier"
    token_types: bool = True
    positions_from_ids: bool = False
    first_token: int = 0


FAMILIES = {
    "bert": Family("BERT"),
    "roberta": Family("RoBERTa", head_output="classifier.out_proj", positions_from_ids=True),
    "xlm-roberta": Family(
        "XLM-RoBERTa", head_output="classifier.out_proj", positions_from_ids=True
    ),
    "distilbert": Family("DistilBERT", layers="transformer.layer", token_types=False),
    "electra": Family(
        "ELECTRA",
        embeddings=("embeddings", "embeddings_project"),
        head_output="classifier.out_proj",
    ),
    "deberta-v2": Family("DeBERTa-v2/v3"),
}


def supported() -> str:
    """The supported model types, for messages."""
    return ", ".join(f"{key} ({family.name})" for key, family in FAMILIES.items())


def family_of(model: PreTrainedModel | PretrainedConfig) -> Family:
    """The family of a model or config; an unsupported ``model_type`` is a one-line error that
    names the supported ones."""
    config = model if isinstance(model, PretrainedConfig) else model.config
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise WorkbenchError(
            f"model type {config.model_type!r} is not supported: the workbench reads {supported()}"
        )
    return family


def _module(owner: nn.Module, path: str) -> nn.Module | None:
    for name in path.split("."):
        owner = getattr(owner, name, None)
        if owner is None:
            return None
    return owner


def embedding_modules(model: PreTrainedModel) -> list[nn.Module]:
    """The embedding stage's modules of ``model``, in order (ELECTRA: embeddings, projection)."""
    found = [_module(model.base_model, path) for path in family_of(model).embeddings]
    modules = [module for module in found if module is not None]
    if not modules:
        raise WorkbenchError(f"{type(model).__name__} has no embeddings module: unsupported model")
    return modules


def encoder_layers(model: PreTrainedModel) -> nn.ModuleList:
    """The model's transformer layers, in order."""
    layers = _module(model.base_model, family_of(model).layers)
    if not isinstance(layers, nn.ModuleList):
        raise WorkbenchError(f"{type(model).__name__} has no layer list: unsupported model")
    return layers


def layer_prefix(model: PreTrainedModel) -> str:
    """The state-dict prefix of the layer list's entries (``bert.encoder.layer.``)."""
    return f"{model.base_model_prefix}.{family_of(model).layers}."


def head_output(model: PreTrainedModel) -> nn.Linear:
    """The classification head's output layer (one row of its weight per class)."""
    module = _module(model, family_of(model).head_output)
    if not isinstance(module, nn.Linear):
        raise WorkbenchError(
            f"{type(model).__name__} has no {family_of(model).head_output} output layer: not a "
            "sequence classifier of its family"
        )
    return module
