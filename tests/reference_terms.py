"""Reference forms of every loss term, written again from the papers and the authors' code.

Independent of ``kd`` (plain torch, nothing imported from the project): each function follows
the equation in ``docs/methods.md`` or the released code's arithmetic as directly as possible —
per-example, per-pair and per-triple loops where the project uses banded or batched tensors.
``tests/fixtures/golden_terms.json`` stores their values on fixed seeded inputs
(``python tests/reference_terms.py`` rewrites it) and ``tests/methods/test_golden_terms.py`` holds
the project's functions to them. ``bench/reference.py`` builds the authors' AD-KD and GKD
steps from the same functions.

Sources: AD-KD's official reduction and maps follow the authors' released ``loss.py``
(``saliency_mse``: top-K norm, ``F.normalize`` over the sequence, ``MSE(sum) / #non-zero``,
summed over classes); ``DistillKL`` there is the ``soft-ce`` form. The PKD, CKD and GKD forms
follow ``docs/methods.md``; for CKD's official pair term the denominator is ``Σ_seq (#real)²``
(real pairs with ``i = j``), as the released ``loss.py`` divides (the sum of the attention
mask's outer product), not the number of pairs with ``i ≠ j``; see the golden test's note.

Shapes: batch ``B``, length ``L``, width ``d``, classes or views ``C``, mapped layers ``K``;
a mask is ``[B, L]`` with 1 for real tokens. All functions take any float dtype; the stored
values come from float64.
"""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

FIXTURE = Path(__file__).parent / "fixtures" / "golden_terms.json"

# ---------------------------------------------------------------- §1 response-based terms


def task_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """``CE(z_s, y)`` for ``[B, C]`` logits (mean of ``−log σ(z)_y``); ``MSE`` for ``[B, 1]``."""
    if logits.shape[-1] == 1:
        return (logits[:, 0] - labels.to(logits.dtype)).pow(2).mean()
    log_probs = logits.log_softmax(-1)
    return -log_probs[torch.arange(len(labels)), labels].mean()


def logit_kd_loss(student: Tensor, teacher: Tensor, tau: float, form: str = "kl") -> Tensor:
    """Logit distillation, ``[B, C]`` logits each (teacher used detached).

    ``kl`` (Hinton; paper): ``τ² · (1/B) Σ_b Σ_c p_t log(p_t / p_s)``; ``soft-ce`` (AD-KD / CKD
    ``DistillKL``): ``−(1/B) Σ_b Σ_c p_t log p_s``, no τ²; ``kl-mean`` (GKD / PKD
    ``KLDivLoss(reduction="mean") · T²``): the KL sum divided by ``B·C``. Regression (``C = 1``):
    ``MSE(z_s/τ, z_t/τ)``.
    """
    teacher = teacher.detach()
    if student.shape[-1] == 1:
        return (student / tau - teacher / tau).pow(2).mean()
    log_p_s = (student / tau).log_softmax(-1)
    p_t = (teacher / tau).softmax(-1)
    batch, classes = student.shape
    if form == "soft-ce":
        return -(p_t * log_p_s).sum() / batch
    kl = (p_t * (p_t.log() - log_p_s)).sum()
    if form == "kl":
        return tau**2 * kl / batch
    if form == "kl-mean":
        return tau**2 * kl / (batch * classes)
    raise ValueError(f"unknown form {form!r}")


# ---------------------------------------------------------------- §2 Patient KD


def patient_loss(student_cls: Tensor, teacher_cls: Tensor, reduction: str = "paper") -> Tensor:
    """PKD on ``[B, K, d]`` [CLS] states of the mapped layers.

    ``paper`` (Eq. 3): ``(1/B) Σ_b Σ_j ‖ h_s/‖h_s‖ − h_t/‖h_t‖ ‖²``; ``official``: the released
    ``MSELoss`` of the normalised states, a mean over ``B·K·d``.
    """
    batch, layers, width = student_cls.shape
    total = student_cls.new_zeros(())
    for b, j in product(range(batch), range(layers)):
        s, t = student_cls[b, j], teacher_cls[b, j].detach()
        total = total + (s / s.norm() - t / t.norm()).pow(2).sum()
    if reduction == "paper":
        return total / batch
    if reduction == "official":
        return total / (batch * layers * width)
    raise ValueError(f"unknown reduction {reduction!r}")


# ---------------------------------------------------------------- §3 Contextual KD


def _cosine(x: Tensor, y: Tensor) -> Tensor:
    return (x @ y) / (x.norm() * y.norm())


def _pairs(seq: Tensor, real: list[int], kind: str) -> dict[tuple[int, int], Tensor]:
    """``ψ_P(r_i, r_j)`` for real ``i ≠ j`` of one ``[S, d]`` sequence."""
    out = {}
    for i, j in product(real, real):
        if i != j:
            if kind == "cosine":
                out[i, j] = 1 - _cosine(seq[i], seq[j])
            else:
                out[i, j] = (seq[i] - seq[j]).norm()
    if kind == "l2_mean" and out:
        mean = sum(out.values()) / len(out)
        out = {key: value / mean for key, value in out.items()}
    return out


def _triples(seq: Tensor, real: list[int], delta: int) -> dict[tuple[int, int, int], Tensor]:
    """``ψ_T = cos∠(r_j − r_i, r_k − r_i)`` for real ``i, j, k`` with ``j, k ≠ i`` and
    ``|i − j|, |i − k| ≤ δ``."""
    out = {}
    for i in real:
        near = [j for j in real if j != i and abs(i - j) <= delta]
        for j, k in product(near, near):
            out[i, j, k] = _cosine(seq[j] - seq[i], seq[k] - seq[i])
    return out


def _official_pair_kl(student: Tensor, teacher: Tensor, real: list[int]) -> Tensor:
    """Released CKD pair term, summed over one sequence: for each real row ``i``, ``KL(softmax_j
    cos_t(i, j) ‖ softmax_j cos_s(i, j))`` over real ``j ≠ i`` (a row with no such ``j`` adds 0)."""
    total = student.new_zeros(())
    for i in real:
        others = [j for j in real if j != i]
        if not others:
            continue
        cos_s = torch.stack([_cosine(student[i], student[j]) for j in others])
        cos_t = torch.stack([_cosine(teacher[i], teacher[j]) for j in others])
        p_t, log_p_s = cos_t.softmax(0), cos_s.log_softmax(0)
        total = total + (p_t * (p_t.log() - log_p_s)).sum()
    return total


def _relation_loss(
    sequences: list[tuple[Tensor, Tensor, list[int]]],
    *,
    delta: int,
    pair_kind: str,
    pair_weight: float,
    triple_weight: float,
    variant: str,
) -> Tensor:
    """``pair_weight·L_pair + triple_weight·L_triple`` over ``(student [S, d_s], teacher [S, d_t],
    real positions)`` sequences. Paper: squared errors averaged over all valid pairs and all valid
    triples. Official pair term: the KL sum over all rows divided by ``Σ_seq (#real)²``."""
    pair_sq, pair_count, triple_sq, triple_count = 0.0, 0, 0.0, 0
    kl_sum, official_denominator = 0.0, 0
    for student, teacher, real in sequences:
        teacher = teacher.detach()
        if variant == "official":
            kl_sum = kl_sum + _official_pair_kl(student, teacher, real)
            official_denominator += len(real) ** 2
        else:
            s_pairs, t_pairs = _pairs(student, real, pair_kind), _pairs(teacher, real, pair_kind)
            pair_sq = pair_sq + sum((s_pairs[key] - t_pairs[key]) ** 2 for key in s_pairs)
            pair_count += len(s_pairs)
        s_triples, t_triples = _triples(student, real, delta), _triples(teacher, real, delta)
        triple_sq = triple_sq + sum((s_triples[key] - t_triples[key]) ** 2 for key in s_triples)
        triple_count += len(s_triples)
    if variant == "official":
        pair = kl_sum / max(official_denominator, 1)
    else:
        pair = pair_sq / max(pair_count, 1)
    return pair_weight * pair + triple_weight * triple_sq / max(triple_count, 1)


def word_relation_loss(
    student: Tensor,
    teacher: Tensor,
    mask: Tensor,
    *,
    window: int = 10,
    pair_kind: str = "cosine",
    pair_weight: float = 1.0,
    triple_weight: float = 1.0,
    variant: str = "paper",
) -> Tensor:
    """CKD Word Relation: relations among the real tokens of each mapped layer.

    ``student [B, K, L, d_s]``, ``teacher [B, K, L, d_t]``, ``mask [B, L]``; one sequence per
    example and layer.
    """
    sequences = [
        (student[b, k], teacher[b, k], mask[b].nonzero().flatten().tolist())
        for b, k in product(range(student.shape[0]), range(student.shape[1]))
    ]
    return _relation_loss(
        sequences,
        delta=window,
        pair_kind=pair_kind,
        pair_weight=pair_weight,
        triple_weight=triple_weight,
        variant=variant,
    )


def layer_relation_loss(
    student: Tensor,
    teacher: Tensor,
    mask: Tensor,
    *,
    window: int | None = None,
    pair_kind: str = "cosine",
    pair_weight: float = 1.0,
    triple_weight: float = 1.0,
    variant: str = "paper",
) -> Tensor:
    """CKD Layer Transforming Relation: for each real token, relations among its ``K`` mapped
    representations (``[B, K, L, d]`` as in :func:`word_relation_loss`); ``window=None``
    spans all ``K`` layers."""
    layers = student.shape[1]
    sequences = [
        (student[b, :, i], teacher[b, :, i], list(range(layers)))
        for b, i in product(range(student.shape[0]), range(student.shape[2]))
        if mask[b, i]
    ]
    return _relation_loss(
        sequences,
        delta=layers if window is None else window,
        pair_kind=pair_kind,
        pair_weight=pair_weight,
        triple_weight=triple_weight,
        variant=variant,
    )


# ---------------------------------------------------------------- §4 AD-KD


def attribution_map(ig: Tensor, mask: Tensor, top_k: int | None = None) -> Tensor:
    """Per-view unit maps from per-dimension attributions.

    ``ig [B, C, L, d]`` → ``[B, C, L]``: per token ``‖TopK_d(|IG_i|)‖₂`` (teacher, ``top_k``) or
    ``‖IG_i‖₂`` (student, ``None``), pads set to 0, each view divided by its L2 norm over the
    sequence (the released ``F.normalize(..., dim=1)``).
    """
    magnitudes = ig.abs()
    if top_k is not None:
        magnitudes = magnitudes.topk(top_k, dim=-1).values
    per_token = magnitudes.norm(dim=-1) * mask[:, None, :].to(ig.dtype)
    return F.normalize(per_token, p=2.0, dim=-1)


def attribution_loss(
    student_maps: Tensor, teacher_maps: Tensor, mask: Tensor | None, reduction: str = "paper"
) -> Tensor:
    """AD-KD's distance between unit maps ``[B, C, L]`` (pads 0, teacher used detached).

    ``paper`` (Eq. 9): ``(1/B) Σ_b ‖Ã_t[b] − Ã_s[b]‖₂`` over the concatenated ``C`` views;
    ``squared``: ``(1/B) Σ_b ‖Ã_t[b] − Ã_s[b]‖₂²``; ``official`` (``loss.py``): per view
    ``MSE(sum) / (t_saliency != 0).sum()``, summed over views.
    """
    teacher_maps = teacher_maps.detach()
    if mask is not None:
        keep = mask[:, None, :].to(student_maps.dtype)
        student_maps, teacher_maps = student_maps * keep, teacher_maps * keep
    if reduction == "official":
        return sum(
            (student_maps[:, c] - teacher_maps[:, c]).pow(2).sum() / (teacher_maps[:, c] != 0).sum()
            for c in range(student_maps.shape[1])
        )
    distances = [(s - t).flatten().norm() for s, t in zip(student_maps, teacher_maps, strict=True)]
    if reduction == "paper":
        return torch.stack(distances).mean()
    if reduction == "squared":
        return torch.stack(distances).pow(2).mean()
    raise ValueError(f"unknown reduction {reduction!r}")


# ---------------------------------------------------------------- §5 GKD


def gradient_alignment_loss(
    student_grads: Tensor, teacher_grads: Tensor, mask: Tensor | None = None
) -> Tensor:
    """GKD: ``Σ_{b,i} m_bi ‖ g_s/‖g_s‖ − g_t/‖g_t‖ ‖² / Σ m`` on ``[B, L, d]`` gradients
    (``mask=None``: every position, the GKD-CLS use on ``[B, K, d]``)."""
    teacher_grads = teacher_grads.detach()
    if mask is None:
        mask = torch.ones(student_grads.shape[:2])
    # F.normalize leaves a zero gradient (a pad's) at zero instead of dividing 0 by 0.
    s_unit, t_unit = F.normalize(student_grads, dim=-1), F.normalize(teacher_grads, dim=-1)
    per_position = (s_unit - t_unit).pow(2).sum(-1)
    return per_position[mask.bool()].mean()


# ---------------------------------------------------------------- golden values

SEED = 20261123
SHAPES = {
    "batch": 3,
    "length": 7,
    "lengths": [7, 5, 3],
    "classes": 3,
    "width": 8,
    "teacher_width": 12,
    "layers": 3,
    "top_k": 4,
}


def golden_inputs(seed: int = SEED) -> dict[str, Tensor]:
    """The fixed float64 inputs of every case, drawn in a fixed order from one generator.

    Pads hold random values wherever a term takes a mask, so a term that reads them changes.
    """
    g = torch.Generator().manual_seed(seed)
    n, length, classes = SHAPES["batch"], SHAPES["length"], SHAPES["classes"]
    width, teacher_width, layers = SHAPES["width"], SHAPES["teacher_width"], SHAPES["layers"]

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    mask = (torch.arange(length)[None, :] < torch.tensor(SHAPES["lengths"])[:, None]).long()
    inputs = {
        "mask": mask,
        "student_logits": 2 * randn(n, classes),
        "teacher_logits": 2 * randn(n, classes),
        "labels": torch.randint(classes, (n,), generator=g),
        "student_scores": randn(n, 1),
        "teacher_scores": randn(n, 1),
        "targets": randn(n),
        "student_cls": randn(n, layers - 1, width),
        "teacher_cls": randn(n, layers - 1, width),
        "student_hidden": randn(n, layers, length, width),
        "teacher_hidden": randn(n, layers, length, teacher_width),
        "student_ig": randn(n, classes, length, width),
        "teacher_ig": randn(n, classes, length, width),
        "student_grads": randn(n, length, width),
        "teacher_grads": randn(n, length, width),
    }
    inputs["student_maps"] = attribution_map(inputs["student_ig"], mask)
    inputs["teacher_maps"] = attribution_map(inputs["teacher_ig"], mask, SHAPES["top_k"])
    return inputs


def _relation_cases() -> list[dict]:
    """CKD cases: each pair form alone (the window does not touch it), then per window the
    angles alone and every pair form weighted together with them."""
    args = ["student_hidden", "teacher_hidden", "mask"]
    forms = [("cosine", "paper"), ("l2", "paper"), ("l2_mean", "paper"), ("cosine", "official")]
    cases = []
    for term, windows in (("word_relation", [2, 10]), ("layer_relation", [1, None])):
        weightings = [(windows[0], 1.0, 0.0)]
        weightings += [(window, w_pair, 2.0) for window in windows for w_pair in (0.0, 0.5)]
        for (window, pair_weight, triple_weight), (kind, variant) in product(weightings, forms):
            if pair_weight == 0.0 and (kind, variant) != forms[0]:
                continue  # the angles alone: one case per window
            options = {
                "window": window,
                "pair_kind": kind,
                "pair_weight": pair_weight,
                "triple_weight": triple_weight,
                "variant": variant,
            }
            cases.append({"term": term, "args": args, "options": options})
    return cases


def golden_cases() -> list[dict]:
    """Every term and form: ``term`` (the function's name here and in ``kd``), ``args`` (input
    names, in order; ``None`` passes None) and keyword ``options``."""
    logits, scores = ["student_logits", "teacher_logits"], ["student_scores", "teacher_scores"]
    cases = [
        {"term": "task", "args": ["student_logits", "labels"], "options": {}},
        {"term": "task", "args": ["student_scores", "targets"], "options": {}},
    ]
    for form, tau in product(("kl", "soft-ce", "kl-mean"), (1.0, 4.0)):
        cases.append({"term": "logit_kd", "args": [*logits, tau], "options": {"form": form}})
    cases.append({"term": "logit_kd", "args": [*scores, 2.0], "options": {"form": "kl"}})
    for reduction in ("paper", "official"):
        cases.append(
            {
                "term": "patient",
                "args": ["student_cls", "teacher_cls"],
                "options": {"reduction": reduction},
            }
        )
    cases += _relation_cases()
    maps = ["student_maps", "teacher_maps"]
    for reduction in ("paper", "squared", "official"):
        cases.append(
            {"term": "attribution", "args": [*maps, "mask"], "options": {"reduction": reduction}}
        )
    cases.append({"term": "attribution", "args": [*maps, None], "options": {"reduction": "paper"}})
    grads = ["student_grads", "teacher_grads"]
    cases.append({"term": "gradient_alignment", "args": [*grads, "mask"], "options": {}})
    cases.append({"term": "gradient_alignment", "args": [*grads, None], "options": {}})
    cases.append(
        {"term": "gradient_alignment", "args": ["student_cls", "teacher_cls", None], "options": {}}
    )
    return cases


def case_name(case: dict) -> str:
    """A readable id: the term, its input names and options."""
    parts = [case["term"], *(str(a) for a in case["args"])]
    parts += [f"{k}={v}" for k, v in case["options"].items()]
    return " ".join(parts)


def case_arguments(case: dict, inputs: dict[str, Tensor]) -> list:
    """The positional arguments of ``case``: input names become tensors, numbers stay."""
    return [inputs[a] if isinstance(a, str) else a for a in case["args"]]


REFERENCE = {
    "task": task_loss,
    "logit_kd": logit_kd_loss,
    "patient": patient_loss,
    "word_relation": word_relation_loss,
    "layer_relation": layer_relation_loss,
    "attribution": attribution_loss,
    "gradient_alignment": gradient_alignment_loss,
}


def input_checksums(inputs: dict[str, Tensor]) -> dict[str, list[float]]:
    """``[Σx, Σx²]`` of each input, stored so that a change of the random stream is named."""
    return {
        name: [float(x.double().sum()), float(x.double().pow(2).sum())]
        for name, x in inputs.items()
    }


def golden_values() -> dict:
    """The fixture's content: seed, shapes, input checksums and one value per case."""
    inputs = golden_inputs()
    values = {}
    for case in golden_cases():
        value = REFERENCE[case["term"]](*case_arguments(case, inputs), **case["options"])
        values[case_name(case)] = float(value)
    return {
        "seed": SEED,
        "shapes": SHAPES,
        "dtype": "float64",
        "inputs": input_checksums(inputs),
        "values": values,
    }


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(golden_values(), indent=1) + "\n")
    print(f"wrote {len(golden_cases())} reference values to {FIXTURE}")
