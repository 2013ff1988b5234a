"""What a teacher's fine-tuning trains (``--adapt``), and whether it fits in memory.

- ``full``: every weight.
- ``lora``: low-rank adapters (peft's LoRA) on the modules ``--lora-targets`` names, and the
  classification head whole (:func:`head_modules`, peft's ``modules_to_save``); the run's
  ``model/`` holds the adapters merged into a plain classifier, ``adapter/`` the adapters.
- ``head``: the head's output layer only, on the states it reads from the frozen model
  (:func:`head_features`), computed once per model, data and length and cached in the run.

:func:`check_fits` refuses a fine-tuning that cannot fit before any weight is read.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path

import torch
from torch import Tensor
from transformers import PretrainedConfig, PreTrainedModel

from kd.methods.vanilla import task_loss
from kd.training.config import OptimConfig, TeacherConfig
from kd.training.trainer import LossFunction
from workbench.core.assembly import require_library
from workbench.core.cache import ExampleCache
from workbench.core.config import option_name, set_settings
from workbench.core.errors import WorkbenchError
from workbench.core.models import forward
from workbench.core.parts import head_output, head_states, layer_count
from workbench.core.verify import safetensors_header

ADAPTER_DIR = "adapter"  # a LoRA run's adapters, beside its merged model/
LORA_SETTINGS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "lora_layers")
ALL_LINEAR = "all-linear"
FLOAT_BYTES = 4  # weights, gradients and AdamW states train in float32 (autocast or not)
GB = 1024**3


def check_adaptation(teacher: TeacherConfig) -> None:
    """Refuse settings that ``--adapt`` would ignore, in one line naming the option, and
    ``--adapt lora`` without peft (the ``llm`` extra)."""
    if teacher.adapt == "lora":
        require_library("peft", "--adapt lora")
    lora = [name for name in set_settings(teacher) if name in LORA_SETTINGS]
    if lora and teacher.adapt != "lora":
        raise WorkbenchError(f"{option_name(lora[0])} sets LoRA's adapters: add --adapt lora")
    if teacher.adapt == "head" and teacher.gradient_checkpointing:
        raise WorkbenchError(
            "--gradient-checkpointing lowers the memory of gradients through the model, which "
            "--adapt head does not take: leave it out"
        )


def head_modules(model: PreTrainedModel) -> list[str]:
    """The classification head: the model's top-level modules with weights outside its
    backbone (BERT's ``classifier``, Llama's ``score``, DistilBERT's ``pre_classifier`` and
    ``classifier``)."""
    return [
        name
        for name, module in model.named_children()
        if name != model.base_model_prefix and any(True for _ in module.parameters())
    ]


def add_lora(model: PreTrainedModel, teacher: TeacherConfig):
    """``model`` with LoRA adapters injected in place (peft's ``get_peft_model``) as the
    settings of ``teacher`` say: only the adapters and the head's copy (:func:`head_modules`)
    train. Returns the ``PeftModel`` (whose ``get_base_model()`` is ``model``, adapted) and
    what the settings resolved to (:class:`~workbench.core.runs.ResolvedLora`'s fields)."""
    from peft import LoraConfig, TaskType, get_peft_model
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    named = [name.strip() for name in teacher.lora_targets.split(",") if name.strip()]
    targets = (
        ALL_LINEAR
        if named == [ALL_LINEAR]
        else named or DEFAULTS.get(model.config.model_type, ALL_LINEAR)
    )
    heads = head_modules(model)
    layers = layer_count(model)
    if teacher.lora_layers is not None and teacher.lora_layers > layers:
        raise WorkbenchError(
            f"--lora-layers {teacher.lora_layers}: {type(model).__name__} has {layers} layers"
        )
    top = None if teacher.lora_layers is None else list(range(layers - teacher.lora_layers, layers))
    config = LoraConfig(
        layers_to_transform=top,
        task_type=TaskType.SEQ_CLS,
        r=teacher.lora_rank,
        lora_alpha=teacher.lora_alpha,
        lora_dropout=teacher.lora_dropout,
        target_modules=targets,
        modules_to_save=list(heads),  # which peft extends with its defaults
    )
    try:
        adapted = get_peft_model(model, config)
    except ValueError:  # targets the model lacks
        linear = {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name.split(".")[0] not in heads
        }
        raise WorkbenchError(
            f"--lora-targets {teacher.lora_targets or targets!r} names no layer of "
            f"{type(model).__name__} that LoRA adapts: name some of its linear layers "
            f"({', '.join(sorted(linear))}) or all-linear"
        ) from None
    return adapted, {
        "rank": teacher.lora_rank,
        "alpha": teacher.lora_alpha,
        "dropout": teacher.lora_dropout,
        "target_modules": sorted(adapted.peft_config["default"].target_modules),
        "modules_to_save": heads,
        **({"layers": top} if top is not None else {}),
    }


def merged(adapted) -> PreTrainedModel:
    """A plain classifier with ``adapted``'s adapters merged into its weights (a copy:
    ``adapted`` keeps training from its own, unrounded weights)."""
    return copy.deepcopy(adapted).merge_and_unload()


ADAPTER_REMEDY = "delete the run folder and train again (the best model's adapters are lost)"


def check_adapter_folder(folder: Path) -> None:
    """Refuse, in one line, before a LoRA run resumes, an :data:`ADAPTER_DIR` that its end could
    not read back (:func:`lora_loader`): not a folder of its own (a link, a file), weights that
    are not a regular safetensors file, or pickled ones. None yet is fine: no best model saved."""
    if not os.path.lexists(folder):
        return
    if folder.is_symlink() or not folder.is_dir():
        raise WorkbenchError(f"{folder} is not the run's adapter folder: {ADAPTER_REMEDY}")
    if os.path.lexists(folder / "adapter_model.bin"):
        raise WorkbenchError(
            f"{folder / 'adapter_model.bin'} is a pickle, which a run never writes and never "
            f"loads: {ADAPTER_REMEDY}"
        )
    safetensors_header(folder / "adapter_model.safetensors", ADAPTER_REMEDY)


def lora_loader(adapted, folder: Path):
    """How a LoRA run's best model returns to ``adapted``: its adapters and head, read from
    ``folder`` (:data:`ADAPTER_DIR`, peft's ``save_pretrained``)."""
    from peft import load_peft_weights, set_peft_model_state_dict

    def load(_model: PreTrainedModel, _model_dir: Path) -> None:
        device = str(next(adapted.parameters()).device)
        set_peft_model_state_dict(adapted, load_peft_weights(str(folder), device=device))

    return load


def freeze_to_head(model: PreTrainedModel) -> torch.nn.Linear:
    """Leave only the head's output layer of ``model`` trainable; return it."""
    head = head_output(model, "--adapt head")
    model.requires_grad_(False)
    head.requires_grad_(True)
    return head


def head_features(model: PreTrainedModel, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """``{"features": [B, d]}``: the input of the head's output layer at what it reads (a
    BERT's pooled [CLS] state, a decoder's state at its last real token) — what
    ``--adapt head`` trains on. Call it in eval mode (dropout off) without gradients."""
    seen: list[Tensor] = []
    handle = head_output(model, "--adapt head").register_forward_hook(
        lambda _module, inputs, _output: seen.append(inputs[0])
    )
    try:
        forward(model, batch)
    finally:
        handle.remove()
    state = seen[-1]
    return {"features": head_states(model, state, batch) if state.ndim == 3 else state}


def head_loss(head: torch.nn.Linear, cache: ExampleCache, term: str) -> LossFunction:
    """The loss of a step of ``--adapt head``: the task loss (:func:`task_loss`) of the head's
    logits ``[B, C]`` on the cached features of the batch's examples, under the name ``term``;
    the model itself does not run."""

    def loss(_model: PreTrainedModel, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        features = cache.gather("features", batch["index"].cpu()).to(head.weight.device)
        return {term: task_loss(head(features), batch["labels"])}

    return loss


@dataclasses.dataclass(frozen=True)
class MemoryNeed:
    """What fine-tuning a model needs, in bytes: its weights, the gradients and AdamW's two
    states of its trained part, and the activations of a micro-batch."""

    parameters: int
    trained: int
    weights: int
    training: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.training + self.activations


def memory_need(
    config: PretrainedConfig, teacher: TeacherConfig, optim: OptimConfig, max_length: int
) -> MemoryNeed:
    """An estimate of the memory that fine-tuning the model of ``config`` takes, its parameters
    counted on the meta device (no weight is read). Activations per layer and token:
    ``10·hidden + 4·intermediate`` floats (inputs of the matrix products, norms and activation
    functions) and ``3·heads·max_length`` (attention scores, probabilities, dropout), times the
    micro-batch (``batch_size / accumulation_steps``) × ``max_length`` × layers (within 10% of
    the peak of a 4-layer BERT's step on the CPU); with gradient checkpointing, each layer's
    input and three layers' sets (the layer recomputed, its gradients and the backward pass's
    temporaries). ``head`` runs the model only in evaluation (one layer's activations at the
    evaluation batch size); ``lora`` adds a merged copy of the weights, made when the best
    model is saved, and keeps activations for its adapted layers only (``--lora-layers``)."""
    from transformers import AutoModelForSequenceClassification

    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(config)
    parameters = sum(p.numel() for p in model.parameters())
    weights, layers = parameters * FLOAT_BYTES, config.num_hidden_layers
    if teacher.adapt == "lora":
        model = add_lora(model, teacher)[0]
        weights *= 2
        layers = teacher.lora_layers or layers  # below them nothing is kept for the backward pass
    hidden = config.hidden_size
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    per_token = 10 * hidden + 4 * intermediate + 3 * config.num_attention_heads * max_length
    if teacher.adapt == "head":
        heads = head_modules(model)
        trained = sum(p.numel() for n in heads for p in model.get_submodule(n).parameters())
        tokens, kept = optim.eval_batch_size * max_length, per_token
    else:
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        tokens = max(1, optim.batch_size // optim.accumulation_steps) * max_length
        checkpointed = layers * hidden + 3 * per_token  # one layer recomputed, with gradients
        kept = checkpointed if teacher.gradient_checkpointing else layers * per_token
    return MemoryNeed(
        parameters=parameters,
        trained=trained,
        weights=weights,
        training=3 * trained * FLOAT_BYTES,
        activations=tokens * kept * FLOAT_BYTES,
    )


def free_memory(device: torch.device) -> int | None:
    """Bytes free for a training on ``device``: the GPU's free memory, or the system's
    ``MemAvailable`` (``/proc/meminfo``); None where neither can be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    found = [line.split()[1] for line in lines if line.startswith("MemAvailable:")]
    return int(found[0]) * 1024 if found else None


def check_fits(
    config: PretrainedConfig,
    teacher: TeacherConfig,
    optim: OptimConfig,
    max_length: int,
    device: torch.device,
) -> None:
    """Refuse, in one line, a fine-tuning whose :func:`memory_need` exceeds the memory free on
    ``device`` (:func:`free_memory`), naming what it needs and the ways out."""
    free = free_memory(device)
    need = memory_need(config, teacher, optim, max_length)
    if free is None or need.total <= free:
        return
    ways = [f"--adapt {a}" for a in ("lora", "head") if a != teacher.adapt]
    if teacher.adapt != "head":
        ways.append("a smaller --batch-size (or more --accumulation-steps)")
        if not teacher.gradient_checkpointing:
            ways.append("--gradient-checkpointing")
    raise WorkbenchError(
        f"fine-tuning {teacher.model} with --adapt {teacher.adapt} would need about "
        f"{need.total / GB:.1f} GB ({need.parameters / 1e6:.1f}M parameters, "
        f"{need.trained / 1e6:.2f}M trained: {(need.weights + need.training) / GB:.1f} GB of "
        f"weights, gradients and AdamW states, and {need.activations / GB:.1f} GB of "
        f"activations at {max_length} tokens) and {free / GB:.1f} GB is free on {device}: use "
        f"{', '.join(ways)}, or a machine with more memory (kdw cache there computes what "
        "students read from the teacher, once)"
    )
