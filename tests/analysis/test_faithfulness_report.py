"""``kdw faithfulness`` on tiny runs (a teacher and its distilled student): every value against
the functions it is built from (explain_batch, aopc, leave_one_out, kendall_per_example,
paired_bootstrap), the report's shape and ranks, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kd.cli import main
from tests.conftest import write_tiny_runs
from workbench.analysis.attribution import ExplainerChoice, explain_batch
from workbench.analysis.faithfulness import aopc, kendall_per_example, leave_one_out
from workbench.analysis.faithfulness_report import MEASURES, explainer_faithfulness
from workbench.analysis.stats import paired_bootstrap
from workbench.core.config import FaithfulnessSettings
from workbench.core.data import batches, encode, load_task, pad_id, sample_split
from workbench.core.models import load_model


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("runs")
    write_tiny_runs(work)
    return work


@pytest.mark.slow
def test_report_values_equal_the_functions_it_is_built_from(runs):
    settings = FaithfulnessSettings(explainers="grad,occlusion", examples=6, batch_size=4)
    choices = [ExplainerChoice("grad"), ExplainerChoice("occlusion", {"window": 1})]
    report = explainer_faithfulness([runs / "teacher", runs / "student"], settings, choices)
    assert [(r["model"], r["explainer"]) for r in report["rows"]] == [
        (m, e) for m in ("teacher", "student") for e in ("grad", "occlusion")
    ]
    n = report["examples"]  # about 6: a stratified sample
    assert len(report["intervals"]) == 2 * len(MEASURES) and 5 <= n <= 7
    for model_rows in (report["rows"][:2], report["rows"][2:]):
        for key in ("rank", *(f"rank_{m}" for m in MEASURES)):
            assert sorted(r[key] for r in model_rows) == [1, 2]
    # the teacher's grad row and the student − teacher interval of occlusion, recomputed
    per_model = {}
    for name in ("teacher", "student"):
        loaded = load_model(str(runs / name))
        data = load_task(loaded.data)
        part = sample_split(data.splits["test"], 6, loaded.data.split_seed)
        dataset = encode(part, loaded.tokenizer, loaded.max_length)
        batch = next(batches(dataset, range(n), n, pad_id(loaded.tokenizer)))
        inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        drops = leave_one_out(loaded.model, *inputs)
        per_model[name] = {}
        for choice in choices:
            scores = explain_batch(loaded.model, batch, choice)
            faithful = aopc(loaded.model, *inputs, scores=scores)
            per_model[name][choice.name] = {
                "comprehensiveness": faithful.comprehensiveness.numpy(),
                "sufficiency": faithful.sufficiency.numpy(),
                "loo_kendall_tau": kendall_per_example(scores, drops).numpy(),
            }
    row = report["rows"][0]
    teacher = per_model["teacher"]["grad"]
    assert row["comprehensiveness"] == pytest.approx(teacher["comprehensiveness"].mean(), abs=1e-6)
    assert row["sufficiency"] == pytest.approx(teacher["sufficiency"].mean(), abs=1e-6)
    assert row["loo_kendall_tau"] == pytest.approx(np.nanmean(teacher["loo_kendall_tau"]))
    interval = next(
        i
        for i in report["intervals"]
        if i["explainer"] == "occlusion" and i["measure"] == "comprehensiveness"
    )
    expected = paired_bootstrap(
        per_model["student"]["occlusion"]["comprehensiveness"],
        per_model["teacher"]["occlusion"]["comprehensiveness"],
    )
    assert interval["difference"] == pytest.approx(expected.difference, abs=1e-6)
    assert interval["low"] == pytest.approx(expected.low, abs=1e-6)
    assert report["explainers"]["occlusion"] == {"window": 1, "stride": 1}


@pytest.mark.slow
def test_kdw_faithfulness_writes_json_and_refuses_bad_input_in_one_line(runs, tmp_path, capsys):
    out = tmp_path / "report.json"
    command = ["faithfulness", str(runs / "teacher"), "--examples", "4", "--resamples", "200"]
    assert main([*command, "--explainers", "ablation,grad", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["explainer"] for r in report["rows"]] == ["ablation", "grad"]
    assert report["intervals"] == [] and report["settings"]["explainers"] == "ablation,grad"
    assert "ablation" in capsys.readouterr().out
    for bad, message in (
        (["--explainers", "grad,shap"], "unknown explainer 'shap'"),
        (["--explainers", "grad", "--window", "2"], "--window is a setting of occlusion"),
        (["--explainers", "lime", "--n-samples", "0"], "--n-samples: 0 is not allowed"),
    ):
        assert main([*command, *bad, "--json", str(tmp_path / "no.json")]) == 2
        assert message in capsys.readouterr().err.splitlines()[-1]
    assert not (tmp_path / "no.json").exists()
