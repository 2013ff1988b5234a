"""The Python API refuses each damaged model folder of the shared table
(``tests/damaged_models.py``) with the line every door says; a deep config is refused from the
weights' header at once, and a checkpoint without a head gets a new one and says so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.damaged_models import IDS, build, error
from workbench.core.errors import WorkbenchError
from workbench.core.models import load_classifier, load_model


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("damaged-models"))


def test_the_undamaged_folder_loads(work):
    loaded = load_model(str(work / "good"))
    assert loaded.spec.label_names == ("negative", "neutral", "positive")


@pytest.mark.parametrize("case", IDS)
def test_the_python_api_refuses_it(work, case):
    with pytest.raises(WorkbenchError) as raised:
        load_model(str(work / "cases" / case))
    assert str(raised.value) == error(case, work)


def test_a_deep_config_is_refused_from_the_header_at_once(work):
    start = time.perf_counter()
    with pytest.raises(WorkbenchError, match="num_hidden_layers is 100000"):
        load_classifier(str(work / "cases" / "100000 layers"), 3)
    assert time.perf_counter() - start < 5  # building 100000 layers takes minutes


def test_a_checkpoint_without_a_head_gets_a_new_one_and_says_so(work):
    notes: list[str] = []
    from workbench.core.verify import check_loaded

    model, info = _bare_load(work / "tiny-bert")
    check_loaded(model, info, "tiny-bert", True, notes.append)
    assert notes == [
        "tiny-bert has no classification head: a new one (classifier.bias, classifier.weight) "
        "starts from random values and is trained for the task"
    ]
    with pytest.raises(WorkbenchError, match="2 weights the architecture expects missing"):
        check_loaded(model, info, "tiny-bert", False)  # a classifier without its head: refused


def _bare_load(folder: Path):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(
        folder, num_labels=3, output_loading_info=True
    )
