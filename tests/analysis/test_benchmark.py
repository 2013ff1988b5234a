"""``kdw benchmark`` and ``kdw export-model --onnx`` on tiny runs: the table and its JSON, the
export's parity check (and its failure on a corrupted graph), the ONNX graphs of BERT and
RoBERTa at other batch sizes and lengths than traced, and one-line errors for bad input."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import safetensors.torch
import torch
from transformers import AutoModelForSequenceClassification

import workbench.analysis.deployment as deployment
from kd.cli import main
from tests.cli.test_cli import _error_line
from tests.conftest import make_sentences, tiny_config, tiny_model, tiny_tokenizer
from tests.tiny_families import FAMILY_TYPES, save_family_model
from workbench.analysis.benchmark import benchmark
from workbench.analysis.evaluation import predict_logits
from workbench.analysis.int8 import quantize_int8
from workbench.analysis.settings import BenchmarkSettings, OnnxSettings, parse_precisions
from workbench.core.data import Split, encode, pad_id
from workbench.core.errors import WorkbenchError
from workbench.core.machine import describe, processor
from workbench.core.models import load_model, load_run

MEASURED = (
    "parameters",
    "disk_mb",
    "peak_memory_mb",
    "tokenize_ms_per_text",
    "latency_ms_median",
    "latency_ms_p95",
    "throughput_b8",
)
ROW_FIELDS = {
    "name",
    "engine",
    "source",
    *MEASURED,
    "accuracy",
    "macro_f1",
    "label_loyalty",
    "probability_loyalty",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny teacher run (4 layers) and a 2-layer student distilled from it."""
    root = tmp_path_factory.mktemp("runs")
    model_dir, task = root / "tiny-bert", root / "task"
    tokenizer = tiny_tokenizer(model_dir)
    tiny_model().bert.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    task.mkdir()
    frame = make_sentences(400)
    frame.iloc[:300].to_csv(task / "train.csv", index=False)
    frame.iloc[300:350].to_csv(task / "dev.csv", index=False)
    frame.iloc[350:].to_csv(task / "test.csv", index=False)
    teacher, student = root / "teacher", root / "student"
    common = f"--task {task} --max-length 16 --threads 1 --batch-size 8".split()
    common += ["--learning-rate", "2e-3", "--checkpoint-every", "1000"]
    teach = f"train-teacher --run-dir {teacher} --model {model_dir} --epochs 3".split()
    assert main([*teach, *common]) == 0
    distil = f"distill --run-dir {student} --teacher {teacher} --preset kd --epochs 1".split()
    assert main([*distil, "--num-layers", "2", *common]) == 0
    return teacher, student


@pytest.fixture(scope="module")
def exported(runs) -> Path:
    """The teacher exported as ONNX, float32 and int8."""
    out = runs[0].parent / "teacher-onnx"
    assert (
        main(["export-model", str(runs[0]), "--out", str(out), "--onnx", "--quantize", "int8"]) == 0
    )
    return out


@pytest.mark.slow
def test_export_is_checked_and_recorded(runs, exported):
    record = json.loads((exported / "export.json").read_text())
    assert set(record["graphs"]) == {"fp32", "int8"}
    assert record["examples"] == 50 and record["split"] == "test"
    fp32, int8 = record["graphs"]["fp32"], record["graphs"]["int8"]
    assert fp32["max_abs_logit_difference"] < 1e-4 and fp32["label_agreement"] == 1.0
    assert int8["label_agreement"] >= 0.99
    assert fp32["max_abs_logit_difference"] < int8["max_abs_logit_difference"]
    card = (exported / "README.md").read_text()
    pytorch = (runs[0] / "model" / "README.md").read_text()
    assert "library_name: transformers" in pytorch and not list(exported.glob("*.safetensors"))
    assert card.startswith(pytorch.replace("library_name: transformers", "library_name: onnx"))
    assert f"| fp32 | `model.onnx` | {fp32['max_abs_logit_difference']:.3g} | 1.0000 |" in card
    # the processor whose int8 kernels gave the agreement, in the record and the card
    assert record["machine"]["instructions"] == processor()["instructions"]
    assert f"test split, on {describe(record['machine'])}, and compared" in card
    assert {"model.onnx", "model.int8.onnx", "tokenizer.json", "config.json"} <= {
        p.name for p in exported.iterdir()
    }
    # the card's way to run a graph runs, and names the class PyTorch predicts
    code = card.split("```python\n", 1)[1].split("```", 1)[0]
    code = code.replace("path/to/this/folder", str(exported))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})
    teacher = load_run(runs[0])
    logits = teacher.model(**teacher.tokenizer(["a text to classify"], return_tensors="pt")).logits
    assert printed.getvalue().strip() == str([teacher.spec.label_names[int(logits.argmax())]])
    assert not list(exported.parent.glob(".teacher-onnx*"))  # no staging folder left


@pytest.mark.slow
def test_int8_export_into_a_folder_named_from_the_working_directory(
    runs, tmp_path, monkeypatch, capsys
):
    """A relative --out: ONNX Runtime prepares the int8 graph in a temporary folder of its own,
    where a relative path would name nothing; the export lands in the working directory, and
    the command prints each graph's agreement as the record keeps it."""
    monkeypatch.chdir(tmp_path)
    command = ["export-model", str(runs[0]), "--out", "onnx8", "--onnx", "--quantize", "int8"]
    assert main(command) == 0
    record = json.loads((tmp_path / "onnx8" / "export.json").read_text())
    assert set(record["graphs"]) == {"fp32", "int8"}
    printed = capsys.readouterr().out.splitlines()
    assert printed[1:] == [
        f"{p}: label agreement {g['label_agreement']:.4f} with PyTorch on 50 test examples "
        "(at least 0.99 asked)"
        for p, g in record["graphs"].items()
    ]
    assert (tmp_path / "onnx8" / "model.int8.onnx").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["onnx8"]  # no staging folder left


def test_fused_calibrated_int8_export_keeps_the_answers(runs, tmp_path):
    """The fused graph agrees with PyTorch as closely as the plain one; static int8, calibrated
    on dev texts with per-channel weights, the embedding tables and the first layer left in
    float32, reaches the default --min-agreement; the record and the card say how the graphs
    were built."""
    out = tmp_path / "fused"
    options = ["--onnx", "--fuse", "--quantize", "int8", "--int8", "static"]
    options += ["--calibration-examples", "32", "--keep-float", "Gather"]
    options += ["--keep-float", "layer.0/"]
    assert main(["export-model", str(runs[0]), "--out", str(out), *options]) == 0
    record = json.loads((out / "export.json").read_text())
    assert {"Attention", "SkipLayerNormalization"} <= set(record["fusions"])
    calibration = record["quantization"].pop("calibration")
    search = record["quantization"].pop("search")  # the graph reached the gate: nothing kept
    assert search["reached"] and search["kept"] == [] and search["agreement"] >= 0.99
    assert record["quantization"] == {
        "weights": "int8",
        "activations": "static",
        "per_channel": True,
        "kept_float": ["Gather", "layer.0/"],
    }
    assert calibration["split"] == "dev" and 30 <= calibration["examples"] <= 34  # stratified
    fp32, int8 = record["graphs"]["fp32"], record["graphs"]["int8"]
    assert fp32["max_abs_logit_difference"] < 1e-4 and int8["label_agreement"] >= 0.99
    graph = onnx.load(str(out / "model.int8.onnx")).graph
    types = {node.op_type for node in graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Attention"} <= types  # QDQ around MatMuls
    dequantized = {node.output[0] for node in graph.node if node.op_type == "DequantizeLinear"}
    matmuls = {node.name: node for node in graph.node if node.op_type == "MatMul"}
    first = [node for name, node in matmuls.items() if "layer.0/" in name]
    assert first and not any(set(node.input) & dequantized for node in first)  # float32
    assert len(first) < len(matmuls) and all(
        set(node.input) & dequantized for name, node in matmuls.items() if "layer.0/" not in name
    )
    floats = {t.name: t.data_type for t in graph.initializer}
    word_embeddings = next(name for name in floats if "word_embeddings" in name)
    assert floats[word_embeddings] == onnx.TensorProto.FLOAT  # left in float32
    card = (out / "README.md").read_text()
    assert "Fused offline by ONNX Runtime's transformer optimizer: " in card
    kept = "left in float32: Gather, layer.0/."
    assert f"calibrated on {calibration['examples']} dev texts; {kept}" in card


def test_int8_search_leaves_the_costly_node_in_float(runs, tmp_path, capsys):
    """A run whose weights are random and wide-spread (its answers differ from text to text),
    with an outlier in the embedding row of a token no text holds ([MASK]): the answers are as
    they were, but the embedding table's int8 scale rounds every other row to nearly nothing.
    The all-int8 graph disagrees with the float32 one; the search leaves exactly the word
    embedding lookup in float32, which brings the graph back over the gate; the record, the card
    and the command say so. Without the search the same export is rejected, saying what the
    all-int8 graph reached."""
    run = tmp_path / "outlier"
    shutil.copytree(runs[0], run)
    config = tiny_config()
    config.initializer_range = 0.3
    torch.manual_seed(0)
    weights = AutoModelForSequenceClassification.from_config(config).state_dict()
    table = "bert.embeddings.word_embeddings.weight"
    weights[table][load_run(runs[0]).tokenizer.mask_token_id] = 1e4
    weights_file = run / "model" / "model.safetensors"
    kept = safetensors.torch.load_file(weights_file).keys()  # those the run's model holds
    weights = {name: value.contiguous() for name, value in weights.items() if name in kept}
    safetensors.torch.save_file(weights, weights_file, metadata={"format": "pt"})
    out = tmp_path / "int8"
    options = ["--onnx", "--quantize", "int8", "--min-agreement", "0.9"]
    assert main(["export-model", str(run), "--out", str(out), *options]) == 0
    record = json.loads((out / "export.json").read_text())
    search = record["quantization"]["search"]
    assert search["all_int8"]["agreement"] < 0.9 <= search["agreement"] and search["reached"]
    assert search["split"] == "dev" and search["examples"] == 50
    graph = onnx.load(str(out / "model.int8.onnx")).graph
    lookup = next(n.name for n in graph.node if f"model.{table}" in n.input)
    assert [node["node"] for node in search["kept"]] == [lookup]
    assert search["kept"][0]["cost"] > 0 and search["quantised_nodes"] > 4
    assert {t.name: t.data_type for t in graph.initializer}[f"model.{table}"] == 1  # float
    assert record["graphs"]["int8"]["label_agreement"] >= 0.9
    assert (
        f"left in float32 the 1 of its {search['quantised_nodes']} quantised nodes"
        in (out / "README.md").read_text()
    )
    printed = capsys.readouterr().out.splitlines()[-1]
    assert printed.startswith("int8: 1 of ") and printed.endswith(f"dev texts): {lookup}")

    plain = tmp_path / "plain"
    command = ["export-model", str(run), "--out", str(plain), *options, "--no-accuracy-aware"]
    assert main(command) == 2
    error = _error_line(capsys)
    agreement = search["all_int8"]["agreement"]
    assert f"; the all-int8 graph agreed on {agreement:.4f} on 50 dev texts and the " in error
    assert error.endswith(
        f"search was off (--no-accuracy-aware)): kept for inspection in {plain}.rejected"
    )


@pytest.mark.parametrize("family", FAMILY_TYPES)
def test_graph_matches_pytorch_at_other_shapes_than_traced(family, tmp_path, monkeypatch):
    folder = save_family_model(family, tmp_path / family, ["negative", "neutral", "positive"])
    loaded = load_model(str(folder))
    deployment.export_onnx(loaded.model, loaded.tokenizer, tmp_path / "model.onnx")
    texts = [
        "an example of a much longer text than the one the graph was traced with, surely",
        "short",
        "three words here",
    ]
    split = Split(texts=texts, labels=[0, 1, 2], uids=["a", "b", "c"])
    dataset = encode(split, loaded.tokenizer, 64)
    reference = predict_logits(loaded.model, dataset, 3, pad_id(loaded.tokenizer))
    classifier = deployment.OnnxClassifier(
        deployment.open_session(tmp_path / "model.onnx", 1),
        loaded.tokenizer,
        loaded.spec,
        None,
        family,
        tmp_path / "model.onnx",
        "fp32",
    )
    for batch_size in (1, 3):  # one text, and three padded to the longest
        logits = deployment.onnx_logits(classifier, dataset, batch_size)
        torch.testing.assert_close(logits, reference, rtol=0, atol=1e-4)
    if deployment.fusion_type(loaded.model) is None:
        return
    # the graph fused offline by ONNX Runtime's optimizer computes the same logits
    fusions = deployment.fuse_graph(loaded.model, tmp_path / "model.onnx", tmp_path / "fused.onnx")
    assert fusions, family  # it found something to fuse
    classifier.session = deployment.open_session(tmp_path / "fused.onnx", 1)
    for batch_size in (1, 3):
        logits = deployment.onnx_logits(classifier, dataset, batch_size)
        torch.testing.assert_close(logits, reference, rtol=0, atol=1e-4)
    # quantised, or refused in one line where ONNX Runtime cannot type the fused operators;
    # nothing left in the working directory either way
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    settings = OnnxSettings(quantize="int8")
    if family == "albert":
        with pytest.raises(WorkbenchError, match=r"cannot infer the shapes .* without --fuse"):
            quantize_int8(tmp_path / "fused.onnx", tmp_path / "q.onnx", settings)
    else:
        quantize_int8(tmp_path / "fused.onnx", tmp_path / "q.onnx", settings)
        assert (tmp_path / "q.onnx").is_file()
    assert not list((tmp_path / "cwd").iterdir())


def test_benchmark_prints_the_table_and_writes_every_field(runs, exported, tmp_path, capsys):
    teacher, student = runs
    out = tmp_path / "bench.json"
    options = [
        "--threads",
        "1",
        "--warmup",
        "1",
        "--repeats",
        "2",
        "--examples",
        "30",
        "--batch-sizes",
        "1,8",
    ]
    assert (
        main(["benchmark", str(teacher), str(student), str(exported), *options, "--json", str(out)])
        == 0
    )
    captured = capsys.readouterr()
    printed = captured.out
    assert "30 texts, batch sizes 1,8, 1 warm-up and 2 timed rounds" in printed
    assert "1 threads, cpu" in printed and "the first model, teacher" in printed
    assert "peak memory: peak resident-set growth" in printed
    table = [line for line in printed.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 4  # the header and a row per model (the export's two graphs)
    report = json.loads(out.read_text())
    assert report["settings"] == {
        "task": "task",
        "metrics": ["accuracy", "macro_f1"],
        "split": "test",
        "examples": 30,
        "batch_sizes": [1, 8],
        "warmup": 1,
        "repeats": 2,
        "threads": 1,
        "device": "cpu",
        "precisions": ["fp32"],
        "timer": "the wall clock (time.perf_counter) around each batch's forward pass",
    }
    rows = report["rows"]
    assert [row["engine"] for row in rows] == [
        "pytorch fp32",
        "pytorch fp32",
        "onnx fp32",
        "onnx int8",
    ]
    above = [r["name"] for r in rows[1:] if r["accuracy"] > rows[0]["accuracy"]]
    said = [line for line in captured.err.splitlines() if "above the first model" in line]
    assert len(said) == len(above)
    assert all(any(f"{name} scores" in line for line in said) for name in above)
    for row in rows:
        assert set(row) >= ROW_FIELDS and all(f"{key}_ratio" in row for key in MEASURED)
        assert all(
            row[key] is not None and row[key] > 0 for key in MEASURED if key != "peak_memory_mb"
        )
        assert row["peak_memory_mb"] >= 0
        assert row["latency_ms_p95"] >= row["latency_ms_median"]
    first = rows[0]
    assert all(first[f"{key}_ratio"] == 1.0 for key in MEASURED if first[key])
    assert first["label_loyalty"] == 1.0 and first["probability_loyalty"] == 1.0
    student_row, onnx_row = rows[1], rows[2]
    assert student_row["parameters"] < first["parameters"]
    assert student_row["parameters_ratio"] == pytest.approx(
        student_row["parameters"] / first["parameters"]
    )
    assert onnx_row["label_loyalty"] == 1.0  # the float32 graph predicts as its PyTorch model
    assert onnx_row["accuracy"] == first["accuracy"]
    assert onnx_row["disk_mb"] == (exported / "model.onnx").stat().st_size / 1e6
    assert onnx_row["parameters"] == pytest.approx(first["parameters"], rel=0.01)


def test_a_run_and_its_export_read_the_texts_at_their_own_length(runs, exported, tmp_path):
    """With the task and another --max-length named on the command, the teacher run and its
    ONNX export both read its 16 tokens (the export read 64 before, and answered other texts),
    the plain model the command's 64, and the header says who reads how many."""
    teacher = runs[0]
    out = tmp_path / "bench.json"
    options = ["--threads", "1", "--warmup", "0", "--repeats", "1", "--examples", "30"]
    options += ["--batch-sizes", "1", "--task", str(teacher.parent / "task"), "--max-length", "64"]
    plain = tmp_path / "plain"
    assert main(["export-model", str(teacher), "--out", str(plain)]) == 0
    sources = [str(plain), str(teacher), str(exported / "model.onnx")]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["benchmark", *sources, *options, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [row["max_length"] for row in rows] == [64, 16, 16]
    for key in ("accuracy", "label_loyalty"):  # the same model in two engines, the same answers
        assert rows[1][key] == rows[2][key], key
    assert (
        "tokens read per text: plain 64, teacher 16, teacher-onnx (onnx fp32) 16 (a run or an "
        "export reads at its own length)" in printed.getvalue()
    )


def _scale_classifier(path: Path, factor: float) -> None:
    """Multiply the classification head's weights and bias in an ONNX file by ``factor``."""
    graph = onnx.load(str(path))
    hits = [t for t in graph.graph.initializer if t.name.startswith("model.classifier.")]
    assert hits, [t.name for t in graph.graph.initializer]
    for tensor in hits:
        values = onnx.numpy_helper.to_array(tensor) * np.float32(factor)
        tensor.CopyFrom(onnx.numpy_helper.from_array(values, tensor.name))
    onnx.save(graph, str(path))


def test_a_corrupted_graph_is_rejected_and_kept(runs, tmp_path, monkeypatch, capsys):
    original = deployment.export_onnx

    def corrupted(model, tokenizer, path):
        original(model, tokenizer, path)
        _scale_classifier(path, -1.0)  # every prediction becomes the least likely class

    monkeypatch.setattr(deployment, "export_onnx", corrupted)
    out = tmp_path / "export"
    assert main(["export-model", str(runs[0]), "--out", str(out), "--onnx"]) == 2
    error = _error_line(capsys)
    assert "disagrees with the PyTorch model" in error and "< 0.99 on 50 test examples" in error
    assert error.endswith(f"kept for inspection in {out}.rejected")
    assert not out.exists()
    record = json.loads((tmp_path / "export.rejected" / "export.json").read_text())
    assert record["graphs"]["fp32"]["label_agreement"] < 0.5
    assert (tmp_path / "export.rejected" / "model.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export.rejected"]


def test_bad_input_is_one_line_and_writes_nothing(runs, exported, tmp_path, capsys):
    teacher, _ = runs
    out = tmp_path / "out"
    bare = tmp_path / "untrained"
    shutil.copytree(teacher, bare)
    shutil.rmtree(bare / "model")
    assert main(["export-model", str(bare), "--out", str(out), "--onnx"]) == 2
    assert "has no trained model yet" in _error_line(capsys)
    with pytest.raises(SystemExit, match="2"):
        main(["export-model", str(teacher), "--out", str(out), "--onnx", "--quantize", "int4"])
    assert "argument --quantize: invalid choice: 'int4'" in capsys.readouterr().err
    for option in (["--quantize", "int8"], ["--fuse"], ["--examples", "10"]):
        assert main(["export-model", str(teacher), "--out", str(out), *option]) == 2
        assert f"{option[0]} sets the ONNX export: add --onnx" in _error_line(capsys)
    for option in (["--int8", "static"], ["--no-per-channel"], ["--keep-float", "Gather"]):
        assert main(["export-model", str(teacher), "--out", str(out), "--onnx", *option]) == 2
        named = option[0].replace("--no-", "--")  # a switch is named by its setting
        assert f"{named} sets the int8 graph: add --quantize int8" in _error_line(capsys)
    int8 = ["--onnx", "--quantize", "int8", "--keep-float", "Conv"]
    assert main(["export-model", str(teacher), "--out", str(out), *int8]) == 2
    assert (
        "--keep-float Conv: no node of the graph is of that type or has it in its name (its "
        "types: " in _error_line(capsys)
    )
    refused = {  # options that would make a graph other than the one the record names
        ("--keep-float", ""): "--keep-float '': an empty name is part of every node's name, so "
        "no node would be quantised: name a node type (Gather) or a part of node names",
        ("--keep-float", "/"): "--keep-float / keeps every matrix product of the graph (MatMul, "
        "Gemm) in float32: the int8 graph would hold no int8 one; name fewer nodes",
        ("--calibration-examples", "32", "--no-accuracy-aware"): "--calibration-examples "
        "calibrates a static int8 graph and is the int8 search's texts (a dynamic one quantises "
        "its activations as it runs): add --int8 static, or leave out --no-accuracy-aware or "
        "--calibration-examples",
    }
    for option, message in refused.items():
        command = ["export-model", str(teacher), "--out", str(out), "--onnx", "--quantize"]
        assert main([*command, "int8", *option]) == 2
        assert _error_line(capsys) == f"kdw: error: {message}"
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["untrained"]
    assert main(["export-model", str(teacher), "--out", "/proc/x", "--onnx"]) == 2
    assert _error_line(capsys) == (
        "kdw: error: --out /proc/x: cannot write in /proc (No such file or directory)"
    )

    broken = tmp_path / "broken-onnx"
    shutil.copytree(exported, broken)
    (broken / "model.onnx").write_bytes(b"not a graph" * 10)
    report = tmp_path / "bench.json"
    assert main(["benchmark", str(teacher), str(broken), "--json", str(report)]) == 2
    assert "model.onnx cannot be loaded by ONNX Runtime" in _error_line(capsys)
    shutil.copy(exported / "model.onnx", broken / "model.onnx")
    _scale_classifier(broken / "model.onnx", float("nan"))  # scores like chance, unchecked
    assert main(["benchmark", str(teacher), str(broken), "--json", str(report)]) == 2
    assert _error_line(capsys) == (
        f"kdw: error: {broken / 'model.onnx'}: the initializers model.classifier.weight, "
        "model.classifier.bias hold NaN or infinite values: export the graph again from a "
        "model with finite weights (kdw export-model --onnx)"
    )
    assert main(["benchmark", str(teacher), "--batch-sizes", "0,8", "--json", str(report)]) == 2
    assert "--batch-sizes: '0,8' is not allowed" in _error_line(capsys)
    assert main(["benchmark", str(teacher), str(exported), "--device", "cuda:0"]) == 2
    _error_line(capsys)
    assert main(["benchmark", str(teacher), "--precisions", "fp32,int4"]) == 2
    assert "--precisions: 'fp32,int4' is not allowed" in _error_line(capsys)
    assert not report.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken-onnx", "untrained"]


def test_every_precision_asked_for_is_a_row_of_its_own(runs):
    """``--precisions fp32,bf16`` times each PyTorch model twice: the bf16 row runs a copy of
    the weights cast to bfloat16 (same parameters, logits close to fp32's but not equal), and
    the loaded fp32 model is left as it was."""
    teacher, student = runs
    settings = BenchmarkSettings(
        examples=30, batch_sizes="1,8", warmup=0, repeats=1, threads=1, precisions="bf16,fp32"
    )
    notes: list[str] = []
    report = benchmark([str(teacher), str(student)], settings, notify=notes.append)
    assert report["settings"]["precisions"] == ["fp32", "bf16"]  # in PRECISIONS' order
    emulated = not {"AVX-512 BF16", "AMX BF16"} & set(report["machine"]["instructions"])
    assert any("has no bfloat16 instructions" in note for note in notes) == emulated
    rows = report["rows"]
    assert [(row["name"], row["engine"]) for row in rows] == [
        ("teacher", "pytorch fp32"),
        ("teacher", "pytorch bf16"),
        ("student", "pytorch fp32"),
        ("student", "pytorch bf16"),
    ]
    assert rows[1]["parameters"] == rows[0]["parameters"]
    assert rows[1]["disk_mb"] == rows[0]["disk_mb"]  # the weights as saved
    assert rows[0]["label_loyalty"] == 1.0 and rows[0]["probability_loyalty"] == 1.0
    assert 0.8 <= rows[1]["label_loyalty"] <= 1.0
    assert rows[1]["probability_loyalty"] < 1.0  # bfloat16 changes the probabilities


def test_precisions_default_to_fp32_on_the_cpu_and_add_bf16_on_cuda():
    assert parse_precisions("auto", "cpu") == ("fp32",)
    assert parse_precisions("auto", "cuda") == ("fp32", "bf16")
    assert parse_precisions(" fp16 , fp32", "cpu") == ("fp32", "fp16")
    for bad in ("", "fp64", "fp32,auto"):
        with pytest.raises(WorkbenchError, match="expected auto or comma-separated"):
            parse_precisions(bad, "cpu")
