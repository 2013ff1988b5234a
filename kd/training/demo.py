"""The embedded demo: a MiniLM-L6 teacher fine-tuned on the bundled tweets and 3-layer students
distilled from it. ``kdw demo`` prints their scores; the app builds the same runs on first launch
and reuses them afterwards (each run resumes or is skipped when already finished)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kd.methods.config import ObjectiveConfig
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.evaluate import evaluate_runs, format_table
from kd.training.pipeline import distill, train_teacher
from kd.training.trainer import Callback
from workbench.analysis.tfidf_baseline import tfidf_baseline
from workbench.core.config import DataConfig
from workbench.core.data import load_task


@dataclass(frozen=True)
class DemoSize:
    """How much of the tweets the demo trains on, for how long, and from which model."""

    train_examples: int | None
    eval_examples: int | None
    max_length: int
    teacher_epochs: float
    student_epochs: float
    teacher_model: str = TeacherConfig.model
    teacher_learning_rate: float = 5e-5
    teacher_train_examples: int | None = None  # the teacher's own (default: train_examples)

    def data(self, teacher: bool = False) -> DataConfig:
        """The tweets the students train on, or with ``teacher`` the teacher's (the same dev
        and test texts: loyalty compares the two on them)."""
        examples = self.train_examples
        if teacher and self.teacher_train_examples is not None:
            examples = self.teacher_train_examples
        return DataConfig(
            task="tweets",
            max_length=self.max_length,
            max_train_examples=examples,
            max_eval_examples=self.eval_examples,
        )


SIZES = {
    # the quick teacher reads more tweets than its one-epoch students, at twice their rate: at
    # 1,500 tweets and 5e-5 it called most positive tweets negative (docs/results.md)
    "quick": DemoSize(
        1500, 300, 32, 1.0, 1.0, teacher_learning_rate=2e-4, teacher_train_examples=2400
    ),
    "default": DemoSize(6000, 1500, 64, 2.0, 2.0),
}
TABLE_METHODS = ("finetune", "kd", "pkd-skip", "adkd")
APP_METHODS = ("kd", "adkd")
STUDENT_LEARNING_RATE = 1e-4


def build_demo(
    root: Path,
    size: DemoSize = SIZES["default"],
    methods: Sequence[str] = APP_METHODS,
    callbacks: Sequence[Callback] = (),
    announce=print,
) -> list[Path]:
    """Train (or resume, or reuse) the teacher and one 3-layer student per method under
    ``root``; return the run folders, teacher first."""
    data, teacher_data = size.data(), size.data(teacher=True)
    tweets = teacher_data.max_train_examples
    announce(f"demo: teacher ({size.teacher_model} fine-tuned on {tweets} tweets)")
    teacher = train_teacher(
        teacher_data,
        TeacherConfig(model=size.teacher_model),
        OptimConfig(epochs=size.teacher_epochs, learning_rate=size.teacher_learning_rate),
        root / "teacher",
        callbacks,
    )
    runs = [teacher.path]
    for method in methods:
        announce(f"demo: 3-layer student, {method}")
        runs.append(
            distill(
                data,
                StudentConfig(teacher=str(teacher.path), num_layers=3),
                ObjectiveConfig(preset=method),
                OptimConfig(epochs=size.student_epochs, learning_rate=STUDENT_LEARNING_RATE),
                root / f"student-{method}",
                callbacks,
            ).path
        )
    return runs


def run_demo(root: Path, quick: bool = False) -> list[dict]:
    """Build the demo's runs with every table method and print their test scores beside a
    TF-IDF + logistic-regression baseline on the same split."""
    size = SIZES["quick" if quick else "default"]
    runs = build_demo(root, size, TABLE_METHODS)
    rows = evaluate_runs([str(p) for p in runs], "test")
    baseline = tfidf_baseline(load_task(size.data()), "test")
    rows.append({"run": "tfidf-logreg", "kind": "baseline", "method": "tf-idf + LR", **baseline})
    print(format_table(rows))
    return rows
