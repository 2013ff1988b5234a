"""What a student buys: size, memory, latency and throughput of models beside their accuracy
and their loyalty to the first model (``kdw benchmark``; docs/deployment.md, "Measuring").

The first model is the reference of every ratio and of loyalty. PyTorch models and ONNX exports
sit in one table; all run in one process, interleaved round-robin per round, with tokenisation
timed apart and batches on the device before the clock starts (CUDA events on a GPU, the wall
clock on the CPU; each precision asked for on CUDA).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from workbench.analysis.deployment import (
    OnnxClassifier,
    graph_parameters,
    is_onnx_export,
    load_onnx,
)
from workbench.analysis.evaluation import evaluate_logits, logits_in_order
from workbench.analysis.settings import BenchmarkSettings, parse_batch_sizes, parse_precisions
from workbench.core.config import DataConfig
from workbench.core.data import (
    EncodedSplit,
    Split,
    TaskData,
    batches,
    encode,
    load_task,
    pad_id,
    sample_split,
    to_device,
)
from workbench.core.errors import WorkbenchError
from workbench.core.machine import check_bf16, describe, machine
from workbench.core.models import (
    LoadedModel,
    forward,
    is_run,
    load_for_task,
    resolve_device,
    resolve_model,
)
from workbench.core.runs import task_beside

MEMORY_CPU = (
    "peak resident-set growth of the process over one pass of the texts at the largest batch "
    "size, each model's first after a one-text pass that loads its libraries (Linux VmHWM reset "
    "through /proc/self/clear_refs, glibc's free memory returned by malloc_trim before)"
)
MEMORY_CUDA = (
    "torch.cuda.max_memory_allocated above the memory allocated before one pass of the texts "
    "at the largest batch size"
)
WEIGHT_FILES = ("*.safetensors", "*.bin")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TIMER_CUDA = "CUDA events around each batch's forward pass (the GPU's clock)"
TIMER_CPU = "the wall clock (time.perf_counter) around each batch's forward pass"


@dataclass
class Candidate:
    """One model as the benchmark runs it: ``run`` maps a padded batch on ``device`` (tensors
    ``[B, L]``) to logits ``[B, C]`` on ``device``; ``disk_mb`` is None where the weights are not
    in a local folder (a hub id)."""

    name: str
    engine: str  # "pytorch fp32", "pytorch bf16", "onnx fp32", "onnx int8"
    source: str
    device: torch.device
    tokenizer: PreTrainedTokenizerBase
    max_length: int
    parameters: int
    disk_mb: float | None
    run: Callable[[dict[str, Tensor]], Tensor]


def pytorch_candidates(
    loaded: LoadedModel, device: torch.device, precisions: Sequence[str]
) -> list[Candidate]:
    """A PyTorch classifier on ``device``, once per precision (each but the last a copy of the
    loaded weights cast to it, the last the loaded weights cast in place); its weights on disk
    are its folder's safetensors (or ``.bin``) files, as saved."""
    folder = loaded.run.model_dir if loaded.run else Path(resolve_model(loaded.source))
    files = [file for pattern in WEIGHT_FILES for file in folder.glob(pattern)]  # none: no folder
    disk_mb = sum(file.stat().st_size for file in files) / 1e6 if files else None
    candidates = []
    for index, precision in enumerate(precisions):
        weights = loaded.model if index == len(precisions) - 1 else copy.deepcopy(loaded.model)
        model = weights.to(device=device, dtype=DTYPES[precision]).eval()
        candidates.append(
            Candidate(
                loaded.name,
                f"pytorch {precision}",
                loaded.source,
                device,
                loaded.tokenizer,
                loaded.max_length,
                sum(p.numel() for p in model.parameters()),
                disk_mb,
                lambda batch, model=model: forward(model, batch).logits,
            )
        )
    return candidates


def onnx_candidate(classifier: OnnxClassifier) -> Candidate:
    """An exported graph run by ONNX Runtime; its weights on disk are the ``.onnx`` file."""
    return Candidate(
        classifier.name,
        f"onnx {classifier.precision}",
        str(classifier.path),
        torch.device("cpu"),
        classifier.tokenizer,
        classifier.data.max_length,
        graph_parameters(classifier.path),
        classifier.path.stat().st_size / 1e6,
        classifier,
    )


def load_candidates(
    sources: Sequence[str],
    data: DataConfig | None,
    device: torch.device,
    threads: int,
    precisions: Sequence[str] = ("fp32",),
    notify: Callable[[str], None] | None = None,
) -> tuple[list[Candidate], TaskData]:
    """The models of ``sources`` (an ONNX export gives one per graph, a PyTorch model one per
    precision) and the task every one is scored on: ``data``'s, else the first model's own
    (:func:`task_beside` for a model that is not a run)."""
    candidates: list[Candidate] = []
    task: TaskData | None = None
    for source in sources:
        if is_onnx_export(source):
            if device.type != "cpu":
                raise WorkbenchError(
                    f"{source} is an ONNX graph, run by ONNX Runtime on the CPU only: "
                    "benchmark it with --device cpu"
                )
            classifiers = load_onnx(source, data, threads)
            task = task or load_task(classifiers[0].data)
            candidates += [onnx_candidate(classifier) for classifier in classifiers]
            data = data or classifiers[0].data
            continue
        mapping = ""
        if data is None and not is_run(source) and (beside := task_beside(source, sources, notify)):
            data, mapping = beside  # a model beside a run: the run's task and settings
        loaded, loaded_task = load_for_task(source, data, mapping)
        task = task or loaded_task
        data = data or loaded.data
        candidates += pytorch_candidates(loaded, device, precisions)
    assert task is not None, "no models"
    return candidates, task


def _status_mb(field: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    raise KeyError(field)


def peak_memory_mb(step: Callable[[], object], device: torch.device) -> float | None:
    """The memory ``step`` needs above what is held before it, in MB (:data:`MEMORY_CPU`,
    :data:`MEMORY_CUDA`); None on a CPU system without Linux's ``/proc`` counters."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 1e6
    with contextlib.suppress(OSError, AttributeError):  # freed memory returned; not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = _status_mb("VmRSS")
    except (OSError, KeyError):
        step()
        return None
    step()
    return max(_status_mb("VmHWM") - before, 0.0)


def time_step(step: Callable[[], object], device: torch.device) -> float:
    """Seconds ``step`` takes: on CUDA between two events on the current stream, read once the GPU
    has done the work ``step`` launched; elsewhere by the wall clock."""
    if device.type != "cuda":
        start = time.perf_counter()
        step()
        return time.perf_counter() - start
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    step()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3


def _ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


@dataclass
class Measured:
    """What :func:`measure` found: the texts' labels ``[N]`` as encoded, and per model (in
    order) its peak memory (MB), its logits ``[N, C]``, the seconds to tokenise the texts per
    timed round, and per batch size the seconds of each batch per timed round."""

    labels: Tensor
    memory: list[float]
    logits: list[Tensor]
    tokenise_s: list[list[float]]
    timed: list[dict[int, list[list[float]]]]


def measure(
    candidates: Sequence[Candidate],
    part: Split,
    regression: bool,
    sizes: list[int],
    settings: BenchmarkSettings,
    device: torch.device,
) -> Measured:
    """Time ``candidates`` on the texts ``part``, interleaved round by round (the first
    ``settings.warmup`` rounds untimed): tokenisation, and forward passes at each batch size
    over batches collated once; their peak memory at the largest size and their logits."""

    def tokenise(candidate: Candidate) -> EncodedSplit:
        return encode(part, candidate.tokenizer, candidate.max_length, regression)

    encoded = [tokenise(c) for c in candidates]
    padded = [  # batches in the split's order, collated once: only the forward pass is timed
        {
            b: [
                to_device(batch, c.device)
                for batch in batches(e, range(len(e)), b, pad_id(c.tokenizer))
            ]
            for b in sizes
        }
        for c, e in zip(candidates, encoded, strict=True)
    ]

    def pass_over(index: int, size: int) -> list[float]:
        run, on = candidates[index].run, candidates[index].device
        return [time_step(lambda batch=batch: run(batch), on) for batch in padded[index][size]]

    tokenise_s, timed = [[] for _ in candidates], [{b: [] for b in sizes} for _ in candidates]
    with torch.inference_mode():
        for candidate, these in zip(candidates, padded, strict=True):
            candidate.run(these[sizes[0]][0])  # one-time initialisation outside the measures
        memory = [
            peak_memory_mb(lambda i=i: pass_over(i, sizes[-1]), device)
            for i in range(len(candidates))
        ]
        logits = [
            logits_in_order(
                lambda batch, c=c: c.run(to_device(batch, c.device)).float().cpu(),
                e,
                sizes[-1],
                pad_id(c.tokenizer),
            )
            for c, e in zip(candidates, encoded, strict=True)
        ]
        for round_ in range(settings.warmup + settings.repeats):
            for index, candidate in enumerate(candidates):
                elapsed = time_step(lambda c=candidate: tokenise(c), torch.device("cpu"))
                runs = {b: pass_over(index, b) for b in sizes}
                if round_ >= settings.warmup:
                    tokenise_s[index].append(elapsed)
                    for b in sizes:
                        timed[index][b].append(runs[b])
    return Measured(encoded[0].labels, memory, logits, tokenise_s, timed)


def _row(candidate: Candidate, found: Measured, index: int, sizes: list[int], texts: int) -> dict:
    """A model's measured numbers (:func:`benchmark`'s row before ratios and metrics)."""
    row: dict = {
        "name": candidate.name,
        "engine": candidate.engine,
        "source": candidate.source,
        "parameters": candidate.parameters,
        "disk_mb": candidate.disk_mb,
        "peak_memory_mb": found.memory[index],
        "tokenize_ms_per_text": statistics.median(found.tokenise_s[index]) / texts * 1e3,
    }
    if 1 in sizes:
        single = np.array([s for round_ in found.timed[index][1] for s in round_]) * 1e3
        row["latency_ms_median"] = float(np.median(single))
        row["latency_ms_p95"] = float(np.percentile(single, 95))
    for b in sizes[1:]:
        seconds = statistics.median(sum(round_) for round_ in found.timed[index][b])
        row[f"throughput_b{b}"] = texts / seconds
    return row


def benchmark(
    sources: Sequence[str],
    settings: BenchmarkSettings,
    data: DataConfig | None = None,
    notify: Callable[[str], None] | None = None,
) -> dict:
    """Benchmark ``sources`` (the first is the reference) on ``settings.split`` of their task.

    Returns ``{"reference", "settings", "memory_method", "machine", "rows"}``, one row per
    model: ``parameters``, ``disk_mb`` (weight files), ``peak_memory_mb``,
    ``tokenize_ms_per_text`` (median over rounds), ``latency_ms_median`` and
    ``latency_ms_p95`` (batch size 1, over every text of every timed round),
    ``throughput_bN`` (examples/s at batch size N > 1: the texts over the median round's
    seconds), each number with its ``…_ratio`` to the first model's, ``max_length`` (the tokens
    it reads per text), then the task metrics and ``label_loyalty``/``probability_loyalty`` to
    the first model (1.0 for itself)."""
    sizes = parse_batch_sizes(settings.batch_sizes)
    device = resolve_device(settings.device)
    precisions = parse_precisions(settings.precisions, device.type)
    if "bf16" in precisions and notify is not None:
        check_bf16(device.type, "--precisions bf16", notify)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    threads = torch.get_num_threads()
    candidates, task = load_candidates(sources, data, device, threads, precisions, notify)
    if settings.split not in task.splits:
        raise WorkbenchError(f"split {settings.split!r} not in {sorted(task.splits)}")
    seed = (data or DataConfig()).split_seed
    part = sample_split(task.splits[settings.split], settings.examples or None, seed, exact=True)
    found = measure(candidates, part, task.spec.regression, sizes, settings, device)
    rows = [_row(c, found, i, sizes, len(part)) for i, c in enumerate(candidates)]
    measured = [key for key in rows[0] if key not in ("name", "engine", "source")]
    for row, candidate, these in zip(rows, candidates, found.logits, strict=True):
        row["max_length"] = candidate.max_length
        row |= {f"{key}_ratio": _ratio(row[key], rows[0][key]) for key in measured}
        row |= evaluate_logits(task.spec, these, found.labels, found.logits[0])
    metric = task.spec.metrics[0]
    for row in rows[1:]:  # a model that scores above the reference (the teacher, given first)
        if notify is not None and row[metric] > rows[0][metric]:
            notify(
                f"{row['name']} scores {row[metric]:.4f} {metric}, above the first model, "
                f"{rows[0]['name']} ({rows[0][metric]:.4f}): as a teacher, it teaches less "
                "than the labels do"
            )
    return {
        "reference": candidates[0].name,
        "settings": {
            "task": task.spec.name,
            "metrics": list(task.spec.metrics),
            "split": settings.split,
            "examples": len(part),
            "batch_sizes": list(sizes),
            "warmup": settings.warmup,
            "repeats": settings.repeats,
            "threads": threads,
            "device": str(device),
            "precisions": list(precisions),
            "timer": TIMER_CUDA if device.type == "cuda" else TIMER_CPU,
        },
        "memory_method": MEMORY_CUDA if device.type == "cuda" else MEMORY_CPU,
        "machine": machine()
        | {"cuda": torch.cuda.get_device_name(device) if device.type == "cuda" else None},
        "rows": rows,
    }


def _cell(value: float | None, ratio: float | None = None, form: str = "{:.3g}") -> str:
    if value is None:
        return "–"
    text = f"{value:,.0f}" if value >= 1000 else form.format(value)
    return text if ratio is None else f"{text} ({ratio:.2f}×)"


def _lengths_note(rows: Sequence[dict]) -> str:
    """A line saying so when the models read the texts at different lengths (a run or an export
    at its own, a plain model at ``--max-length``): a text longer than one model's length is
    cut for that model alone, which can change its answer."""
    lengths = {row["name"]: row["max_length"] for row in rows}
    if len(set(lengths.values())) == 1:
        return ""
    said = ", ".join(f"{name} {length}" for name, length in lengths.items())
    return (
        f"tokens read per text: {said} (a run or an export reads at its own length): a text "
        "longer than a model's length is cut for that model alone, which can change its answer\n"
    )


def format_benchmark(report: dict) -> str:
    """:func:`benchmark`'s report as a header (settings, reference, memory method) and a
    markdown table, each measured value followed by its ratio to the first model, then the
    task's metrics and loyalty (the rows' per-class recalls are in the JSON only)."""
    settings = report["settings"]
    rows = report["rows"]
    metrics = [*settings["metrics"], "label_loyalty", "probability_loyalty"]
    timing = [
        key
        for key in rows[0]
        if key.startswith(("latency", "throughput")) and not key.endswith("_ratio")
    ]
    columns = {
        "model": lambda r: r["name"],
        "engine": lambda r: r["engine"],
        "params (M)": lambda r: _cell(r["parameters"] / 1e6, r["parameters_ratio"]),
        "disk MB": lambda r: _cell(r["disk_mb"], r["disk_mb_ratio"]),
        "peak MB": lambda r: _cell(r["peak_memory_mb"], r["peak_memory_mb_ratio"]),
        "tokenise ms/text": lambda r: _cell(r["tokenize_ms_per_text"]),
        **{
            key.replace("latency_ms_", "latency ms ").replace("throughput_b", "examples/s @"): (
                lambda r, key=key: _cell(r[key], r[f"{key}_ratio"])
            )
            for key in timing
        },
        **{key: (lambda r, key=key: _cell(r.get(key), form="{:.4f}")) for key in metrics},
    }
    header = (
        f"{settings['task']} {settings['split']}: {settings['examples']} texts, batch sizes "
        f"{','.join(map(str, settings['batch_sizes']))}, {settings['warmup']} warm-up and "
        f"{settings['repeats']} timed rounds (round-robin over models), {settings['threads']} "
        f"threads, {settings['device']}, timed by {settings['timer']}\n"
        f"reference (ratios, loyalty): the first model, {report['reference']}\n"
        f"peak memory: {report['memory_method']}\n"
        f"machine: {describe(report['machine'])}\n{_lengths_note(rows)}"
    )
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row) for cell in columns.values()) + " |" for row in rows]
    return header + "\n" + "\n".join(lines)
