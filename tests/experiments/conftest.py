"""Fixtures of the experiments' tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from kd.experiments.reproduce import Suite, TaskPlan
from kd.training.config import TeacherConfig
from workbench.core.config import DataConfig


@pytest.fixture
def one_seed_plan(tiny_model_dir: Path, tiny_task_dir: Path) -> TaskPlan:
    """A one-seed plan on the tiny model and task, quick to train."""
    return TaskPlan(
        DataConfig(task=str(tiny_task_dir), max_length=16),
        TeacherConfig(model=str(tiny_model_dir)),
        teacher_epochs=1,
        student_epochs=0.2,
        student_layers=2,
        seeds=(1,),
        batch_size=16,
        teacher_learning_rate=2e-3,
        student_learning_rate=1e-3,
        explained_examples=10,
    )


@pytest.fixture
def kd_and_ckd(one_seed_plan: TaskPlan) -> Suite:
    """A suite of two methods on :func:`one_seed_plan`, without searches, controls or
    ablations, timing its students on 8 test texts (test_report.py tests the timing)."""
    return Suite(
        plans={"tiny": one_seed_plan},
        ablation_task="tiny",
        methods=("kd", "ckd"),
        ablation_groups=(),
        controls=False,
        speed_examples=8,
    )
