"""Step time of every distillation preset divided by a vanilla-KD step, and AD-KD / GKD against
the straightforward form of the authors' code (teacher recomputed with a graph each step,
per-class loop), with the loss values of both printed to show they agree.

    python -m bench.bench_objectives            # batch 32, 10 interleaved rounds
    python -m bench.bench_objectives --quick    # batch 8, 3 rounds (under a minute)

One step = student forward, every term, backward and an AdamW step. Teacher fields that the
workbench caches (logits, [CLS] states, attribution maps, input gradients) are computed once
before timing, as the cache serves them; CKD's teacher hidden states are recomputed in its step.
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
from bench.reference import authors_step_loss
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import Objective

PRESETS = ("kd", "pkd-skip", "ckd", "adkd", "gkd", "gkd-cls")


def make_step(student, loss_fn):
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-5)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn()["loss"].backward()
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="batch 8, 3 rounds")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    size, repeats = (8, 3) if args.quick else (args.batch_size, args.repeats)
    setup()
    teacher, tokenizer, teacher_note = teacher_and_tokenizer()
    teacher.requires_grad_(False)
    batch = tweet_batch(tokenizer, size)
    padded = tweet_batch(tokenizer, size, pad_to=128)
    base = student_from(teacher).train()
    steps, objectives, students = {}, {}, {}
    variants = {preset: ObjectiveConfig(preset=preset) for preset in PRESETS}
    variants["adkd, one sampled view"] = ObjectiveConfig(preset="adkd").with_settings(
        attr_views="sample"
    )
    for preset, config in variants.items():
        objective = Objective.resolve(config, 6, 3, 3)
        student = copy.deepcopy(base)
        objective.prepare_student(teacher, student)
        loss_fn = training_loss(objective, teacher, student, batch)
        objectives[preset], students[preset] = objective, student
        steps[f"{preset} (cached teacher)"] = make_step(student, loss_fn)

    def vanilla_live():
        with torch.no_grad():
            fields = {
                "logits": teacher(
                    **{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
                ).logits
            }
        return objectives["kd"](students["kd"], batch, fields)

    steps["kd (teacher forward each step)"] = make_step(students["kd"], vanilla_live)
    for name in ("adkd", "gkd"):
        objective, student = objectives[name], students[name]
        for label, data in (("", batch), (", padded to 128", padded)):
            steps[f"{name} straightforward{label}"] = make_step(
                student,
                lambda n=name, o=objective, s=student, d=data: authors_step_loss(
                    n, teacher, s, d, o
                ),
            )
    medians = interleaved_medians(steps, repeats)
    vanilla = medians["kd (cached teacher)"]
    rows = [
        {"step": name, "seconds": seconds, "x_vanilla_kd": seconds / vanilla}
        for name, seconds in medians.items()
    ]
    speedups = {
        name: medians[f"{name} straightforward"] / medians[f"{name} (cached teacher)"]
        for name in ("adkd", "gkd")
    } | {
        f"{name} end-to-end (authors pad to 128)": medians[f"{name} straightforward, padded to 128"]
        / medians[f"{name} (cached teacher)"]
        for name in ("adkd", "gkd")
    }
    agreement = {}
    for name in ("adkd", "gkd"):
        student = students[name].eval()
        objective = objectives[name]
        ours = objective(student, batch, objective.teacher_batch(teacher, batch))
        theirs = authors_step_loss(name, teacher, student, batch, objective)
        agreement[name] = {
            k: {"ours": ours[k].item(), "straightforward": theirs[k].item()} for k in theirs
        }
    print(
        f"teacher: {teacher_note}; student: 3 layers cut from it; batch {size} tweets, "
        f"{batch['input_ids'].shape[1]} positions; median of {repeats} interleaved rounds"
    )
    print(table(rows, ["step", "seconds", "x_vanilla_kd"]))
    print("\nspeed-up of the workbench over the straightforward form (same padding unless said):")
    for name, value in speedups.items():
        print(f"  {name}: {value:.2f}x")
    print("\nloss values (student in eval mode), ours vs straightforward:")
    for name, values in agreement.items():
        print(
            f"  {name}: "
            + ", ".join(
                f"{k} {v['ours']:.6f} / {v['straightforward']:.6f}" for k, v in values.items()
            )
        )
    path = write_results(
        "objectives" + ("-quick" if args.quick else ""),
        {
            "teacher": teacher_note,
            "batch_size": size,
            "positions": batch["input_ids"].shape[1],
            "repeats": repeats,
            "steps": rows,
            "speedups": speedups,
            "loss_agreement": agreement,
        },
    )
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
