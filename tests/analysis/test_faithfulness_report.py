"""``kdw faithfulness`` on tiny runs (a teacher and its distilled student): every value against
the functions it is built from (explain_batch, aopc, leave_one_out, kendall_per_example,
paired_bootstrap), the report's shape and ranks, merging into an earlier report (only the
missing explainers computed, resumable after each), and one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kd.cli import main
from tests.conftest import write_tiny_runs
from workbench.analysis.attribution import ExplainerChoice, explain_batch
from workbench.analysis.faithfulness import aopc, kendall_per_example, leave_one_out
from workbench.analysis.faithfulness_report import MEASURES, explainer_faithfulness
from workbench.analysis.settings import FaithfulnessSettings
from workbench.analysis.stats import paired_bootstrap
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
    for measure in ("comprehensiveness", "sufficiency"):  # the means' intervals
        mean = paired_bootstrap(teacher[measure], np.zeros(n), resamples=settings.resamples)
        assert row[f"{measure}_low"] == pytest.approx(mean.low, abs=1e-6)
        assert row[f"{measure}_high"] == pytest.approx(mean.high, abs=1e-6)
        assert row[f"{measure}_low"] <= row[measure] <= row[f"{measure}_high"]
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
    edited = tmp_path / "edited.json"  # a hand-edited AOPC is refused, never merged and ranked
    report["rows"][0]["comprehensiveness"] = 1e9
    edited.write_text(json.dumps(report))
    assert main([*command, "--explainers", "grad", "--json", str(edited), "--merge"]) == 2
    assert capsys.readouterr().err == (
        "kdw: error: not a kdw faithfulness report: row 1 (teacher, ablation): "
        "comprehensiveness 1000000000.0 is outside [-1, 1]\n"
    )
    assert json.loads(edited.read_text()) == report


@pytest.mark.slow
def test_merge_computes_only_the_missing_explainers_and_resumes_after_each(runs, tmp_path, capsys):
    out = tmp_path / "report.json"
    command = ["faithfulness", str(runs / "teacher"), "--examples", "6", "--resamples", "200"]
    student = str(runs / "student")
    assert (
        main([*command[:2], student, *command[2:], "--explainers", "grad", "--json", str(out)]) == 0
    )
    first = json.loads(out.read_text())
    capsys.readouterr()
    assert main([*command, "--explainers", "grad,ablation", "--json", str(out), "--merge"]) == 0
    assert "grad: kept from the file merged into" in capsys.readouterr().err
    merged = json.loads(out.read_text())
    assert [(r["model"], r["explainer"]) for r in merged["rows"]] == [
        ("teacher", "grad"),
        ("teacher", "ablation"),
        ("student", "grad"),
    ]
    assert merged["rows"][2] == first["rows"][1]  # the student's row is kept as it was
    assert merged["intervals"] == first["intervals"]
    assert merged["explainers"] == {"grad": {}, "ablation": {}}
    assert merged["settings"]["explainers"] == "grad,ablation"
    assert sorted(r["rank"] for r in merged["rows"][:2]) == [1, 2]
    # the merged ablation row equals a run of ablation alone
    settings = FaithfulnessSettings(explainers="ablation", examples=6, resamples=200)
    alone = explainer_faithfulness([runs / "teacher"], settings, [ExplainerChoice("ablation")])
    for key in ("comprehensiveness", "sufficiency", "loo_kendall_tau", "comprehensiveness_low"):
        assert merged["rows"][1][key] == pytest.approx(alone["rows"][0][key], abs=1e-9)
    for bad, message in (
        (["--examples", "5"], "the file to merge into has examples 6, this run 5"),
        (["--rules", "ferret"], "the file to merge into has rules 'project', this run 'ferret'"),
    ):
        assert main([*command, *bad, "--explainers", "gxi", "--json", str(out), "--merge"]) == 2
        assert message in capsys.readouterr().err.splitlines()[-1]
    elsewhere = tmp_path / "elsewhere" / "student"  # another model under the student's name
    shutil.copytree(student, elsewhere)
    moved = [*command[:2], str(elsewhere), *command[2:], "--explainers", "gxi"]
    assert main([*moved, "--json", str(out), "--merge"]) == 2
    assert f"this run student from {elsewhere}" in capsys.readouterr().err
    swapped = [command[0], student, *command[2:], "--explainers", "gxi"]
    assert main([*swapped, "--json", str(out), "--merge"]) == 2
    assert "give teacher first" in capsys.readouterr().err
    assert main([*command, "--explainers", "gxi", "--merge"]) == 2
    assert "--merge needs --json FILE" in capsys.readouterr().err
    other = tmp_path / "other.json"
    damaged = {**merged, "models": []}
    for text in ("[1, 2]", json.dumps({k: v for k, v in merged.items() if k != "intervals"})):
        other.write_text(text)
        assert main([*command, "--explainers", "gxi", "--json", str(other), "--merge"]) == 2
        assert "not a kdw faithfulness report: it needs" in capsys.readouterr().err
    other.write_text(json.dumps(damaged))
    assert main([*command, "--explainers", "gxi", "--json", str(other), "--merge"]) == 2
    assert "its models, rows or settings are damaged" in capsys.readouterr().err
    other.write_text(json.dumps({**merged, "settings": {**merged["settings"], "resamples": 7}}))
    assert main([*command, "--explainers", "gxi", "--json", str(other), "--merge"]) == 2
    assert "has resamples 7" in capsys.readouterr().err
    assert main([*command, "--explainers", "gxi", "--json", str(out), "--recompute"]) == 2
    assert "give --merge" in capsys.readouterr().err
    assert json.loads(out.read_text()) == merged  # nothing written by a refused merge
    again = [*command, "--explainers", "grad", "--json", str(out), "--merge", "--recompute"]
    assert main(again) == 0
    assert "kept from the file" not in capsys.readouterr().err
    recomputed = json.loads(out.read_text())  # computed again: the same values
    assert [(r["model"], r["explainer"]) for r in recomputed["rows"]] == [
        (r["model"], r["explainer"]) for r in merged["rows"]
    ]
    for key in ("comprehensiveness", "comprehensiveness_low", "sufficiency_high"):
        assert recomputed["rows"][0][key] == pytest.approx(merged["rows"][0][key], abs=1e-9)


@pytest.mark.slow
def test_the_report_is_handed_on_after_each_explainer(runs):
    seen = []
    settings = FaithfulnessSettings(explainers="grad,gxi", examples=4, resamples=100)
    choices = [ExplainerChoice("grad"), ExplainerChoice("gxi")]
    final = explainer_faithfulness([runs / "teacher"], settings, choices, checkpoint=seen.append)
    assert [[r["explainer"] for r in report["rows"]] for report in seen] == [
        ["grad"],
        ["grad", "gxi"],
    ]
    assert seen[-1] == final
    # an interrupted run resumes from the first report: only gxi is computed again
    resumed = explainer_faithfulness([runs / "teacher"], settings, choices, previous=seen[0])

    def unranked(row: dict) -> dict:
        return {k: v for k, v in row.items() if not k.startswith("rank")}

    assert unranked(resumed["rows"][0]) == unranked(seen[0]["rows"][0])  # kept, not computed
    assert resumed["rows"][1]["comprehensiveness"] == final["rows"][1]["comprehensiveness"]
