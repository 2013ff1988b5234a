"""``kdw export-model``: a run's best model as a Hugging Face checkpoint folder (or an ONNX graph),
optionally pushed to the Hub."""

from __future__ import annotations

import argparse
import json

from workbench.analysis.settings import OnnxSettings
from workbench.core.config import add_arguments, from_arguments


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export-model",
        help="a run's best model as a Hugging Face checkpoint folder",
        description="Write the best model of a run into --out as a self-contained Hugging Face "
        "checkpoint: config.json naming the task's classes, the weights, the tokenizer and a "
        "model card (README.md) generated from the run's files. The folder loads with "
        "transformers.pipeline('text-classification', model=OUT).",
    )
    parser.add_argument("run", help="run folder")
    parser.add_argument(
        "--out", required=True, help="folder to write the checkpoint to (new or empty)"
    )
    parser.add_argument(
        "--push-to-hub",
        metavar="REPO",
        help="also upload the checkpoint to this Hub repository (namespace/name) through "
        "transformers' push_to_hub; needs the network and a Hub login (hf auth login); not "
        "exercised offline: the project's tests check only the calls it makes",
    )
    parser.add_argument(
        "--onnx",
        action="store_true",
        help="write an ONNX graph of the classifier instead (torch.onnx, dynamic batch and "
        "length axes, run by ONNX Runtime), with the tokenizer, config.json, export.json and "
        "the model card; released only after its logits are checked against the PyTorch model "
        "on the run's test split",
    )
    add_arguments(parser, OnnxSettings)


def run(args: argparse.Namespace) -> None:
    from kd.training.pipeline import export_model
    from workbench.analysis.deployment import RECORD

    settings = from_arguments(OnnxSettings, args)
    out = export_model(args.run, args.out, args.push_to_hub, onnx=args.onnx, settings=settings)
    print(out)
    if args.onnx:  # what the check found, as export.json keeps it
        record = json.loads((out / RECORD).read_text())
        for precision, graph in record["graphs"].items():
            print(
                f"{precision}: label agreement {graph['label_agreement']:.4f} with PyTorch on "
                f"{record['examples']} {record['split']} examples (at least "
                f"{record['min_agreement']} asked)"
            )
        search = (record["quantization"] or {}).get("search")
        if search and search["kept"]:
            print(
                f"int8: {len(search['kept'])} of {search['quantised_nodes']} quantised nodes kept "
                f"in float32 by the search ({search['all_int8']['agreement']:.4f} -> "
                f"{search['agreement']:.4f} on {search['examples']} {search['split']} texts): "
                + ", ".join(node["node"] for node in search["kept"])
            )
    if args.push_to_hub:
        print(f"pushed to the Hub repository {args.push_to_hub}")
