"""How the cost of each method grows: step time and peak memory against sequence length
(32 → 512) and number of classes (2, 3, 5), so users can see where a method stops being
affordable.

    python -m bench.bench_scaling           # lengths 32..512 at 3 classes, classes 2/3/5 at 64
    python -m bench.bench_scaling --quick   # lengths 32 and 128, kd/adkd/gkd only

Each configuration runs in its own process (MiniLM-L6 teacher with a random head, 3-layer
student cut from it, batch of 8 random-token sequences without padding, 2 threads): the median
of a few training steps, and the peak resident memory the steps add above the memory held after
set-up (``ru_maxrss`` against ``/proc/self/statm``).
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

from bench.common import setup, student_from, table, write_results
from kd.objective import Objective
from kd.pipeline import prepare_gradient_student
from workbench.config import ObjectiveConfig
from workbench.models import load_classifier

METHODS = ("kd", "pkd-skip", "ckd", "adkd", "gkd", "gkd-cls")
LENGTHS = (32, 64, 128, 256, 512)
CLASSES = (2, 3, 5)
BATCH = 8


def _resident_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(method: str, length: int, classes: int, repeats: int) -> dict:
    """One configuration, in this process."""
    setup()
    teacher = load_classifier("minilm-l6", classes).eval().requires_grad_(False)
    student = student_from(teacher).train()
    objective = Objective.resolve(ObjectiveConfig(preset=method), 6, 3, classes)
    if objective.gradient_kd:
        prepare_gradient_student(teacher, student)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (BATCH, length), generator=generator)
    ids[:, 0], ids[:, -1] = 101, 102
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "token_type_ids": torch.zeros_like(ids),
             "labels": torch.randint(0, classes, (BATCH,), generator=generator)}
    cached = {k: v.detach() for k, v in
              objective.teacher_batch(teacher, batch, objective.cached_fields()).items()}
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-5)

    def step() -> None:
        fields = dict(cached)
        if objective.live_fields():
            with torch.no_grad():
                fields |= objective.teacher_batch(teacher, batch, objective.live_fields())
        optimizer.zero_grad(set_to_none=True)
        objective(student, batch, fields)["loss"].backward()
        optimizer.step()

    step()  # warm-up: optimizer state allocated
    before = _resident_mib()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"method": method, "length": length, "classes": classes,
            "seconds": sorted(times)[len(times) // 2], "peak_extra_mib": max(0.0, peak - before)}


def _in_subprocess(method: str, length: int, classes: int, repeats: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_scaling", "--one", method, str(length), str(classes),
         "--repeats", str(repeats)],
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="lengths 32/128, kd/adkd/gkd")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", nargs=3, metavar=("METHOD", "LENGTH", "CLASSES"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        method, length, classes = args.one
        print(json.dumps(measure(method, int(length), int(classes), args.repeats)))
        return
    methods = ("kd", "adkd", "gkd") if args.quick else METHODS
    lengths = (32, 128) if args.quick else LENGTHS
    configs = [(m, n, 3) for m in methods for n in lengths]
    if not args.quick:
        configs += [(m, 64, c) for m in methods for c in CLASSES if c != 3]
    rows = []
    for method, length, classes in configs:
        row = _in_subprocess(method, length, classes, args.repeats)
        print(f"{method:9s} L={length:3d} C={classes}: {row['seconds']:.3f} s, "
              f"+{row['peak_extra_mib']:.0f} MiB", flush=True)
        rows.append(row)
    vanilla = {(r["length"], r["classes"]): r["seconds"] for r in rows if r["method"] == "kd"}
    for row in rows:
        row["x_vanilla_kd"] = row["seconds"] / vanilla[(row["length"], row["classes"])]
    print(table(rows, ["method", "length", "classes", "seconds", "x_vanilla_kd",
                       "peak_extra_mib"]))
    path = write_results("scaling" + ("-quick" if args.quick else ""),
                         {"batch_size": BATCH, "repeats": args.repeats, "rows": rows})
    print(f"written: {path}")


if __name__ == "__main__":
    main()
