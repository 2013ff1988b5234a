"""``kdw methods``: the registered methods' presets, terms, tune spaces, ablations and claims."""

from __future__ import annotations

import argparse


def add(commands: argparse._SubParsersAction) -> None:
    commands.add_parser(
        "methods",
        help="list the registered methods: presets, terms, tune spaces, ablations, claims",
        description="Every registered preset as its method's module declares it: its name and "
        "paper, its weights (paper and official parity), τ, own terms, kdw tune's default space "
        "and the term β weighs, the ablations kdw reproduce --ablations trains and the claims "
        "its report checks; then the loss terms --weights accepts.",
    )


def run(_args: argparse.Namespace) -> None:
    from kd.methods.objective import describe_presets

    print(describe_presets())
