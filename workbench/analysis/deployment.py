"""Deployable exports of a run's classifier: an ONNX graph that ONNX Runtime runs, optionally
with dynamically quantised int8 weights, each checked against the PyTorch model before it is
released.

The graph is written by ``torch.onnx.export``'s TorchScript exporter (``dynamo=False``): it
traces the eager attention every model of the workbench is loaded with
(:data:`~workbench.core.models. ATTENTION`), its dynamic axes (batch, length) hold for the families
the tests export (encoders and decoders of every architecture in the tests), and it needs
nothing beyond torch and ``onnx``. The dynamo exporter would add ``onnxscript``, Hugging Face
Optimum a further dependency tree, for the same graph.

An export folder holds ``model.onnx`` (float32), ``model.int8.onnx`` when quantised, the
tokenizer, ``config.json`` (the class names), the run's model card with a section on the
export, and :data:`RECORD` (``export.json``): the parity of each graph and the run's task, so
that ``kdw benchmark`` scores the folder on that task.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from workbench.analysis.evaluation import logits_in_order, predict_logits
from workbench.analysis.metrics import label_loyalty
from workbench.core.config import DataConfig, from_dict, to_dict
from workbench.core.data import (
    EncodedSplit,
    Split,
    TaskSpec,
    batches,
    encode,
    load_task,
    pad_id,
    sample_split,
)
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import (
    RECORD_LIMIT,
    atomic_write_json,
    atomic_write_text,
    check_format,
    existing_path,
    read_json_file,
    with_format,
)
from workbench.core.models import LoadedModel, load_tokenizer, set_label_names
from workbench.core.parts import parts_of
from workbench.core.runs import model_card, replace_directory
from workbench.core.verify import check_onnx_graph

GRAPHS = {"fp32": "model.onnx", "int8": "model.int8.onnx"}  # precision → file in the folder
RECORD = "export.json"
OPSET = 17
QUANTIZATIONS = ("int8",)
REJECTED_SUFFIX = ".rejected"


class _Logits(nn.Module):
    """A classifier as a function of positional input tensors ``[B, L]`` (in the order of
    ``names``) to its logits ``[B, C]``: the signature an ONNX graph has."""

    def __init__(self, model: PreTrainedModel, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.model(**dict(zip(self.names, inputs, strict=True))).logits


def graph_inputs(model: PreTrainedModel) -> tuple[str, ...]:
    """The inputs of a model's graph, each ``[batch, length]`` int64: token ids, the attention
    mask, and token types for a family that reads them."""
    types = ("token_type_ids",) if parts_of(model).token_types else ()
    return ("input_ids", "attention_mask", *types)


def export_onnx(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    """Write ``model`` (in eval mode, eager attention) as an ONNX graph: inputs
    :func:`graph_inputs`, output ``logits`` ``[batch, C]`` float32, batch and length dynamic."""
    names = graph_inputs(model)
    texts = Split(texts=["an example text", "a"], labels=[0, 0], uids=["0", "1"])
    example = next(batches(encode(texts, tokenizer, 16), [0, 1], 2, pad_id(tokenizer)))
    arguments = tuple(example[name] for name in names)
    axes = {name: {0: "batch", 1: "length"} for name in names} | {"logits": {0: "batch"}}
    module = _Logits(model, names).eval()  # the exporter restores the wrapper's mode after
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings on shape-dependent Python code
            torch.onnx.export(
                module,
                arguments,
                str(path),
                dynamo=False,
                input_names=list(names),
                output_names=["logits"],
                dynamic_axes=axes,
                opset_version=OPSET,
            )
    except Exception as error:  # the exporter's errors have no common type
        raise WorkbenchError(
            f"torch.onnx cannot export this {type(model).__name__}: {first_line(error)}"
        ) from None


def quantize_int8(source: Path, target: Path) -> None:
    """Write ``source``'s graph with its weights quantised to int8 (ONNX Runtime's dynamic
    quantisation: activations are quantised on the fly, per batch)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.disable(logging.WARNING)  # its advice to pre-process the graph, on the root logger
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    finally:
        logging.disable(logging.NOTSET)


def open_session(path: Path, threads: int):
    """An ONNX Runtime session of the graph ``path`` on the CPU with ``threads`` threads within
    an operator; a file ONNX Runtime cannot load is a one-line error."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # ONNX Runtime's errors have no common base
        raise WorkbenchError(
            f"{path} cannot be loaded by ONNX Runtime: {first_line(error)}"
        ) from None


@dataclass
class OnnxClassifier:
    """An exported graph run by ONNX Runtime, with the tokenizer, task and tokens per text of
    its export folder. Called on a padded batch (tensors ``[B, L]``), it returns the logits
    ``[B, C]`` float32 on the CPU."""

    session: object  # onnxruntime.InferenceSession
    tokenizer: PreTrainedTokenizerBase
    spec: TaskSpec
    data: DataConfig
    name: str
    path: Path
    precision: str

    @property
    def max_length(self) -> int:
        return self.data.max_length

    def __call__(self, batch: Mapping[str, Tensor]) -> Tensor:
        feeds = {i.name: batch[i.name].numpy() for i in self.session.get_inputs()}
        return torch.from_numpy(np.asarray(self.session.run(["logits"], feeds)[0]))


def graph_parameters(path: Path) -> int:
    """The elements of a graph's initializers (its weights: int8 ones count one each)."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as error:  # a truncated or foreign file: protobuf's DecodeError and others
        raise WorkbenchError(f"{path} is not an ONNX graph: {first_line(error)}") from None
    return sum(int(np.prod(tensor.dims)) for tensor in graph.initializer)


def is_onnx_export(source: str | Path) -> bool:
    """Whether ``source`` is an ONNX export folder (it has :data:`RECORD`) or a graph file."""
    path = Path(source)
    return path.suffix == ".onnx" or (path / RECORD).is_file()


def load_onnx(
    source: str | Path, data: DataConfig | None = None, threads: int = 1
) -> list[OnnxClassifier]:
    """The graphs of an export folder (float32, then int8 where there is one), or the one graph
    file ``source`` of such a folder, on the folder's recorded task (``data``, when given, must
    name it: its settings then sample the task). A graph reads its texts at the length its run
    was trained and exported with, as the run itself does, whatever ``data`` says."""
    path = existing_path(str(source))
    folder = path.parent if path.is_file() else path
    if not (folder / RECORD).is_file():
        raise WorkbenchError(
            f"{folder} has no {RECORD}: not a folder written by kdw export-model --onnx"
        )
    try:
        record = read_json_file(folder / RECORD, RECORD_LIMIT, "the export record")
    except WorkbenchError as error:
        raise WorkbenchError(f"{error}: export again") from None
    check_format(record, folder / RECORD, "export again")
    recorded = from_dict(DataConfig, record["data"])
    if data is not None and data.task != recorded.task:
        raise WorkbenchError(
            f"{source} was exported from a run on {recorded.task!r}, not {data.task!r}: "
            f"pass --task {recorded.task}"
        )
    task = record["task"]
    spec = TaskSpec(task["name"], tuple(task["label_names"]), tuple(task["metrics"]), task["pair"])
    tokenizer = load_tokenizer(str(folder))
    graphs = {p: folder / f for p, f in GRAPHS.items() if p in record["graphs"]}
    if path.is_file():
        precision = next((p for p, f in graphs.items() if f.name == path.name), None)
        if precision is None:
            raise WorkbenchError(f"{path} is not one of the graphs {RECORD} records")
        graphs = {precision: path}
    for file in graphs.values():
        check_onnx_graph(file)
    return [
        OnnxClassifier(
            open_session(file, threads),
            tokenizer,
            spec,
            recorded if data is None else replace(data, max_length=recorded.max_length),
            f"{folder.name} (onnx {precision})",
            file,
            precision,
        )
        for precision, file in graphs.items()
    ]


def onnx_logits(classifier: OnnxClassifier, dataset: EncodedSplit, batch_size: int = 64) -> Tensor:
    """Logits ``[N, C]`` of an exported graph in dataset order."""
    return logits_in_order(classifier, dataset, batch_size, pad_id(classifier.tokenizer))


def parity(reference: Tensor, logits: Tensor) -> dict[str, float]:
    """How far an export's logits ``[N, C]`` are from the PyTorch model's: the largest absolute
    difference, and the share of examples whose predicted class is the same."""
    return {
        "max_abs_logit_difference": float((reference - logits).abs().max()),
        "label_agreement": label_loyalty(reference, logits),
    }


def _card_section(record: dict) -> str:
    lines = [
        "",
        "## ONNX export",
        "",
        f"Written by `torch.onnx.export` (TorchScript exporter, opset {record['opset']}) with "
        "dynamic batch and length axes; inputs "
        + ", ".join(f"`{name}`" for name in record["inputs"])
        + ", output `logits`. Each graph was run by ONNX Runtime on "
        f"{record['examples']} examples of the {record['split']} split and compared with the "
        f"PyTorch model (released at a label agreement of at least {record['min_agreement']}):",
        "",
        "| graph | file | max abs logit difference | label agreement |",
        "|---|---|---|---|",
    ]
    for precision, graph in record["graphs"].items():
        lines.append(
            f"| {precision} | `{graph['file']}` | {graph['max_abs_logit_difference']:.3g} | "
            f"{graph['label_agreement']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def export_onnx_folder(
    loaded: LoadedModel,
    out: Path,
    quantize: str | None = None,
    examples: int = 0,
    min_agreement: float = 0.99,
    split: str = "test",
) -> dict:
    """Export a run's model (:func:`export_onnx`, and :func:`quantize_int8` with
    ``quantize="int8"``) into ``out`` and return the export's record.

    Every graph is checked on a stratified sample of about ``examples`` texts of the run's
    ``split`` (0: all of them)
    against the PyTorch model (:func:`parity`) before the folder is released: it is built in a
    temporary folder beside ``out`` and renamed to ``out`` only when every graph's label
    agreement reaches ``min_agreement``; otherwise it is renamed to ``out.rejected`` (replacing
    an earlier rejected export) and the error says so, in one line."""
    if quantize not in (None, *QUANTIZATIONS):
        raise WorkbenchError(
            f"--quantize {quantize}: not supported (expected {', '.join(QUANTIZATIONS)})"
        )
    if loaded.spec.regression:
        raise WorkbenchError(
            "the ONNX export is checked by label agreement: regression runs are not supported"
        )
    task = load_task(loaded.data)
    if split not in task.splits:
        raise WorkbenchError(f"split {split!r} not in {sorted(task.splits)}")
    part = sample_split(task.splits[split], examples or None, loaded.data.split_seed)
    dataset = encode(part, loaded.tokenizer, loaded.max_length)
    reference = predict_logits(loaded.model, dataset, 64, pad_id(loaded.tokenizer))
    set_label_names(loaded.model, loaded.spec)
    record = {
        "format": "onnx",
        "exporter": "torch.onnx.export (TorchScript, dynamo=False)",
        "opset": OPSET,
        "inputs": list(graph_inputs(loaded.model)),
        "run": str(Path(loaded.source).resolve()),
        "split": split,
        "examples": len(dataset),
        "min_agreement": min_agreement,
        "task": {
            "name": loaded.spec.name,
            "label_names": list(loaded.spec.label_names),
            "metrics": list(loaded.spec.metrics),
            "pair": loaded.spec.pair,
        },
        "data": to_dict(loaded.data),
        "graphs": {},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        loaded.model.config.save_pretrained(staging)
        loaded.tokenizer.save_pretrained(staging)
        export_onnx(loaded.model, loaded.tokenizer, staging / GRAPHS["fp32"])
        if quantize:
            quantize_int8(staging / GRAPHS["fp32"], staging / GRAPHS[quantize])
        for precision in ("fp32", *([quantize] if quantize else [])):
            file = staging / GRAPHS[precision]
            session = open_session(file, torch.get_num_threads())
            classifier = OnnxClassifier(
                session, loaded.tokenizer, loaded.spec, loaded.data, out.name, file, precision
            )
            measured = parity(reference, onnx_logits(classifier, dataset))
            record["graphs"][precision] = {
                "file": file.name,
                "size_mb": file.stat().st_size / 1e6,
                **measured,
            }
        atomic_write_json(staging / RECORD, with_format(record))
        atomic_write_text(staging / "README.md", model_card(loaded.run) + _card_section(record))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    failed = {
        precision: graph["label_agreement"]
        for precision, graph in record["graphs"].items()
        if graph["label_agreement"] < min_agreement
    }
    target = out.with_name(out.name + REJECTED_SUFFIX) if failed else out
    replace_directory(target, lambda path: os.replace(staging, path))
    if failed:
        found = ", ".join(f"{p} {value:.4f}" for p, value in failed.items())
        raise WorkbenchError(
            f"the ONNX export disagrees with the PyTorch model (label agreement {found} < "
            f"{min_agreement} on {len(dataset)} {split} examples): kept for inspection in {target}"
        )
    return record
