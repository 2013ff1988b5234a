"""Attribution maps of many sentences: the workbench's batched engine against a straightforward
per-example, per-class loop.

    python bench/bench_attribution.py            # 128 tweets (test split)
    python bench/bench_attribution.py --quick    # 10 tweets, m = 1 and 8, all views only
    python bench/bench_attribution.py --count 32 # any sample size

Teacher: MiniLM-L6 (the demo's fine-tuned teacher if it exists, else a random classification
head: timing does not depend on the head), pad baseline, 2 torch threads. The engine runs for
steps m = 1, 2, 4, 8 with one view (the predicted class) and with all 3 views (every class), to
show how time and memory grow; the reference runs for m = 1 and 8 with all 3 views. Engine:
:func:`workbench.analysis.attribution.attribution_maps` on batches of 32 tweets sorted by length,
steps × examples stacked into chunks under its default memory budget, one forward per chunk for
all views. Reference: each tweet alone, each class separately — for ``steps >= 2``
Captum's ``LayerIntegratedGradients`` (riemann_right, pad-id baselines); for ``steps = 1``
Captum cannot run (it asserts ``n_steps > 1``), so the reference row is the same loop with one
plain ``autograd.grad`` of the class probability per example and class.

Each configuration runs in its own process; peak memory is the growth of the process's peak
resident set (``ru_maxrss``) during the timed run over its peak after loading the model and data
and a warm-up call — all CPU memory, torch's included (tracemalloc does not see torch's
allocations). Other load on the machine slows both sides: each row prints the 1-minute load
average at its end (2 cores) and its CPU seconds next to the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from captum.attr import LayerIntegratedGradients

from bench.common import setup, table, teacher_and_tokenizer, write_results
from workbench.analysis.attribution import attribution_map, attribution_maps
from workbench.core.config import DataConfig
from workbench.core.data import batches, encode, load_task, sample_split
from workbench.core.models import embed, embeddings_module, forward

BATCH_SIZE = 32
ENGINE_STEPS = (1, 2, 4, 8)
ENGINE_VIEWS = ("pred", "all")
REFERENCE_STEPS = (1, 8)  # against the engine with all views


def _tweets(tokenizer, count: int):
    split = load_task(DataConfig(task="tweets")).splits["test"]
    return encode(sample_split(split, count, seed=0), tokenizer, max_length=128)


def _engine(model, dataset, steps: int, views: str = "all") -> list[torch.Tensor]:
    """Maps ``[V, n]`` per tweet, batched by length."""
    order = sorted(range(len(dataset)), key=lambda i: len(dataset.input_ids[i]))
    maps: list[torch.Tensor] = [torch.empty(0)] * len(dataset)
    for batch in batches(dataset, order, BATCH_SIZE, model.config.pad_token_id):
        out = attribution_maps(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            batch["token_type_ids"],
            views=views,
            steps=steps,
        )
        for row, (index, n) in enumerate(
            zip(batch["index"].tolist(), batch["attention_mask"].sum(1).tolist(), strict=True)
        ):
            maps[index] = out[row, :, :n]
    return maps


def _probabilities(model):
    def scores(input_ids, attention_mask, token_type_ids):
        return model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).logits.softmax(-1)

    return scores


def _reference_ig(model, example: dict, target: int, steps: int) -> torch.Tensor:
    """IG ``[1, n, d]`` of one tweet for one class, the straightforward way."""
    pad_ids = torch.full_like(example["input_ids"], model.config.pad_token_id)
    if steps >= 2:
        explainer = LayerIntegratedGradients(_probabilities(model), embeddings_module(model))
        return explainer.attribute(
            example["input_ids"],
            baselines=pad_ids,
            target=target,
            n_steps=steps,
            method="riemann_right",
            additional_forward_args=(example["attention_mask"], example["token_type_ids"]),
        )
    end = embed(model, example).detach().requires_grad_()
    start = embed(model, {**example, "input_ids": pad_ids}).detach()
    probability = forward(model, example, embedding_output=end).logits.softmax(-1)[0, target]
    (gradient,) = torch.autograd.grad(probability, end)
    return (end - start) * gradient


def _reference(model, dataset, steps: int, views: str = "all") -> list[torch.Tensor]:
    maps = []
    for i in range(len(dataset)):
        ids = torch.tensor([dataset.input_ids[i]])
        example = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.tensor([dataset.token_type_ids[i]]),
        }
        views = [
            attribution_map(
                _reference_ig(model, example, c, steps).detach(), example["attention_mask"]
            )[0]
            for c in range(model.config.num_labels)
        ]
        maps.append(torch.stack(views))
    return maps


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def worker(implementation: str, steps: int, views: str, count: int, maps_path: str) -> dict:
    """Time one configuration in this process; save its maps for the agreement check."""
    setup(threads=2)
    torch.manual_seed(0)
    model, tokenizer, note = teacher_and_tokenizer()
    dataset = _tweets(tokenizer, count)
    run = _engine if implementation == "engine" else _reference
    run(model, _tweets(tokenizer, 2), steps, views)  # warm-up
    before = _peak_mib()
    wall, cpu = time.perf_counter(), time.process_time()
    maps = run(model, dataset, steps, views)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    torch.save(maps, maps_path)
    return {
        "implementation": implementation,
        "steps": steps,
        "views": views,
        "sentences": len(dataset),
        "tokens": sum(len(ids) for ids in dataset.input_ids),
        "wall_s": wall,
        "cpu_s": cpu,
        "sentences_per_s": len(dataset) / wall,
        "peak_rss_growth_mib": _peak_mib() - before,
        "load_average_1min": round(os.getloadavg()[0], 2),
        "teacher": note,
    }


def _spawn(implementation: str, steps: int, views: str, count: int, maps_path: Path) -> dict:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        implementation,
        "--steps",
        str(steps),
        "--views",
        views,
        "--count",
        str(count),
        "--maps",
        str(maps_path),
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="10 tweets instead of 128, the engine only where the reference runs "
        "(m = 1 and 8, all views)",
    )
    parser.add_argument("--worker", choices=("engine", "reference"), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--views", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help="number of tweets (default 128; 10 with --quick)")
    parser.add_argument("--maps", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.views, args.count, args.maps)))
        return
    count = args.count or (10 if args.quick else 128)
    engine_steps, engine_views = (
        (REFERENCE_STEPS, ("all",)) if args.quick else (ENGINE_STEPS, ENGINE_VIEWS)
    )
    configurations = [("engine", m, v) for v in engine_views for m in engine_steps]
    configurations += [("reference", m, "all") for m in REFERENCE_STEPS]
    with tempfile.TemporaryDirectory() as folder:
        maps_paths = {c: Path(folder) / "{}-{}-{}.pt".format(*c) for c in configurations}
        results = {c: _spawn(*c, count, path) for c, path in maps_paths.items()}
        comparisons = []
        for steps in REFERENCE_STEPS:
            engine, reference = results["engine", steps, "all"], results["reference", steps, "all"]
            difference = max(
                float((a - b).abs().max())
                for a, b in zip(
                    torch.load(maps_paths["engine", steps, "all"]),
                    torch.load(maps_paths["reference", steps, "all"]),
                    strict=True,
                )
            )
            comparisons.append(
                {
                    "steps": steps,
                    "reference": "Captum LayerIG loop" if steps >= 2 else "own-gradient loop",
                    "speed_ratio": engine["sentences_per_s"] / reference["sentences_per_s"],
                    "cpu_ratio": reference["cpu_s"] / engine["cpu_s"],
                    "max_map_difference": difference,
                }
            )
    rows = list(results.values())
    print(
        f"teacher: {rows[0]['teacher']}; {rows[0]['sentences']} tweets (test split, "
        f"{rows[0]['tokens']} tokens), pad baseline, 2 threads"
    )
    print(
        table(
            rows,
            [
                "implementation",
                "steps",
                "views",
                "sentences_per_s",
                "wall_s",
                "cpu_s",
                "peak_rss_growth_mib",
                "load_average_1min",
            ],
        )
    )
    print("\nengine vs reference (speed_ratio: sentences/s; cpu_ratio: CPU seconds):")
    shown = [
        {**row, "max_map_difference": f"{row['max_map_difference']:.1e}"} for row in comparisons
    ]
    print(table(shown, ["steps", "reference", "speed_ratio", "cpu_ratio", "max_map_difference"]))
    path = write_results(
        "attribution" + ("-quick" if args.quick else ""),
        {
            "command": " ".join(["python bench/bench_attribution.py", *sys.argv[1:]]),
            "sentences": rows[0]["sentences"],
            "batch_size": BATCH_SIZE,
            "baseline": "pad",
            "memory": "growth of ru_maxrss during the timed run, per configuration process",
            "runs": rows,
            "comparisons": comparisons,
        },
    )
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()
