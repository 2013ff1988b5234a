"""``kdw benchmark``: size, memory, latency and throughput of models beside their accuracy and
loyalty to the first."""

from __future__ import annotations

import argparse

from kd.cli.common import MODELS_HELP, add_task_options, note, task_data
from workbench.analysis.settings import BenchmarkSettings
from workbench.core.config import add_arguments, from_arguments


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "benchmark",
        help="size, memory, latency and throughput beside accuracy and loyalty",
        description="Time models on real texts of a split and put what a student buys beside "
        "what it costs: parameters, weights on disk, peak memory of inference, latency per "
        "text at batch size 1 (median, 95th percentile; tokenisation timed apart), throughput "
        "at larger batches, each with its ratio to the FIRST model, which is the reference "
        "(give the teacher first); then the task metrics and label/probability loyalty to the "
        "first model. Models run interleaved (round-robin per round) in one process. Run "
        "folders, Hugging Face classifier folders and ONNX exports (kdw export-model --onnx: "
        "every graph of the folder, run by ONNX Runtime) sit in one table.",
    )
    parser.add_argument("models", nargs="+", help=MODELS_HELP + ", or ONNX export folders")
    parser.add_argument("--json", help="also write the report to this JSON file")
    add_arguments(parser, BenchmarkSettings)
    add_task_options(
        parser,
        "the task of classifiers the workbench did not train (default: the first model's own)",
    )


def run(args: argparse.Namespace) -> None:
    from workbench.analysis.benchmark import benchmark, format_benchmark
    from workbench.core.files import check_output_file, json_text, write_output_file

    if args.json:  # before the minutes of timing
        check_output_file(args.json, "--json")
    data = task_data(args, args.models)
    report = benchmark(args.models, from_arguments(BenchmarkSettings, args), data, note)
    print(format_benchmark(report))
    if args.json:
        write_output_file(args.json, json_text(report), "--json")
