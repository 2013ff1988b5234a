"""Contextual KD terms against explicit loops, plus invariances, padding and degenerate inputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kd.methods.ckd import layer_relation_loss, word_relation_loss
from workbench.analysis.relation_geometry import pairwise_distance_relation, windowed_angle_relation

DT = torch.float64


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mask(lengths: list[int], length: int) -> torch.Tensor:
    return torch.tensor([[1] * n + [0] * (length - n) for n in lengths], dtype=torch.long)


# ---------------------------------------------------------------- direct (loop) references


def _cos(u: torch.Tensor, v: torch.Tensor) -> float:
    nu, nv = u.norm().item(), v.norm().item()
    return 0.0 if nu == 0 or nv == 0 else (u @ v).item() / (nu * nv)


def _direct_pairs(h: torch.Tensor, m: list[int], kind: str) -> dict[tuple[int, int], float]:
    """ψ_P over valid pairs of one sequence ``h [S, d]``, by explicit loops."""
    out = {}
    for i in range(len(m)):
        for j in range(len(m)):
            if m[i] and m[j] and i != j:
                if kind == "cosine":
                    out[i, j] = 1.0 - _cos(h[i], h[j])
                else:
                    out[i, j] = (h[i] - h[j]).norm().item()
    if kind == "l2_mean" and out:
        mean = sum(out.values()) / len(out)
        out = {key: value / mean for key, value in out.items()}
    return out


def _direct_triples(h: torch.Tensor, m: list[int], delta: int) -> dict[tuple, float]:
    """ψ_T over all triples of one sequence, window applied explicitly."""
    size = len(m)
    out = {}
    for i in range(size):
        for j in range(size):
            for k in range(size):
                inside = abs(i - j) <= delta and abs(i - k) <= delta
                if m[i] and m[j] and m[k] and j != i and k != i and inside:
                    out[i, j, k] = _cos(h[j] - h[i], h[k] - h[i])
    return out


def _direct_official_rows(hs, ht, m) -> float:
    """Released pair term of one sequence: Σ_rows KL(softmax(cos_t) ‖ softmax(cos_s))."""
    total = 0.0
    for i in range(len(m)):
        js = [j for j in range(len(m)) if m[i] and m[j] and j != i]
        if not js:
            continue
        cs = torch.tensor([_cos(hs[i], hs[j]) for j in js], dtype=DT)
        ct = torch.tensor([_cos(ht[i], ht[j]) for j in js], dtype=DT)
        p, log_p, log_q = ct.softmax(0), ct.log_softmax(0), cs.log_softmax(0)
        total += (p * (log_p - log_q)).sum().item()
    return total


def _direct_loss(sequences, delta, kind="cosine", variant="paper", wp=1.0, wt=1.0) -> float:
    """Pooled pair and triple losses over ``(student [S, d_s], teacher [S, d_t], mask)``."""
    pair_sum = pair_n = triple_sum = triple_n = 0.0
    for hs, ht, m in sequences:
        if variant == "official":
            pair_sum += _direct_official_rows(hs, ht, m)
            pair_n += sum(m) ** 2
        else:
            ps, pt = _direct_pairs(hs, m, kind), _direct_pairs(ht, m, kind)
            pair_sum += sum((ps[key] - pt[key]) ** 2 for key in ps)
            pair_n += len(ps)
        ts, tt = _direct_triples(hs, m, delta), _direct_triples(ht, m, delta)
        triple_sum += sum((ts[key] - tt[key]) ** 2 for key in ts)
        triple_n += len(ts)
    return wp * pair_sum / max(pair_n, 1) + wt * triple_sum / max(triple_n, 1)


def _word_sequences(student, teacher, mask):
    """WR: one sequence per (example, layer). student ``[B, K, L, d]``."""
    return [
        (student[b, k], teacher[b, k], mask[b].tolist())
        for b in range(student.shape[0])
        for k in range(student.shape[1])
    ]


def _layer_sequences(student, teacher, mask):
    """LTR: one sequence of K layers per real token."""
    layers = student.shape[1]
    return [
        (student[b, :, i], teacher[b, :, i], [1] * layers)
        for b in range(student.shape[0])
        for i in range(student.shape[2])
        if mask[b, i]
    ]


# ---------------------------------------------------------------- building blocks


@pytest.mark.parametrize("kind", ["cosine", "l2", "l2_mean"])
def test_pair_relation_matches_loops(kind):
    h = torch.randn(3, 6, 5, dtype=DT, generator=_gen(1))
    mask = _mask([6, 4, 1], 6)
    relation, valid = pairwise_distance_relation(h, mask, kind)
    assert relation.shape == valid.shape == (3, 6, 6)
    for n in range(3):
        direct = _direct_pairs(h[n], mask[n].tolist(), kind)
        assert {tuple(ij) for ij in valid[n].nonzero().tolist()} == set(direct)
        for (i, j), value in direct.items():
            assert relation[n, i, j].item() == pytest.approx(value, abs=1e-9)
    assert relation[~valid].abs().sum().item() == 0.0


@pytest.mark.parametrize("delta", [1, 2, 7])
def test_windowed_angles_match_loops(delta):
    h = torch.randn(2, 7, 4, dtype=DT, generator=_gen(2))
    mask = _mask([7, 5], 7)
    angles, valid = windowed_angle_relation(h, mask, delta)
    width = 2 * delta + 1
    assert angles.shape == valid.shape == (2, 7, width, width)
    for n in range(2):
        direct = _direct_triples(h[n], mask[n].tolist(), delta)
        banded = {(i, i + a - delta, i + b - delta) for i, a, b in valid[n].nonzero().tolist()}
        assert banded == set(direct)
        for (i, j, k), value in direct.items():
            entry = angles[n, i, j - i + delta, k - i + delta].item()
            assert entry == pytest.approx(value, abs=1e-9)
    assert angles[~valid].abs().sum().item() == 0.0


def test_windowed_angles_stay_banded_for_long_sequences():
    """L=256, d=64, δ=5: the relation is [B, L, 11, 11] and no tensor saved for backward is
    larger than the band of difference vectors, B·L·W·d (a dense triple tensor would be
    B·L³ = 33.5M entries for B=2)."""
    batch, length, dim, delta = 2, 256, 64, 5
    width = 2 * delta + 1
    h = torch.randn(batch, length, dim, requires_grad=True)
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        angles, valid = windowed_angle_relation(h, torch.ones(batch, length), delta)
    assert angles.shape == valid.shape == (batch, length, width, width)
    assert max(sizes) <= batch * length * width * dim
    angles.sum().backward()
    assert torch.isfinite(h.grad).all()


# ---------------------------------------------------------------- losses vs direct


@pytest.mark.parametrize("kind", ["cosine", "l2", "l2_mean"])
@pytest.mark.parametrize("delta", [1, 3])
def test_word_relation_paper_matches_direct(kind, delta):
    g = _gen(3)
    student = torch.randn(2, 2, 7, 5, dtype=DT, generator=g)
    teacher = torch.randn(2, 2, 7, 8, dtype=DT, generator=g)
    mask = _mask([7, 4], 7)
    loss = word_relation_loss(
        student, teacher, mask, window=delta, pair_kind=kind, pair_weight=0.7, triple_weight=2.0
    )
    direct = _direct_loss(_word_sequences(student, teacher, mask), delta, kind, wp=0.7, wt=2.0)
    assert loss.item() == pytest.approx(direct, abs=1e-5)


def test_word_relation_official_matches_direct():
    g = _gen(4)
    student = torch.randn(3, 2, 6, 5, dtype=DT, generator=g)
    teacher = torch.randn(3, 2, 6, 9, dtype=DT, generator=g)
    mask = _mask([6, 3, 0], 6)
    loss = word_relation_loss(student, teacher, mask, window=2, variant="official")
    direct = _direct_loss(_word_sequences(student, teacher, mask), 2, variant="official")
    assert loss.item() == pytest.approx(direct, abs=1e-5)


def test_word_relation_layer_conventions_agree():
    """[B, L, d] is one layer; [B, K, L, d] and a list of K layers give the mean over layers."""
    g = _gen(5)
    student = torch.randn(2, 3, 6, 4, dtype=DT, generator=g)
    teacher = torch.randn(2, 3, 6, 7, dtype=DT, generator=g)
    mask = _mask([6, 5], 6)
    stacked = word_relation_loss(student, teacher, mask, window=2)
    listed = word_relation_loss(list(student.unbind(1)), list(teacher.unbind(1)), mask, window=2)
    per_layer = [word_relation_loss(student[:, k], teacher[:, k], mask, window=2) for k in range(3)]
    assert stacked.item() == pytest.approx(listed.item(), abs=1e-12)
    assert stacked.item() == pytest.approx(sum(x.item() for x in per_layer) / 3, abs=1e-12)


@pytest.mark.parametrize(
    ("variant", "kind", "delta"),
    [
        ("paper", "cosine", None),
        ("paper", "l2", 1),
        ("paper", "l2_mean", None),
        ("official", "cosine", None),
    ],
)
def test_layer_relation_matches_direct(variant, kind, delta):
    g = _gen(6)
    student = torch.randn(2, 4, 5, 3, dtype=DT, generator=g)
    teacher = torch.randn(2, 4, 5, 6, dtype=DT, generator=g)
    mask = _mask([5, 2], 5)
    loss = layer_relation_loss(
        student, teacher, mask, window=delta, pair_kind=kind, variant=variant
    )
    direct = _direct_loss(
        _layer_sequences(student, teacher, mask), delta or 3, kind, variant=variant
    )
    assert loss.item() == pytest.approx(direct, abs=1e-5)


def _naive_official_pair(student, teacher, mask):
    """The released pair term written the obvious way: −inf masking fed to kl_div."""
    m = (mask[:, :, None] * mask[:, None, :]).to(student.dtype)
    off_diagonal = ~torch.eye(mask.shape[1], dtype=torch.bool)

    def logits(h):
        u = F.normalize(h, dim=-1)
        sim = (u @ u.transpose(1, 2)) * m
        return sim.masked_fill(~off_diagonal, -math.inf).masked_fill(m == 0, -math.inf)

    log_q = F.log_softmax(logits(student), -1) * m
    p = F.softmax(logits(teacher), -1) * m
    return F.kl_div(log_q, p, reduction="sum") / m.sum()


def test_official_pair_is_nan_free_where_the_naive_one_is_not():
    g = _gen(7)
    student = torch.randn(3, 5, 4, dtype=DT, generator=g, requires_grad=True)
    teacher = torch.randn(3, 5, 6, dtype=DT, generator=g)
    mask = _mask([5, 3, 0], 5)  # pads, and an all-pad row
    naive = _naive_official_pair(student, teacher, mask)
    assert torch.isnan(naive)
    loss = word_relation_loss(student, teacher, mask, triple_weight=0.0, variant="official")
    direct = _direct_loss(
        [(student[b].detach(), teacher[b], mask[b].tolist()) for b in range(3)],
        1,
        variant="official",
        wt=0.0,
    )
    assert loss.item() == pytest.approx(direct, abs=1e-6)
    loss.backward()
    assert torch.isfinite(student.grad).all()


# ---------------------------------------------------------------- invariances


def _orthonormal_columns(rows: int, cols: int, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(rows, cols, dtype=DT, generator=_gen(seed)))
    return q  # [rows, cols] with q.T @ q = I


@pytest.mark.parametrize("width", [8, 12])
def test_rotated_scaled_student_has_zero_relation_loss(width):
    teacher = torch.randn(2, 3, 9, 8, dtype=DT, generator=_gen(8))
    student = 3.7 * teacher @ _orthonormal_columns(width, 8, 9).T  # [.., width]
    mask = _mask([9, 6], 9)
    for fn in (word_relation_loss, layer_relation_loss):
        assert fn(student, teacher, mask, window=3).item() < 1e-12
        assert fn(student, teacher, mask, pair_kind="l2_mean").item() < 1e-12
        assert fn(student, teacher, mask, variant="official").item() < 1e-12


def test_l2_pair_is_rotation_but_not_scale_invariant():
    teacher = torch.randn(2, 9, 8, dtype=DT, generator=_gen(10))
    rotated = teacher @ _orthonormal_columns(12, 8, 11).T
    mask = _mask([9, 7], 9)
    kwargs = {"pair_kind": "l2", "triple_weight": 0.0}
    assert word_relation_loss(rotated, teacher, mask, **kwargs).item() < 1e-12
    assert word_relation_loss(rotated + 5.0, teacher, mask, **kwargs).item() < 1e-12
    assert word_relation_loss(2.0 * rotated, teacher, mask, **kwargs).item() > 1e-2


# ---------------------------------------------------------------- padding, degenerate inputs


def _pad_with_garbage(x: torch.Tensor, mask: torch.Tensor, extra: int, seq_dim: int):
    shape = list(x.shape)
    shape[seq_dim] = extra
    garbage = 100 * torch.randn(*shape, dtype=x.dtype, generator=_gen(12))
    return torch.cat([x, garbage], seq_dim), F.pad(mask, (0, extra))


@pytest.mark.parametrize(
    ("fn", "options"),
    [
        (word_relation_loss, {"window": 2}),
        (word_relation_loss, {"window": 2, "pair_kind": "l2"}),
        (word_relation_loss, {"window": 2, "pair_kind": "l2_mean"}),
        (word_relation_loss, {"window": 2, "variant": "official"}),
        (layer_relation_loss, {}),
        (layer_relation_loss, {"pair_kind": "l2_mean", "variant": "paper", "window": 1}),
        (layer_relation_loss, {"variant": "official"}),
    ],
)
def test_extra_padding_changes_nothing(fn, options):
    g = _gen(13)
    student = torch.randn(2, 3, 6, 5, dtype=DT, generator=g)
    teacher = torch.randn(2, 3, 6, 7, dtype=DT, generator=g)
    mask = _mask([6, 4], 6)
    # garbage also inside the existing pads of the second example
    student[1, :, 4:] = 50.0
    before = fn(student, teacher, mask, **options)
    padded_student, padded_mask = _pad_with_garbage(student, mask, 5, seq_dim=2)
    padded_teacher, _ = _pad_with_garbage(teacher, mask, 5, seq_dim=2)
    after = fn(padded_student, padded_teacher, padded_mask, **options)
    assert after.item() == pytest.approx(before.item(), abs=1e-6)


def _degenerate_cases():
    g = _gen(14)
    base = torch.randn(3, 2, 5, 4, dtype=DT, generator=g)
    identical = base[:1, :1, :1].expand(3, 2, 5, 4).clone()
    yield "all-pad row", base.clone(), _mask([5, 3, 0], 5)
    yield "one-token sequences", base[:, :, :1].clone(), _mask([1, 1, 0], 1)
    yield "identical tokens", identical, _mask([5, 4, 5], 5)
    yield "all-zero states", torch.zeros(3, 2, 5, 4, dtype=DT), _mask([5, 2, 0], 5)


@pytest.mark.parametrize("case", list(_degenerate_cases()), ids=lambda c: c[0])
@pytest.mark.parametrize(
    "options", [{}, {"pair_kind": "l2"}, {"pair_kind": "l2_mean"}, {"variant": "official"}]
)
def test_degenerate_inputs_are_finite(case, options):
    _, states, mask = case
    random_teacher = torch.randn((*states.shape[:-1], 6), dtype=DT, generator=_gen(15))
    same_teacher = states @ torch.randn(4, 6, dtype=DT, generator=_gen(16))  # same degeneracy
    for fn in (word_relation_loss, layer_relation_loss):
        for teacher_states in (random_teacher, same_teacher):
            student = states.clone().requires_grad_(True)
            teacher = teacher_states.clone().requires_grad_(True)
            loss = fn(student, teacher, mask, window=2, **options)
            loss.backward()
            assert torch.isfinite(loss)
            assert torch.isfinite(student.grad).all()
            assert teacher.grad is None


@pytest.mark.parametrize("fn", [word_relation_loss, layer_relation_loss])
@pytest.mark.parametrize("variant", ["paper", "official"])
def test_gradient_reaches_student_only(fn, variant):
    g = _gen(16)
    student = torch.randn(2, 3, 6, 5, generator=g, requires_grad=True)
    teacher = torch.randn(2, 3, 6, 7, generator=g, requires_grad=True)
    loss = fn(student, teacher, _mask([6, 4], 6), variant=variant)
    loss.backward()
    assert student.grad is not None and student.grad.abs().sum() > 0
    assert teacher.grad is None


def test_invalid_arguments_raise():
    student, teacher = torch.randn(2, 3, 6, 5), torch.randn(2, 3, 6, 7)
    mask = torch.ones(2, 6)
    with pytest.raises(ValueError, match="variant"):
        word_relation_loss(student, teacher, mask, variant="released")
    with pytest.raises(ValueError, match="pair_kind"):
        word_relation_loss(student, teacher, mask, pair_kind="dot")
    with pytest.raises(ValueError, match="official"):
        word_relation_loss(student, teacher, mask, pair_kind="l2", variant="official")
    with pytest.raises(ValueError, match="B, K, L"):
        layer_relation_loss(student, teacher[:, :2], mask)
    with pytest.raises(ValueError, match="attention_mask"):
        word_relation_loss(student, teacher, torch.ones(2, 5))
    with pytest.raises(ValueError, match="window"):
        windowed_angle_relation(student[:, 0], mask, 0)
