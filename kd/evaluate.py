"""Score runs on a split: task metrics and, for students, loyalty to their teacher."""

from __future__ import annotations

from collections.abc import Sequence

from workbench.data import encode, load_task
from workbench.errors import WorkbenchError
from workbench.evaluation import evaluate_logits, predict_logits
from workbench.models import encoder_layers, load_run


def evaluate_runs(
    paths: Sequence[str], split: str = "test", teacher: str | None = None
) -> list[dict]:
    """One row per run: name, kind, method, layers, parameters, task metrics, and for students
    label/probability loyalty to ``teacher`` (default: the run's own teacher)."""
    rows, teacher_logits = [], {}
    for path in paths:
        loaded = load_run(path)
        info = loaded.run.info()
        data = load_task(loaded.data)
        if split not in data.splits:
            raise WorkbenchError(f"split {split!r} not in {sorted(data.splits)}")
        dataset = encode(data.splits[split], loaded.tokenizer, loaded.data.max_length,
                         data.spec.regression)
        logits = predict_logits(loaded.model, dataset, 64, loaded.tokenizer.pad_token_id)
        reference = None
        teacher_path = teacher or info["configs"].get("student", {}).get("teacher_run")
        if info["kind"] == "student" and teacher_path:
            if teacher_path not in teacher_logits:
                source = load_run(teacher_path)
                teacher_logits[teacher_path] = predict_logits(
                    source.model, dataset, 64, source.tokenizer.pad_token_id
                )
            reference = teacher_logits[teacher_path]
        rows.append({
            "run": loaded.run.name, "kind": info["kind"], "method": info["method"],
            "layers": len(encoder_layers(loaded.model)),
            "parameters_m": round(sum(p.numel() for p in loaded.model.parameters()) / 1e6, 1),
            "split": split, "examples": len(dataset),
            **evaluate_logits(data.spec, logits, dataset.labels, reference),
        })
    return rows


def format_table(rows: Sequence[dict]) -> str:
    """A markdown table of :func:`evaluate_runs` rows (numbers to 4 decimals)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4f}"
        return "–" if value is None else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
