"""The end-to-end demo: a MiniLM-L6 teacher fine-tuned on the bundled tweets, 3-layer students
distilled from it, and the table of their scores."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kd.evaluate import evaluate_runs, format_table
from kd.pipeline import distill, train_teacher
from workbench.baseline import tfidf_baseline
from workbench.config import DataConfig, ObjectiveConfig, OptimConfig, StudentConfig, TeacherConfig
from workbench.data import load_task

STUDENT_METHODS = ("finetune", "kd", "pkd-skip")


@dataclass(frozen=True)
class DemoSize:
    train_examples: int | None
    eval_examples: int | None
    max_length: int
    teacher_epochs: float
    student_epochs: float


SIZES = {
    "quick": DemoSize(1500, 300, 48, 1.0, 1.0),
    "default": DemoSize(8000, 1500, 64, 2.0, 2.0),
}


def run_demo(root: Path, quick: bool = False) -> list[dict]:
    """Train (or resume, or reuse) the demo's runs under ``root`` and print their test scores."""
    size = SIZES["quick" if quick else "default"]
    data = DataConfig(task="tweets", max_length=size.max_length,
                      max_train_examples=size.train_examples,
                      max_eval_examples=size.eval_examples)
    teacher_run = train_teacher(
        data, TeacherConfig(), OptimConfig(epochs=size.teacher_epochs, learning_rate=5e-5),
        root / "teacher",
    )
    runs = [teacher_run.path]
    for method in STUDENT_METHODS:
        runs.append(distill(
            data, StudentConfig(teacher_run=str(teacher_run.path), num_layers=3),
            ObjectiveConfig(preset=method),
            OptimConfig(epochs=size.student_epochs, learning_rate=1e-4), root / f"student-{method}",
        ).path)
    rows = evaluate_runs([str(p) for p in runs], "test")
    baseline = tfidf_baseline(load_task(data), "test")
    rows.append({"run": "tfidf-logreg", "kind": "baseline", "method": "tf-idf + LR", **baseline})
    print(format_table(rows))
    return rows
