"""``kdw cache`` and ``kdw distill --teacher-cache``: a cache built in shards equals one built
whole, a resumed build computes only the pieces it lacks, a student trained from a cache with
its teacher gone equals one trained with the teacher, across tokenizers too, and every
mismatch between a cache and a distillation is one line, exit 2, nothing written."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import workbench.core.cache as cache_module
from kd.cli import main
from kd.training.config import OptimConfig, TeacherConfig
from kd.training.evaluate import evaluate_runs
from kd.training.pipeline import train_teacher
from tests.conftest import make_sentences, write_tiny_workspace
from tests.tiny_families import save_family_model
from workbench.core.config import DataConfig
from workbench.core.runs import Run

pytestmark = pytest.mark.slow  # each trains or builds caches: seconds

LABELS = ["negative", "neutral", "positive"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A task, a tiny BERT teacher run on it, a tiny Llama classifier (byte-level BPE) and a
    tiny BERT one (WordPiece) as the teacher and the student of another tokenizer."""
    work = tmp_path_factory.mktemp("teacher-cache")
    write_tiny_workspace(work)
    data = DataConfig(task=str(work / "task"), max_length=16)
    fast = OptimConfig(epochs=0.1, batch_size=16, threads=1)
    train_teacher(data, TeacherConfig(model=str(work / "tiny-bert")), fast, work / "teacher")
    save_family_model("llama", work / "llama", LABELS, seed=1)
    save_family_model("bert", work / "bert", LABELS, seed=2)
    return work


def _data(work: Path) -> list[str]:
    return ["--task", str(work / "task"), "--max-length", "16"]


def _student(*extra: str) -> list[str]:
    return [
        "--preset",
        "adkd",
        "--attr-steps",
        "4",
        "--init",
        "random",
        "--num-layers",
        "2",
        *extra,
    ]


def _cache(work: Path, out: Path, *extra: str) -> list[str]:
    """``kdw cache``'s arguments: batches of 8, so that the 120 train examples are 2 pieces."""
    teacher = ["--teacher", str(work / "teacher")]
    return [
        "cache",
        *teacher,
        *_data(work),
        *_student(),
        "--batch-size",
        "8",
        "--out",
        str(out),
        *extra,
    ]


def _tensors(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {path.name: load_file(path) for path in sorted(folder.glob("teacher-*.safetensors"))}


def _equal(one: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> bool:
    return one.keys() == other.keys() and all(torch.equal(one[k], other[k]) for k in one)


def test_a_cache_built_in_shards_equals_one_built_whole_and_resumes(work, tmp_path, monkeypatch):
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    assert main(_cache(work, whole)) == 0
    assert main(_cache(work, sharded, "--shard", "2/2")) == 0
    record = json.loads((sharded / "cache.json").read_text())
    assert record["files"] == []  # train's first piece, dev's and test's only piece are 1/2's
    assert len(list(sharded.glob("teacher-train-*.pieces/piece-*"))) == 1

    computed = []
    compute_rows = cache_module.compute_rows
    monkeypatch.setattr(
        cache_module,
        "compute_rows",
        lambda dataset, order, *rest: (
            computed.append(len(order)) or compute_rows(dataset, order, *rest)
        ),
    )
    assert main(_cache(work, sharded)) == 0  # the rest: resumed, then merged
    assert computed == [64, 30, 50]  # train's first piece (its second was 2/2's), dev, test
    assert not list(sharded.glob("*.pieces"))
    built, reference = _tensors(sharded), _tensors(whole)
    assert len(built) == 3 and built.keys() == reference.keys()
    assert all(_equal(built[name], reference[name]) for name in built)
    files = {f["file"]: f for f in json.loads((sharded / "cache.json").read_text())["files"]}
    train = next(f for name, f in files.items() if name.startswith("teacher-train"))
    assert train["examples"] == 120 and set(train["seconds"]) == {"logits", "maps"}
    assert all(seconds > 0 for seconds in train["seconds"].values())


def test_a_student_trained_from_a_cache_equals_one_trained_with_its_teacher(work, tmp_path):
    optim = ["--epochs", "0.3", "--batch-size", "16", "--eval-batch-size", "8", "--threads", "1"]
    with_teacher = tmp_path / "with-teacher"
    distill = ["distill", *_data(work), *_student(), *optim]
    assert main([*distill, "--teacher", str(work / "teacher"), "--run-dir", str(with_teacher)]) == 0
    folder = tmp_path / "cache"
    assert main(_cache(work, folder)) == 0
    teacher = work / "teacher"
    away = teacher.rename(tmp_path / "teacher-away")  # the teacher is not on this machine
    try:
        from_cache = tmp_path / "from-cache"
        assert main([*distill, "--teacher-cache", str(folder), "--run-dir", str(from_cache)]) == 0
    finally:
        away.rename(teacher)
    one, other = (
        load_file(run / "model" / "model.safetensors") for run in (with_teacher, from_cache)
    )
    assert _equal(one, other)
    results = [json.loads((run / "results.json").read_text()) for run in (with_teacher, from_cache)]
    assert results[0] == results[1]
    pins = [Run.open(run).info().resolved.teacher for run in (with_teacher, from_cache)]
    assert pins[0] == pins[1]  # the cache's pin: the same teacher's digests
    manifest = json.loads((from_cache / "manifest.json").read_text())
    assert manifest["teacher_fields"] == {"cache": str(folder.resolve())}

    # kdw evaluate: a teacher that is only a cache, scored and compared on the logits it holds
    cache_row, student_row = evaluate_runs([str(folder), str(from_cache)])
    teacher_row, against_teacher = evaluate_runs(
        [str(teacher), str(from_cache)], teacher=str(teacher)
    )
    assert cache_row["kind"] == "teacher cache" and cache_row["layers"] == teacher_row["layers"]
    assert cache_row["parameters_m"] == teacher_row["parameters_m"]
    for metric in ("accuracy", "macro_f1", "examples"):
        assert cache_row[metric] == teacher_row[metric]
    assert student_row["label_loyalty"] == against_teacher["label_loyalty"]
    # the cache's logits and evaluate's own come from batches of other sizes: float32 rounding
    assert student_row["probability_loyalty"] == pytest.approx(
        against_teacher["probability_loyalty"], abs=1e-6
    )


def _dev_terms(run: Path) -> dict[str, float]:
    """The terms' values of the last dev record of a run's ``metrics.jsonl``."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in reversed(records) if r["split"] == "dev")


@pytest.mark.parametrize(
    ("method", "term"),
    [(["--preset", "adkd", "--attr-steps", "4"], "attr"), (["--preset", "ckd"], "ltr")],
)
def test_across_tokenizers_a_cache_holds_the_fields_on_the_students_words(
    work, tmp_path, capsys, method, term
):
    folder, student = (
        tmp_path / "cache",
        ["--init", "pretrained", "--pretrained", str(work / "bert"), "--num-layers", "2"],
    )
    common = [*_data(work), *method, *student]
    assert main(["cache", "--teacher", str(work / "llama"), *common, "--out", str(folder)]) == 0
    run, live = tmp_path / "student", tmp_path / "live"
    optim = ["--epochs", "0.2", "--batch-size", "16", "--threads", "1"]
    assert (
        main(["distill", "--teacher-cache", str(folder), *common, *optim, "--run-dir", str(run)])
        == 0
    )
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["word_alignment"]["train"]["words"] > 0
    assert (
        "teacher and student read the text through different tokenizers" in capsys.readouterr().err
    )
    # the same student trained with the teacher itself: its term's value within float32's
    # rounding of the teacher's fields computed in other batches (the cache's of 64)
    teacher = ["--teacher", str(work / "llama")]
    assert main(["distill", *teacher, *common, *optim, "--run-dir", str(live)]) == 0
    cached_terms, live_terms = _dev_terms(run), _dev_terms(live)
    assert cached_terms[term] > 0
    assert cached_terms[term] == pytest.approx(live_terms[term], rel=1e-4)
    capsys.readouterr()
    # a student of the teacher's own tokenizer reads the teacher's tokens, not these words
    random = ["--init", "random", "--num-layers", "2"]
    other = [*_data(work), *method, *random, *optim]
    assert (
        main(["distill", "--teacher-cache", str(folder), *other, "--run-dir", str(run) + "2"]) == 2
    )
    assert "differ in words" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ["--max-train-examples", "60"],
            "was built on other data than these options give (its splits differ): it was built "
            "with no --max-train-examples",
        ),
        (["--init", "cut"], "a cut student is made of the teacher's layers"),
        (["--preset", "kd"], "holds no train cache of logits for these settings"),
        (["--teacher", "OTHER"], "caches another teacher than"),
        (["--teacher-cache", "NOWHERE"], "--teacher-cache NOWHERE: no such folder"),
    ],
)
def test_a_cache_that_does_not_fit_is_one_line_and_nothing_is_written(
    work, tmp_path, capsys, change, message
):
    folder = tmp_path / "cache"
    assert main(_cache(work, folder)) == 0
    if "OTHER" in change:  # the same architecture trained on: other weights
        shutil.copytree(work / "teacher", tmp_path / "other")
        (tmp_path / "other" / "model" / "model.safetensors").write_bytes(
            (work / "tiny-bert" / "model.safetensors").read_bytes()
        )
        change = ["--teacher", str(tmp_path / "other")]
    capsys.readouterr()
    run = tmp_path / "student"
    given = [
        "distill",
        "--teacher-cache",
        str(folder),
        *_data(work),
        *_student(),
        "--run-dir",
        str(run),
    ]
    assert main([*given, *change]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("kdw: error: ")
    assert not run.exists()


def test_kdw_cache_refuses_a_cache_as_its_teacher(work, tmp_path, capsys):
    out = tmp_path / "cache"
    assert main([*_cache(work, out), "--teacher-cache", str(tmp_path)]) == 2
    assert (
        "kdw cache computes the teacher's fields: leave out --teacher-cache"
        in capsys.readouterr().err
    )
    alone = ["cache", *_data(work), "--preset", "finetune", "--out", str(out)]
    assert main(alone) == 2
    assert "kdw cache needs --teacher" in capsys.readouterr().err
    assert not out.exists()


def test_gkd_from_a_cache_copies_the_embeddings_it_keeps(work, tmp_path, capsys):
    gkd = ["--preset", "gkd", "--init", "random", "--num-layers", "2"]
    optim = ["--epochs", "0.3", "--batch-size", "16", "--eval-batch-size", "8", "--threads", "1"]
    distill = ["distill", *_data(work), *gkd, *optim]
    teacher = work / "teacher"
    with_teacher, from_cache = tmp_path / "with-teacher", tmp_path / "from-cache"
    assert main([*distill, "--teacher", str(teacher), "--run-dir", str(with_teacher)]) == 0
    folder = tmp_path / "cache"
    cache = ["cache", "--teacher", str(teacher), *_data(work), *gkd, "--out", str(folder)]
    assert main(cache) == 0
    kept = folder / "teacher" / "embeddings.safetensors"
    teacher_weights = load_file(teacher / "model" / "model.safetensors")
    embeddings = load_file(kept)
    assert embeddings.keys() == {k for k in teacher_weights if ".embeddings." in k}
    assert all(torch.equal(embeddings[k], teacher_weights[k]) for k in embeddings)

    kept.unlink()  # a cache without them: refused in one line, nothing written
    capsys.readouterr()
    given = [*distill, "--teacher-cache", str(folder), "--run-dir", str(from_cache)]
    assert main(given) == 2
    err = capsys.readouterr().err
    assert "which this teacher cache does not hold: run kdw cache on it" in err
    assert err.count("\n") == 1 and not from_cache.exists()
    assert main(cache) == 0 and kept.is_file()  # kdw cache with the teacher adds them

    assert main(given) == 0
    one, other = (
        load_file(run / "model" / "model.safetensors") for run in (with_teacher, from_cache)
    )
    # the same student as with its teacher (the cached input gradients come from batches of
    # other sizes: float32 rounding), its embeddings the teacher's, copied and frozen
    assert one.keys() == other.keys()
    assert all(torch.allclose(one[k], other[k], rtol=1e-4, atol=1e-7) for k in one)
    assert all(torch.equal(other[k], embeddings[k]) for k in embeddings)

    kept.write_bytes(b"not a safetensors file")  # damaged: one line naming it
    capsys.readouterr()
    assert main([*given[:-1], str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert f"{kept} is not the file kdw cache wrote" in err and err.count("\n") == 1


def test_a_ckd_cache_serves_only_students_of_its_layer_mapping(work, tmp_path, capsys):
    """CKD's teacher states are those of the layers its uniform mapping pairs with the
    student's, so a cache built for a 2-layer student is refused to a 1-layer one in one line
    naming the mapping, nothing written."""
    folder, run = tmp_path / "cache", tmp_path / "student"
    ckd = [*_data(work), "--preset", "ckd", "--init", "random", "--num-layers"]
    teacher = ["--teacher", str(work / "teacher")]
    assert main(["cache", *teacher, *ckd, "2", "--out", str(folder)]) == 0
    capsys.readouterr()
    assert main(["distill", "--teacher-cache", str(folder), *ckd, "1", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "relation_pairs" in err and err.count("\n") == 1 and err.startswith("kdw: error: ")
    assert not run.exists()


def test_a_transfer_set_is_cached_trained_on_and_recorded(work, tmp_path, capsys):
    """``--transfer``: the cache holds the teacher's fields on the transfer texts too, a student
    trains from it, ``run.json`` and ``manifest.json`` record the set, a transfer text equal to a
    test text is dropped and counted, and a cache of other transfer texts is refused by name."""
    test_text = (work / "task" / "test.csv").read_text().splitlines()[1].rsplit(",", 1)[0]
    texts = [t for t in make_sentences(100, seed=11).text]
    more = tmp_path / "more.txt"
    more.write_text("\n".join([*texts, test_text.strip('"')]))
    transfer = ["--transfer", str(more), "--max-transfer-examples", "40"]
    folder, run = tmp_path / "cache", tmp_path / "student"
    kd = ["--preset", "kd", "--init", "pretrained", "--pretrained", str(work / "tiny-bert")]
    capsys.readouterr()
    assert main(["cache", "--teacher", str(work / "teacher"), *_data(work), *kd, *transfer,
                 "--out", str(folder)]) == 0  # fmt: skip
    assert "classification head" not in capsys.readouterr().err  # the cache trains no student
    optim = ["--epochs", "0.3", "--batch-size", "16", "--threads", "1"]
    distill = ["distill", *_data(work), *kd, *optim, "--teacher-cache", str(folder)]
    assert main([*distill, *transfer, "--run-dir", str(run)]) == 0
    assert "has no classification head: a new one" in capsys.readouterr().err
    manifest = json.loads((run / "manifest.json").read_text())["transfer"]
    assert manifest["source"] == str(more.resolve()) and manifest["used"] == 40
    assert manifest["dropped"]["dev or test"] == 1  # the test text
    assert manifest["read"] == len(texts) + 1 and manifest["labelled_only"] == ["ce"]
    assert manifest["used"] + sum(manifest["dropped"].values()) == manifest["read"]
    student = Run.open(run).info().configs["student"]
    assert (student["transfer"], student["max_transfer_examples"]) == (str(more.resolve()), 40)
    sizes = json.loads((run / "manifest.json").read_text())["split_sizes"]
    assert sizes["train"] == 120 + 40
    cached = json.loads((folder / "cache.json").read_text())
    train = next(f for f in cached["files"] if f["key"]["split"] == "train")
    assert train["examples"] == 160 and cached["transfer"]["fingerprint"] == manifest["fingerprint"]

    capsys.readouterr()
    assert main([*distill, *transfer, "--run-dir", str(run)]) == 0  # finished: kept as it is
    fewer = [*distill, *transfer, "--max-transfer-examples", "30", "--run-dir", str(run)]
    assert main(fewer) == 2  # another sample: not the cache's, nor the run's
    assert "it was built with --transfer" in capsys.readouterr().err
    assert Run.open(run).status().state == "finished"
    other = tmp_path / "other"
    assert main([*distill, "--run-dir", str(other)]) == 2  # the cache was built with it
    err = capsys.readouterr().err
    assert f"it was built with --transfer {more.resolve()} (40 texts)" in err
    assert not other.exists()
    (tmp_path / "binary.txt").write_bytes(b"a text\n\x00\x01\x02\n")
    assert (
        main([*distill, "--transfer", str(tmp_path / "binary.txt"), "--run-dir", str(other)]) == 2
    )
    assert "line 2 holds a NUL byte: a binary file, not text" in capsys.readouterr().err
    gold = ["--preset", "adkd", "--attr-views", "gold", "--teacher", str(work / "teacher")]
    assert main(["distill", *_data(work), *gold, *transfer, "--run-dir", str(other)]) == 2
    assert "AD-KD's gold view maps the gold class" in capsys.readouterr().err
    assert not other.exists()


def test_a_student_trains_alone_with_no_teacher_or_from_any_cache(work, built, tmp_path, capsys):
    """``--preset finetune`` needs no teacher and reads no train field of a cache: the student
    trained alone with no teacher equals the one trained beside a cache of other fields, whose
    test logits give it its loyalty; ``kdw evaluate`` scores each student against the cache in
    the row above it, saying so where the student learnt from another or from none."""
    alone = ["--preset", "finetune", "--init", "pretrained", "--pretrained", str(work / "bert")]
    optim = ["--epochs", "0.3", "--batch-size", "16", "--threads", "1"]
    distill = ["distill", *_data(work), *alone, *optim]
    assert main([*distill, "--run-dir", str(tmp_path / "alone")]) == 0
    folder = tmp_path / "cache"
    assert main(_cache(work, folder)) == 0  # AD-KD's fields: no finetune key on train
    assert main([*distill, "--teacher-cache", str(folder), "--run-dir", str(tmp_path / "c")]) == 0
    one, other = (load_file(tmp_path / r / "model" / "model.safetensors") for r in ("alone", "c"))
    assert _equal(one, other)
    results = [json.loads((tmp_path / r / "results.json").read_text()) for r in ("alone", "c")]
    assert "label_loyalty" not in results[0]["test"] and "label_loyalty" in results[1]["test"]
    assert Run.open(tmp_path / "alone").info().resolved.teacher is None
    said: list[str] = []
    rows = evaluate_runs(
        [str(built), str(tmp_path / "alone"), str(tmp_path / "c")], notify=said.append
    )
    recorded = results[1]["test"]["label_loyalty"]  # c's, against its own cache: same teacher
    assert [row["label_loyalty"] for row in rows[1:]] == pytest.approx([recorded, recorded])
    assert said[:2] == [
        f"alone was trained without a teacher: its loyalty is measured against {built}, in the "
        "row above it",
        f"c learnt from {folder}: its loyalty is measured against {built}, in the row above it",
    ]

    capsys.readouterr()
    kd = [*distill[:-2], "--preset", "kd", "--run-dir", str(tmp_path / "kd")]
    assert main(kd) == 2
    assert "distill needs --teacher for the terms kd" in capsys.readouterr().err
    cut = ["distill", *_data(work), "--preset", "finetune", "--run-dir", str(tmp_path / "cut")]
    assert main(cut) == 2
    assert "add --init pretrained --pretrained MODEL" in capsys.readouterr().err
    transfer = [*distill, "--transfer", "task", "--run-dir", str(tmp_path / "t")]
    assert main(transfer) == 2  # the texts would teach nothing
    assert "texts without labels teach a student only through a teacher" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in ("kd", "cut", "t"))


@pytest.fixture(scope="module")
def built(work, tmp_path_factory) -> Path:
    """A complete cache of AD-KD's fields (logits, maps) of the teacher run."""
    folder = tmp_path_factory.mktemp("built") / "cache"
    assert main(_cache(work, folder)) == 0
    return folder


def _field_file(folder: Path, split: str) -> Path:
    return next(folder.glob(f"teacher-{split}-*.safetensors"))


def _header(path: Path, key: str, dtype: str) -> None:
    """Rewrite the safetensors header of ``path`` to call the tensor ``key`` ``dtype``, its
    bytes and the header's length unchanged (spaces pad a shorter header)."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    header[key]["dtype"] = dtype
    text = json.dumps(header, separators=(",", ":")).encode().ljust(size)
    path.write_bytes(data[:8] + text + data[8 + size :])


def _record_digests(folder: Path) -> None:
    """Record in ``cache.json`` the sha256 of the files as they are now, as one who forges a
    cache would: only the checks of what the files hold stand in the way."""
    record = json.loads((folder / "cache.json").read_text())
    for entry in record["files"]:
        entry["sha256"] = hashlib.sha256((folder / entry["file"]).read_bytes()).hexdigest()
    teacher = folder / "teacher"
    record["teacher_files"] = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(teacher.iterdir())
    }
    (folder / "cache.json").write_text(json.dumps(record))


def _five_classes(folder: Path) -> None:
    path = _field_file(folder, "test")
    tensors = load_file(path)
    tensors["example.logits"] = torch.zeros(len(tensors["example.logits"]), 5)
    save_file(tensors, path)


def _labels_reordered(folder: Path) -> None:
    record = json.loads((folder / "cache.json").read_text())
    record["task"]["label_names"] = record["task"]["label_names"][::-1]
    (folder / "cache.json").write_text(json.dumps(record))


def _deep_teacher(folder: Path) -> None:
    config = json.loads((folder / "teacher" / "config.json").read_text())
    (folder / "teacher" / "config.json").write_text(
        json.dumps(config | {"num_hidden_layers": 100000})
    )


@pytest.mark.parametrize(
    ("damage", "forged", "message"),
    [
        (
            lambda f: _header(_field_file(f, "train"), "example.logits", "I32"),
            False,
            "teacher-train-{digest} is not the file kdw cache wrote (its sha256 is not the one "
            "cache.json records): delete it, and kdw cache with the teacher computes it again",
        ),
        (
            lambda f: _header(_field_file(f, "train"), "example.logits", "I32"),
            True,
            "is not a cache of this split (example.logits is int32, not float)",
        ),
        (_five_classes, True, "(its logits are [50, 5], not [50, 3]: one a class)"),
        (
            _labels_reordered,
            False,
            "cache.json names the classes ['positive', 'neutral', 'negative'], but the task's "
            "are ['negative', 'neutral', 'positive'] (in this order)",
        ),
        (_deep_teacher, False, "teacher/config.json is not the file kdw cache wrote"),
        (
            _deep_teacher,
            True,
            "teacher/config.json: num_hidden_layers is 100000, more layers than any model has",
        ),
    ],
    ids=["changed", "I32", "5 classes", "labels", "deep teacher", "deep teacher, forged"],
)
def test_a_cache_that_is_not_what_it_claims_is_refused_before_training(
    work, built, tmp_path, capsys, damage, forged, message
):
    """What a cache holds is checked against its record and the split it claims to be of: a
    changed file by its sha256, and, where a forger recorded the new sha256 too, a field's dtype,
    its class count, the classes' order and the teacher's config, each one line, exit 2,
    nothing written, at once."""
    folder = tmp_path / "cache"
    shutil.copytree(built, folder)
    digest = _field_file(folder, "train").name.removeprefix("teacher-train-")
    damage(folder)
    if forged:
        _record_digests(folder)
    run = tmp_path / "student"
    distill = ["distill", "--teacher-cache", str(folder), *_data(work), *_student()]
    capsys.readouterr()
    start = time.perf_counter()
    assert main([*distill, "--run-dir", str(run)]) == 2
    assert time.perf_counter() - start < 30  # a 100,000-layer model takes minutes to build
    err = capsys.readouterr().err
    assert message.format(digest=digest) in err and err.count("\n") == 1
    assert not run.exists()
    if damage is _five_classes:  # the cache scored as a teacher reads the same test logits
        assert main(["evaluate", str(folder)]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda t: t | {"index": torch.zeros_like(t["index"])}, "its index names other examples"),
        (lambda t: t | {"index": t["index"] + 10**9}, "its index names other examples"),
        (lambda t: t | {"token.maps": t["token.maps"] * torch.nan}, "NaN or infinite values"),
        (lambda t: {k: v for k, v in t.items() if k != "token.maps"}, "it holds no token.maps"),
    ],
    ids=["index zeros", "index 1e9", "NaN", "missing field"],
)
def test_a_bad_piece_is_refused_by_name_and_nothing_is_merged_or_deleted(
    work, tmp_path, capsys, damage, problem
):
    folder = tmp_path / "cache"
    assert main(_cache(work, folder, "--shard", "1/2")) == 0
    piece = next(folder.glob("teacher-train-*.pieces/piece-*"))
    save_file(damage(load_file(piece)), piece)
    capsys.readouterr()
    assert main(_cache(work, folder)) == 2  # the other piece computed, then the merge refused
    line = capsys.readouterr().err.splitlines()[-1]  # after the notes and the progress bar
    assert line.startswith(f"kdw: error: {piece} is not a piece of this cache ({problem}")
    assert len(list(piece.parent.iterdir())) == 2  # both kept
    assert not list(folder.glob("teacher-train-*.safetensors"))
    piece.unlink()  # computed again, then merged
    assert main(_cache(work, folder)) == 0
    assert _field_file(folder, "train").exists() and not piece.parent.exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_pipe_as_cache_json_is_refused_by_what_it_is(work, tmp_path, capsys):
    folder = tmp_path / "cache"
    folder.mkdir()
    os.mkfifo(folder / "cache.json")
    run = tmp_path / "student"
    distill = ["distill", "--teacher-cache", str(folder), *_data(work), *_student()]
    assert main([*distill, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'cache.json'} is a pipe" in err and err.count("\n") == 1
    assert main(["evaluate", str(folder)]) == 2
    assert f"{folder / 'cache.json'} is a pipe" in capsys.readouterr().err
    assert not run.exists()
