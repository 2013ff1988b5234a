"""The distillation objective: a weighted sum of registered loss terms.

A *term* adapts one pure loss function of :mod:`kd.terms` to a training step: it reads the
student's output record and what the frozen teacher says about the batch (*teacher fields*, served
from the cache). Presets are plain weight tables; explicit weights (``ce=0.1,kd=0.9,pkd=1``)
replace them, so any terms combine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import PreTrainedModel

from kd.layer_map import patient_layers
from kd.terms.logits import logit_kd_loss, task_loss
from kd.terms.patient import patient_loss
from workbench.config import ObjectiveConfig
from workbench.errors import WorkbenchError
from workbench.models import ModelOutput, forward


@dataclass
class StepInputs:
    """One step's inputs to the terms; the student runs at most once, lazily."""

    model: PreTrainedModel
    batch: dict[str, Tensor]
    teacher: dict[str, Tensor]
    hidden_states: bool
    _student: ModelOutput | None = None

    @property
    def student(self) -> ModelOutput:
        if self._student is None:
            self._student = forward(self.model, self.batch, hidden_states=self.hidden_states)
        return self._student


@dataclass(frozen=True)
class Term:
    """How a loss term is computed in a step, and what it needs."""

    compute: Callable[[Objective, StepInputs], Tensor]
    teacher_fields: tuple[str, ...] = ()
    hidden_states: bool = False


@dataclass(frozen=True)
class TeacherField:
    """A value the frozen teacher computes per example: ``compute(objective, teacher, batch)``
    gives ``[B, ...]`` (``[B, L, ...]`` when ``per_token``)."""

    compute: Callable[[Objective, PreTrainedModel, dict[str, Tensor]], Tensor]
    per_token: bool = False


TERMS: dict[str, Term] = {}
TEACHER_FIELDS: dict[str, TeacherField] = {}


def term(name: str, teacher_fields: tuple[str, ...] = (), hidden_states: bool = False):
    """Register a loss term under ``name`` (the key of the weights)."""

    def register(compute: Callable[[Objective, StepInputs], Tensor]):
        TERMS[name] = Term(compute, teacher_fields, hidden_states)
        return compute

    return register


def teacher_field(name: str, per_token: bool = False):
    """Register a teacher field under ``name``."""

    def register(compute: Callable[[Objective, PreTrainedModel, dict[str, Tensor]], Tensor]):
        TEACHER_FIELDS[name] = TeacherField(compute, per_token)
        return compute

    return register


# Preset weights, per parity; ``pkd`` is β of the paper form (sum over layers) or of the official
# mean over B×(M−1)×d, which is why the two differ by orders of magnitude.
PRESETS: dict[str, dict[str, dict[str, float]]] = {
    "finetune": {"paper": {"ce": 1.0}, "official": {"ce": 1.0}},
    "kd": {"paper": {"ce": 0.5, "kd": 0.5}, "official": {"ce": 0.5, "kd": 0.5}},
    "pkd-skip": {
        "paper": {"ce": 0.5, "kd": 0.5, "pkd": 1.0},
        "official": {"ce": 0.5, "kd": 0.5, "pkd": 500.0},
    },
}
PRESETS["pkd-last"] = PRESETS["pkd-skip"]
OFFICIAL_KD_FORM = {"kd": "kl-mean", "pkd-skip": "kl-mean", "pkd-last": "kl-mean"}


def parse_weights(text: str) -> dict[str, float]:
    """``"ce=0.1,kd=0.9"`` → ``{"ce": 0.1, "kd": 0.9}``."""
    weights = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in TERMS:
            raise WorkbenchError(f"unknown loss term {name!r}: known terms {sorted(TERMS)}")
        try:
            weights[name] = float(value)
        except ValueError:
            raise WorkbenchError(f"weight of {name!r} must be a number, got {value!r}") from None
    return weights


@dataclass
class Objective:
    """A resolved objective: weights and the settings each term reads."""

    config: ObjectiveConfig
    weights: dict[str, float]
    teacher_layers: int
    student_layers: int
    kd_form: str = "kl"
    patient_pairs: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def resolve(
        cls, config: ObjectiveConfig, teacher_layers: int, student_layers: int
    ) -> Objective:
        if config.preset not in PRESETS:
            raise WorkbenchError(
                f"unknown method preset {config.preset!r}: use one of {sorted(PRESETS)}"
            )
        weights = parse_weights(config.weights) or dict(PRESETS[config.preset][config.parity])
        weights = {name: w for name, w in weights.items() if w != 0}
        if not weights:
            raise WorkbenchError("the objective has no term with a non-zero weight")
        official = config.parity == "official"
        kd_form = config.kd_loss or (OFFICIAL_KD_FORM.get(config.preset, "kl") if official
                                     else "kl")
        mapping = {"pkd-skip": "skip", "pkd-last": "last"}.get(config.preset, config.pkd_mapping)
        pairs = (patient_layers(teacher_layers, student_layers, mapping)
                 if "pkd" in weights else [])
        return cls(config, weights, teacher_layers, student_layers, kd_form, pairs)

    @property
    def reduction(self) -> str:
        return self.config.parity

    def teacher_fields(self) -> list[str]:
        """Teacher fields the active terms read, ``logits`` always (loyalty uses them)."""
        names = dict.fromkeys(["logits"])
        for name in self.weights:
            names.update(dict.fromkeys(TERMS[name].teacher_fields))
        return list(names)

    def teacher_settings(self, fields: list[str]) -> dict:
        """Every setting that changes the given teacher fields (part of the cache key)."""
        settings: dict = {"fields": fields}
        if "cls" in fields:
            settings["patient_pairs"] = self.patient_pairs
        return settings

    def teacher_batch(
        self, teacher: PreTrainedModel, batch: dict[str, Tensor], fields: list[str] | None = None
    ) -> dict[str, Tensor]:
        """Teacher fields of a batch (all the objective reads by default), for the cache."""
        return {name: TEACHER_FIELDS[name].compute(self, teacher, batch)
                for name in fields or self.teacher_fields()}

    def per_token_fields(self) -> list[str]:
        return [n for n in self.teacher_fields() if TEACHER_FIELDS[n].per_token]

    def __call__(
        self, model: PreTrainedModel, batch: dict[str, Tensor], teacher: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Each weighted term's value and their sum under ``"loss"``."""
        inputs = StepInputs(
            model, batch, teacher, any(TERMS[n].hidden_states for n in self.weights)
        )
        values = {name: TERMS[name].compute(self, inputs) for name in self.weights}
        values["loss"] = torch.stack([self.weights[n] * v for n, v in values.items()]).sum()
        return values


@teacher_field("logits")
def _teacher_logits(_objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    return forward(teacher, batch).logits


@teacher_field("cls")
def _teacher_cls(objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    hidden = forward(teacher, batch, hidden_states=True).hidden_states
    return torch.stack([hidden[t][:, 0] for _, t in objective.patient_pairs], dim=1)


@term("ce")
def _ce(_objective: Objective, inputs: StepInputs) -> Tensor:
    return task_loss(inputs.student.logits, inputs.batch["labels"])


@term("kd", teacher_fields=("logits",))
def _kd(objective: Objective, inputs: StepInputs) -> Tensor:
    return logit_kd_loss(
        inputs.student.logits, inputs.teacher["logits"], objective.config.temperature,
        form=objective.kd_form,
    )


@term("pkd", teacher_fields=("cls",), hidden_states=True)
def _pkd(objective: Objective, inputs: StepInputs) -> Tensor:
    hidden = inputs.student.hidden_states
    student_cls = torch.stack([hidden[s][:, 0] for s, _ in objective.patient_pairs], dim=1)
    return patient_loss(student_cls, inputs.teacher["cls"], reduction=objective.reduction)
