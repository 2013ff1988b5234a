"""An instruction-tuned LLM as a classifier through a prompt (``kdw evaluate --prompt``), with
no fine-tuning: its accuracy zero- and few-shot, read raw and with contextual calibration, on a
split of the task; one row per model and shot count, both readings from one pass.

    python -m bench.prompted_teacher --models smollm2-135m --shots 0,1 --task tweets \\
        --max-eval-examples 500 --max-length 64

Calibration divides each class's probability by its probability for the content-free text
``N/A`` (Zhao et al., 2021): computed here from the raw scores and the model's scores of ``N/A``,
as ``--calibrate`` does. Each row gives the folder of the prompted model (``folder``), a teacher
for ``bench.llm_teacher_students --teacher`` (the students distilled from it, with and without
labels).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench.common import RESULTS, setup, table, write_results
from workbench.analysis.evaluation import evaluate_logits, predict_logits
from workbench.core.config import CONTENT_FREE, DataConfig, PromptConfig
from workbench.core.data import encode, load_task, pad_id
from workbench.core.models import forward, load_model, prompted_model

PROMPT = (
    "Tweet: {text}\nWhat is the sentiment of this tweet? Answer negative, neutral or positive."
    "{answer}The sentiment of this tweet is"
)
VERBALIZER = "negative=negative,neutral=neutral,positive=positive"


def content_free_scores(loaded) -> torch.Tensor:
    """The class scores ``[C]`` of the content-free text."""
    batch = loaded.tokenizer([CONTENT_FREE], return_tensors="pt")
    with torch.no_grad():
        return forward(loaded.model, batch).logits[0]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m", help="comma-separated base models")
    parser.add_argument("--shots", default="0,1", help="comma-separated examples per class")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--verbalizer", default=VERBALIZER)
    parser.add_argument("--task", default="tweets")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-train-examples", type=int, default=1200, help="the shots' pool")
    parser.add_argument("--max-eval-examples", type=int, default=500)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", default="prompted-teacher")
    args = parser.parse_args(argv)
    setup(args.threads)
    data = DataConfig(
        task=args.task,
        max_train_examples=args.max_train_examples,
        max_eval_examples=args.max_eval_examples,
        max_length=args.max_length,
    )
    task = load_task(data)
    split = task.splits[args.split]
    labels = torch.tensor(split.labels)
    asked = [(m, int(s)) for m in args.models.split(",") for s in args.shots.split(",")]
    path = RESULTS / f"{args.results}.json"  # the rows of other models and shots are kept
    again = set(asked) | {(Path(m).name, s) for m, s in asked}  # a path is kept by its name
    rows = [
        row
        for row in (json.loads(path.read_text())["teachers"] if path.exists() else [])
        if (row["model"], row["shots"]) not in again
    ]
    for model, shots in asked:
        config = PromptConfig(prompt=args.prompt, verbalizer=args.verbalizer, shots=shots)
        folder = prompted_model(model, config, task.spec, task.splits["train"], data.split_seed)
        loaded = load_model(folder, task.spec)
        encoded = encode(split, loaded.tokenizer, args.max_length)
        started = time.perf_counter()
        raw = predict_logits(loaded.model, encoded, args.batch_size, pad_id(loaded.tokenizer))
        seconds = (time.perf_counter() - started) / len(split)
        free = content_free_scores(loaded)
        prompt_tokens = len(loaded.model.prefix_ids) + len(loaded.model.suffix_ids)
        for calibrated in (False, True):
            scores = raw.log_softmax(-1) - free.log_softmax(-1) if calibrated else raw
            metrics = evaluate_logits(task.spec, scores, labels)
            answers = scores.argmax(-1).bincount(minlength=task.spec.num_labels)
            rows.append(
                {
                    "model": model,
                    "shots": shots,
                    "calibrated": calibrated,
                    "split": args.split,
                    "examples": len(split),
                    "accuracy": metrics["accuracy"],
                    "macro_f1": metrics["macro_f1"],
                    "recall": {k.split("/", 1)[1]: v for k, v in metrics.items() if "/" in k},
                    "predicted": answers.tolist(),  # texts per class
                    "content_free_probabilities": free.softmax(-1).tolist(),
                    "prompt_tokens": prompt_tokens,
                    "seconds_per_text": seconds,
                    "folder": folder,
                }
            )
            print(table(rows[-1:], ["model", "shots", "calibrated", "accuracy", "macro_f1"]))
        write_results(
            args.results, {"settings": vars(args), "prompt": args.prompt, "teachers": rows}
        )
    return rows


if __name__ == "__main__":
    main()
