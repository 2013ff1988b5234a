"""What a student buys at deployment: the demo's teacher and its 3-layer student, each as
PyTorch float32, ONNX float32 and ONNX int8, timed and scored in one ``kdw benchmark`` table
on the bundled tweets' test split (ratios to the PyTorch teacher, loyalty to it).

    python -m bench.bench_deploy                    # runs/demo/teacher, runs/demo/student-kd:
                                                    #   bench/results/deploy-demo.json
    python -m bench.bench_deploy TEACHER STUDENT    # any two run folders of one task
    python -m bench.bench_deploy --tiny             # tiny random models trained for seconds
    python -m bench.bench_deploy TEACHER STUDENT --student-graphs-only --results deploy-llm
                                                    # a teacher in PyTorch alone (an LLM)

Both runs are exported with ``kdw export-model --onnx --quantize int8`` (dynamic, per-channel
int8) into a temporary folder
(each export checked against its PyTorch model first), then benchmarked at batch sizes 1 and 32
on 2 threads, 1 warm-up and 5 timed rounds, the models interleaved. ``--tiny`` trains a
2-layer, 32-wide teacher with MiniLM's vocabulary and a 1-layer student on 300 tweets, to check
the script in a minute; its numbers say nothing about real models.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.common import setup, write_results
from kd.methods.config import ObjectiveConfig
from kd.methods.students import random_student
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.pipeline import distill, export_model, train_teacher
from workbench.analysis.benchmark import benchmark, format_benchmark
from workbench.analysis.settings import BenchmarkSettings, OnnxSettings
from workbench.core.config import DataConfig
from workbench.core.models import load_config, load_tokenizer

DEMO = Path("runs/demo")


def tiny_runs(root: Path) -> tuple[Path, Path]:
    """A tiny random teacher (2 layers of 32) fine-tuned for one epoch on 300 tweets, and a
    1-layer student distilled from it with vanilla KD."""
    model_dir = root / "tiny-model"
    model = random_student(load_config("minilm-l6"), 2, hidden_size=32, num_heads=2)
    model.base_model.save_pretrained(model_dir)  # an encoder: the teacher gets the task's head
    load_tokenizer("minilm-l6").save_pretrained(model_dir)
    data = DataConfig(task="tweets", max_length=64, max_train_examples=300, max_eval_examples=200)
    optim = OptimConfig(epochs=1, batch_size=16, learning_rate=1e-3, threads=2)
    teacher = train_teacher(data, TeacherConfig(model=str(model_dir)), optim, root / "teacher")
    student = distill(
        data,
        StudentConfig(teacher=str(teacher.path), num_layers=1),
        ObjectiveConfig(preset="kd"),
        optim,
        root / "student",
    )
    return teacher.path, student.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="teacher and student run folders")
    parser.add_argument("--tiny", action="store_true", help="tiny random models (a minute)")
    parser.add_argument("--examples", type=int, default=0, help="test texts (0: all)")
    parser.add_argument(
        "--min-agreement",
        type=float,
        default=0.95,
        help="label agreement each export needs with its PyTorch model (int8 teachers lose "
        "more than their students)",
    )
    parser.add_argument(
        "--student-graphs-only",
        action="store_true",
        help="export the student alone: the teacher runs in PyTorch only",
    )
    parser.add_argument("--results", help="bench/results/<name>.json (default: by the runs)")
    args = parser.parse_args()
    setup(threads=2)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        if args.tiny:
            teacher, student = tiny_runs(root)
        else:
            teacher, student = map(Path, args.runs or (DEMO / "teacher", DEMO / "student-kd"))
        exports = []
        for run in (student,) if args.student_graphs_only else (teacher, student):
            out = root / f"{run.name}-onnx"
            export = OnnxSettings(
                quantize="int8", examples=args.examples, min_agreement=args.min_agreement
            )
            export_model(run, out, onnx=True, settings=export)
            exports.append(str(out))
        settings = BenchmarkSettings(
            examples=args.examples, batch_sizes="1,32", warmup=1, repeats=5, threads=2
        )
        report = benchmark([str(teacher), str(student), *exports], settings)
    print(format_benchmark(report))
    name = args.results or (
        "deploy-tiny" if args.tiny else "deploy" if args.runs else "deploy-demo"
    )
    path = write_results(name, report)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
