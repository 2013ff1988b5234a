"""What a student buys on a GPU: a BERT-base-sized classifier and its 6- and 3-layer students,
each in float32 and bfloat16, in one ``kdw benchmark --device cuda`` table on the bundled
tweets' test split (ratios to the float32 teacher, loyalty to it).

    python -m bench.bench_gpu                       # bench/results/deploy-gpu.json
    python -m bench.bench_gpu --tokenizer DIR       # a folder with MiniLM's tokenizer files

The teacher is randomly initialised with BERT-base's shape (12 layers, hidden size 768, 12
heads, MiniLM's 30,522-token vocabulary) and a 3-class head; the students keep every second
and every fourth of its layers (``skip``), its embeddings and its head. No model is trained:
the timings are those of real shapes, while the accuracy and loyalty columns say nothing
about distillation. Batch sizes 1, 32 and 128 at up to 128 tokens, 1 warm-up and 5 timed
rounds with CUDA events, the models interleaved; models run with the eager attention the
workbench loads them with (attribution needs it).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, BertConfig

from bench.common import setup, student_from, write_results
from workbench.analysis.benchmark import benchmark, format_benchmark
from workbench.analysis.settings import BenchmarkSettings
from workbench.core.config import DataConfig
from workbench.core.data import load_task
from workbench.core.models import ATTENTION, load_tokenizer


def bert_base_models(root: Path, tokenizer: str, data: DataConfig) -> list[Path]:
    """A random BERT-base-sized classifier for ``data``'s task and its 6- and 3-layer cut
    students, each saved with the tokenizer as a Hugging Face classifier folder."""
    labels = load_task(data).spec.label_names
    config = BertConfig(
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    torch.manual_seed(0)
    teacher = AutoModelForSequenceClassification.from_config(config, attn_implementation=ATTENTION)
    saved_tokenizer = load_tokenizer(tokenizer)
    folders = []
    for name, model in (
        ("bert-base-12", teacher),
        ("student-6", student_from(teacher, 6)),
        ("student-3", student_from(teacher, 3)),
    ):
        model.save_pretrained(root / name)
        saved_tokenizer.save_pretrained(root / name)
        folders.append(root / name)
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="minilm-l6", help="tokenizer (name or folder)")
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N")
    parser.add_argument("--examples", type=int, default=500, help="test texts (0: all)")
    args = parser.parse_args()
    setup(threads=2)
    data = DataConfig(task="tweets", max_length=128)
    settings = BenchmarkSettings(
        examples=args.examples, batch_sizes="1,32,128", device=args.device, threads=2
    )
    with tempfile.TemporaryDirectory() as scratch:
        models = bert_base_models(Path(scratch), args.tokenizer, data)
        report = benchmark([str(model) for model in models], settings, data)
    print(format_benchmark(report))
    print(f"\nwritten to {write_results('deploy-gpu', report)}")


if __name__ == "__main__":
    main()
