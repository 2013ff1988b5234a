"""How a student is built from its teacher: cut from the teacher's layers (the initialisation
of Patient KD and GKD), or random of the teacher's architecture at another depth or width; and
the set-ups that methods apply to it (frozen embeddings, dropout off, the teacher's embeddings
copied: :class:`~kd.methods.objective.StudentSetup`).

Which teacher layers a cut student keeps is :func:`kd.methods.layer_map.select_layers`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    PretrainedConfig,
    PreTrainedModel,
)

from workbench.core.errors import WorkbenchError
from workbench.core.models import ATTENTION
from workbench.core.parts import embedding_modules, require


def with_layers(config: PretrainedConfig, layers: Sequence[int]) -> PretrainedConfig:
    """A copy of ``config`` for a model of the given layers of its own (in order): the layer
    count under the architecture's name for it (DistilBERT's ``n_layers``, GPT-2's ``n_layer``,
    through their attribute maps) and every per-layer list (``layer_types``: ModernBERT's and
    Qwen2's local or global attention) taken at those layers, so that each layer keeps its
    kind."""
    config = copy.deepcopy(config)
    count = config.num_hidden_layers
    for name, value in config.to_dict().items():
        if isinstance(value, list) and len(value) == count and name != "architectures":
            setattr(config, name, [value[i % count] for i in layers])
    config.num_hidden_layers = len(layers)
    return config


def cut_student(
    teacher: PreTrainedModel,
    layers: list[int],
    notify: Callable[[str], None] | None = None,
) -> PreTrainedModel:
    """A student made of the teacher's embedding stage, the given layers (in order), every other
    module outside the layer list (DeBERTa's relative-position embeddings, a decoder's final
    norm) and its head (as Patient KD and GKD initialise theirs). A weight of a chosen layer
    that the student's layer at its new place has no parameter for is left out, and
    ``notify`` hears of it."""
    prefix = f"{require(teacher, 'layers', 'a student cut from the teacher (--init cut)')}."
    config = with_layers(teacher.config, layers)
    student = AutoModelForSequenceClassification.from_config(config, attn_implementation=ATTENTION)
    state = {}
    for key, value in teacher.state_dict().items():
        if key.startswith(prefix):
            index, rest = key[len(prefix) :].split(".", 1)
            if int(index) not in layers:
                continue
            key = f"{prefix}{layers.index(int(index))}.{rest}"
        state[key] = value.clone()
    result = student.load_state_dict(state, strict=False)
    if result.missing_keys or any(not k.startswith(prefix) for k in result.unexpected_keys):
        raise WorkbenchError(
            f"a student cut from {type(teacher).__name__} expects weights its teacher does not "
            f"hold ({', '.join((result.missing_keys or result.unexpected_keys)[:3])}): use "
            "--init pretrained or random"
        )
    if result.unexpected_keys and notify:  # ModernBERT's first layer has no attention norm
        notify(
            f"the student's first layer has no place for {', '.join(result.unexpected_keys)} "
            f"of the teacher's layer {layers[0]} (in {teacher.config.model_type} the first "
            "layer reads the normalised embeddings): left out"
        )
    return student


def random_student(
    teacher_config: AutoConfig,
    num_layers: int,
    hidden_size: int | None = None,
    num_heads: int | None = None,
) -> PreTrainedModel:
    """A randomly initialised student of the teacher's architecture and vocabulary, with
    ``num_layers`` layers and possibly another width (its feed-forward 4× the width, and a
    decoder's key-value heads and head width following its heads)."""
    config = with_layers(teacher_config, range(num_layers))
    heads = num_heads or config.num_attention_heads
    if (hidden_size or config.hidden_size) % heads:  # checked now, not when it is saved
        raise WorkbenchError(
            f"hidden size {hidden_size or config.hidden_size} is not divisible by {heads} heads: "
            "choose --num-heads and --hidden-size so that the heads divide the width"
        )
    if hidden_size is not None:
        width = config.hidden_size
        for name, value in config.to_dict().items():  # DeBERTa's pooler_hidden_size, …
            if name.endswith("hidden_size") and value == width:
                setattr(config, name, hidden_size)
        config.hidden_size = hidden_size
        config.intermediate_size = 4 * hidden_size
    config.num_attention_heads = heads
    if getattr(config, "head_dim", None) is not None:
        config.head_dim = config.hidden_size // heads
    if getattr(config, "num_key_value_heads", None) is not None and (
        heads % config.num_key_value_heads or num_heads is not None
    ):
        config.num_key_value_heads = heads
    try:  # what save_pretrained validates, at the end of a training, validated before it
        if hasattr(config, "validate"):
            config.validate()
        return AutoModelForSequenceClassification.from_config(config, attn_implementation=ATTENTION)
    except Exception as error:  # transformers' validators raise errors of their own kinds
        cause = str(error).strip().splitlines()[-1].strip() or type(error).__name__
        raise WorkbenchError(
            f"the student's settings make a {config.model_type} config transformers refuses "
            f"({cause}): change --num-layers, --hidden-size or --num-heads"
        ) from None


def set_embeddings_trainable(model: PreTrainedModel, trainable: bool) -> None:
    """Freeze or unfreeze the embedding stage (ELECTRA's projection included)."""
    for module in embedding_modules(model, "freezing the embeddings"):
        module.requires_grad_(trainable)


def disable_dropout(model: nn.Module) -> None:
    """Switch every dropout off (attention dropout included), in the saved config too (every
    setting whose name holds ``dropout``, under each family's names)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    for name, value in (config.to_dict() if config is not None else {}).items():
        if "dropout" in name and isinstance(value, float) and value > 0:
            setattr(config, name, 0.0)


def copy_embeddings(source: PreTrainedModel, target: PreTrainedModel) -> None:
    """Copy the embedding stage's weights (GKD initialises the student's from the teacher's);
    a student whose embedding stage holds other parameters or sizes (another family, another
    position table) is a one-line error."""
    need = "gradient KD (the teacher's embeddings copied into the student)"
    theirs, ours = embedding_modules(source, need), embedding_modules(target, need)
    states = [(a.state_dict(), b.state_dict()) for a, b in zip(theirs, ours, strict=False)]
    if len(theirs) != len(ours) or any(
        a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a) for a, b in states
    ):
        raise WorkbenchError(
            "gradient KD copies the teacher's embeddings into the student, and the student's "
            f"({target.config.model_type}) differ from the teacher's "
            f"({source.config.model_type}) in their parameters or sizes: use --init cut, or a "
            "student of the teacher's architecture and sizes"
        )
    for module, (state, _) in zip(ours, states, strict=True):
        module.load_state_dict(state)
