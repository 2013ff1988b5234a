"""What the objective's diagnostics (``--log-every``) add to a training: a step of each preset
alone, with each term's gradient measured (a logging step between the first and the last, whose
cost is their mean) and with every term's (the first and the last step), timed in interleaved
rounds; then the share of
a run's training time they add at ``--log-every 20`` over runs of 126 and 500 steps, beside
what measuring every term at every logging step would add.

    python -m bench.diagnostics_cost            # batch 32, 10 interleaved rounds
    python -m bench.diagnostics_cost --quick    # batch 8, 3 rounds

One step = student forward, every term, backward and an AdamW step, the teacher's cached fields
computed once before timing (as in ``bench.bench_objectives``).
"""

from __future__ import annotations

import argparse
import copy

import torch

from bench.common import (
    interleaved_medians,
    setup,
    student_from,
    table,
    teacher_and_tokenizer,
    training_loss,
    tweet_batch,
    write_results,
)
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import Objective
from kd.training.diagnostics import term_gradients

PRESETS = ("kd", "ckd", "adkd")
EVERY = 20
RUNS = (126, 500)


def make_step(student, loss_fn, weights: dict[str, float]):
    """One optimiser step, measuring the gradients of the terms in ``weights`` first."""
    parameters = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=1e-5)

    def step():
        optimizer.zero_grad(set_to_none=True)
        values = loss_fn()
        term_gradients(values, weights, parameters)
        values["loss"].backward()
        optimizer.step()

    return step


def run_cost(seconds: dict[str, float], steps: int, rotate: bool) -> float:
    """The fraction of a run of ``steps`` steps that logging adds: with ``rotate`` one term per
    logging step between the first and the last (every term at those two, as the trainer
    does), else every term at every logging step."""
    logged = {1, steps} | set(range(EVERY, steps + 1, EVERY))
    full = len({1, steps}) if rotate else len(logged)
    extra = full * (seconds["all"] - seconds["plain"])
    extra += (len(logged) - full) * (seconds["one"] - seconds["plain"])
    return extra / (steps * seconds["plain"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="batch 8, 3 rounds")
    args = parser.parse_args()
    size, repeats = (8, 3) if args.quick else (32, 10)
    setup()
    teacher, tokenizer, teacher_note = teacher_and_tokenizer()
    teacher.requires_grad_(False)
    batch = tweet_batch(tokenizer, size)
    base = student_from(teacher).train()
    steps = {}
    for preset in PRESETS:
        objective = Objective.resolve(ObjectiveConfig(preset=preset), 6, 3, 3)
        student = copy.deepcopy(base)
        loss_fn = training_loss(objective, teacher, student, batch)
        weights = objective.weights
        variants = {"plain": {}, "all": weights}
        variants |= {f"one {name}": {name: weight} for name, weight in weights.items()}
        for label, measured in variants.items():
            steps[preset, label] = make_step(student, loss_fn, measured)
    medians = interleaved_medians(steps, repeats)
    rows = []
    for preset in PRESETS:
        mine = {label: value for (name, label), value in medians.items() if name == preset}
        ones = [value for label, value in mine.items() if label.startswith("one ")]
        # the terms take their turns alike: a logging step between costs their mean
        seconds = {"plain": mine["plain"], "all": mine["all"], "one": sum(ones) / len(ones)}
        row = {
            "preset": preset,
            "terms": len(ones),
            "step_s": seconds["plain"],
            "x_one_term": seconds["one"] / seconds["plain"],
            "x_all_terms": seconds["all"] / seconds["plain"],
        }
        for steps_run in RUNS:
            row[f"run{steps_run}_pct"] = 100 * run_cost(seconds, steps_run, rotate=True)
            row[f"run{steps_run}_pct_every_term"] = 100 * run_cost(seconds, steps_run, False)
        rows.append(row)
    columns = list(rows[0])
    print(table(rows, columns))
    write_results(
        "diagnostics-cost",
        {"teacher": teacher_note, "batch_size": size, "repeats": repeats, "rows": rows},
    )


if __name__ == "__main__":
    main()
