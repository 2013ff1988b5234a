"""On a CUDA GPU (skipped where there is none): each method's objective gives the CPU's loss and
gradients there, students train in every precision, and ``kdw benchmark --device cuda`` times
float32 and bfloat16 between CUDA events, predicting what the CPU predicts."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from kd.cli import main
from kd.methods.config import ObjectiveConfig
from kd.methods.gkd import gradient_kd, prepare_gradient_student
from kd.methods.objective import Objective
from kd.methods.students import cut_student
from tests.conftest import (
    TEXTS_WITHOUT_PUNCTUATION,
    tiny_model,
    word_batches,
    write_tiny_workspace,
)
from tests.tiny_families import save_family_model
from workbench.analysis.agreement import pearson_per_example, rank_correlation
from workbench.analysis.attribution.chunking import batch_token_limit, bytes_per_token
from workbench.analysis.benchmark import TIMER_CUDA, benchmark
from workbench.analysis.settings import BenchmarkSettings
from workbench.core.data import (
    EncodedSplit,
    batches,
    to_device,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

METHODS = ("kd", "pkd-skip", "ckd", "adkd", "gkd", "gkd-cls")


def _batch(count: int = 6) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = [
        [2, *torch.randint(5, 40, (int(n),), generator=generator).tolist(), 3]
        for n in torch.randint(2, 9, (count,), generator=generator)
    ]
    labels = torch.randint(0, 3, (count,), generator=generator)
    split = EncodedSplit(ids, [[0] * len(i) for i in ids], labels, 0)
    return next(batches(split, list(range(count)), count, 0))


def _loss_and_gradients(
    method: str, device: str, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The objective's loss and the student's gradients (float64 on the CPU) for one batch on
    ``device`` in ``dtype``: a 4-layer teacher, a 2-layer student cut from it (dropout off, so
    that both devices compute one function)."""
    teacher = tiny_model(layers=4).requires_grad_(False).eval().to(dtype)
    student = cut_student(teacher, [1, 3]).to(dtype).eval()
    objective = Objective.resolve(ObjectiveConfig(preset=method), 4, 2, num_labels=3)
    if gradient_kd(objective):
        prepare_gradient_student(teacher, student)
        student.eval()
    teacher, student = teacher.to(device), student.to(device)
    batch = {name: value.to(device) for name, value in _batch().items()}
    loss = objective(student, batch, objective.teacher_batch(teacher, batch))["loss"]
    loss.backward()
    grads = {n: p.grad.cpu().double() for n, p in student.named_parameters() if p.grad is not None}
    return loss.detach().cpu().double(), grads


@pytest.mark.parametrize("method", METHODS)
def test_every_method_gives_the_cpus_loss_and_gradients_on_cuda(method):
    """Float32 on CUDA and on the CPU against float64 on the CPU: the loss to 1e-4, each
    parameter's gradient to 0.5 % of its largest entry (CKD's window angles of nearly equal
    states carry float32 errors of about 0.2 % on either device)."""
    exact_loss, exact = _loss_and_gradients(method, "cpu", torch.float64)
    for device in ("cpu", "cuda"):
        loss, grads = _loss_and_gradients(method, device)
        torch.testing.assert_close(loss, exact_loss, rtol=1e-4, atol=1e-7)
        assert grads.keys() == exact.keys() and grads
        for name, grad in exact.items():
            torch.testing.assert_close(
                grads[name],
                grad,
                rtol=0,
                atol=max(5e-3 * grad.abs().max().item(), 1e-7),
                msg=lambda m, name=name, device=device: f"{device} {name}: {m}",
            )


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A tiny teacher trained on CUDA, and the options its students share."""
    root = tmp_path_factory.mktemp("gpu")
    write_tiny_workspace(root)
    common = f"--task {root / 'task'} --max-length 16 --batch-size 8 --device cuda".split()
    common += ["--learning-rate", "2e-3", "--checkpoint-every", "1000"]
    teacher = root / "teacher"
    teach = f"train-teacher --run-dir {teacher} --model {root / 'tiny-bert'} --epochs 3".split()
    assert main([*teach, *common]) == 0
    return teacher, common


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("method", ["kd", "adkd", "gkd"])
def test_students_train_on_cuda_in_every_precision(teacher_run, method, precision):
    teacher, common = teacher_run
    run = teacher.parent / f"{method}-{precision}"
    distil = f"distill --run-dir {run} --teacher {teacher} --preset {method} --epochs 1".split()
    assert main([*distil, "--num-layers", "2", "--precision", precision, *common]) == 0
    optim = json.loads((run / "run.json").read_text())["configs"]["optim"]
    assert optim.get("precision", "fp32") == precision
    test = json.loads((run / "results.json").read_text())["test"]
    assert math.isfinite(test["probability_loyalty"]) and 0.0 <= test["accuracy"] <= 1.0


def test_a_narrower_student_learns_patient_kd_through_its_projection_on_cuda(teacher_run):
    teacher, common = teacher_run
    run = teacher.parent / "pkd-narrow"
    distil = f"distill --run-dir {run} --teacher {teacher} --preset pkd-skip --epochs 1".split()
    narrow = ["--init", "random", "--num-layers", "2", "--hidden-size", "8", "--num-heads", "2"]
    assert main([*distil, *narrow, "--precision", "bf16", *common]) == 0
    record = json.loads((run / "run.json").read_text())["resolved"]["objective"]
    assert record["pkd_projection"] == {"student": 8, "teacher": 16}
    saved = torch.load(run / "checkpoint.pt", weights_only=True)["objective"]["pkd.weight"]
    assert (saved.shape == (16, 8) and saved.device.type == "cpu") or saved.is_cuda
    test = json.loads((run / "results.json").read_text())["test"]
    assert math.isfinite(test["probability_loyalty"])


def test_benchmark_times_fp32_and_bf16_between_cuda_events(teacher_run):
    teacher, _ = teacher_run
    settings = BenchmarkSettings(examples=40, batch_sizes="1,8", warmup=1, repeats=2)
    on_cpu = benchmark([str(teacher)], settings)
    on_gpu = benchmark([str(teacher)], dataclasses.replace(settings, device="cuda"))
    assert on_gpu["settings"]["timer"] == TIMER_CUDA
    assert on_gpu["machine"]["cuda"] == torch.cuda.get_device_name()
    fp32, bf16 = on_gpu["rows"]
    assert (fp32["engine"], bf16["engine"]) == ("pytorch fp32", "pytorch bf16")
    assert fp32["accuracy"] == pytest.approx(on_cpu["rows"][0]["accuracy"])
    assert fp32["peak_memory_mb"] > 0 and bf16["peak_memory_mb"] > 0
    assert bf16["latency_ms_median"] > 0 and bf16["throughput_b8"] > 0
    assert bf16["label_loyalty"] >= 0.8


def test_attribution_chunks_fill_half_the_free_gpu_memory():
    """Without a budget, IG's chunks on a GPU are sized to half its free memory (on the CPU,
    to 1 GiB): a BERT-base-wide double backward then runs whole batches, not one row at a time."""
    model = tiny_model(layers=4)
    cpu = batch_token_limit(model, 128, 3, True, None, None)
    assert cpu == 1024 * 2**20 // bytes_per_token(model, 128, 3, True)
    model.cuda()
    free, _ = torch.cuda.mem_get_info()
    expected = free / 2 // bytes_per_token(model, 128, 3, True)
    assert batch_token_limit(model, 128, 3, True, None, None) == pytest.approx(expected, rel=0.05)
    assert batch_token_limit(model, 128, 3, True, None, 1024.0) == cpu  # a budget given is kept


def test_map_correlations_take_maps_on_the_gpu_and_answer_there():
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 4, 3, 9, generator=generator)  # [B, V, L] maps of two models
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[1, 5:] = 0
    for correlation in (pearson_per_example, rank_correlation):
        on_cpu = correlation(a, b, mask)
        on_gpu = correlation(a.cuda(), b.cuda(), mask.cuda())
        assert on_gpu.device.type == "cuda" and on_gpu.shape == (4, 3)
        torch.testing.assert_close(on_gpu.cpu(), on_cpu, equal_nan=True)


@pytest.mark.parametrize("method", ["adkd", "ckd", "gkd"])
def test_methods_on_words_give_the_cpus_loss_on_cuda(method, two_tokenizers):
    """A teacher and a student of different tokenizers compared on their shared words: the
    word pooling, masks and the teacher's word-level fields give the CPU's loss on CUDA."""
    teacher, student = (m.model.eval() for m in two_tokenizers)
    objective = Objective.resolve(ObjectiveConfig(preset=method), 4, 4, num_labels=3, words=True)
    _, batches = word_batches(*two_tokenizers, list(TEXTS_WITHOUT_PUNCTUATION))
    losses = []
    for device in ("cpu", "cuda"):
        on = {side: to_device(batch, device) for side, batch in batches.items()}
        fields = objective.teacher_batch(teacher.to(device), on["teacher"])
        losses.append(float(objective(student.to(device), on["student"], fields)["loss"]))
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)


def test_a_decoder_classifier_teaches_another_tokenizer_on_cuda(tmp_path):
    """A Qwen2 classifier (byte-level BPE) distils a BERT student (WordPiece) with AD-KD, CKD
    and GKD on CUDA, on the words both tokenisations share."""
    write_tiny_workspace(tmp_path)
    labels = ["negative", "neutral", "positive"]
    teacher = save_family_model("qwen2", tmp_path / "qwen2", labels)
    student = save_family_model("bert", tmp_path / "bert", labels)
    for preset in ("adkd", "ckd", "gkd"):
        run = tmp_path / preset
        command = ["distill", "--run-dir", str(run), "--teacher", str(teacher)]
        command += ["--task", str(tmp_path / "task"), "--init", "pretrained"]
        command += ["--pretrained", str(student), "--preset", preset, "--device", "cuda"]
        assert main([*command, "--max-length", "16", "--batch-size", "8", "--epochs", "1"]) == 0
        words = json.loads((run / "manifest.json").read_text())["word_alignment"]["train"]
        assert words["words"] > 0
        assert math.isfinite(json.loads((run / "results.json").read_text())["test"]["accuracy"])
