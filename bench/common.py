"""Shared set-up of the benchmarks: models, a batch of tweets, timing, the results file."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import PreTrainedModel

from kd.methods.layer_map import select_layers
from kd.methods.students import cut_student
from workbench.core.config import DataConfig
from workbench.core.data import batches, encode, load_task, pad_id
from workbench.core.machine import machine
from workbench.core.models import (
    layer_count,
    load_classifier,
    load_run,
    load_tokenizer,
    quiet_library_output,
)

RESULTS = Path(__file__).parent / "results"
DEMO_TEACHER = Path("runs/demo/teacher")


def setup(threads: int = 2) -> None:
    torch.set_num_threads(threads)
    quiet_library_output()


def teacher_and_tokenizer(num_labels: int = 3) -> tuple[PreTrainedModel, object, str]:
    """The demo's fine-tuned teacher if it exists, else MiniLM-L6 with a random head."""
    if (DEMO_TEACHER / "model" / "config.json").exists():
        loaded = load_run(DEMO_TEACHER)
        return loaded.model, loaded.tokenizer, f"fine-tuned teacher {DEMO_TEACHER}"
    model = load_classifier("minilm-l6", num_labels).eval()
    return model, load_tokenizer("minilm-l6"), "MiniLM-L6 with a random classification head"


def student_from(teacher: PreTrainedModel, layers: int = 3) -> PreTrainedModel:
    return cut_student(teacher, select_layers(layer_count(teacher), layers, "skip"))


def tweet_batch(
    tokenizer, size: int, max_length: int = 128, split: str = "train", pad_to: int | None = None
) -> dict[str, torch.Tensor]:
    """``size`` tweets (a fixed sample), padded to the longest (or to ``pad_to``)."""
    data = load_task(DataConfig(task="tweets"))
    encoded = encode(data.splits[split], tokenizer, max_length)
    order = torch.randperm(len(encoded), generator=torch.Generator().manual_seed(0))[:size]
    batch = next(batches(encoded, order.tolist(), size, pad_id(tokenizer)))
    if pad_to is not None and batch["input_ids"].shape[1] < pad_to:
        extra = pad_to - batch["input_ids"].shape[1]
        for name in ("input_ids", "token_type_ids", "attention_mask"):
            value = pad_id(tokenizer) if name == "input_ids" else 0
            batch[name] = torch.nn.functional.pad(batch[name], (0, extra), value=value)
    return batch


def training_loss(objective, teacher: PreTrainedModel, student: PreTrainedModel, batch: dict):
    """The objective's terms on ``batch`` as a training step computes them: the teacher's
    cacheable fields computed once before (as the teacher cache serves them), its other fields
    (CKD's hidden states) recomputed without a graph at each call."""
    cached = objective.teacher_batch(teacher, batch, objective.cached_fields())
    cached = {name: value.detach() for name, value in cached.items()}
    live = objective.live_fields()

    def loss() -> dict:
        fields = dict(cached)
        if live:
            with torch.no_grad():
                fields |= objective.teacher_batch(teacher, batch, live)
        return objective(student, batch, fields)

    return loss


def interleaved_medians(
    steps: dict[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> dict[str, float]:
    """Median seconds of each step function, timed in interleaved rounds so that drifts in the
    machine's speed hit every configuration alike."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def portable(value: object) -> object:
    """``value`` with every absolute path in it made relative to the working folder, or
    reduced to its name when it lies outside: a results file names no folder of the machine
    it ran on."""
    if isinstance(value, dict):
        return {key: portable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [portable(item) for item in value]
    if isinstance(value, str) and os.path.isabs(value) and "\n" not in value:
        path = Path(value)
        return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else path.name
    return value


def write_results(name: str, payload: dict) -> Path:
    """``bench/results/<name>.json``: the payload, portable (:func:`portable`), after the
    machine it ran on (:func:`~workbench.core.machine.machine`)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    record = portable({"machine": machine(), **payload})
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
