"""What fine-tuning an LLM classifier costs under each ``--adapt``: seconds per training step
(the median of 3 after 1 warm-up) and the peak resident memory of a process that loads the model
and runs them, at batch 32 × 32 tokens of tweets, each adaptation in a process of its own.

    python -m bench.llm_teacher_cost              # smollm2-135m (SmolLM2-135M-Instruct)
    python -m bench.llm_teacher_cost --model DIR  # another model: a folder or a built-in name

A step is the training's: the fine-tuning objective (cross-entropy) forward and backward,
gradient clipping and an AdamW step over the trained parameters, the model prepared by
:mod:`kd.training.adaptation` (LoRA adapters with their defaults; ``head``: the head's output
layer on the batch's features, computed once before timing, as the run's cache holds them).
LoRA is measured as it is by default, on its top 8 layers only (``--lora-layers 8``) and under
bfloat16 autocast (``--precision bf16``); ``head``'s row adds what computing its features (one
forward pass) cost per example. Writes ``bench/results/llm-teacher-cost.json``: one row per
variant, with the machine and its load average.
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

from bench.common import RESULTS, interleaved_medians, portable, setup, table, tweet_batch
from kd.training.config import ADAPTATIONS
from workbench.core.machine import machine

BUILT_IN = "smollm2-135m"  # SmolLM2-135M-Instruct, assembled once from its package's GGUF
BATCH, TOKENS = 32, 32


def _load(model: str):
    """The classifier (3 classes, a fresh head) and tokenizer of ``model``, as
    ``kdw train-teacher --model`` loads them."""
    from workbench.core.models import load_classifier, load_tokenizer

    return load_classifier(model, 3), load_tokenizer(model)


# what is measured: each --adapt as it is by default, then the LoRA settings that cut its cost
VARIANTS = (
    ("full", {}),
    ("lora", {}),
    ("lora", {"lora_layers": 8}),
    ("lora", {"precision": "bf16"}),
    ("lora", {"lora_layers": 8, "precision": "bf16"}),
    ("head", {}),
)


def measure(adapt: str, model: str, lora_layers: int | None, precision: str) -> dict:
    """One adaptation's seconds per step and this process's peak resident memory; with
    ``precision`` bf16, the step under CPU autocast (``--precision bf16``)."""
    from kd.methods.config import ObjectiveConfig
    from kd.methods.objective import Objective
    from kd.training.adaptation import add_lora, freeze_to_head, head_features, head_loss
    from kd.training.config import TeacherConfig
    from workbench.core.cache import ExampleCache
    from workbench.core.data import EncodedSplit

    classifier, tokenizer = _load(model)
    batch = tweet_batch(tokenizer, BATCH, TOKENS, pad_to=TOKENS)
    objective = Objective.resolve(ObjectiveConfig(preset="finetune"), 0, 0)
    loss = lambda m, b: objective(m, b, {})  # noqa: E731
    extra: dict = {}  # head: what computing its features cost, once per example
    if adapt == "lora":
        add_lora(classifier, TeacherConfig(adapt="lora", lora_layers=lora_layers))
    if adapt == "head":
        rows = batch["attention_mask"].sum(1).tolist()
        split = EncodedSplit(
            [ids[:n].tolist() for ids, n in zip(batch["input_ids"], rows, strict=True)],
            [types[:n].tolist() for types, n in zip(batch["token_type_ids"], rows, strict=True)],
            batch["labels"],
            0,
        )
        classifier.eval()
        started = time.perf_counter()
        features = ExampleCache.compute(
            split,
            lambda b: head_features(classifier, b),
            batch_size=BATCH,
            pad_token_id=tokenizer.pad_token_id,
            inference=True,
        )
        extra["feature_seconds_per_example"] = (time.perf_counter() - started) / BATCH
        loss = head_loss(freeze_to_head(classifier), features, "ce")
        batch["index"] = torch.arange(BATCH)  # the batch's rows are the cache's examples
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB → GiB
    classifier.train()
    parameters = [p for p in classifier.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=1e-5)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
            value = loss(classifier, batch)["ce"]
        value.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()

    seconds = interleaved_medians({"step": step}, repeats=3, warmup=1)["step"]
    return {
        "adapt": adapt,
        "seconds_per_step": seconds,
        "peak_memory_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
        "peak_before_training_gb": loaded,  # loading and set-up
        "parameters_trained": sum(p.numel() for p in parameters),
        **extra,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=BUILT_IN, help="a model (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process")
    # a child's: the variant it measures
    parser.add_argument("--only", choices=ADAPTATIONS, help=argparse.SUPPRESS)
    parser.add_argument("--lora-layers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    args = parser.parse_args()
    setup(args.threads)
    if args.only:
        row = measure(args.only, args.model, args.lora_layers, args.precision)
        print(json.dumps(row))
        return
    from workbench.core.models import resolve_model

    resolve_model(args.model)  # a built-in model assembled once, before the measured processes
    rows, path = [], RESULTS / "llm-teacher-cost.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    for adapt, options in VARIANTS:  # each row written as soon as measured
        command = [sys.executable, "-m", "bench.llm_teacher_cost", "--only", adapt]
        command += ["--threads", str(args.threads), "--model", args.model]
        command += [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(
            {
                **row,
                "lora_layers": options.get("lora_layers"),
                "precision": options.get("precision", "fp32"),
                "model": args.model,
                "batch": BATCH,
                "tokens": TOKENS,
                "load_average": os.getloadavg(),
                **machine(),
            }
        )
        path.write_text(json.dumps(portable(rows), indent=2) + "\n")
    columns = ["adapt", "lora_layers", "precision", "seconds_per_step", "peak_memory_gb"]
    print(table(rows, [*columns, "peak_before_training_gb", "parameters_trained"]))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
