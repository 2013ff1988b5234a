"""The settings of a training: the teacher fine-tuned (:class:`TeacherConfig`), the student and
the teacher it learns from (:class:`StudentConfig`), optimisation, evaluation and checkpointing
(:class:`OptimConfig`), and a configuration file's sections (:data:`CONFIG_SECTIONS`). The run
record's ``teacher``, ``student`` and ``optim`` sections are registered here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kd.methods.config import ObjectiveConfig
from workbench.analysis.settings import PRECISIONS
from workbench.core.config import (
    Checked,
    DataConfig,
    Domain,
    between,
    non_negative_int,
    non_negative_number,
    number_in,
    option,
    parse_label_map,
    parses,
    positive,
    positive_number,
    register_section,
    seed_range,
    unit_interval,
)
from workbench.core.names import BUILTIN_MODELS, TRANSFER_TASK, builtin_models_help

ADAPTATIONS = ("full", "lora", "head")  # --adapt: what a teacher's fine-tuning trains


def label_map_option(model: str) -> Any:
    """The ``--label-map`` setting of a config that loads ``model`` (a field recorded only
    when set)."""
    return option(
        "",
        f"how the task's classes are named by the {model} where the names differ: "
        "TASK_CLASS=MODEL_LABEL pairs, e.g. positive=POS,negative=NEG (default: matched by "
        "name, case-insensitively; generic LABEL_n names by position)",
        domain=Domain(parses(parse_label_map), "TASK_CLASS=MODEL_LABEL pairs, e.g. positive=POS"),
        recorded_if_set=True,
    )


@dataclass
class TeacherConfig(Checked):
    """The model fine-tuned as a teacher."""

    model: str = option(
        "minilm-l6",
        f"built-in offline model ({builtin_models_help()}), a hub id such as bert-base-uncased, "
        "a local directory with config.json and weights, or a GGUF file; a sequence classifier "
        "keeps its head, its classes matched to the task's by name",
        path=BUILTIN_MODELS,
    )
    label_map: str = label_map_option("--model")
    adapt: str = option(
        "full",
        "which weights fine-tuning trains: full: all of them; lora: low-rank adapters on "
        "--lora-targets and the whole classification head (the saved model has them merged); "
        "head: only the head's output layer, on the frozen model's states, computed once and "
        "cached in the run",
        choices=ADAPTATIONS,
        recorded_if_set=True,
    )
    lora_rank: int = option(
        8, "LoRA's rank r (--adapt lora)", domain=positive, recorded_if_set=True
    )
    lora_alpha: float = option(
        16.0,
        "LoRA's scale α: the update B·A is scaled by α/r (--adapt lora)",
        domain=positive_number,
        recorded_if_set=True,
    )
    lora_dropout: float = option(
        0.05,
        "dropout on LoRA's input (--adapt lora)",
        domain=number_in(0, 0.99),
        recorded_if_set=True,
    )
    lora_targets: str = option(
        "",
        "the modules LoRA adapts, as comma-separated names or all-linear (--adapt lora); "
        "default: peft's choice for the architecture (BERT's query and value, Llama's q_proj and "
        "v_proj), else all-linear",
        recorded_if_set=True,
    )
    lora_layers: int | None = option(
        None,
        "adapt only the top N layers (--adapt lora): the backward pass stops below them, so a "
        "step costs less time and memory; default: every layer",
        domain=positive,
        recorded_if_set=True,
    )
    gradient_checkpointing: bool = option(
        False,
        "recompute each layer's activations in the backward pass instead of keeping them "
        "(--adapt full or lora): less memory, about a fifth more time per step",
        recorded_if_set=True,
    )


@dataclass
class StudentConfig(Checked):
    """How the student is built."""

    teacher: str = option(
        "",
        "the fine-tuned teacher: a run folder (from train-teacher), a Hugging Face sequence "
        "classifier's folder (config, weights, tokenizer) or a PEFT adapter folder of one, a "
        "built-in name or a hub id",
        path=BUILTIN_MODELS,
    )
    label_map: str = label_map_option("teacher")
    teacher_cache: str | None = option(
        None,
        "a folder that kdw cache built: every teacher field is read from it, and the teacher "
        "need not exist here (a --teacher named too must be the cache's)",
        path=(),
    )
    transfer: str | None = option(
        None,
        "texts without labels that the teacher labels for the student (a transfer set): a text "
        "file (one text a line), a CSV/TSV/JSONL/parquet file or folder (its --text-column; a "
        "label column is ignored), a folder from datasets' save_to_disk, a hub data set, or "
        "task: the task's own training texts past --max-train-examples, labels withheld. The "
        "terms that read labels (CE) see the labelled examples only, every teacher term sees "
        "both; texts equal to a dev, test or labelled text, repeated or empty, are dropped and "
        "counted",
        path=(TRANSFER_TASK,),
        recorded_if_set=True,
    )
    max_transfer_examples: int | None = option(
        None,
        "use a random sample (the --split-seed's) of this many transfer texts (--transfer)",
        domain=positive,
        recorded_if_set=True,
    )
    labels: bool = option(
        True,
        "train on the labelled examples beside the transfer set; --no-labels: on the transfer "
        "set alone (--transfer), the teacher's answers all the student learns from, the terms "
        "that read labels (CE) adding nothing",
        recorded_if_set=True,
    )
    allow_unfinished: bool = option(
        False,
        "distil from a teacher run that has not finished training (stopped, killed, diverged "
        "or still training): its best dev model so far, which the run saves at each dev "
        "improvement (default: such a teacher is refused)",
        recorded_if_set=True,
    )
    init: str = option(
        "cut",
        "cut: teacher embeddings + a subset of its layers; pretrained: another checkpoint "
        "(--pretrained); random: a fresh, possibly narrower, config",
        choices=("cut", "pretrained", "random"),
    )
    num_layers: int | None = option(
        None,
        "number of student layers (default: 3 for cut and random; every layer of a pretrained "
        "checkpoint, which a number given here cuts as --init cut does, by --layers)",
        domain=positive,
    )
    layers: str = option(
        "skip",
        "which layers a cut student keeps of its source (the teacher's, or with --init "
        "pretrained --num-layers the checkpoint's): first, skip, last, or an explicit list "
        "of 0-based indices such as 1,3,5",
    )
    freeze_embeddings: bool = option(False, "freeze the student's embeddings")
    pretrained: str | None = option(
        None,
        "checkpoint for --init pretrained (hub id or directory); one of another tokenizer "
        "than the teacher's learns the per-token terms on the words both share ({words})",
        path=BUILTIN_MODELS,
    )
    hidden_size: int | None = option(
        None, "hidden size for --init random (default: teacher's)", domain=positive
    )
    num_heads: int | None = option(
        None, "attention heads for --init random (default: teacher's)", domain=positive
    )


@dataclass
class OptimConfig(Checked):
    """Optimisation, evaluation and checkpointing."""

    epochs: float = option(
        3.0, "training epochs (fractions allowed), at most 1000", domain=number_in(0, 1000)
    )
    batch_size: int = option(
        32,
        "training batch size: the global batch of a step, over all processes and "
        "accumulation steps",
        domain=positive,
    )
    accumulation_steps: int = option(
        1,
        "split each batch into N micro-batches run one after another, their gradients summed "
        "into the batch's (the same step with less memory; N must divide the batch per process)",
        domain=positive,
    )
    precision: str = option(
        "fp32",
        "fp32; bf16 (autocast on CUDA, or on CPU); fp16 (CUDA only: autocast with a gradient "
        "scaler). Evaluation and the teacher cache stay in float32",
        choices=PRECISIONS,
        recorded_if_set=True,
    )
    eval_batch_size: int = option(64, "evaluation batch size", domain=positive)
    learning_rate: float = option(
        5e-5,
        "peak AdamW learning rate (fine-tuning uses about 1e-5 to 1e-4; a training that "
        "diverges stops with an error naming the step and the term)",
        domain=positive_number,
    )
    weight_decay: float = option(
        0.01,
        "AdamW weight decay (not applied to biases and LayerNorm), in [0, 1]: each step scales "
        "the weights by 1 − learning rate × decay",
        domain=unit_interval,
    )
    warmup_ratio: float = option(
        0.1, "share of steps with linear warm-up, then linear decay", domain=unit_interval
    )
    max_grad_norm: float = option(
        1.0, "gradient clipping norm (0 disables)", domain=non_negative_number
    )
    eval_every: int = option(
        0, "evaluate on dev every N steps (0: at the end of each epoch)", domain=non_negative_int
    )
    checkpoint_every: int = option(50, "save a resumable checkpoint every N steps", domain=positive)
    log_every: int = option(
        20,
        "every N steps (and at the first and last), log each loss term's weighted value and "
        "its share of the gradient to metrics.jsonl: every term's share at the first and last "
        "step, one term's in turn between (0: never; costs one extra backward pass per share, "
        "and changes no weight)",
        domain=non_negative_int,
    )
    seed: int = option(42, "seed of initialisation, data order and dropout", domain=seed_range)
    threads: int = option(
        0, "torch CPU threads (0: torch's default), at most 1024", domain=between(0, 1024)
    )
    device: str = option("auto", "cpu, cuda, cuda:N, or auto (cuda when available)")


# a configuration file's sections (kdw distill --config, kdw tune's best.json), as their dataclasses
CONFIG_SECTIONS = {
    "data": DataConfig,
    "student": StudentConfig,
    "objective": ObjectiveConfig,
    "optim": OptimConfig,
}

register_section("teacher", TeacherConfig)
register_section("student", StudentConfig)
register_section("optim", OptimConfig)
