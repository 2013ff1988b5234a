"""How many IG steps a figure needs: the completeness gap of Integrated Gradients against its
steps, on a fine-tuned teacher and test tweets.

    python -m bench.ig_completeness [--teacher runs/demo-quick/teacher] [--examples 100]

For each text, the predicted class is explained from the [PAD] baseline (the app's default) and
the gap is ``|Σ IG − (p(x) − p(x'))| / |p(x) − p(x')|``: how far the attributions fall short of
the change of probability they should add up to (the right Riemann sum's error). Texts whose
probability hardly moves from the baseline (``|p(x) − p(x')| < 0.05``) are left out: a gap
relative to almost nothing says nothing. Prints the median, 90th percentile and largest gap per
step count and writes ``bench/results/ig-completeness.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.common import setup, table, tweet_batch, write_results
from workbench.analysis.attribution import ig_completeness
from workbench.core.models import load_run

STEPS = (1, 5, 10, 20, 32, 50, 100)
SMALL_CHANGE = 0.05  # |p(x) − p(x')| below it: the relative gap is left out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", default="runs/demo-quick/teacher", help="teacher run folder")
    parser.add_argument("--examples", type=int, default=100, help="test tweets explained")
    parser.add_argument("--steps", default=",".join(map(str, STEPS)), help="step counts")
    args = parser.parse_args()
    setup()
    loaded = load_run(Path(args.teacher))
    batch = tweet_batch(loaded.tokenizer, args.examples, loaded.data.max_length, split="test")
    rows = []
    for steps in [int(s) for s in args.steps.split(",")]:
        attributed, change = ig_completeness(
            loaded.model, batch["input_ids"], batch["attention_mask"],
            batch.get("token_type_ids"), target="pred", steps=steps,
        )  # fmt: skip
        kept = change.abs() >= SMALL_CHANGE
        gap = ((attributed - change).abs() / change.abs())[kept]
        rows.append(
            {
                "steps": steps,
                "texts": int(kept.sum()),
                "median gap": float(gap.median()),
                "p90 gap": float(torch.quantile(gap, 0.9)),
                "max gap": float(gap.max()),
                "under 5 %": float((gap < 0.05).float().mean()),
            }
        )
        print(table(rows[-1:], list(rows[-1])), flush=True)
    print(table(rows, list(rows[0])))
    path = write_results(
        "ig-completeness",
        {
            "teacher": args.teacher,
            "examples": args.examples,
            "left_out_below": SMALL_CHANGE,
            "rows": rows,
        },
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
