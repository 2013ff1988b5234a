"""A worked example of adding a method: hidden-state MSE between mapped layers (the hidden-state
loss of FitNets / TinyBERT, without their projection), in one file.

    L_hid = (1/K) Σ_k MSE(H_s[k], H_t[I(k)])    over real tokens, K mapped layers from the F-th
    L = CE + KD + β L_hid

Importing the module registers everything, in one call (``register_method``): its option ``--hidden-
from`` (F) in ``kdw``'s parser, the app's forms, ``--config`` files and run records; ``kdw distill
--preset hidden-mse`` (or ``--weights ce=0.5,kd=0.5,hidden=1``) trains with it; ``kdw tune``
searches its preset's space and, with ``--space hidden_from=0,1``, its option; ``kdw reproduce
--ablations`` trains its ablation and its sweep of F, draws the sweep and checks its claim. To ship
it with the package (so that ``kdw`` offers it from the start), move it to ``kd/methods/`` and
import it in ``kd/methods/__init__.py``. See ``docs/adding-a-method.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kd.methods.layer_map import uniform_layers
from kd.methods.objective import (
    TOKENS,
    Ablation,
    Claim,
    Method,
    Objective,
    Preset,
    StepInputs,
    Sweep,
    TeacherField,
    Term,
    register_method,
    setting_parameter,
)
from workbench.core.config import Checked, non_negative_int, option
from workbench.core.errors import WorkbenchError
from workbench.core.lazy import lazy_module

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedModel

# torch and the modules built on it, imported when a term first runs: importing the method (as
# kdw's parser does, for its options) stays fast
torch = lazy_module("torch")
models = lazy_module("workbench.core.models")


# 1. Its settings: one dataclass, each field an option (help, domain) of kdw, the app and records.
@dataclass
class HiddenSettings(Checked):
    """Hidden MSE: which mapped hidden states are compared."""

    hidden_from: int = option(
        0,
        "Hidden MSE: the first mapped hidden state compared (0: the embeddings' output)",
        domain=non_negative_int,
    )


# 2. The loss: a pure function of tensors, shapes in its docstring.
def hidden_mse_loss(student: Tensor, teacher: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean squared error over the real tokens of ``K`` mapped layers.

    Args:
        student: ``[B, K, L, d]`` the student's mapped hidden states.
        teacher: ``[B, K, L, d]`` the teacher's (used detached); equal widths.
        attention_mask: ``[B, L]`` 1 for real tokens.

    Returns:
        Scalar ``Σ m·(h_s − h_t)²`` over layers, tokens and dimensions ``/ (K · Σ m · d)``.
    """
    if student.shape != teacher.shape:
        raise ValueError(
            f"hidden-state MSE needs equal shapes, got student {tuple(student.shape)} and "
            f"teacher {tuple(teacher.shape)} (equal hidden sizes)"
        )
    mask = attention_mask[:, None, :, None].to(student.dtype).expand_as(student)
    squared = (student - teacher.detach()).pow(2) * mask
    return squared.sum() / mask.sum().clamp_min(1)


# 3. What its terms read: the layer pairs, a function of its settings and the two models' depths.
def hidden_pairs(objective: Objective) -> list[tuple[int, int]]:
    """The ``(student, teacher)`` hidden-state pairs compared: the uniform mapping, from the
    ``hidden_from``-th."""
    first = objective.of(HiddenSettings).hidden_from
    return uniform_layers(objective.teacher_layers, objective.student_layers)[first:]


# ... checked once per run against the models (its settings need nothing decided: None).
def _resolve(objective: Objective) -> None:
    if not hidden_pairs(objective):
        first, last = objective.of(HiddenSettings).hidden_from, objective.student_layers
        raise WorkbenchError(f"--hidden-from {first}: this student maps hidden states 0..{last}")


# 4. What the frozen teacher contributes.
def _teacher_hidden(objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    hidden = models.forward(teacher, batch, hidden_states=True).hidden_states
    return torch.stack([hidden[t] for _, t in hidden_pairs(objective)], dim=2)  # [B, L, K, d]


# 5. The term: reads the step's student output and the teacher field.
def _hidden(objective: Objective, inputs: StepInputs) -> Tensor:
    hidden = inputs.student.hidden_states
    student = torch.stack([hidden[s] for s, _ in hidden_pairs(objective)], dim=1)
    teacher = inputs.teacher["hidden_states"].transpose(1, 2)  # [B, K, L, d]
    return hidden_mse_loss(student, teacher, inputs.batch["attention_mask"])


# 6. Everything registered in one call: its settings; the teacher field by name (cached per
# example unless cacheable=False; ``key``: what changes its values); the term, what it reads and
# what its value is a mean over; the method (its resolution, run.json's record of it, the layer
# pairs the app draws); a parameter kdw tune can search (--space hidden_from=0,1); and a preset:
# plain weight tables per parity, and everything else about the method: its name and paper, its
# own term (the control goes without it), kdw tune's default space and the term β weighs, a
# sweep of its option and an ablation (operations on the preset) and the claim the reproduction
# report checks.
register_method(
    "hidden-mse",
    settings=HiddenSettings,
    teacher_fields={
        "hidden_states": TeacherField(
            _teacher_hidden, per_token=True, key=lambda o: {"hidden_pairs": hidden_pairs(o)}
        )
    },
    terms={
        "hidden": Term(_hidden, teacher_fields=("hidden_states",), hidden_states=True, unit=TOKENS)
    },
    method=Method(
        frozenset({"hidden"}),
        _resolve,
        record=lambda o: {"hidden_pairs": hidden_pairs(o)},
        layer_pairs="hidden_pairs",
        mapping="uniform mapping of the hidden-state MSE ({method})",
    ),
    parameters={
        "hidden_from": setting_parameter(
            "Hidden MSE: the first mapped hidden state compared",
            HiddenSettings,
            "hidden_from",
            "hidden",
        )
    },
    presets={
        "hidden-mse": Preset(
            {"ce": 0.5, "kd": 0.5, "hidden": 1.0},
            {"ce": 0.5, "kd": 0.5, "hidden": 1.0},
            own=("hidden",),
            name="Hidden MSE",
            reference="Romero et al. 2015",
            space={"beta": "0.1,1,10", "alpha": "0.1,0.5,0.9"},
            beta="hidden",
            ablations=(
                Sweep(
                    "F", "hidden-from", "hidden_from", "hidden_from_sweep", (1, 2), "first state F"
                ),
                Ablation("w/o ce", "hidden-terms", weights={"ce": 0.0}),
            ),
            claims=(Claim("accuracy", "≥"),),
        )
    },
)
