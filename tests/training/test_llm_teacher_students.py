"""``bench/llm_teacher_students.py``: students of a teacher cache across tokenizers, one row per
student matching its run's records (a pretrained student cut to the layers asked for), its
saliency loyalty the mean of the per-example scores kept, and paired intervals that agree with
the runs' scores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

import bench.common
from bench.llm_teacher_students import main, same_training
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import control
from tests.conftest import make_sentences, write_tiny_workspace
from tests.tiny_families import LAYERS, save_family_model
from workbench.core.config import DataConfig

LABELS = ["negative", "neutral", "positive"]


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.slow  # builds a cache and trains three students: seconds
def test_rows_and_pairs_match_the_runs(tmp_path, monkeypatch):
    write_tiny_workspace(tmp_path)
    save_family_model("llama", tmp_path / "llama", LABELS, seed=1)
    save_family_model("bert", tmp_path / "bert", LABELS, seed=2)
    monkeypatch.setattr(bench.common, "RESULTS", tmp_path / "results")
    cache, out = tmp_path / "cache", tmp_path / "suite"
    argv = [
        "--teacher-cache",
        str(cache),
        "--teacher",
        str(tmp_path / "llama"),  # completes the cache with each arm's fields
        "--task",
        str(tmp_path / "task"),
        "--max-length",
        "16",
        "--pretrained",
        str(tmp_path / "bert"),
        "--num-layers",
        "1",
        "--presets",
        "kd,gkd",
        "--seeds",
        "1",
        "--epochs",
        "0.2",
        "--batch-size",
        "16",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    rows = main(argv)
    assert [(r["method"], r["control"], r["seed"], r["transfer"]) for r in rows] == [
        ("finetune", False, 1, 0),
        ("kd", False, 1, 0),
        ("gkd", False, 1, 0),
        ("gkd", True, 1, 0),
    ]
    alone, rows = rows[0], rows[1:]
    _check_alone(alone, out, cache)
    for r, name in zip(rows, ("kd-s1", "gkd-s1", "gkd-control-s1"), strict=True):
        run = out / "runs" / name
        test = _read(run / "results.json")["test"]
        for metric in ("accuracy", "label_loyalty", "probability_loyalty"):
            assert r[metric if metric != "accuracy" else "test_accuracy"] == test[metric]
        # only a per-token term (GKD's, not its control's) compares on words
        alignment = _read(run / "manifest.json").get("word_alignment")
        assert (alignment is not None) == (name == "gkd-s1")
        assert r["words_dropped"] == (alignment["train"]["left_out"] if alignment else None)
        assert r["teacher_model_type"] == "llama" and r["student_model_type"] == "bert"
        for side, folder in (("teacher", tmp_path / "llama"), ("student", tmp_path / "bert")):
            tokenizer = AutoTokenizer.from_pretrained(folder)
            assert r[f"{side}_tokenizer"].endswith(f" ({len(tokenizer):,})")
        assert r["teacher_tokenizer"].split(" ")[0].endswith("/BPE")
        assert r["student_tokenizer"].split(" ")[0].endswith("/WordPiece")
        assert r["student_init"] == "pretrained bert"  # no folder of the machine it ran on
        assert r["student_layers"] == 1 and r["student_kept_layers"] == [LAYERS - 1]
        assert set(r["recall"]) == set(LABELS)
        kept = _read(out / "saliency" / f"{name}.json")
        assert kept["uids"] == _read(run / "predictions.json")["test"]["uids"]
        scores = [x for x in kept["scores"] if x is not None]
        assert scores and all(-1 - 1e-6 <= x <= 1 + 1e-6 for x in scores)
        assert r["saliency_loyalty"] == pytest.approx(np.mean(scores))
    written = _read(tmp_path / "results" / "llm-teacher.json")
    assert written["rows"] == bench.common.portable(
        [alone, *rows]
    )  # the runs named, not their paths
    assert written["rows"][1]["run"] == Path(rows[0]["run"]).name
    assert set(written["pairs"]) == {"gkd", "kd"}  # vanilla KD is its own control
    assert set(written["pairs"]["kd"]) == {"kd − finetune"}  # what the teacher bought
    bought = written["pairs"]["kd"]["kd − finetune"]["test_accuracy"]["difference"]
    assert bought == pytest.approx(rows[0]["test_accuracy"] - alone["test_accuracy"])
    test = {r["run"]: _read(Path(r["run"]) / "predictions.json")["test"] for r in rows}
    gkd, control, kd = (test[r["run"]] for r in (rows[1], rows[2], rows[0]))
    for name, other in (("gkd − control", control), ("gkd − kd", kd)):
        found = written["pairs"]["gkd"][name]
        assert other["uids"] == gkd["uids"]  # one test set, in one order
        correct = [np.equal(t["predictions"], t["labels"]).mean() for t in (gkd, other)]
        accuracy = found["test_accuracy"]
        assert accuracy["difference"] == pytest.approx(correct[0] - correct[1])
        assert accuracy["low"] <= accuracy["difference"] <= accuracy["high"]
        assert accuracy["seeds"] == 1 and accuracy["pairs"] == len(gkd["uids"])
        loyalty = found["label_loyalty"]["difference"]
        assert loyalty == pytest.approx(
            np.mean(gkd["label_loyalty"]) - np.mean(other["label_loyalty"])
        )
        names = {"gkd − control": "gkd-control-s1", "gkd − kd": "kd-s1"}
        a, b = (_read(out / "saliency" / f"{n}.json")["scores"] for n in ("gkd-s1", names[name]))
        both = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
        assert found["saliency_loyalty"]["difference"] == pytest.approx(
            np.mean([x - y for x, y in both])
        )

    # a second call reuses the finished runs: the same rows
    assert [r["test_accuracy"] for r in main(argv)[1:]] == [r["test_accuracy"] for r in rows]
    # --no-training reports what is trained and trains nothing: CKD is left out, its control
    # is vanilla KD's student
    shown = main([*argv, "--presets", "kd,ckd", "--no-training", "--no-alone"])
    assert [(r["method"], r["control"], r["run"]) for r in shown] == [
        ("kd", False, rows[0]["run"]),
        ("ckd", True, rows[0]["run"]),
    ]
    assert not (out / "runs" / "ckd-s1").exists()
    assert _read(tmp_path / "results" / "llm-teacher.json")["rows"] == bench.common.portable(shown)

    # with a transfer set: vanilla KD on it and on the labelled examples alone, and the
    # reference rows: the teacher itself agrees with itself, a random student is the floor
    more = tmp_path / "more.txt"
    more.write_text("\n".join(make_sentences(200, seed=7).text))
    shown = main(
        [
            *argv,
            *("--teacher-cache", str(tmp_path / "cache-u"), "--out", str(tmp_path / "u")),
            *("--presets", "kd", "--transfer", str(more), "--no-alone", "--results", "u"),
            *("--references", str(tmp_path / "llama"), "--random-reference"),
        ]
    )
    used = _read(tmp_path / "u" / "runs" / "kd-s1" / "manifest.json")["transfer"]["used"]
    assert [(r["method"], r["labelled"], r["transfer"]) for r in shown] == [
        ("kd", 120, 0),
        ("kd", 120, used),
    ]
    written = _read(tmp_path / "results" / "u.json")
    assert set(written["pairs"]["kd"]) == {"kd − kd on L"}
    itself, floor = written["references"]
    assert itself["label_loyalty"] == 1.0 and itself["saliency_loyalty"] == pytest.approx(1.0)
    assert floor["method"] == "reference: random student" and floor["saliency_loyalty"] < 1


def _check_alone(alone: dict, out: Path, cache: Path) -> None:
    """The student trained alone: no teacher recorded, and its label loyalty the share of test
    examples where it predicts the teacher's class (the cache's logits)."""
    from kd.training.teacher_cache import cached_logits
    from workbench.core.data import load_task
    from workbench.core.runs import Run

    run = out / "runs" / "finetune-s1"
    assert Run.open(run).info().resolved.teacher is None
    assert "teacher_fields" not in _read(run / "manifest.json")
    predicted = _read(run / "predictions.json")["test"]["predictions"]
    task = load_task(Run.open(run).config(DataConfig, "data"), notify=lambda _: None)
    teacher = cached_logits(cache, "test", task).argmax(-1).tolist()
    assert alone["label_loyalty"] == pytest.approx(np.equal(predicted, teacher).mean())
    assert alone["probability_loyalty"] is None


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("kd", "ckd", True),  # CKD's and PKD's controls weigh CE and KD as vanilla KD does
        ("kd", "pkd-skip", True),
        ("kd", "gkd", False),  # GKD's control keeps its student set-up: dropout off
        ("kd", "adkd", False),  # AD-KD's control weighs CE 0.1, KD 0.9 at τ 2
        ("ckd", "ckd", True),
    ],
)
def test_a_control_that_trains_as_vanilla_kd_is_recognised(a, b, same):
    one, other = ObjectiveConfig(preset=a), control(ObjectiveConfig(preset=b))
    assert same_training(control(one), other) is same
    assert same_training(ObjectiveConfig(preset="ckd"), other) is False  # own terms: never
