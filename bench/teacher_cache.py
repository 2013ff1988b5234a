"""What building a teacher cache costs: the logits of the MiniLM teacher (the demo's if it
exists) over tweets, as :meth:`~workbench.core.cache.ExampleCache.compute` builds them, under
``no_grad`` and in inference mode, at several batch sizes, timed in interleaved rounds; beside
one vanilla-KD training step of a 3-layer student at batch 32, to say how many steps the cache of
one example costs.

    python -m bench.teacher_cache            # 512 tweets, 5 rounds
    python -m bench.teacher_cache --quick    # 128 tweets, 2 rounds
"""

from __future__ import annotations

import argparse

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
from workbench.core.cache import ExampleCache
from workbench.core.config import DataConfig
from workbench.core.data import EncodedSplit, encode, load_task, pad_id
from workbench.core.models import forward

BATCH_SIZES = (8, 16, 32, 64, 128)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="128 tweets, 2 rounds")
    args = parser.parse_args()
    setup()
    examples, repeats = (128, 2) if args.quick else (512, 5)
    teacher, tokenizer, described = teacher_and_tokenizer()
    teacher.eval()
    data = load_task(DataConfig(task="tweets"))
    whole = encode(data.splits["train"], tokenizer, 128)
    encoded = EncodedSplit(
        whole.input_ids[:examples], whole.token_type_ids[:examples], whole.labels[:examples], 0
    )

    def logits(batch: dict) -> dict:
        return {"logits": forward(teacher, batch).logits}

    def build(size: int, inference: bool):
        return lambda: ExampleCache.compute(
            encoded, logits, batch_size=size, pad_token_id=pad_id(tokenizer), inference=inference
        )

    builds = {
        f"{mode} {size}": build(size, mode == "inference")
        for size in BATCH_SIZES
        for mode in ("no_grad", "inference")
    }
    seconds = interleaved_medians(builds, repeats)
    student = student_from(teacher)
    objective = Objective.resolve(ObjectiveConfig(preset="kd"), 6, 3)
    loss = training_loss(objective, teacher, student, tweet_batch(tokenizer, 32))
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss()["loss"].backward()
        optimizer.step()

    step_s = interleaved_medians({"step": step}, repeats * 4)["step"]
    base = seconds[f"no_grad {BATCH_SIZES[0]}"]
    rows = [
        {
            "mode": name.split()[0],
            "batch": int(name.split()[1]),
            "s": value,
            "ms_per_example": 1000 * value / examples,
            "x_no_grad_8": base / value,
            "steps_per_epoch_of_32": value / examples * 32 / step_s,
        }
        for name, value in seconds.items()
    ]
    columns = list(rows[0])
    print(table(rows, columns))
    print(f"one vanilla-KD step at batch 32: {step_s:.3f} s")
    path = write_results(
        "teacher-cache-quick" if args.quick else "teacher-cache",
        {
            "teacher": described,
            "examples": examples,
            "repeats": repeats,
            "kd_step_s": step_s,
            "rows": rows,
        },
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
