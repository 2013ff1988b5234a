"""Int8 graphs of an exported classifier (``kdw export-model --onnx --quantize int8``): ONNX
Runtime's quantisation, dynamic or static (:func:`quantize_int8`), and the accuracy-aware search
(:func:`search_int8`) that leaves in float32 the fewest nodes that cost most agreement with the
float32 graph, until the int8 graph reaches the export's gate on texts other than those it is
checked on (docs/deployment.md, "Int8 that keeps its answers")."""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
from torch import Tensor
from tqdm.auto import tqdm

from workbench.analysis.metrics import label_loyalty, probability_loyalties
from workbench.analysis.settings import OnnxSettings
from workbench.core.errors import WorkbenchError, first_line


def quantize_int8(
    source: Path,
    target: Path,
    settings: OnnxSettings,
    calibration: list[dict[str, np.ndarray]] | None = None,
) -> None:
    """Write ``source``'s graph with int8 weights (per channel with ``settings.per_channel``) to
    ``target``, the nodes ``settings.keep_float`` names left in float32: dynamic, or static with
    the matrix products' activation ranges calibrated on ``calibration`` (feeds ``[B, L]`` of
    the graph's inputs). A fused graph ONNX Runtime cannot type (ALBERT's) is a one-line
    error."""
    with prepared(source, target.parent, settings) as (typed, kept):
        quantize_prepared(typed, target, settings, calibration, kept)


def _kept_float(graph, settings: OnnxSettings) -> list[str]:
    """The names of the nodes of ``graph`` that ``settings.keep_float`` names (a node type or a
    part of node names), each name checked to name some node and all of them to leave at least
    one matrix product to quantise."""

    def kept(node, keys: tuple[str, ...] = settings.keep_float) -> bool:
        return any(key == node.op_type or key in node.name for key in keys)

    absent = [key for key in settings.keep_float if not any(kept(n, (key,)) for n in graph.node)]
    if absent:
        types = sorted({node.op_type for node in graph.node})
        raise WorkbenchError(
            f"--keep-float {absent[0]}: no node of the graph is of that type or has it in its "
            f"name (its types: {', '.join(types)})"
        )
    products = [node for node in graph.node if node.op_type in ("MatMul", "Gemm")]
    if settings.keep_float and products and all(kept(node) for node in products):
        raise WorkbenchError(
            f"--keep-float {', '.join(settings.keep_float)} keeps every matrix product of the "
            "graph (MatMul, Gemm) in float32: the int8 graph would hold no int8 one; name "
            "fewer nodes"
        )
    return [node.name for node in graph.node if kept(node)]


@contextlib.contextmanager
def prepared(
    source: Path, folder: Path, settings: OnnxSettings
) -> Iterator[tuple[Path, list[str]]]:
    """While open: ``source``'s graph with the types and shapes of every tensor (those of a
    fused graph's contrib operators by symbolic inference), which the quantiser reads and
    calibrates by, written once in ``folder``; and the nodes ``settings.keep_float`` names
    (:func:`_kept_float`). ONNX Runtime's notes are silenced meanwhile."""
    import onnx
    import onnxruntime
    from onnxruntime.quantization.shape_inference import quant_pre_process

    graph = onnx.load(str(source), load_external_data=False).graph
    kept = _kept_float(graph, settings)
    logging.disable(logging.WARNING)  # notes on the root logger
    onnxruntime.set_default_logger_severity(3)  # calibration's log: errors only
    # absolute: the working directory changes below
    source, typed = source.absolute(), folder.absolute() / f"typed-{source.name}"
    try:
        contrib = any(node.domain == "com.microsoft" for node in graph.node)
        # where symbolic inference fails, ONNX Runtime saves its partial graph in the working
        # directory: a scratch folder's, not the user's
        with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
            try:
                quant_pre_process(
                    str(source), str(typed), skip_optimization=True, skip_symbolic_shape=not contrib
                )
            except Exception as error:  # ONNX Runtime's errors have no common base
                if not contrib:
                    raise
                raise WorkbenchError(
                    f"ONNX Runtime cannot infer the shapes of this fused graph's operators "
                    f"({first_line(error)}), which int8 quantisation needs: export without --fuse"
                ) from None
        yield typed, kept
    finally:
        typed.unlink(missing_ok=True)
        onnxruntime.set_default_logger_severity(2)  # ONNX Runtime's default: warnings
        logging.disable(logging.NOTSET)


def quantize_prepared(
    typed: Path,
    target: Path,
    settings: OnnxSettings,
    calibration: list[dict[str, np.ndarray]] | None,
    float_nodes: Sequence[str],
) -> None:
    """Write the :func:`prepared` graph ``typed`` as ``settings`` ask to ``target``, the nodes
    named in ``float_nodes`` left in float32 (:func:`quantize_int8`)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    options = {
        "weight_type": QuantType.QInt8,
        "per_channel": settings.per_channel,
        "nodes_to_exclude": list(float_nodes),
    }
    if settings.int8 == "dynamic":
        quantize_dynamic(str(typed), str(target.absolute()), **options)
        return

    class Calibration(CalibrationDataReader):
        feeds = iter(calibration or [])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    quantize_static(
        str(typed),
        str(target.absolute()),
        Calibration(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        op_types_to_quantize=["MatMul"],  # the pooler's and classifier's Gemm stay float
        **options,
    )


def quantised_nodes(source: Path, target: Path) -> list[tuple[str, str]]:
    """The nodes (name, type) of the float32 graph ``source`` whose weights its int8 graph
    ``target`` holds in int8 (an initializer ``W`` of theirs there as ``W_quantized``, ONNX
    Runtime's name for it, dynamic and static alike), in graph order."""
    import onnx

    float_graph = onnx.load(str(source), load_external_data=False).graph
    weights = {tensor.name for tensor in float_graph.initializer}
    int8 = {
        tensor.name for tensor in onnx.load(str(target), load_external_data=False).graph.initializer
    }
    return [
        (node.name, node.op_type)
        for node in float_graph.node
        if any(name in weights and f"{name}_quantized" in int8 for name in node.input)
    ]


def search_int8(
    source: Path,
    target: Path,
    settings: OnnxSettings,
    calibration: list[dict[str, np.ndarray]] | None,
    logits_of: Callable[[Path], tuple[Tensor, float]],
) -> dict:
    """Write ``source``'s int8 graph to ``target`` (:func:`quantize_int8`) and, with
    ``settings.accuracy_aware``, leave in float32 the fewest of its quantised nodes that bring
    its agreement with the float32 graph to ``settings.min_agreement`` on the search texts.
    ``logits_of(graph)``: a graph's logits ``[N, C]`` on those texts and the seconds the graph
    took to compute them.

    When the int8 graph is below the gate, each quantised node's cost is what keeping it alone in
    float32 raises the mean probability loyalty to the float32 logits; the costliest ``k`` stay
    in float32, ``k = 1, 2, …``, until the label agreement reaches the gate, at most half of the
    quantised nodes. ``target`` holds the graph that reached the gate, or the one that came
    closest. Returns the search's record: the texts' count, the agreement and speed (the float32
    graph's seconds over the int8 graph's) of the all-int8 graph and of the one kept, the nodes
    kept in float32 with their costs in the order kept, and whether the gate was reached."""
    with prepared(source, target.parent, settings) as (typed, kept_by_name):
        reference, float_seconds = logits_of(source)

        def trial(kept: Sequence[str]) -> dict:
            quantize_prepared(typed, target, settings, calibration, [*kept_by_name, *kept])
            logits, seconds = logits_of(target)
            return {
                "agreement": label_loyalty(reference, logits),
                "probability_loyalty": float(probability_loyalties(reference, logits).mean()),
                "speed": float_seconds / seconds,
            }

        return _search(source, target, settings, trial) | {"examples": len(reference)}


def _search(source: Path, target: Path, settings: OnnxSettings, trial: Callable) -> dict:
    """:func:`search_int8`'s search, ``trial(kept)`` quantising with the nodes ``kept`` in
    float32 into ``target`` and measuring the graph."""
    best = trial(())
    record = {"gate": settings.min_agreement, "all_int8": best}
    record |= {"quantised_nodes": 0, "kept": [], "reached": best["agreement"] >= record["gate"]}
    if record["reached"] or not settings.accuracy_aware:
        return record | {"agreement": best["agreement"], "speed": best["speed"]}
    nodes = quantised_nodes(source, target)
    record["quantised_nodes"] = len(nodes)
    costs = []
    for name, op in tqdm(nodes, desc="int8 search: each node's cost", unit="node", leave=False):
        gain = trial([name])["probability_loyalty"] - best["probability_loyalty"]
        costs.append({"node": name, "op": op, "cost": gain})
    costs.sort(key=lambda node: -node["cost"])
    best_kept, tried = [], None
    with tqdm(desc="int8 search: nodes kept in float32", unit="node", leave=False) as bar:
        for count in range(1, len(nodes) // 2 + 1):
            tried = trial([node["node"] for node in costs[:count]])
            bar.update()
            if tried["agreement"] > best["agreement"]:
                best, best_kept = tried, costs[:count]
            if tried["agreement"] >= record["gate"]:
                break
    if tried is not best:  # the graph on disk is the last one tried, not the best one
        trial([node["node"] for node in best_kept])
    return record | {
        "kept": best_kept,
        "agreement": best["agreement"],
        "speed": best["speed"],
        "reached": best["agreement"] >= record["gate"],
    }
