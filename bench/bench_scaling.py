"""How the cost of each method grows: step time and peak memory against sequence length
(32 → 512) and number of classes (2, 3, 5), so users can see where a method stops being
affordable.

    python -m bench.bench_scaling           # lengths 32..512 at 3 classes, classes 2/3/5 at 64
    python -m bench.bench_scaling --quick   # lengths 32 and 64, kd and adkd only
    python -m bench.bench_scaling --teacher bert-base-random --device cuda --batch-size 32
    python -m bench.bench_scaling --methods kd,adkd --lengths 128,512   # a subset

Each configuration runs in its own process (by default the MiniLM-L6 teacher with a random head
and a 3-layer student cut from it; ``bert-base-random``: a randomly initialised BERT-base-sized
teacher, 12 layers of 768, and a 6-layer student, for timing where no hub is reachable; batches of
random-token sequences without padding, 2 threads): the median wall and CPU seconds of a few
training steps (CPU seconds, all threads together, move less than wall seconds when other jobs
share the machine), and the peak memory the steps add above the memory held after
set-up — on CPU the resident set (``ru_maxrss`` against ``/proc/self/statm``), on CUDA the
allocator's peak.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
from transformers import AutoModelForSequenceClassification, BertConfig, PreTrainedModel

from bench.common import setup, student_from, table, write_results
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import Objective
from workbench.core.models import ATTENTION, layer_count, load_classifier, resolve_device

METHODS = ("kd", "pkd-skip", "ckd", "adkd", "gkd", "gkd-cls")
LENGTHS = (32, 64, 128, 256, 512)
CLASSES = (2, 3, 5)
STUDENT_LAYERS = {"minilm-l6": 3, "bert-base-random": 6}


def _resident_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _teacher(name: str, classes: int) -> PreTrainedModel:
    if name == "bert-base-random":  # BertConfig's defaults are BERT-base's shape
        return AutoModelForSequenceClassification.from_config(
            BertConfig(num_labels=classes), attn_implementation=ATTENTION
        )
    return load_classifier(name, classes)


def _peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _memory_now_mib(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) / 2**20
    return _resident_mib()


def measure(
    method: str,
    length: int,
    classes: int,
    repeats: int,
    teacher_name: str,
    batch_size: int,
    device_name: str,
) -> dict:
    """One configuration, in this process."""
    setup()
    device = resolve_device(device_name)
    teacher = _teacher(teacher_name, classes).eval().requires_grad_(False)
    layers = STUDENT_LAYERS[teacher_name]
    student = student_from(teacher, layers).train()
    objective = Objective.resolve(
        ObjectiveConfig(preset=method), layer_count(teacher), layers, classes
    )
    objective.prepare_student(teacher, student)
    teacher, student = teacher.to(device), student.to(device)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (batch_size, length), generator=generator)
    ids[:, 0], ids[:, -1] = 101, 102
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": torch.zeros_like(ids),
        "labels": torch.randint(0, classes, (batch_size,), generator=generator),
    }
    batch = {name: value.to(device) for name, value in batch.items()}
    cached = {
        k: v.detach()
        for k, v in objective.teacher_batch(teacher, batch, objective.cached_fields()).items()
    }
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-5)

    def step() -> None:
        fields = dict(cached)
        if objective.live_fields():
            with torch.no_grad():
                fields |= objective.teacher_batch(teacher, batch, objective.live_fields())
        optimizer.zero_grad(set_to_none=True)
        objective(student, batch, fields)["loss"].backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step()  # warm-up: optimizer state allocated
    before = _memory_now_mib(device)
    times, cpu_times = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return {
        "method": method,
        "length": length,
        "classes": classes,
        "seconds": sorted(times)[len(times) // 2],
        "cpu_seconds": sorted(cpu_times)[len(cpu_times) // 2],
        "peak_extra_mib": max(0.0, _peak_memory_mib(device) - before),
    }


def _in_subprocess(method: str, length: int, classes: int, args: argparse.Namespace) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_scaling",
            "--one",
            method,
            str(length),
            str(classes),
            "--repeats",
            str(args.repeats),
            "--teacher",
            args.teacher,
            "--batch-size",
            str(args.batch_size),
            "--device",
            args.device,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="lengths 32/64, kd and adkd only")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--teacher", choices=tuple(STUDENT_LAYERS), default="minilm-l6")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated presets")
    parser.add_argument(
        "--lengths",
        default=",".join(map(str, LENGTHS)),
        help="comma-separated lengths (the class sweep runs at 64 when 64 is among them)",
    )
    parser.add_argument(
        "--one", nargs=3, metavar=("METHOD", "LENGTH", "CLASSES"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.one:
        method, length, classes = args.one
        print(
            json.dumps(
                measure(
                    method,
                    int(length),
                    int(classes),
                    args.repeats,
                    args.teacher,
                    args.batch_size,
                    args.device,
                )
            )
        )
        return
    methods = ("kd", "adkd") if args.quick else args.methods.split(",")
    lengths = (32, 64) if args.quick else [int(n) for n in args.lengths.split(",")]
    configs = [(m, n, 3) for m in methods for n in lengths]
    if not args.quick and 64 in lengths:
        configs += [(m, 64, c) for m in methods for c in CLASSES if c != 3]
    rows = []
    for method, length, classes in configs:
        row = _in_subprocess(method, length, classes, args)
        print(
            f"{method:9s} L={length:3d} C={classes}: {row['seconds']:.3f} s "
            f"({row['cpu_seconds']:.3f} CPU s), +{row['peak_extra_mib']:.0f} MiB",
            flush=True,
        )
        rows.append(row)
    vanilla = {(r["length"], r["classes"]): r for r in rows if r["method"] == "kd"}
    for row in rows:
        reference = vanilla[(row["length"], row["classes"])]
        row["x_vanilla_kd"] = row["seconds"] / reference["seconds"]
        row["x_vanilla_kd_cpu"] = row["cpu_seconds"] / reference["cpu_seconds"]
    print(
        table(
            rows,
            [
                "method",
                "length",
                "classes",
                "seconds",
                "cpu_seconds",
                "x_vanilla_kd",
                "x_vanilla_kd_cpu",
                "peak_extra_mib",
            ],
        )
    )
    name = "-".join(
        [
            "scaling",
            *([] if args.teacher == "minilm-l6" else [args.teacher]),
            *([] if args.device == "cpu" else [args.device]),
            *(["quick"] if args.quick else []),
        ]
    )
    path = write_results(
        name,
        {
            "teacher": args.teacher,
            "student_layers": STUDENT_LAYERS[args.teacher],
            "device": args.device,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "load_average_1min_at_end": round(os.getloadavg()[0], 2),
            "rows": rows,
        },
    )
    print(f"written: {path}")


if __name__ == "__main__":
    main()
