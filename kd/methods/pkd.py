"""Patient KD (Sun et al. 2019; docs/methods.md §2): the student's intermediate [CLS] states learn
the teacher's, layer by layer, besides vanilla KD's two terms.

    L_PT = Σ_j ‖ h_s[j]/‖h_s[j]‖ − h_t[I(j)]/‖h_t[I(j)]‖ ‖²          (Eq. 3)
    L = (1 − α) CE + α KD + β L_PT                                     (Eq. 4)

with ``I`` PKD-Skip (every ``N/M``-th teacher layer) or PKD-Last (the last ``M − 1``).

A student narrower or wider than its teacher compares ``h_s[j] W`` instead of ``h_s[j]``: one
linear map ``W`` from the student's width to the teacher's, without bias, shared by the mapped
layers and trained with the student (as TinyBERT's ``W_h``); the run records its widths and the
saved student leaves it out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kd.methods.layer_map import patient_layers
from kd.methods.objective import (
    Claim,
    Method,
    Objective,
    Preset,
    StepInputs,
    TeacherField,
    Term,
    register_method,
)
from workbench.core.config import Checked, option
from workbench.core.lazy import lazy_module

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedModel

torch = lazy_module("torch")
F = lazy_module("torch.nn.functional")
models = lazy_module("workbench.core.models")
parts = lazy_module("workbench.core.parts")


@dataclass
class PKDSettings(Checked):
    """Patient KD: which teacher layers the student's layers learn."""

    pkd_mapping: str = option(
        "skip",
        "Patient KD layer mapping for custom weights (presets pkd-skip/pkd-last set it)",
        choices=("skip", "last"),
    )


def patient_loss(student_cls: Tensor, teacher_cls: Tensor, *, reduction: str = "paper") -> Tensor:
    """``Σ_j ‖ h_s[j]/‖h_s[j]‖ − h_t[j]/‖h_t[j]‖ ‖²`` over already-mapped layers.

    ``student_cls``, ``teacher_cls``: ``[B, M, d]`` ([CLS] vectors of the M mapped layers).
    ``paper``: summed over layers and dimensions, mean over the batch; ``official``: mean over
    ``B × M × d`` (the released code, hence its β of 100–1000). The teacher is detached.
    """
    if student_cls.shape != teacher_cls.shape:
        raise ValueError(
            f"Patient KD needs equal shapes; got student {tuple(student_cls.shape)} and teacher "
            f"{tuple(teacher_cls.shape)} (equal hidden sizes and mapped layer counts)"
        )
    squared = (F.normalize(student_cls, dim=-1) - F.normalize(teacher_cls.detach(), dim=-1)).pow(2)
    if reduction == "paper":
        return squared.sum((1, 2)).mean()
    if reduction == "official":
        return squared.mean()
    raise ValueError(f"unknown reduction {reduction!r}; use paper or official")


def mapped_pairs(objective: Objective) -> list[tuple[int, int]]:
    """The ``(student j, teacher I(j))`` hidden-state pairs of the preset's mapping (PKD-Skip,
    PKD-Last) or of ``--pkd-mapping`` for explicit weights. GKD-CLS uses them too."""
    mapping = objective.of(PKDSettings).pkd_mapping
    return patient_layers(objective.teacher_layers, objective.student_layers, mapping)


def projection_widths(objective: Objective) -> dict[str, int] | None:
    """The student's and the teacher's widths where they differ (the projection ``W`` maps the
    one to the other), else None."""
    widths = {"student": objective.student_width, "teacher": objective.teacher_width}
    differ = None not in widths.values() and widths["student"] != widths["teacher"]
    return widths if differ else None


def _projection(objective: Objective) -> dict[str, torch.nn.Module]:
    """Where the widths differ, ``W``: ``[.., d_s] → [.., d_t]``."""
    if (widths := projection_widths(objective)) is None:
        return {}
    return {"pkd": torch.nn.Linear(widths["student"], widths["teacher"], bias=False)}


def _resolve(objective: Objective) -> None:
    """The mapping checked against the two models' depths; its settings need nothing decided."""
    mapped_pairs(objective)


def _cls_states(objective: Objective, model: PreTrainedModel, batch, hidden, side: int) -> Tensor:
    """``[B, M, d]``: what the head reads of ``hidden`` at the pairs' layers of ``side`` (0, 1)."""
    pairs = mapped_pairs(objective)
    return torch.stack([parts.head_states(model, hidden[p[side]], batch) for p in pairs], 1)


def _teacher_cls(objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    hidden = models.forward(teacher, batch, hidden_states=True).hidden_states
    return _cls_states(objective, teacher, batch, hidden, 1)


def _pkd(objective: Objective, inputs: StepInputs) -> Tensor:
    hidden = inputs.student.hidden_states
    student_cls = _cls_states(objective, inputs.model, inputs.batch, hidden, 0)
    if "pkd" in objective.modules:  # another width: [B, M, d_s] → [B, M, d_t]
        student_cls = objective.modules["pkd"](student_cls)
    return patient_loss(student_cls, inputs.teacher["cls"], reduction=objective.config.parity)


# β is for the paper form (sum over layers) or the official mean over B×(M−1)×d, hence the
# orders of magnitude between the two.
PKD_SKIP = Preset(
    {"ce": 0.5, "kd": 0.5, "pkd": 1.0},
    {"ce": 0.5, "kd": 0.5, "pkd": 500.0},
    own=("pkd",),
    name="PKD-skip",
    reference="Sun et al. 2019",
    space={"beta": "0.1,1,10,100"},
    beta="pkd",
    tuned=("beta",),
    claims=(Claim("accuracy", "≥"),),
    settings={"pkd_mapping": "skip"},
)
register_method(
    "pkd",
    settings=PKDSettings,
    teacher_fields={
        "cls": TeacherField(_teacher_cls, key=lambda o: {"patient_pairs": mapped_pairs(o)})
    },
    terms={"pkd": Term(_pkd, teacher_fields=("cls",), hidden_states=True)},
    method=Method(
        frozenset({"pkd"}),
        _resolve,
        record=lambda o: (
            {"patient_pairs": mapped_pairs(o)}
            | ({"pkd_projection": widths} if (widths := projection_widths(o)) else {})
        ),
        modules=_projection,
        layer_pairs="patient_pairs",
        mapping="Patient KD mapping ({method})",
    ),
    presets={
        "pkd-skip": PKD_SKIP,
        "pkd-last": replace(PKD_SKIP, name="PKD-last", settings={"pkd_mapping": "last"}),
    },
)
