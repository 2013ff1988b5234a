"""Estimate the wall clock of ``kdw reproduce --jobs 2`` (the default suite, from an empty
folder) from per-step costs measured cheaply, without running the suite.

Measured here, with one CPU thread per process as under ``--jobs 2``: the seconds per training
step of the teacher and of every method's student (the median interval between steps over a
few steps, from the trainer's ``on_step`` callback), at each task's length; the seconds per
example of a dev/test evaluation pass, of the per-example scoring (Grad saliency and IG maps of
teacher and student) and of AOPC. The estimate multiplies these by the suite's counts (steps,
examples, students, search trials) and divides the students' and searches' part by 2 (two
processes). Writes ``estimate.json`` next to this file::

    PYTHONPATH=. python reports/reproduce/estimate.py [--steps 8] [--work FOLDER]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from kd.pipeline import distill, train_teacher
from kd.reproduce import DEFAULT, MAIN_METHODS, ExampleScores, experiments
from workbench.config import ObjectiveConfig, OptimConfig, StudentConfig
from workbench.runs import Run

HERE = Path(__file__).resolve().parent


class StepClock:
    """Times between training steps (the trainer's ``on_step``)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step(self, step: int, total: int, losses: dict[str, float]) -> None:
        self.times.append(time.perf_counter())

    def per_step(self) -> float:
        gaps = [b - a for a, b in zip(self.times[1:], self.times[2:], strict=False)]
        return statistics.median(gaps)


EXTRA = {  # ablations whose student step differs from their method's
    "adkd m=2": replace(ObjectiveConfig(preset="adkd"), attr_steps=2),
    "adkd m=4": replace(ObjectiveConfig(preset="adkd"), attr_steps=4),
}
MEASURED = {  # per task, the students timed; a method not timed on a task (bbc-news) takes its
    # cost on the ablation task scaled by vanilla KD's ratio between the two tasks
    "tweets": (*MAIN_METHODS, *EXTRA),
    "bbc-news": ("finetune", "kd"),
}


def measure(folder: Path, steps: int) -> dict:
    """Seconds per training step (teacher, students) and per example (a student evaluation
    pass; each method's teacher cache; the per-example scoring) at the default suite's lengths,
    one thread. Each figure is saved in ``folder/costs.json`` as it is measured, so a killed
    measurement resumes with the rest."""
    torch.set_num_threads(1)
    saved = folder / "costs.json"
    costs: dict = json.loads(saved.read_text()) if saved.exists() else {}
    for name in ("teacher_step", "step", "cache_example", "eval_example", "score_example"):
        costs.setdefault(name, {})
    for task, plan in DEFAULT.plans.items():
        evaluated = 64
        data = replace(
            plan.data, max_train_examples=plan.batch_size * steps, max_eval_examples=evaluated
        )
        optim = OptimConfig(epochs=1, batch_size=plan.batch_size, seed=1, threads=1)
        clock = StepClock()
        teacher = train_teacher(
            data, plan.teacher, optim, folder / task / "teacher", callbacks=[clock]
        )
        if clock.times:
            costs["teacher_step"][task] = clock.per_step()
        student = StudentConfig(teacher_run=str(teacher.path), num_layers=plan.student_layers)
        objectives = {m: ObjectiveConfig(preset=m) for m in MAIN_METHODS} | EXTRA
        for name in MEASURED[task]:
            if f"{task}/{name}" in costs["step"]:
                continue
            clock = StepClock()
            started = time.perf_counter()
            run = distill(
                data, student, objectives[name], optim, folder / task / name, callbacks=[clock]
            )
            overhead = time.perf_counter() - started - clock.per_step() * steps
            # not training: two dev passes and a test pass, and (KD methods) the teacher cache
            # over train, dev and test
            if name == "finetune":
                costs["eval_example"][task] = overhead / (3 * evaluated)
                started = time.perf_counter()
                ExampleScores()(Run(teacher.path), run, evaluated)
                costs["score_example"][task] = (time.perf_counter() - started) / evaluated
            else:
                cache = overhead - 3 * evaluated * costs["eval_example"][task]
                examples = plan.batch_size * steps + 2 * evaluated
                costs["cache_example"][f"{task}/{name}"] = max(0.0, cache) / examples
            costs["step"][f"{task}/{name}"] = clock.per_step()
            saved.write_text(json.dumps(costs, indent=1))
            print(f"{task}/{name}: {clock.per_step():.3f} s a step", flush=True)
    for task, names in MEASURED.items():  # the methods not timed on a task
        for method in MAIN_METHODS:
            if method not in names:
                ratio = costs["step"][f"{task}/kd"] / costs["step"]["tweets/kd"]
                costs["step"][f"{task}/{method}"] = ratio * costs["step"][f"tweets/{method}"]
                costs["cache_example"][f"{task}/{method}"] = (
                    ratio * costs["cache_example"][f"tweets/{method}"]
                )
    return costs


SIZES = {"tweets": (29748, 3718), "bbc-news": (1699, 212)}  # train, dev/test of the bundled data


def _size(limit: int | None, available: int) -> int:
    return available if limit is None else min(limit, available)


def estimate(costs: dict) -> dict:
    """Seconds of the default suite from ``costs``: the teachers in one process, then the
    searches and the students in two. A teacher cache is computed once per task, sample and
    method (the students share it)."""
    teachers = sum(
        math.ceil(_size(plan.data.max_train_examples, SIZES[task][0]) / plan.batch_size)
        * plan.teacher_epochs
        * costs["teacher_step"][task]
        for task, plan in DEFAULT.plans.items()
    )
    parts = {"searches": 0.0, "students": 0.0, "caches": 0.0, "scoring": 0.0}
    caches = set()
    tweets = DEFAULT.plans[DEFAULT.ablation_task]
    sample = DEFAULT.tuning_data(DEFAULT.ablation_task)
    train, evaluated = sample.max_train_examples, sample.max_eval_examples
    steps = math.ceil(train / tweets.batch_size) * tweets.student_epochs
    for method in DEFAULT.tuned:  # 4 dev evaluations per epoch for the pruner
        parts["caches"] += costs["cache_example"].get(f"tweets/{method}", 0) * (
            train + 2 * evaluated
        )
        parts["searches"] += DEFAULT.tune_trials * (
            steps * costs["step"][f"tweets/{method}"]
            + (4 * tweets.student_epochs + 2) * evaluated * costs["eval_example"]["tweets"]
        )
    for experiment in experiments(DEFAULT):
        plan = DEFAULT.plan_of(experiment)
        task, method = experiment.task, experiment.objective.preset
        train = _size(plan.data.max_train_examples, SIZES[task][0])
        evaluated = _size(plan.data.max_eval_examples, SIZES[task][1])
        steps = math.ceil(train / plan.batch_size) * plan.student_epochs
        step = costs["step"].get(f"{task}/{experiment.name}", costs["step"][f"{task}/{method}"])
        parts["students"] += steps * step + (
            (plan.student_epochs + 2) * evaluated * costs["eval_example"][task]
        )
        parts["scoring"] += evaluated * costs["score_example"][task]
        cache = (task, experiment.group == "main", method)
        if cache not in caches:
            caches.add(cache)
            parts["caches"] += costs["cache_example"].get(f"{task}/{method}", 0) * (
                train + 2 * evaluated
            )
    parallel = sum(parts.values())
    return {
        "teachers_s": round(teachers),
        **{f"{name}_s": round(value) for name, value in parts.items()},
        "wall_clock_jobs2_h": round((teachers + parallel / 2) / 3600, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="training steps timed per model")
    parser.add_argument(
        "--work", default=None, help="folder for the timed runs (default: a temporary one)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        costs = measure(Path(args.work or temporary), args.steps)
    result = {"costs_s": costs, "estimate": estimate(costs)}
    (HERE / "estimate.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["estimate"], indent=1))


if __name__ == "__main__":
    main()
