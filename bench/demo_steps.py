"""What each stage of the first-run demo build costs, from a few steps of each at a demo size
(wall and CPU seconds, medians): the teacher's training step, a teacher and a student forward
pass of an evaluation batch (the KD student's teacher cache is teacher forwards), the AD-KD
teacher maps of a batch, vanilla-KD and AD-KD student steps; and from them the expected seconds
of each run of the demo on this machine as loaded now.

    python -m bench.demo_steps                  # the quick demo's size, 2 timed steps each
    python -m bench.demo_steps --size default

Batches are 32 tweets at the size's length (evaluation batches 64, as the pipeline uses), padded
to their longest; the teacher is the demo's if built, else MiniLM-L6 with a random head.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import torch

from bench.bench_objectives import make_step
from bench.common import setup, student_from, teacher_and_tokenizer, tweet_batch, write_results
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import Objective
from kd.training.config import OptimConfig
from kd.training.demo import SIZES


def timed(step, repeats: int) -> dict[str, float]:
    """Median wall and CPU seconds of ``step`` (after one untimed call)."""
    step()
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {"wall_s": statistics.median(wall), "cpu_s": statistics.median(cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    size, optim = SIZES[args.size], OptimConfig()
    setup()
    teacher, tokenizer, note = teacher_and_tokenizer()
    batch = tweet_batch(tokenizer, optim.batch_size, size.max_length)
    eval_batch = tweet_batch(tokenizer, optim.eval_batch_size, size.max_length)
    finetune = Objective.resolve(ObjectiveConfig(preset="finetune"), 0, 0)
    kd, adkd = (Objective.resolve(ObjectiveConfig(preset=p), 6, 3, 3) for p in ("kd", "adkd"))
    student = student_from(teacher).train()

    def forward(model):
        def step():
            with torch.no_grad():
                model(
                    input_ids=eval_batch["input_ids"], attention_mask=eval_batch["attention_mask"]
                )

        return step

    def student_step(objective):
        cached = objective.teacher_batch(teacher.eval(), batch, objective.cached_fields())
        return make_step(student, lambda: objective(student, batch, cached))

    teacher_step = make_step(teacher.train(), lambda: finetune(teacher, batch, {}))
    costs = {"teacher step": timed(teacher_step, args.repeats)}
    teacher.eval()
    costs["teacher forward (64)"] = timed(forward(teacher), args.repeats)
    costs["student forward (64)"] = timed(forward(student.eval()), args.repeats)

    def maps() -> None:
        with torch.no_grad():  # as the cache computes them (IG enables its own gradients)
            adkd.teacher_batch(teacher, eval_batch, ["maps"])

    costs["adkd teacher maps (64)"] = timed(maps, args.repeats)
    student.train()
    costs["kd student step"] = timed(student_step(kd), args.repeats)
    costs["adkd student step"] = timed(student_step(adkd), args.repeats)

    wall = {name: cost["wall_s"] for name, cost in costs.items()}
    train, evaluation = size.train_examples, 2 * size.eval_examples
    taught = size.data(teacher=True).max_train_examples
    steps = {
        role: math.ceil(examples * epochs / optim.batch_size)
        for role, examples, epochs in (
            ("teacher", taught, size.teacher_epochs),
            ("student", train, size.student_epochs),
        )
    }

    def passes(examples: float, name: str) -> float:
        return math.ceil(examples / optim.eval_batch_size) * wall[name]

    def dev_checks(epochs: float) -> int:  # the dev set at the end of every epoch
        return math.ceil(epochs) * size.eval_examples

    runs = {
        "teacher": steps["teacher"] * wall["teacher step"]
        + passes(dev_checks(size.teacher_epochs) + evaluation, "teacher forward (64)"),
        "student-kd": passes(train + evaluation, "teacher forward (64)")
        + steps["student"] * wall["kd student step"]
        + passes(dev_checks(size.student_epochs) + evaluation, "student forward (64)"),
        "student-adkd": passes(train, "adkd teacher maps (64)")
        + passes(evaluation, "teacher forward (64)")
        + steps["student"] * wall["adkd student step"]
        + passes(dev_checks(size.student_epochs) + evaluation, "student forward (64)"),
    }
    load = round(os.getloadavg()[0], 2)
    for name, cost in costs.items():
        print(f"{name:24} {cost['wall_s']:7.3f} s wall {cost['cpu_s']:7.3f} s CPU")
    for name, seconds in runs.items():
        print(f"expected {name:16} {seconds / 60:6.1f} min at this machine's load ({load})")
    write_results(
        f"demo-steps-{args.size}",
        {
            "size": args.size,
            "teacher": note,
            "steps": steps,
            "costs": costs,
            "expected_run_s": runs,
            "load_average_1min_at_end": load,
        },
    )


if __name__ == "__main__":
    main()
