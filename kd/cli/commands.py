"""``kdw``: fine-tune teachers, distil students, evaluate runs, run the demo.

Every option comes from the config dataclasses of :mod:`workbench.core.config`, so the CLI, the
Python API (:mod:`kd.training.pipeline`) and the app read the same settings. Problems with the input
end in one line on stderr and exit status 2; an interrupted training keeps its last checkpoint and
resumes when the same command is run again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import typing
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path

import kd.methods  # noqa: F401  (registers the methods' settings: the objective's options)
from workbench.analysis.attribution.registry import EXPLAINERS, WORD_AGGREGATIONS, get_explainer
from workbench.analysis.explanations import HeatmapSettings
from workbench.analysis.heatmap_export import ExportSettings
from workbench.core.config import (
    AttributionConfig,
    BenchmarkSettings,
    DataConfig,
    FaithfulnessSettings,
    MapSettings,
    ObjectiveConfig,
    OnnxSettings,
    OptimConfig,
    StudentConfig,
    TeacherConfig,
    TrackingConfig,
    TuneConfig,
    add_arguments,
    check_values,
    fill_help,
    from_arguments,
    from_dict,
    option_name,
    to_dict,
)
from workbench.core.errors import WorkbenchError, mask_secrets, one_line
from workbench.core.files import read_json_file


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 1, got {text!r}")
    return value


def _train_teacher(args: argparse.Namespace) -> None:
    from kd.training.pipeline import train_teacher

    run = train_teacher(
        from_arguments(DataConfig, args),
        from_arguments(TeacherConfig, args),
        from_arguments(OptimConfig, args),
        args.run_dir,
        tracking_config=from_arguments(TrackingConfig, args),
    )
    _print_results(run.path)


def _distill(args: argparse.Namespace) -> None:
    from kd.training.pipeline import distill

    run = distill(
        from_arguments(DataConfig, args),
        from_arguments(StudentConfig, args),
        from_arguments(ObjectiveConfig, args),
        from_arguments(OptimConfig, args),
        args.run_dir,
        tracking_config=from_arguments(TrackingConfig, args),
    )
    _print_results(run.path)


def _tune(args: argparse.Namespace) -> None:
    from kd.experiments.tune import tune
    from kd.training.evaluate import format_table

    result = tune(
        from_arguments(DataConfig, args),
        from_arguments(StudentConfig, args),
        from_arguments(ObjectiveConfig, args),
        from_arguments(OptimConfig, args),
        from_arguments(TuneConfig, args),
        args.out,
        tracking_config=from_arguments(TrackingConfig, args),
    )
    print(format_table(result.rows))
    if result.best is not None:
        print(
            f"best configuration: {result.best} (train it with kdw distill --config "
            f"{result.best} --run-dir DIR)"
        )


MAX_STUDENTS_BYTES = 1_000_000  # a --students file lists a few students' settings
CONFIG_SECTIONS = {
    "data": DataConfig,
    "student": StudentConfig,
    "objective": ObjectiveConfig,
    "optim": OptimConfig,
}


def config_defaults(path: str) -> dict:
    """The option defaults a ``--config`` file (``kdw tune``'s ``best.json``) sets: its
    ``data``, ``student``, ``objective`` and ``optim`` sections, each checked against its
    dataclass (an unknown setting is an error)."""
    from kd.experiments.tune import load_config_file

    sections = load_config_file(path)
    defaults = {}
    for name, cls in CONFIG_SECTIONS.items():
        values = sections.get(name, {})
        if not isinstance(values, dict):
            raise WorkbenchError(f"--config {path}: section {name!r} is not an object")
        try:  # unknown settings, bad types or values: errors
            values = check_values(cls, values, text=True)
            from_dict(cls, {**to_dict(cls()), **values})
        except WorkbenchError as error:
            raise WorkbenchError(f"--config {path}: section {name!r}: {error}") from None
        defaults |= values
    return defaults


def _print_results(path: Path) -> None:
    from kd.training.distributed import world
    from workbench.core.runs import Run

    if not world().main:  # under torchrun the first process reports for all
        return
    results = Run.open(path).results()
    if results:
        print(json.dumps(results, indent=2))
    print(f"run folder: {path}")


def _task_data(
    args: argparse.Namespace, sources: Sequence[str], own: Sequence[str] = ()
) -> DataConfig | None:
    """The data options of a command that scores ``sources`` (run folders, models) on their own
    tasks unless ``--task`` names one: without ``--task``, a data option given is refused rather
    than ignored (each run reads its task with its own settings), but those named in ``own``,
    which the command applies to each run's own task. A task that a run among ``sources``
    recorded is read with that run's columns unless they are given (:func:`recorded_columns`)."""
    from workbench.core.runs import recorded_columns

    if args.task is not None:
        return recorded_columns(from_arguments(DataConfig, args), sources, _note)
    given = [
        option_name(f.name)
        for f in fields(DataConfig)
        if f.name not in ("task", *own) and getattr(args, f.name) != f.default
    ]
    if given:
        raise WorkbenchError(
            f"{', '.join(given)} set without --task: each run is scored on its own task with its "
            "own settings; name the task with --task to score them on it with these"
        )
    return None


def _note(text: str) -> None:
    print(f"kdw: note: {text}", file=sys.stderr)


def _evaluate(args: argparse.Namespace) -> None:
    from kd.training.evaluate import evaluate_runs, format_table
    from workbench.core.files import check_output_file, write_output_file

    if args.json:  # before the minutes of scoring
        check_output_file(args.json, "--json")
    data = _task_data(args, args.runs, own=("dedupe",))
    rows = evaluate_runs(
        args.runs,
        args.split,
        args.teacher,
        terms=args.terms,
        data=data,
        label_map=args.label_map,
        notify=_note,
        dedupe=args.dedupe,
    )
    print(format_table(rows))
    if args.json:
        write_output_file(args.json, json.dumps(rows, indent=2), "--json")


def _benchmark(args: argparse.Namespace) -> None:
    from workbench.analysis.benchmark import benchmark, format_benchmark
    from workbench.core.files import check_output_file, json_text, write_output_file

    if args.json:  # before the minutes of timing
        check_output_file(args.json, "--json")
    data = _task_data(args, args.models)
    report = benchmark(args.models, from_arguments(BenchmarkSettings, args), data)
    print(format_benchmark(report))
    if args.json:
        write_output_file(args.json, json_text(report), "--json")


def _baseline(args: argparse.Namespace) -> None:
    from workbench.analysis.baseline import tfidf_baseline
    from workbench.core.data import load_task

    metrics = tfidf_baseline(load_task(from_arguments(DataConfig, args)), args.split)
    print(json.dumps(metrics, indent=2))


def _methods(_args: argparse.Namespace) -> None:
    from kd.methods.objective import describe_presets

    print(describe_presets())


def _demo(args: argparse.Namespace) -> None:
    from kd.training.demo import run_demo

    run_demo(Path(args.root), quick=args.quick)


def _sources(args: argparse.Namespace) -> dict:
    return {
        "texts": args.text or (),
        "pair": args.pair,
        "texts_file": args.texts_file,
        "split": args.split,
        "indices": args.examples,
    }


def _add_explainer_settings(group, taken: set[str]) -> None:
    """An option for each registered explainer's setting not already among ``taken`` (default:
    each explainer's own)."""
    settings: dict[str, list] = {}
    for explainer in EXPLAINERS.values():
        for f in fields(explainer.settings):
            if f.name not in taken:
                settings.setdefault(f.name, []).append((explainer, f))
    for name, owners in settings.items():
        hint = typing.get_type_hints(owners[0][0].settings)[name]
        kind = next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))
        defaults = ", ".join(f"{e.name} {f.default}" for e, f in owners)
        group.add_argument(
            option_name(name),
            dest=name,
            type=kind,
            default=None,
            metavar=name.upper(),
            help=f"{owners[0][1].metadata['help']} (default: {defaults})",
        )


def _add_explainer(parser: argparse.ArgumentParser) -> None:
    """``--explainer`` (its choices and help from the registry), each explainer's settings
    not already among the parser's options, and ``--words``."""
    group = parser.add_argument_group(
        "explainer", "which registered explainer scores the tokens (docs/explainers.md)"
    )
    group.add_argument(
        "--explainer",
        default=None,
        choices=list(EXPLAINERS),
        metavar="NAME",
        help="; ".join(f"{e.name}: {e.description}" for e in EXPLAINERS.values())
        + " (default: ig, or grad with --method grad)",
    )
    _add_explainer_settings(group, {action.dest for action in parser._actions})
    group.add_argument(
        "--words",
        default=None,
        choices=WORD_AGGREGATIONS,
        help="score words instead of sub-tokens (the fast tokenizer's words): the sum, mean or "
        "largest magnitude (max-abs) of their pieces; [CLS]/[SEP] stay words of their own "
        "(default: sub-tokens)",
    )


def _choices(args: argparse.Namespace, names: Sequence[str], shared: set[str] = frozenset()):
    """The explainers ``names`` with the settings the options give each (the rest: their
    defaults); an option given that none of them takes is refused rather than ignored
    (``shared``: options checked elsewhere)."""
    from workbench.analysis.attribution import ExplainerChoice

    chosen = [get_explainer(name) for name in names]
    own = {f.name for e in chosen for f in fields(e.settings)}
    for explainer in EXPLAINERS.values():
        for f in fields(explainer.settings):
            if f.name not in own | shared and getattr(args, f.name, None) is not None:
                raise WorkbenchError(
                    f"{option_name(f.name)} is a setting of {explainer.name}, not of "
                    f"{', '.join(names)}"
                )
    return [
        ExplainerChoice(
            e.name,
            {
                f.name: getattr(args, f.name)
                for f in fields(e.settings)
                if getattr(args, f.name) is not None
            },
        )
        for e in chosen
    ]


def _explainer_choice(args: argparse.Namespace):
    """The explainer ``--explainer`` names (ig with ``--method ig``, the default), with its
    settings; None for ``--method grad`` without ``--explainer``."""
    name = args.explainer or ("ig" if args.method == "ig" else None)
    if name is None:
        return None
    return _choices(args, [name], {f.name for f in fields(MapSettings)})[0]


def _faithfulness(args: argparse.Namespace) -> None:
    from workbench.analysis.faithfulness_report import (
        MAX_REPORT_BYTES,
        explainer_faithfulness,
        format_faithfulness,
    )
    from workbench.core.files import check_output_file, json_text, write_output_file

    if args.merge and not args.json:
        raise WorkbenchError("--merge needs --json FILE: the report to extend")
    if args.recompute and not args.merge:
        raise WorkbenchError("--recompute replaces rows of a --merge FILE: give --merge")
    previous = None
    if args.json:  # before the minutes of explaining
        path = check_output_file(args.json, "--json")
        if args.merge and path.is_file():
            previous = read_json_file(path, MAX_REPORT_BYTES, "--json")

    def write(report: dict) -> None:
        if args.json:
            write_output_file(args.json, json_text(report), "--json")

    settings = from_arguments(FaithfulnessSettings, args)
    choices = _choices(args, settings.names())
    report = explainer_faithfulness(
        args.runs,
        settings,
        choices,
        notify=lambda note: print(f"kdw: note: {note}", file=sys.stderr),
        previous=previous,
        checkpoint=write if args.merge else lambda report: None,
        recompute=args.recompute,
    )
    print(format_faithfulness(report))
    write(report)


def _export(args: argparse.Namespace) -> None:
    from workbench.analysis.heatmap_export import export_runs

    paths = export_runs(
        args.runs,
        args.out,
        from_arguments(HeatmapSettings, args),
        from_arguments(ExportSettings, args),
        notify=lambda note: print(f"kdw: note: {note}", file=sys.stderr),
        explainer=_explainer_choice(args),
        words=args.words,
        **_sources(args),
    )
    print("\n".join(str(path) for path in paths))


def _attribute(args: argparse.Namespace) -> None:
    from workbench.analysis.heatmap_export import attribute_runs

    paths = attribute_runs(
        args.runs,
        args.out,
        from_arguments(AttributionConfig, args),
        explainer=_explainer_choice(args),
        words=args.words,
        **_sources(args),
    )
    print("\n".join(str(path) for path in paths))


def _export_model(args: argparse.Namespace) -> None:
    from kd.training.pipeline import export_model

    print(
        export_model(
            args.run,
            args.out,
            args.push_to_hub,
            onnx=args.onnx,
            settings=from_arguments(OnnxSettings, args),
        )
    )
    if args.push_to_hub:
        print(f"pushed to the Hub repository {args.push_to_hub}")


MODELS_HELP = (
    "run folders, or sequence classifiers the workbench did not train (a Hugging Face "
    "checkpoint folder, a built-in name or a hub id)"
)


def _add_sources(parser: argparse.ArgumentParser, verb: str) -> None:
    """The runs and the texts a command works on."""
    parser.add_argument("runs", nargs="+", help=MODELS_HELP)
    parser.add_argument("--out", required=True, help="folder to write the files to")
    parser.add_argument(
        "--text", action="append", help=f"a text to {verb} (repeat the option for several)"
    )
    parser.add_argument("--pair", default=None, help="second text of every --text (pair tasks)")
    parser.add_argument(
        "--texts-file",
        default=None,
        help="CSV or JSONL file with a text column (optional text_pair, label)",
    )
    parser.add_argument(
        "--split",
        default=None,
        help=f"{verb} examples of this split (train, dev, test) of the task",
    )
    parser.add_argument(
        "--examples", default="0", help="indices of the --split examples, e.g. 0,3,7-9 (default: 0)"
    )


def _app(args: argparse.Namespace) -> None:
    if args.runs:
        os.environ["KDW_RUNS"] = os.pathsep.join(str(Path(r).resolve()) for r in args.runs)
    options = [f"--server.port={args.port}"] if args.port else []
    extra = args.streamlit[1:] if args.streamlit[:1] == ["--"] else args.streamlit
    # the front end's module is run, not imported: the CLI stays below the app's layer
    command = [sys.executable, "-m", "workbench.app.serve", *options, *extra]
    os.execv(sys.executable, command)


def reproduce_suite(args: argparse.Namespace):
    """The suite ``kdw reproduce``'s options name (a :class:`kd.experiments.reproduce.Suite`)."""
    from kd.experiments.reproduce import DEFAULT, FULL

    suite = FULL if args.full else DEFAULT
    if args.fixed:
        suite = suite.fixed()
    if args.ablations:
        suite = suite.with_ablations()
    if args.seeds is not None:
        suite = suite.with_seeds(args.seeds)
    if not args.controls:
        suite = replace(suite, controls=False)
    if args.teacher:
        pairs = [text.partition("=") for text in args.teacher]
        if any(not sep or not task or not source for task, sep, source in pairs):
            raise WorkbenchError("--teacher: write TASK=FOLDER, e.g. tweets=my-model")
        suite = suite.with_teachers({task: source for task, _, source in pairs})
    if args.students:
        entries = read_json_file(args.students, MAX_STUDENTS_BYTES, "--students")
        if not isinstance(entries, list):
            raise WorkbenchError(f"--students {args.students}: expected a JSON list of students")
        suite = suite.with_students(entries)
    return suite


def _reproduce(args: argparse.Namespace) -> None:
    from kd.experiments.reproduce import Shard, merge, reproduce

    suite = reproduce_suite(args)
    if args.merge:
        if args.shard or args.report_only:
            raise WorkbenchError(
                "--merge writes the merged record and report: drop --shard and --report-only"
            )
        report = merge(Path(args.out), [Path(f) for f in args.merge], suite)
    else:
        if args.shard and args.report_only:
            raise WorkbenchError("--shard trains a part of the suite: drop --report-only")
        shard = Shard.parse(args.shard) if args.shard else None
        report = reproduce(
            Path(args.out), suite, jobs=args.jobs, report_only=args.report_only, shard=shard
        )
    print(f"report: {report}")


class RegistryHelp(argparse.HelpFormatter):
    """Help whose texts name the registry's lists (``{presets}``, ``{terms}``, …): filled in by
    :func:`workbench.core.config.fill_help` (building the parser loads no method, so they point to
    ``kdw methods``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return fill_help(super()._get_help_string(action) or "")


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusals are one line like every other ``kdw`` error: the
    problem and where the usage is, without the usage block; its help fills in the registry's
    lists (:class:`RegistryHelp`)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", RegistryHelp)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"kdw: error: {one_line(mask_secrets(message))} (see {self.prog} --help)\n")


def build_parser(distill_defaults: dict | None = None) -> argparse.ArgumentParser:
    """The ``kdw`` parser; ``distill_defaults`` replace the defaults of ``kdw distill``'s
    options (from ``--config``)."""
    parser = Parser(
        prog="kdw",
        description="Distil BERT-style classifiers and see why each model decides.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    teacher = commands.add_parser(
        "train-teacher",
        help="fine-tune a teacher classifier",
        description="Fine-tune a teacher (cross-entropy; MSE for regression) into a run folder. "
        "Rerunning the same command resumes an interrupted run.",
    )
    teacher.add_argument("--run-dir", required=True, help="run folder to write (or resume)")
    for cls in (DataConfig, TeacherConfig, OptimConfig, TrackingConfig):
        add_arguments(teacher, cls)
    teacher.set_defaults(handler=_train_teacher)

    distill = commands.add_parser(
        "distill",
        help="distil a student from a teacher",
        description="Distil a student from a fine-tuned teacher (a run folder, or a sequence "
        "classifier the workbench did not train: a Hugging Face folder or hub id, used as it "
        "is) with a method preset or explicit term weights. The teacher's outputs are computed "
        "once and cached in the run folder. Rerunning the same command resumes an interrupted "
        "run.",
    )
    distill.add_argument("--run-dir", required=True, help="run folder to write (or resume)")
    distill.add_argument(
        "--config",
        default=None,
        help="JSON file of settings (data, student, objective, optim "
        "sections), such as kdw tune's best.json; options given on the command "
        "line override it",
    )
    for cls in (*CONFIG_SECTIONS.values(), TrackingConfig):
        add_arguments(distill, cls)
    distill.set_defaults(handler=_distill, **(distill_defaults or {}))

    tune = commands.add_parser(
        "tune",
        help="choose a method's weights on dev (Optuna)",
        description="Search a method's hyperparameters on the dev split as the papers did: TPE "
        "sampling over the method's default space (the papers' grids) or --space overrides, "
        "poor trials pruned from their dev curves, every trial a resumable run folder, the "
        "study in <out>/study.db so that a killed search resumes. Writes <out>/best.json for "
        "kdw distill --config. With --storage URL (PostgreSQL, MySQL, SQLite) several workers, "
        "on one machine or several, share one study: each setting is tried once across them, "
        "and each worker writes the same best.json once the study is done.",
    )
    tune.add_argument("--out", required=True, help="folder for the study, its trials and best.json")
    for cls in (*CONFIG_SECTIONS.values(), TuneConfig, TrackingConfig):
        add_arguments(tune, cls)
    tune.set_defaults(handler=_tune)

    evaluate = commands.add_parser(
        "evaluate",
        help="score runs on a split, as a table",
        description="Score one or more runs on a split: task metrics, and for students label and "
        "probability loyalty to their teacher. A run folder is scored on its own task; a "
        "classifier the workbench did not train on the task --task names (and the data options), "
        "its classes matched to the task's by name.",
    )
    evaluate.add_argument("runs", nargs="+", help=MODELS_HELP)
    evaluate.add_argument("--split", default="test", help="split to score (default: test)")
    evaluate.add_argument(
        "--teacher",
        default=None,
        help="teacher for loyalty: a run folder or a classifier (default: each student's own "
        "teacher)",
    )
    evaluate.add_argument(
        "--label-map",
        default="",
        help="for a classifier the workbench did not train: TASK_CLASS=MODEL_LABEL pairs "
        "where the names differ, e.g. positive=POS,negative=NEG",
    )
    evaluate.add_argument("--json", default=None, help="also write the rows to this JSON file")
    evaluate.add_argument(
        "--terms",
        action="store_true",
        help="add what dominates each run's objective: every term's share of "
        "the gradient and weighted value at the first and last logged step "
        "(see --log-every)",
    )
    add_arguments(evaluate, DataConfig)
    task = next(action for action in evaluate._actions if action.dest == "task")
    task.help = "the task a classifier the workbench did not train is scored on (a run folder "
    task.help += "is scored on its own)"
    evaluate.set_defaults(handler=_evaluate, task=None)

    bench = commands.add_parser(
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
    bench.add_argument("models", nargs="+", help=MODELS_HELP + ", or ONNX export folders")
    bench.add_argument("--json", default=None, help="also write the report to this JSON file")
    add_arguments(bench, BenchmarkSettings)
    add_arguments(bench, DataConfig)
    task = next(action for action in bench._actions if action.dest == "task")
    task.help = "the task of classifiers the workbench did not train (default: the first "
    task.help += "model's own)"
    bench.set_defaults(handler=_benchmark, task=None)

    baseline = commands.add_parser(
        "baseline",
        help="TF-IDF + logistic regression on the same split",
        description="Train a TF-IDF + logistic-regression classifier on the task's train split "
        "and score it on --split.",
    )
    add_arguments(baseline, DataConfig)
    baseline.add_argument("--split", default="test", help="split to score (default: test)")
    baseline.set_defaults(handler=_baseline)

    demo = commands.add_parser(
        "demo",
        help="end-to-end demo on the bundled tweets",
        description="Fine-tune the MiniLM-L6 teacher on the bundled tweets, distil 3-layer "
        "students (vanilla KD, Patient KD) and a student without a teacher, print the table.",
    )
    demo.add_argument("--root", default="runs/demo", help="folder for the demo's runs")
    demo.add_argument("--quick", action="store_true", help="a much smaller demo (minutes)")
    demo.set_defaults(handler=_demo)

    methods = commands.add_parser(
        "methods",
        help="list the registered methods: presets, terms, tune spaces, ablations, claims",
        description="Every registered preset as its method's module declares it: its name and "
        "paper, its weights (paper and official parity), τ, own terms, kdw tune's default space "
        "and the term β weighs, the ablations kdw reproduce --ablations trains and the claims "
        "its report checks; then the loss terms --weights accepts.",
    )
    methods.set_defaults(handler=_methods)

    app = commands.add_parser(
        "app",
        help="open the workbench in the browser (Streamlit)",
        description="Start the workbench's app from the installed package (the same as "
        "streamlit run app.py in a clone). Options after -- go to streamlit run, e.g. "
        "kdw app -- --server.address 127.0.0.1.",
    )
    app.add_argument(
        "--runs",
        nargs="+",
        default=None,
        metavar="DIR",
        help="the runs roots: each folder's runs are listed, the first is where the app trains "
        "(default: $KDW_RUNS, folders separated by ':', or runs/)",
    )
    app.add_argument("--port", type=positive_int, default=None, help="the server's port")
    app.add_argument("--headless", action="store_true", help="do not open a browser (on a server)")
    app.add_argument("streamlit", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    app.set_defaults(handler=_app)

    reproduce = commands.add_parser(
        "reproduce",
        help="rerun the papers' experiments and write a report",
        description="Choose each method's key weights on dev (kdw tune), train the suite of "
        "the papers' experiments (main table over seeds, loyalty, each method beside its "
        "control; ablations with --ablations), time each task's first-seed students beside "
        "the teacher (size, latency, throughput on the CPU) and write report.md, results.json "
        "and figures. results.json is the record: a later call "
        "(after an interruption, or on a fresh clone without the run folders) trains only what "
        "it lacks.",
    )
    reproduce.add_argument(
        "--out", default="reports/reproduce", help="folder for the runs, the report and its figures"
    )
    reproduce.add_argument(
        "--full",
        action="store_true",
        help="the papers' scale: GLUE, BERT-base teacher, 6-layer students "
        "(needs the network and, in practice, a GPU)",
    )
    reproduce.add_argument(
        "--fixed",
        action="store_true",
        help="run the presets' default weights instead of choosing them on dev first",
    )
    reproduce.add_argument(
        "--ablations",
        action="store_true",
        help="also train the ablations the methods register ({ablations}), which the default "
        "leaves out to fit its time (--full has them)",
    )
    reproduce.add_argument(
        "--teacher",
        action="append",
        metavar="TASK=FOLDER",
        help="teach TASK with this sequence classifier (a folder saved with save_pretrained, or "
        "a run folder), used as it is instead of fine-tuning the suite's teacher; repeat for "
        "several tasks",
    )
    reproduce.add_argument(
        "--controls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train beside each method its control: the same objective, data and student "
        "set-up with the method's own terms at weight 0, so that a gain is credited to the term "
        "or to the rest of the method's regime",
    )
    reproduce.add_argument(
        "--students",
        metavar="FILE",
        help="train more students beside the suite's: a JSON list of {name, task, objective "
        "(ObjectiveConfig settings), group (default extra), sample (main: the main table's "
        "data, the default; ablation: the ablations' sample), seeds (default: the task's), "
        "student (StudentConfig settings)}; e.g. a control of your own",
    )
    reproduce.add_argument(
        "--seeds",
        type=positive_int,
        default=None,
        help="train the main table over seeds 1..N (default: the suite's, 3); rows of seeds "
        "already recorded are kept, so raising it trains only the new seeds",
    )
    reproduce.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        help="students trained at once, each in its own process with the CPU "
        "threads shared out (2 on a 2-core machine trains the suite faster "
        "than 1 with 2 threads)",
    )
    reproduce.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: write the figures and report.md from results.json "
        "alone (the run folders, where present, only redraw the heatmap gallery; "
        "it is updated after every student, so this works while a suite is "
        "still running)",
    )
    reproduce.add_argument(
        "--shard",
        metavar="I/N",
        default=None,
        help="train only the I-th of N disjoint parts of the suite's students (every N-th, from "
        "the I-th on; each part trains the teachers and searches its students need, seeded "
        "alike), e.g. one array task each: --shard $SLURM_ARRAY_TASK_ID/N with its own --out",
    )
    reproduce.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        default=None,
        help="train nothing: join the records of the shards in these folders (run with the "
        "same suite options) into --out's results.json and report; their run folders are "
        "referenced, not copied",
    )
    reproduce.set_defaults(handler=_reproduce)

    export = commands.add_parser(
        "export",
        help="token attribution heatmaps of runs, as files",
        description="Explain texts (typed, from a CSV/JSONL file, or examples of a split) under "
        "one or more runs and write one heatmap per example, a row per run, as SVG, PDF, PNG, "
        "LaTeX and HTML, with the settings, model names and run ids embedded in each file "
        "(with --anonymous, for double-blind review, the models' roles and no path or run id). "
        "A previous export in --out is replaced as a whole set (its heatmap-NNN files go, other "
        "files stay). Each file states whether its text was truncated to the model's maximum "
        "length; texts cut short, and characters no installed font can draw in PNG/PDF, are "
        "also reported on stderr.",
    )
    _add_sources(export, "explain")
    for cls in (HeatmapSettings, ExportSettings):
        add_arguments(export, cls)
    _add_explainer(export)
    export.set_defaults(handler=_export)

    attribute = commands.add_parser(
        "attribute",
        help="token attributions of runs, saved reloadable (JSONL)",
        description="Attribute texts (typed, from a CSV/JSONL file, or examples of a split) "
        "under each run and write <out>/<run>.jsonl: tokens, maps per view, prediction, "
        "probabilities and settings per text "
        "(workbench.analysis.attribution.load_attributions reads it). "
        "Texts over --max-length tokens are truncated and flagged.",
    )
    _add_sources(attribute, "attribute")
    add_arguments(attribute, AttributionConfig)
    _add_explainer(attribute)
    attribute.set_defaults(handler=_attribute)

    faithfulness = commands.add_parser(
        "faithfulness",
        help="which explainer is faithful to which model (AOPC, leave-one-out τ, time)",
        description="Explain a fixed stratified sample of a split under each model and each "
        "explainer (each model's predicted class) and score the explanations: AOPC "
        "comprehensiveness and sufficiency, Kendall's τ between the scores and the drop of the "
        "predicted class's probability when each token alone is removed, and seconds per "
        "example; each explainer's rank per model. Give the teacher first: every later model "
        "(its students) gets paired bootstrap intervals of model − teacher per explainer. The "
        "first model must be a run folder: its task gives the examples.",
    )
    faithfulness.add_argument("runs", nargs="+", help=MODELS_HELP)
    faithfulness.add_argument("--json", default=None, help="also write the report to this file")
    faithfulness.add_argument(
        "--merge",
        action="store_true",
        help="extend the --json report (same split, examples, rules, removal, first model): "
        "compute only the explainers it lacks, add or replace their rows, and rewrite the file "
        "after each explainer, so an interrupted run resumes",
    )
    faithfulness.add_argument(
        "--recompute",
        action="store_true",
        help="with --merge: compute the explainers named even where the file has them (same "
        "settings), replacing their rows",
    )
    add_arguments(faithfulness, FaithfulnessSettings)
    _add_explainer_settings(
        faithfulness.add_argument_group("explainer settings", "for the explainers that take them"),
        set(),
    )
    faithfulness.set_defaults(handler=_faithfulness)

    export_model = commands.add_parser(
        "export-model",
        help="a run's best model as a Hugging Face checkpoint folder",
        description="Write the best model of a run into --out as a self-contained Hugging Face "
        "checkpoint: config.json naming the task's classes, the weights, the tokenizer and a "
        "model card (README.md) generated from the run's files. The folder loads with "
        "transformers.pipeline('text-classification', model=OUT).",
    )
    export_model.add_argument("run", help="run folder")
    export_model.add_argument(
        "--out", required=True, help="folder to write the checkpoint to (new or empty)"
    )
    export_model.add_argument(
        "--push-to-hub",
        metavar="REPO",
        default=None,
        help="also upload the checkpoint to this Hub repository "
        "(namespace/name) through transformers' push_to_hub; needs the "
        "network and a Hub login (hf auth login); not exercised offline: "
        "the project's tests check only the calls it makes",
    )
    export_model.add_argument(
        "--onnx",
        action="store_true",
        help="write an ONNX graph of the classifier instead (torch.onnx, dynamic batch and "
        "length axes, run by ONNX Runtime), with the tokenizer, config.json, export.json and "
        "the model card; released only after its logits are checked against the PyTorch model "
        "on the run's test split",
    )
    add_arguments(export_model, OnnxSettings)
    export_model.set_defaults(handler=_export_model)
    return parser


def check_local_task(args: argparse.Namespace) -> None:
    """Read and check a local data file or folder that ``--task`` names (columns, encoding,
    texts, labels, split sizes) before torch and transformers load, so that its problems are
    one line within a second or two; the command reads it again, and says its notes then."""
    task = getattr(args, "task", None)
    if task is None or not all(hasattr(args, f.name) for f in fields(DataConfig)):
        return
    from workbench.core.data import load_task
    from workbench.core.names import BUNDLED_TASKS, GLUE_TASKS
    from workbench.core.runs import recorded_columns

    # a path that does not exist is the command's to refuse, in its own order of checks
    if task not in BUNDLED_TASKS and task not in GLUE_TASKS and Path(task).exists():
        sources = getattr(args, "runs", None) or getattr(args, "models", None) or []
        data = recorded_columns(from_arguments(DataConfig, args), sources)
        load_task(data, notify=lambda _note: None)


def check_local_models(args: argparse.Namespace) -> None:
    """Check the ``config.json`` (bounded read, labels) and the safetensors headers of each
    local model folder a command names — a classifier's folder or a run's model — before torch
    and transformers load; the load checks the rest (the config against the weights, finite
    values) when the command builds the model."""
    from workbench.core.files import check_weights
    from workbench.core.runs import RUN_FILE, Run
    from workbench.core.verify import REMEDY, check_config_file

    named = []
    for option in ("teacher", "model", "run", "runs", "models"):
        value = getattr(args, option, None)
        named += value if isinstance(value, list) else [value]
    for name in filter(None, named):
        if not Path(name).expanduser().is_dir() and "=" in name:  # reproduce's TASK=FOLDER
            name = name.partition("=")[2]
        path = Path(name).expanduser().absolute()  # named as the command's own checks name it
        if (path / RUN_FILE).is_file():  # a run: its best model, with the run's remedy
            Run(path).check_model()
            path = Run(path).model_dir
        elif (path / "config.json").is_file():
            check_weights(path, REMEDY)
        if (path / "config.json").is_file():
            check_config_file(path)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "config", None):  # the file's settings become the defaults
            args = build_parser(config_defaults(args.config)).parse_args(argv)
        check_local_task(args)
        check_local_models(args)
        from workbench.core.models import quiet_library_output

        quiet_library_output()
        args.handler(args)
    except WorkbenchError as error:
        print(f"kdw: error: {one_line(str(error))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "kdw: interrupted; the run keeps its last checkpoint: run the same command to resume",
            file=sys.stderr,
        )
        return 130
    return 0
