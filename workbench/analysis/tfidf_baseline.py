"""A TF-IDF + logistic-regression baseline on the same split as the neural models."""

from __future__ import annotations

import torch
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from workbench.analysis.metrics import task_metrics
from workbench.core.data import Split, TaskData
from workbench.core.errors import WorkbenchError


def _joined(split: Split) -> list[str]:
    if split.pairs is None:
        return split.texts
    return [f"{a} [SEP] {b}" for a, b in zip(split.texts, split.pairs, strict=True)]


def tfidf_baseline(data: TaskData, split: str = "test", seed: int = 0) -> dict[str, float]:
    """Word 1–2-gram TF-IDF features, logistic regression (C=1, balanced classes off), trained
    on ``train`` and scored on ``split`` with the task's metrics."""
    if data.spec.regression:
        raise WorkbenchError("the TF-IDF baseline is for classification tasks")
    model = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True),
        LogisticRegression(max_iter=2000, random_state=seed),
    )
    model.fit(_joined(data.splits["train"]), data.splits["train"].labels)
    scores = torch.tensor(model.predict_proba(_joined(data.splits[split])))
    return task_metrics(data.spec, scores, torch.tensor(data.splits[split].labels))
