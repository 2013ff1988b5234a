"""Gradient KD (Wang et al. 2022, GKD; docs/methods.md §5): the student's input gradients learn the
teacher's directions, besides vanilla KD's two terms; GKD-CLS also aligns the gradients at the
[CLS] states of PKD's mapped layers (and adds PKD's term).

For every position the student's and the teacher's gradients are unit-normalised and compared:

    g = ∂(Σ_b p_max,b)/∂e_bi  (each model its own p_max)
    L_grad = Σ_{b,i} m_bi ‖ g_s/‖g_s‖ − g_t/‖g_t‖ ‖² / Σ_{b,i} m_bi
    L = (1 − α) CE + α KD + β L_grad

The same function serves GKD-CLS: the layer-wise gradients w.r.t. the [CLS] hidden states as
``[B, M, d]`` with ``attention_mask=None`` (every position counts). Theorem 1's setup: the student
keeps the teacher's embeddings, frozen, and runs without dropout (the method's student set-up,
:func:`prepare_gradient_student`).

Across tokenizers (beyond the paper): a token's gradient has no counterpart in another vocabulary
or width, so each model's gradient saliency ``‖g_i‖`` is summed over the tokens of each word both
tokenisations share and L2-normalised over the words, ``ŝ``, and the term compares those:

    L_grad = Σ_{b,w} m_bw (ŝ_s,bw − ŝ_t,bw)² / Σ_{b,w} m_bw

The student then keeps its own embeddings, trained (it cannot hold the teacher's), without dropout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kd.methods.config import ObjectiveConfig
from kd.methods.objective import (
    TOKENS,
    Ablation,
    Claim,
    Method,
    Objective,
    Preset,
    StepInputs,
    StudentSetup,
    TeacherField,
    Term,
    register_method,
    weight_parameter,
)
from kd.methods.pkd import mapped_pairs
from workbench.core.config import Checked, option
from workbench.core.errors import WorkbenchError
from workbench.core.lazy import lazy_module

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedModel

torch = lazy_module("torch")
attribution = lazy_module("workbench.analysis.attribution")
alignment = lazy_module("workbench.core.data.alignment")
geometry = lazy_module("workbench.analysis.relation_geometry")
models = lazy_module("workbench.core.models")
students = lazy_module("kd.methods.students")
parts = lazy_module("workbench.core.parts")


@dataclass
class GKDSettings(Checked):
    """GKD: the student set-up of Theorem 1 (the teacher's embeddings, frozen; no dropout)."""

    dropout: bool = option(
        False, "keep the student's dropout on under gradient KD (GKD's 'w/ Dropout' ablation)"
    )
    gradient_regime: bool | None = option(
        None,
        "GKD's student set-up: the teacher's embeddings, frozen, and dropout off (unless "
        "--dropout); default: on when a gradient term (grad, cls_grad) is weighted. Pinned on "
        "by a control of GKD, whose gradient terms are at weight 0",
        recorded_if_set=True,
    )


def unit_normalize(x: Tensor, eps: float = 1e-12) -> Tensor:
    """``x`` ``[..., d]`` divided by its L2 norm along the last dimension; vectors of norm
    ``<= eps`` become exactly zero, with a zero (never NaN or huge) gradient."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    # clamp_min keeps the unselected branch finite, so its backward is 0, not 0·inf.
    inverse = torch.where(norm > eps, norm.clamp_min(eps).reciprocal(), 0.0)
    return x * inverse


def gradient_alignment_loss(
    student_grads: Tensor,
    teacher_grads: Tensor,
    attention_mask: Tensor | None = None,
    eps: float = 1e-12,
) -> Tensor:
    """GKD gradient alignment, ``Σ m·‖ĝ_s − ĝ_t‖² / Σ m`` (0 without a real position).

    Args:
        student_grads: ``[B, L, d]`` student gradients w.r.t. its input embeddings (with
            ``create_graph=True``), or ``[B, M, d]`` w.r.t. the [CLS] states of ``M`` layers.
        teacher_grads: the same shape; used detached.
        attention_mask: ``[B, L]`` real-token mask; ``None``: every position is real.
        eps: a gradient of norm ``<= eps`` counts as zero (its position costs 0 or 1).

    Raises:
        ValueError: on a shape mismatch, including different embedding widths (both gradients
            are taken w.r.t. input embeddings of the same width; GKD initialises the student's
            embeddings from the teacher's).
    """
    if student_grads.dim() != 3:
        raise ValueError(f"gradients must be [B, L, d], got {tuple(student_grads.shape)}")
    if student_grads.shape[-1] != teacher_grads.shape[-1]:
        raise ValueError(
            f"student and teacher gradient widths differ ({student_grads.shape[-1]} vs "
            f"{teacher_grads.shape[-1]}): gradient alignment compares gradients w.r.t. input "
            "embeddings of the same width"
        )
    if student_grads.shape != teacher_grads.shape:
        raise ValueError(
            f"shape mismatch: student {tuple(student_grads.shape)}, "
            f"teacher {tuple(teacher_grads.shape)}"
        )
    mask = geometry.real_mask(attention_mask, *student_grads.shape[:2], student_grads.device)
    diff = unit_normalize(student_grads, eps) - unit_normalize(teacher_grads.detach(), eps)
    per_position = torch.where(mask, diff.pow(2).sum(-1), 0.0)
    return per_position.sum() / mask.sum().clamp_min(1)


def saliency_alignment_loss(student: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
    """GKD across tokenizers: ``Σ m (ŝ_s − ŝ_t)² / Σ m`` (0 without a word) between the
    student's word saliencies ``student`` ``[B, W]`` (L2-normalised over each example's words,
    differentiable) and the teacher's (``[B, W]``, used detached); ``mask`` ``[B, W]``: the
    word slots that hold a shared word. Raises ValueError on a shape mismatch."""
    if student.shape != teacher.shape or student.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: student {tuple(student.shape)}, teacher {tuple(teacher.shape)}, "
            f"mask {tuple(mask.shape)}"
        )
    squared = torch.where(mask.bool(), (student - teacher.detach()).pow(2), 0.0)
    return squared.sum() / mask.sum().clamp_min(1)


def saliency_words(gradients: Tensor, word_ids: Tensor) -> Tensor:
    """``[B, L, d]`` input gradients → ``[B, W]``: each token's gradient norm summed over its
    word's tokens, L2-normalised over the words (``word_ids`` ``[B, L]``, −1: no word)."""
    norms = torch.linalg.vector_norm(gradients, dim=-1)[..., None]  # [B, L, 1]
    return alignment.word_maps(norms, word_ids)[..., 0]


def state_gradients(
    model: PreTrainedModel, batch: dict[str, Tensor], layers: list[int], create_graph: bool
) -> Tensor:
    """GKD-CLS: ``∂(Σ_b p_max,b)/∂h[j]`` at [CLS] (what the head reads: a decoder's last real
    token) for hidden-state indices ``layers`` → ``[B, len(layers), d]``."""
    with torch.enable_grad():
        embedded = models.embed(model, batch)
        if not embedded.requires_grad:  # a frozen model: start the graph at its embeddings
            embedded = embedded.detach().requires_grad_()
        out = models.forward(model, batch, hidden_states=True, embedding_output=embedded)
        states = [out.hidden_states[j] for j in layers]
        signal = out.logits.softmax(-1).max(-1).values.sum()
        grads = torch.autograd.grad(signal, states, create_graph=create_graph)
    return torch.stack([parts.head_states(model, g, batch) for g in grads], dim=1)


def _resolve(objective: Objective) -> None:
    """GKD-CLS reads PKD's layer pairs (checked here). Gradients of one token (same tokenizer)
    or of the states the head reads (GKD-CLS) compare in one space: equal widths."""
    widths = objective.teacher_width, objective.student_width
    if None not in widths and widths[0] != widths[1]:
        if "cls_grad" in objective.weights:
            raise WorkbenchError(
                "GKD-CLS compares gradients w.r.t. the states the two heads read, so the "
                f"student needs the teacher's hidden size {widths[0]}, not {widths[1]}: use "
                "--init cut or a student of the same hidden size"
            )
        if "grad" in objective.weights and not objective.words:
            raise WorkbenchError(
                "gradient KD compares gradients w.r.t. the input embeddings, so the student "
                f"needs the teacher's embedding width {widths[0]}, not {widths[1]}: use --init "
                "cut or a student of the same hidden size"
            )
    if "cls_grad" in objective.weights:
        mapped_pairs(objective)


def _teacher_input_grads(_objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    gradients = attribution.input_gradients(teacher, batch)
    if "word_ids" in batch:  # another tokenizer's student: per word, in the first W rows
        return alignment.pad_words(
            saliency_words(gradients, batch["word_ids"])[..., None], batch["word_ids"].shape[1]
        )
    return gradients


def _teacher_cls_grads(objective: Objective, teacher: PreTrainedModel, batch) -> Tensor:
    return state_gradients(teacher, batch, [t for _, t in mapped_pairs(objective)], False)


def _grad(_objective: Objective, inputs: StepInputs) -> Tensor:
    student, logits = attribution.input_gradients(
        inputs.model, inputs.batch, create_graph=True, return_logits=True
    )
    inputs.share(logits)
    if "word_ids" in inputs.batch:  # another tokenizer's teacher: compared on shared words
        ids = inputs.batch["word_ids"]
        saliency = saliency_words(student, ids)  # [B, W]
        teacher = inputs.teacher["input_grads"][:, : saliency.shape[1], 0]
        return saliency_alignment_loss(saliency, teacher, alignment.word_mask(ids))
    return gradient_alignment_loss(
        student, inputs.teacher["input_grads"], inputs.batch["attention_mask"]
    )


def _cls_grad(objective: Objective, inputs: StepInputs) -> Tensor:
    layers = [s for s, _ in mapped_pairs(objective)]
    student = state_gradients(inputs.model, inputs.batch, layers, True)
    return gradient_alignment_loss(student, inputs.teacher["cls_grads"])


def _regime(config: ObjectiveConfig, weights: dict[str, float]) -> bool:
    pinned = config.of(GKDSettings).gradient_regime
    return pinned if pinned is not None else any(name in weights for name in ("grad", "cls_grad"))


def gradient_kd(objective: Objective) -> bool:
    """Whether the student is set up as GKD's (the teacher's embeddings, frozen, and no
    dropout: Theorem 1 of the GKD paper): as ``gradient_regime`` says, by default when a
    gradient term is weighted."""
    return _regime(objective.config, objective.weights)


def prepare_gradient_student(
    teacher: PreTrainedModel,
    student: PreTrainedModel,
    dropout: bool = False,
    same_tokens: bool = True,
) -> None:
    """GKD's student set-up: the teacher's embeddings, frozen (a student of another tokenizer
    keeps and trains its own), and no dropout (``dropout=True`` keeps it, for the paper's
    "w/ Dropout" ablation)."""
    if same_tokens:
        students.copy_embeddings(teacher, student)
        students.set_embeddings_trainable(student, False)
    if not dropout:
        students.disable_dropout(student)


def _prepare(objective: Objective, teacher: PreTrainedModel, student: PreTrainedModel) -> None:
    dropout = objective.of(GKDSettings).dropout
    prepare_gradient_student(teacher, student, dropout, same_tokens=not objective.words)


def _record_setup(objective: Objective) -> dict:
    """Whether the student keeps dropout; another tokenizer's keeps its own embeddings, trained."""
    own = {"student_embeddings": "own"} if objective.words else {}
    return {"student_dropout": objective.of(GKDSettings).dropout} | own


def _pin(config: ObjectiveConfig, weights: dict[str, float]) -> ObjectiveConfig:
    """The set-up written out (``gradient_regime``), on where a gradient term is weighted."""
    if config.of(GKDSettings).gradient_regime is not None:
        return config
    return config.with_settings(gradient_regime=_regime(config, weights) or None)


register_method(
    "gkd",
    settings=GKDSettings,
    teacher_fields={
        "input_grads": TeacherField(_teacher_input_grads, per_token=True, gradients=True),
        "cls_grads": TeacherField(
            _teacher_cls_grads, key=lambda o: {"patient_pairs": mapped_pairs(o)}, gradients=True
        ),
    },
    terms={
        "grad": Term(
            _grad,
            teacher_fields=("input_grads",),
            runs_student=True,
            unit=TOKENS,
            on_words="each token's gradient norm summed over the word's tokens, L2-normalised "
            "over the words (beyond the paper)",
        ),
        "cls_grad": Term(_cls_grad, teacher_fields=("cls_grads",)),
    },
    method=Method(
        frozenset({"grad", "cls_grad"}),
        _resolve,
        record=lambda o: {"patient_pairs": mapped_pairs(o)} if "cls_grad" in o.weights else {},
        layer_pairs="patient_pairs",
        mapping="Patient KD mapping ({method})",
    ),
    setup=StudentSetup(gradient_kd, _prepare, _record_setup, _pin),
    parameters={
        "gamma": weight_parameter("GKD-CLS: weight γ of the [CLS]-state gradient term", "cls_grad")
    },
    presets={
        "gkd": Preset(
            {"ce": 0.5, "kd": 0.5, "grad": 1.0},
            {"ce": 0.5, "kd": 0.5, "grad": 1.0},
            temperature=5.0,
            own=("grad",),
            name="GKD",
            reference="Wang et al. 2022",
            space={"beta": "0.1,1,10", "alpha": "0.1,0.5,0.9", "tau": "1,2,5"},
            beta="grad",
            tuned=("beta",),
            ablations=(Ablation("w/ dropout", "gkd-dropout", settings={"dropout": True}),),
            claims=(Claim("saliency_loyalty", "≫"),),
            gallery=True,
        ),
        # GKD-CLS: the [CLS]-state gradients at weight 0.1. At 1 they held 50–74 % of the
        # gradient (their gradient is twice the input gradients'), CE 4–11 %, and a student
        # trained for 26 steps on BBC News lost two of five classes (docs/results.md, "Choosing
        # the AD-KD and GKD-CLS presets").
        "gkd-cls": Preset(
            {"ce": 0.5, "kd": 0.5, "pkd": 1.0, "grad": 1.0, "cls_grad": 0.1},
            {"ce": 0.5, "kd": 0.5, "pkd": 500.0, "grad": 1.0, "cls_grad": 1.0},
            temperature=5.0,
            own=("grad", "cls_grad"),  # its PKD term is its regime
            name="GKD-CLS",
            reference="Wang et al. 2022",
            space={"beta": "0.1,1,10", "gamma": "0.01,0.1,1", "alpha": "0.1,0.5,0.9"},
            beta="pkd",
            tuned=("beta",),
        ),
    },
)
