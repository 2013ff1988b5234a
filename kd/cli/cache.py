"""``kdw cache``: build what a distillation reads from its teacher into a folder, once, so that
students train from it without the teacher (``kdw distill --teacher-cache``); resumable, and in
shards that several processes or machines build."""

from __future__ import annotations

import argparse

from kd.methods.config import ObjectiveConfig
from kd.training.config import StudentConfig
from kd.training.teacher_cache import CacheConfig
from workbench.core.config import DataConfig, add_arguments, from_arguments


def add(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "cache",
        help="build a teacher cache that students train from without the teacher",
        description="Compute, once, every field that the distillation these options describe "
        "reads from the teacher (logits; AD-KD's maps, GKD's gradients, PKD's and CKD's states; "
        "on the words teacher and student share where their tokenizers differ) on the task's "
        "splits, into a folder that kdw distill --teacher-cache reads without the teacher. The "
        "work is saved in pieces: rerunning the command resumes it. With --shard I/N each "
        "process or machine computes its part; the command run with every part's pieces in the "
        "folder (without --shard, or by the last shard) merges them.",
    )
    parser.add_argument("--out", required=True, help="the cache folder (written or resumed)")
    parser.add_argument(
        "--shard",
        help="compute the I-th of N parts of every split, e.g. 2/4 (copy each part's pieces "
        "into one folder, then run the command once more there to merge them)",
    )
    for cls in (DataConfig, StudentConfig, ObjectiveConfig, CacheConfig):
        add_arguments(parser, cls)


def run(args: argparse.Namespace) -> None:
    from kd.training.pipeline import build_teacher_cache
    from kd.training.teacher_cache import read_record
    from workbench.core.shards import Shard

    shard = Shard.parse(args.shard) if args.shard else None
    configs = [from_arguments(cls, args) for cls in (DataConfig, StudentConfig, ObjectiveConfig)]
    out = build_teacher_cache(*configs, from_arguments(CacheConfig, args), args.out, shard)
    if out is None:
        print(f"part {shard} of the teacher cache is in {args.out}: other parts are missing")
        return
    print(f"teacher cache complete in {out}: kdw distill --teacher-cache {out} …")
    for entry in read_record(out).files:
        costs = ", ".join(
            f"{field} {1000 * seconds / entry.examples:.3g} s"
            for field, seconds in entry.seconds.items()
        )
        print(f"  {entry.file}: {entry.examples} examples; teacher time per 1,000: {costs}")
