"""Where an int8 graph of a student loses its float32 answers: the label agreement of
variants of the student's float32 ONNX graph with that graph itself, on dev texts, each at
batches of 1, 8 and 64 texts (a dynamic int8 graph quantises each activation with one range per
batch, so a text's answer depends on the texts batched with it, padding included).

    python -m bench.int8_probes RUN [--examples 512] [--results int8-probes]

The variants: ONNX Runtime's dynamic int8 (per-channel weights, the export's default), the same
with 7-bit weights (``reduce_range``, which avoids the 16-bit saturation of int8 products on
CPUs without VNNI), static int8 calibrated on 256 train texts (QDQ, per-channel), the weights
alone rounded to int8 per output column with the products kept in float32 (what the weights'
rounding costs by itself), and SmoothQuant's migration (Xiao et al. 2023) before dynamic int8:
each weight product's input divided per channel by ``s = max|X|^alpha / max|W|^(1 - alpha)``
(the maxima over the 256 train texts and the weight's rows) and the weight's rows multiplied
by it, for each ``--alphas``. Speed is the float32 graph's time over the variant's on the texts
at batch 64, one run each: a rough ratio, not a benchmark.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from bench.common import setup, table, write_results
from kd.training.pipeline import export_model
from workbench.analysis.deployment import (
    GRAPHS,
    OnnxClassifier,
    graph_inputs,
    onnx_logits,
    open_session,
)
from workbench.analysis.int8 import quantize_int8
from workbench.analysis.metrics import label_loyalty
from workbench.analysis.settings import OnnxSettings
from workbench.core.data import batches, encode, load_task, pad_id, sample_split
from workbench.core.models import load_run

BATCHES = (1, 8, 64)


def weight_products(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The MatMul nodes whose second input is a 2-D initializer (a layer's weight ``[in, out]``)."""
    weights = {t.name: t for t in model.graph.initializer}
    return [
        node
        for node in model.graph.node
        if node.op_type == "MatMul" and len(getattr(weights.get(node.input[1]), "dims", ())) == 2
    ]


def weights_rounded(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each weight product's weight rounded to int8 per output column (symmetric,
    scale ``max|W| / 127``), kept in float32."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    weights = {t.name: t for t in model.graph.initializer}
    for node in weight_products(model):
        w = numpy_helper.to_array(weights[node.input[1]])
        scale = np.maximum(np.abs(w).max(0, keepdims=True), 1e-12) / 127
        rounded = (np.clip(np.round(w / scale), -127, 127) * scale).astype(np.float32)
        weights[node.input[1]].CopyFrom(numpy_helper.from_array(rounded, node.input[1]))
    return model


def input_maxima(model: onnx.ModelProto, feeds: list[dict]) -> dict[str, np.ndarray]:
    """The largest ``|X|`` of each channel of every weight product's input ``X`` over ``feeds``."""
    import onnxruntime

    probe = onnx.ModelProto.FromString(model.SerializeToString())
    names = sorted({node.input[0] for node in weight_products(model)})
    for name in names:
        probe.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = onnxruntime.InferenceSession(
        probe.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    maxima: dict[str, np.ndarray] = {}
    for feed in feeds:
        for name, value in zip(names, session.run(names, feed), strict=True):
            top = np.abs(value).reshape(-1, value.shape[-1]).max(0)
            maxima[name] = np.maximum(maxima.get(name, top), top)
    return maxima


def smoothed(model: onnx.ModelProto, maxima: dict[str, np.ndarray], alpha: float):
    """``model`` with SmoothQuant's migration at ``alpha``: before each weight product a ``Mul``
    by ``1/s`` per input channel, its weight's rows multiplied by ``s`` (the same function)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    weights = {t.name: t for t in model.graph.initializer}
    nodes = []
    products = {node.name for node in weight_products(model)}
    for node in model.graph.node:
        if node.name in products:
            w = numpy_helper.to_array(weights[node.input[1]])
            s = np.maximum(maxima[node.input[0]], 1e-5) ** alpha
            s = np.clip(s / np.maximum(np.abs(w).max(1), 1e-5) ** (1 - alpha), 1e-2, 1e2)
            weights[node.input[1]].CopyFrom(
                numpy_helper.from_array((w * s[:, None]).astype(np.float32), node.input[1])
            )
            inverse = numpy_helper.from_array((1 / s).astype(np.float32), f"{node.name}/smooth")
            model.graph.initializer.append(inverse)
            scaled = f"{node.name}/smoothed"
            nodes.append(
                helper.make_node("Mul", [node.input[0], inverse.name], [scaled], f"{scaled}/Mul")
            )
            node.input[0] = scaled
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a student's run folder")
    parser.add_argument("--examples", type=int, default=512, help="dev texts (default 512)")
    parser.add_argument("--alphas", default="0.5,0.8,0.9", help="SmoothQuant's alphas")
    parser.add_argument("--results", default="int8-probes", help="bench/results/<name>.json")
    args = parser.parse_args()
    setup(threads=2)
    loaded = load_run(args.run)
    task = load_task(loaded.data)
    seed, pad = loaded.data.split_seed, pad_id(loaded.tokenizer)
    texts = encode(
        sample_split(task.splits["dev"], args.examples, seed), loaded.tokenizer, loaded.max_length
    )
    calibration = encode(
        sample_split(task.splits["train"], 256, seed), loaded.tokenizer, loaded.max_length
    )
    inputs = graph_inputs(loaded.model)
    feeds = [
        {name: batch[name].numpy() for name in inputs}
        for batch in batches(calibration, list(range(len(calibration))), 16, pad)
    ]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        export_model(args.run, root / "export", onnx=True, settings=OnnxSettings())
        fp32 = root / "export" / GRAPHS["fp32"]
        model = onnx.load(str(fp32))
        maxima = input_maxima(model, feeds)
        variants = {"float32": fp32}
        for name, settings in (
            ("dynamic int8", OnnxSettings(quantize="int8")),
            ("static int8", OnnxSettings(quantize="int8", int8="static")),
        ):
            variants[name] = root / f"{name}.onnx"
            quantize_int8(fp32, variants[name], settings, feeds)
        variants["dynamic int8, 7-bit weights"] = root / "reduced.onnx"
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(
            str(fp32), str(root / "reduced.onnx"), weight_type=QuantType.QInt8,
            per_channel=True, reduce_range=True,
        )  # fmt: skip
        variants["weights rounded to int8, float32 products"] = root / "rounded.onnx"
        onnx.save(weights_rounded(model), str(root / "rounded.onnx"))
        for alpha in map(float, args.alphas.split(",")):
            path = root / f"smooth-{alpha}.onnx"
            onnx.save(smoothed(model, maxima, alpha), str(root / "smooth-float.onnx"))
            quantize_int8(root / "smooth-float.onnx", path, OnnxSettings(quantize="int8"))
            variants[f"SmoothQuant alpha {alpha}, dynamic int8"] = path
        rows, reference, float_seconds = [], {}, None
        for name, path in variants.items():
            classifier = OnnxClassifier(
                open_session(path, 2), loaded.tokenizer, loaded.spec, loaded.data, name, path, name
            )
            row = {"graph": name}
            for size in BATCHES:
                start = time.perf_counter()
                logits = onnx_logits(classifier, texts, size)
                seconds = time.perf_counter() - start
                reference.setdefault(size, logits)
                row[f"agreement_b{size}"] = label_loyalty(reference[size], logits)
            float_seconds = float_seconds or seconds
            row["speed_b64"] = float_seconds / seconds
            rows.append(row)
            print(table([row], list(row)).splitlines()[-1], flush=True)
    print(table(rows, list(rows[0])))
    settings = {"run": args.run, "examples": len(texts), "calibration": len(calibration)}
    path = write_results(args.results, {"settings": settings, "rows": rows})
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
