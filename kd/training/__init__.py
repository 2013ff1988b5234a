"""Training students and teachers: the trainer and its diagnostics, tracking, data parallelism,
the pipeline that runs a training from its configs, evaluation of run folders and the demo. It
imports neither the experiments nor the front ends.

The pipeline's :func:`train_teacher` and :func:`distill`, the configs they take
(:class:`TeacherConfig`, :class:`StudentConfig`, :class:`OptimConfig`, and the methods'
:class:`ObjectiveConfig`), and :func:`evaluate_runs` with its :func:`format_table`, are
importable from here; they are imported when first asked for, so that
importing the package loads neither torch nor transformers."""

from __future__ import annotations

from workbench.core.lazy import lazy_names

_NAMES = {
    "ObjectiveConfig": "kd.methods.config",
    "OptimConfig": "kd.training.config",
    "StudentConfig": "kd.training.config",
    "TeacherConfig": "kd.training.config",
    "distill": "kd.training.pipeline",
    "evaluate_runs": "kd.training.evaluate",
    "format_table": "kd.training.evaluate",
    "train_teacher": "kd.training.pipeline",
}
__all__ = sorted(_NAMES)

__getattr__ = lazy_names(__name__, _NAMES)
