"""``kdw reproduce``: rerun the papers' experiments (the suite its options name,
:func:`reproduce_suite`) and write their report; also in shards, merged afterwards."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from kd.cli.common import positive_int
from workbench.core.errors import WorkbenchError
from workbench.core.files import read_json_file

MAX_STUDENTS_BYTES = 1_000_000  # a --students file lists a few students' settings


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "reproduce",
        help="rerun the papers' experiments and write a report",
        description="Choose each method's key weights on dev (kdw tune), train the suite of the "
        "papers' experiments (main table over seeds, loyalty, each method beside its control; "
        "ablations with --ablations), time each task's first-seed students beside the teacher "
        "(size, latency, throughput on the CPU) and write report.md, results.json and figures. "
        "results.json is the record: a later call (after an interruption, or on a fresh clone "
        "without the run folders) trains only what it lacks.",
    )
    parser.add_argument(
        "--out", default="reports/reproduce", help="folder for the runs, the report and its figures"
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="the papers' scale: GLUE, BERT-base teacher, 6-layer students "
        "(needs the network and, in practice, a GPU)",
    )
    parser.add_argument(
        "--fixed",
        action="store_true",
        help="run the presets' default weights instead of choosing them on dev first",
    )
    parser.add_argument(
        "--ablations",
        action="store_true",
        help="also train the ablations the methods register ({ablations}), which the default "
        "leaves out to fit its time (--full has them)",
    )
    parser.add_argument(
        "--teacher",
        action="append",
        metavar="TASK=FOLDER",
        help="teach TASK with this sequence classifier (a folder saved with save_pretrained, or "
        "a run folder), used as it is instead of fine-tuning the suite's teacher; repeat for "
        "several tasks",
    )
    parser.add_argument(
        "--controls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train beside each method its control: the same objective, data and student "
        "set-up with the method's own terms at weight 0, so that a gain is credited to the term "
        "or to the rest of the method's regime",
    )
    parser.add_argument(
        "--students",
        metavar="FILE",
        help="train more students beside the suite's: a JSON list of {name, task, objective "
        "(ObjectiveConfig settings), group (default extra), sample (main: the main table's "
        "data, the default; ablation: the ablations' sample), seeds (default: the task's), "
        "student (StudentConfig settings)}; e.g. a control of your own",
    )
    parser.add_argument(
        "--seeds",
        type=positive_int,
        help="train the main table over seeds 1..N (default: the suite's, 3); rows of seeds "
        "already recorded are kept, so raising it trains only the new seeds",
    )
    _add_call_options(parser)


def _add_call_options(parser: argparse.ArgumentParser) -> None:
    """The options of how a call runs the suite: processes, a report alone, shards, a merge."""
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        help="students trained at once, each in its own process with the CPU threads shared out (2 "
        "on a 2-core machine trains the suite faster than 1 with 2 threads)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: write the figures and report.md from results.json alone (the run "
        "folders, where present, only redraw the heatmap gallery, where their models changed "
        "since it was drawn; results.json is updated after every student, so this works while "
        "a suite is still running)",
    )
    parser.add_argument(
        "--shard",
        metavar="I/N",
        help="train only the I-th of N disjoint parts of the suite's students (every N-th, from "
        "the I-th on; each part trains the teachers and searches its students need, seeded "
        "alike), e.g. one array task each: --shard $SLURM_ARRAY_TASK_ID/N with its own --out",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        help="train nothing: join the records of the shards in these folders (run with the "
        "same suite options) into --out's results.json and report; their run folders are "
        "referenced, not copied",
    )


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


def run(args: argparse.Namespace) -> None:
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
