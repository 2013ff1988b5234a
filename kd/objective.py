"""The distillation objective: a weighted sum of registered loss terms.

A *term* adapts one pure loss function of :mod:`kd.terms` to a training step: it reads the
student's output record and what the frozen teacher says about the batch (*teacher fields*).
Cacheable teacher fields are computed once per example and served from the run's cache; the
others (the teacher's hidden states for CKD, too large to keep for every token of every example)
are recomputed without a graph each step. Presets are plain weight tables; explicit weights
(``ce=0.1,kd=0.9,attr=10``) replace them, so any terms combine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import PreTrainedModel

from kd.layer_map import patient_layers, uniform_layers
from kd.terms.attribution import attribution_loss
from kd.terms.contextual import layer_relation_loss, word_relation_loss
from kd.terms.gradient import gradient_alignment_loss
from kd.terms.logits import logit_kd_loss, task_loss
from kd.terms.patient import patient_loss
from workbench.attribution.gradients import attribution_layers, attribution_maps, input_gradients
from workbench.config import ObjectiveConfig
from workbench.errors import WorkbenchError
from workbench.models import ModelOutput, embed, encoder_layers, forward


@dataclass
class StepInputs:
    """One step's inputs to the terms; the student runs at most once, lazily.

    Gradient terms run the student forward themselves and leave its logits in
    ``shared_logits``: when no term needs hidden states, those logits serve the other terms, as
    in the authors' code, instead of a second forward pass."""

    model: PreTrainedModel
    batch: dict[str, Tensor]
    teacher: dict[str, Tensor]
    hidden_states: bool
    shared_logits: Tensor | None = None
    _student: ModelOutput | None = None

    @property
    def student(self) -> ModelOutput:
        if self._student is None:
            if self.shared_logits is not None and not self.hidden_states:
                self._student = ModelOutput(self.shared_logits, self.batch["attention_mask"])
            else:
                self._student = forward(self.model, self.batch, hidden_states=self.hidden_states)
        return self._student

    def share(self, logits: Tensor) -> None:
        """Offer the logits of a gradient term's forward pass to the other terms."""
        if self.shared_logits is None:
            self.shared_logits = logits


@dataclass(frozen=True)
class Term:
    """How a loss term is computed in a step, and what it needs."""

    compute: Callable[[Objective, StepInputs], Tensor]
    teacher_fields: tuple[str, ...] = ()
    hidden_states: bool = False
    runs_student: bool = False  # runs its own student forward (and shares its logits)


@dataclass(frozen=True)
class TeacherField:
    """A value the frozen teacher computes per example: ``compute(objective, teacher, batch)``
    gives ``[B, ...]`` (``[B, L, ...]`` when ``per_token``). ``cacheable=False`` fields are
    recomputed each step instead of being stored for every example."""

    compute: Callable[[Objective, PreTrainedModel, dict[str, Tensor]], Tensor]
    per_token: bool = False
    cacheable: bool = True


TERMS: dict[str, Term] = {}
TEACHER_FIELDS: dict[str, TeacherField] = {}


def term(
    name: str,
    teacher_fields: tuple[str, ...] = (),
    hidden_states: bool = False,
    runs_student: bool = False,
):
    """Register a loss term under ``name`` (the key of the weights)."""

    def register(compute: Callable[[Objective, StepInputs], Tensor]):
        TERMS[name] = Term(compute, teacher_fields, hidden_states, runs_student)
        return compute

    return register


def teacher_field(name: str, per_token: bool = False, cacheable: bool = True):
    """Register a teacher field under ``name``."""

    def register(compute: Callable[[Objective, PreTrainedModel, dict[str, Tensor]], Tensor]):
        TEACHER_FIELDS[name] = TeacherField(compute, per_token, cacheable)
        return compute

    return register


@dataclass(frozen=True)
class Preset:
    """A method: term weights per parity, its temperature, its official KD form, and the
    attribution distance its weights belong to."""

    paper: dict[str, float]
    official: dict[str, float]
    temperature: float = 4.0
    official_kd_form: str = "kl-mean"
    attr_reduction: str = "paper"


# β of ``pkd`` is for the paper form (sum over layers) or the official mean over B×(M−1)×d,
# hence the orders of magnitude between the two.
PRESETS: dict[str, Preset] = {
    "finetune": Preset({"ce": 1.0}, {"ce": 1.0}),
    "kd": Preset({"ce": 0.5, "kd": 0.5}, {"ce": 0.5, "kd": 0.5}),
    "pkd-skip": Preset({"ce": 0.5, "kd": 0.5, "pkd": 1.0}, {"ce": 0.5, "kd": 0.5, "pkd": 500.0}),
    "ckd": Preset(
        {"ce": 0.5, "kd": 0.5, "wr": 1.0, "ltr": 1.0},
        {"ce": 0.5, "kd": 0.5, "wr": 1.0, "ltr": 1.0},
        official_kd_form="soft-ce",
    ),
    # AD-KD's β grid (Table 5: 1, 10, 50, 100) was tuned on the authors' MSE(sum)/#tokens: the
    # preset computes that distance (README, "Why AD-KD collapsed"); Eq. 9 is --attr-reduction
    # paper. β = 1, the grid's lowest value: at β = 10 the attribution term held 68–93 % of the
    # gradient on the bundled tweets and the minority class fell to 30 % recall.
    "adkd": Preset(
        {"ce": 0.1, "kd": 0.9, "attr": 1.0},
        {"ce": 0.1, "kd": 0.9, "attr": 10.0},
        temperature=2.0,
        official_kd_form="soft-ce",
        attr_reduction="official",
    ),
    "gkd": Preset(
        {"ce": 0.5, "kd": 0.5, "grad": 1.0}, {"ce": 0.5, "kd": 0.5, "grad": 1.0}, temperature=5.0
    ),
    # GKD-CLS: the [CLS]-state gradients at weight 0.1. At 1 they held 50–74 % of the gradient
    # (their gradient is twice the input gradients'), CE 4–11 %, and a student trained for 26
    # steps on BBC News lost two of five classes (README, "Why AD-KD and GKD-CLS collapsed").
    "gkd-cls": Preset(
        {"ce": 0.5, "kd": 0.5, "pkd": 1.0, "grad": 1.0, "cls_grad": 0.1},
        {"ce": 0.5, "kd": 0.5, "pkd": 500.0, "grad": 1.0, "cls_grad": 1.0},
        temperature=5.0,
    ),
}
PRESETS["pkd-last"] = PRESETS["pkd-skip"]


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


def preset_weights(config: ObjectiveConfig) -> dict[str, float]:
    """The term weights a config asks for: its explicit ``weights``, else its preset's for its
    parity; zero weights dropped."""
    if config.preset not in PRESETS:
        raise WorkbenchError(
            f"unknown method preset {config.preset!r}: use one of {sorted(PRESETS)}"
        )
    preset = PRESETS[config.preset]
    weights = parse_weights(config.weights) or dict(
        preset.official if config.parity == "official" else preset.paper
    )
    weights = {name: w for name, w in weights.items() if w != 0}
    if not weights:
        raise WorkbenchError("the objective has no term with a non-zero weight")
    return weights


@dataclass
class Objective:
    """A resolved objective: weights and the settings each term reads."""

    config: ObjectiveConfig
    weights: dict[str, float]
    teacher_layers: int
    student_layers: int
    num_labels: int = 2
    temperature: float = 4.0
    kd_form: str = "kl"
    patient_pairs: list[tuple[int, int]] = field(default_factory=list)
    relation_pairs: list[tuple[int, int]] = field(default_factory=list)
    attr_baseline: str = "pad"
    attr_views: str = "all"
    attr_reduction: str = "paper"

    @classmethod
    def resolve(
        cls, config: ObjectiveConfig, teacher_layers: int, student_layers: int, num_labels: int = 2
    ) -> Objective:
        weights = preset_weights(config)
        preset = PRESETS[config.preset]
        official = config.parity == "official"
        mapping = {"pkd-skip": "skip", "pkd-last": "last"}.get(config.preset, config.pkd_mapping)
        needs_pairs = "pkd" in weights or "cls_grad" in weights
        return cls(
            config=config,
            weights=weights,
            teacher_layers=teacher_layers,
            student_layers=student_layers,
            num_labels=num_labels,
            temperature=config.temperature or preset.temperature,
            kd_form=config.kd_loss or (preset.official_kd_form if official else "kl"),
            patient_pairs=(
                patient_layers(teacher_layers, student_layers, mapping) if needs_pairs else []
            ),
            relation_pairs=(
                uniform_layers(teacher_layers, student_layers)
                if {"wr", "ltr"} & set(weights)
                else []
            ),
            attr_baseline=config.attr_baseline or ("zero" if official else "pad"),
            attr_views=config.attr_views or ("gold" if official and num_labels == 2 else "all"),
            attr_reduction=config.attr_reduction
            or ("official" if official else preset.attr_reduction),
        )

    def record(self) -> dict:
        """What the configs resolved to, as plain data for ``run.json``: every weight, τ, the
        KD form, the layer pairs, and the settings of the terms in use."""
        record: dict = {
            "weights": self.weights,
            "temperature": self.temperature,
            "kd_form": self.kd_form,
            "parity": self.config.parity,
        }
        if self.patient_pairs:
            record["patient_pairs"] = self.patient_pairs
        if self.relation_pairs:
            record["relation_pairs"] = self.relation_pairs
            record["ckd_window"] = self.config.ckd_window
        if "attr" in self.weights:
            c = self.config
            record["attribution"] = {
                "reduction": self.attr_reduction,
                "views": self.attr_views,
                "baseline": self.attr_baseline,
                "steps": c.attr_steps,
                "top_k": c.attr_top_k,
                "layer": c.attr_layer,
            }
        if self.gradient_kd:
            record["student_dropout"] = self.config.dropout
        return json.loads(json.dumps(record))  # tuples as lists, as run.json reads back

    @property
    def reduction(self) -> str:
        return self.config.parity

    @property
    def gradient_kd(self) -> bool:
        """Whether gradient terms (GKD) are on: their student keeps the teacher's embeddings,
        frozen, and runs without dropout (Theorem 1 of the GKD paper)."""
        return bool({"grad", "cls_grad"} & set(self.weights))

    def teacher_fields(self) -> list[str]:
        """Teacher fields the active terms read, ``logits`` always (loyalty uses them)."""
        names = dict.fromkeys(["logits"])
        for name in self.weights:
            names.update(dict.fromkeys(TERMS[name].teacher_fields))
        return list(names)

    def cached_fields(self) -> list[str]:
        return [n for n in self.teacher_fields() if TEACHER_FIELDS[n].cacheable]

    def live_fields(self) -> list[str]:
        return [n for n in self.teacher_fields() if not TEACHER_FIELDS[n].cacheable]

    def per_token_fields(self) -> list[str]:
        return [n for n in self.teacher_fields() if TEACHER_FIELDS[n].per_token]

    def teacher_settings(self, fields: list[str]) -> dict:
        """Every setting that changes the given teacher fields (part of the cache key)."""
        settings: dict = {"fields": fields}
        if {"cls", "cls_grads"} & set(fields):
            settings["patient_pairs"] = self.patient_pairs
        if "maps" in fields:
            c = self.config
            settings["maps"] = {
                "steps": c.attr_steps,
                "top_k": c.attr_top_k,
                "baseline": self.attr_baseline,
                "views": self.attr_views,
                "layer": c.attr_layer,
            }
        return settings

    def teacher_batch(
        self, teacher: PreTrainedModel, batch: dict[str, Tensor], fields: list[str] | None = None
    ) -> dict[str, Tensor]:
        """Teacher fields of a batch (all the objective reads by default)."""
        return {
            name: TEACHER_FIELDS[name].compute(self, teacher, batch)
            for name in fields or self.teacher_fields()
        }

    def __call__(
        self, model: PreTrainedModel, batch: dict[str, Tensor], teacher: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Each weighted term's value and their sum under ``"loss"``."""
        inputs = StepInputs(
            model, batch, teacher, any(TERMS[n].hidden_states for n in self.weights)
        )
        first = sorted(self.weights, key=lambda name: not TERMS[name].runs_student)
        values = {name: TERMS[name].compute(self, inputs) for name in first}
        values = {name: values[name] for name in self.weights}
        values["loss"] = torch.stack([self.weights[n] * v for n, v in values.items()]).sum()
        return values


def _model_inputs(batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor | None]:
    return batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids")


def attribution_views(
    objective: Objective,
    model: PreTrainedModel,
    batch: dict[str, Tensor],
    classes: Tensor | None,
    create_graph: bool,
    top_k: int | None,
) -> tuple[Tensor, Tensor]:
    """AD-KD maps ``[B, S·V, L]`` — the views at each attribution site, concatenated — and the
    model's logits ``[B, C]`` from the first site's forward pass.

    ``classes``: with view ``pred``, the teacher's predicted class per example, so that student
    and teacher attribute the same class; with view ``sample``, the drawn class per example
    (the student's maps are then ``[B, S, L]``)."""
    views, labels = objective.attr_views, batch.get("labels")
    if views == "sample":  # the teacher's maps cover every class; the student's the drawn ones
        views, labels = ("all", labels) if classes is None else ("gold", classes)
    elif views == "pred" and classes is not None:
        views, labels = "gold", classes
    elif views.lstrip("-").isdigit():
        views = int(views)
    sites = attribution_layers(len(encoder_layers(model)), objective.config.attr_layer)
    results = [
        attribution_maps(
            model,
            *_model_inputs(batch),
            views=views,
            labels=labels,
            steps=objective.config.attr_steps,
            baseline=objective.attr_baseline,
            top_k=top_k,
            create_graph=create_graph,
            layer=site,
            return_logits=True,
        )
        for site in sites
    ]
    return torch.cat([maps for maps, _ in results], dim=1), results[0][1]


def state_gradients(
    model: PreTrainedModel, batch: dict[str, Tensor], layers: list[int], create_graph: bool
) -> Tensor:
    """GKD-CLS: ``∂(Σ_b p_max,b)/∂h[j]`` at [CLS] for hidden-state indices ``layers`` →
    ``[B, len(layers), d]``."""
    with torch.enable_grad():
        embedded = embed(model, batch)
        if not embedded.requires_grad:  # a frozen model: start the graph at its embeddings
            embedded = embedded.detach().requires_grad_()
        out = forward(model, batch, hidden_states=True, embedding_output=embedded)
        states = [out.hidden_states[j] for j in layers]
        signal = out.logits.softmax(-1).max(-1).values.sum()
        grads = torch.autograd.grad(signal, states, create_graph=create_graph)
    return torch.stack([g[:, 0] for g in grads], dim=1)


@teacher_field("logits")
def _teacher_logits(_objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    return forward(teacher, batch).logits


@teacher_field("cls")
def _teacher_cls(objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    hidden = forward(teacher, batch, hidden_states=True).hidden_states
    return torch.stack([hidden[t][:, 0] for _, t in objective.patient_pairs], dim=1)


@teacher_field("relation_states", per_token=True, cacheable=False)
def _teacher_relation_states(objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    hidden = forward(teacher, batch, hidden_states=True).hidden_states
    return torch.stack([hidden[t] for _, t in objective.relation_pairs], dim=2)  # [B, L, K, d]


@teacher_field("maps", per_token=True)
def _teacher_maps(objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    maps, _ = attribution_views(objective, teacher, batch, None, False, objective.config.attr_top_k)
    return maps.transpose(1, 2)  # [B, L, S·V]: per token


@teacher_field("input_grads", per_token=True)
def _teacher_input_grads(_objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    return input_gradients(teacher, batch)


@teacher_field("cls_grads")
def _teacher_cls_grads(objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    return state_gradients(teacher, batch, [t for _, t in objective.patient_pairs], False)


@term("ce")
def _ce(_objective: Objective, inputs: StepInputs) -> Tensor:
    return task_loss(inputs.student.logits, inputs.batch["labels"])


@term("kd", teacher_fields=("logits",))
def _kd(objective: Objective, inputs: StepInputs) -> Tensor:
    return logit_kd_loss(
        inputs.student.logits,
        inputs.teacher["logits"],
        objective.temperature,
        form=objective.kd_form,
    )


@term("pkd", teacher_fields=("cls",), hidden_states=True)
def _pkd(objective: Objective, inputs: StepInputs) -> Tensor:
    hidden = inputs.student.hidden_states
    student_cls = torch.stack([hidden[s][:, 0] for s, _ in objective.patient_pairs], dim=1)
    return patient_loss(student_cls, inputs.teacher["cls"], reduction=objective.reduction)


def _relation_states(objective: Objective, inputs: StepInputs) -> tuple[Tensor, Tensor]:
    hidden = inputs.student.hidden_states
    student = torch.stack([hidden[s] for s, _ in objective.relation_pairs], dim=1)
    return student, inputs.teacher["relation_states"].transpose(1, 2)  # [B, K, L, d] each


@term("wr", teacher_fields=("relation_states",), hidden_states=True)
def _wr(objective: Objective, inputs: StepInputs) -> Tensor:
    student, teacher = _relation_states(objective, inputs)
    return word_relation_loss(
        student,
        teacher,
        inputs.batch["attention_mask"],
        window=objective.config.ckd_window,
        variant=objective.reduction,
    )


@term("ltr", teacher_fields=("relation_states",), hidden_states=True)
def _ltr(objective: Objective, inputs: StepInputs) -> Tensor:
    student, teacher = _relation_states(objective, inputs)
    return layer_relation_loss(
        student, teacher, inputs.batch["attention_mask"], variant=objective.reduction
    )


def sampled_view_loss(
    student_maps: Tensor,
    teacher_maps: Tensor,
    classes: Tensor,
    attention_mask: Tensor,
    num_classes: int,
    reduction: str = "squared",
) -> Tensor:
    """View sampling (beyond the paper): each example attributes one class ``classes[b]``
    drawn uniformly; its squared distance is weighted by ``C`` so that the expectation over the
    draws equals the multi-view squared loss (``reduction`` ``"squared"``, or ``"official"``,
    also linear in the views' squared distances; never Eq. 9's unsquared norm).

    Args:
        student_maps: ``[B, S, L]`` the drawn class's map at each of ``S`` attribution sites.
        teacher_maps: ``[B, S·C, L]`` every class's map at each site (site-major).
        classes: ``[B]`` the drawn classes.
        attention_mask: ``[B, L]``.
    """
    sites, length = student_maps.shape[1], student_maps.shape[2]
    index = torch.arange(sites, device=classes.device)[None, :] * num_classes + classes[:, None]
    chosen = teacher_maps.gather(1, index[..., None].expand(-1, -1, length))
    return num_classes * attribution_loss(student_maps, chosen, attention_mask, reduction=reduction)


@term("attr", teacher_fields=("maps",), runs_student=True)
def _attr(objective: Objective, inputs: StepInputs) -> Tensor:
    teacher_maps = inputs.teacher["maps"].transpose(1, 2)
    mask = inputs.batch["attention_mask"]
    if objective.attr_views == "sample":
        classes = torch.randint(objective.num_labels, (mask.shape[0],), device=mask.device)
    else:
        classes = inputs.teacher["logits"].argmax(-1) if "logits" in inputs.teacher else None
    student_maps, logits = attribution_views(
        objective, inputs.model, inputs.batch, classes, True, None
    )
    inputs.share(logits)
    if objective.attr_views == "sample":
        reduction = "official" if objective.attr_reduction == "official" else "squared"
        return sampled_view_loss(
            student_maps, teacher_maps, classes, mask, objective.num_labels, reduction
        )
    return attribution_loss(student_maps, teacher_maps, mask, reduction=objective.attr_reduction)


@term("grad", teacher_fields=("input_grads",), runs_student=True)
def _grad(_objective: Objective, inputs: StepInputs) -> Tensor:
    student, logits = input_gradients(
        inputs.model, inputs.batch, create_graph=True, return_logits=True
    )
    inputs.share(logits)
    return gradient_alignment_loss(
        student, inputs.teacher["input_grads"], inputs.batch["attention_mask"]
    )


@term("cls_grad", teacher_fields=("cls_grads",))
def _cls_grad(objective: Objective, inputs: StepInputs) -> Tensor:
    student = state_gradients(
        inputs.model, inputs.batch, [s for s, _ in objective.patient_pairs], True
    )
    return gradient_alignment_loss(student, inputs.teacher["cls_grads"])
