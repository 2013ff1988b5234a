"""What several ``kdw`` subcommands share: the parser, option types and help texts, the
``--config`` file's defaults, the checks that run before torch loads, the data options of
commands that score runs on their own tasks, and the texts and explainer of an explanation."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import fields
from pathlib import Path

import kd.methods  # noqa: F401  (registers the methods' settings: the objective's options)
from kd.training.config import CONFIG_SECTIONS
from kd.training.tracking import TrackingConfig
from workbench.analysis.attribution.registry import (
    EXPLAINERS,
    WORD_AGGREGATIONS,
    get_explainer,
)
from workbench.core.config import (
    DataConfig,
    PromptConfig,
    add_arguments,
    check_values,
    fill_help,
    from_arguments,
    from_dict,
    option_name,
    option_type,
    to_dict,
)
from workbench.core.errors import WorkbenchError, mask_secrets, one_line


class RegistryHelp(argparse.HelpFormatter):
    """Help whose texts' registry lists (``{presets}``, ``{terms}``, …) are filled in by
    :func:`workbench.core.config.fill_help`."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return fill_help(super()._get_help_string(action) or "")


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose refusals are one line like every other ``kdw`` error (no usage
    block), and whose help is a :class:`RegistryHelp`."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", RegistryHelp)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"kdw: error: {one_line(mask_secrets(message))} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    with suppress(ValueError):
        if (value := int(text)) >= 1:
            return value
    raise argparse.ArgumentTypeError(f"expected an integer of at least 1, got {text!r}")


MODELS_HELP = (
    "run folders, or sequence classifiers the workbench did not train (a Hugging Face "
    "checkpoint folder, a PEFT adapter folder, a GGUF file, a built-in name or a hub id)"
)


def config_defaults(path: str) -> dict:
    """The option defaults a ``--config`` file (``kdw tune``'s ``best.json``) sets: its
    :data:`CONFIG_SECTIONS`, each checked against its dataclass (an unknown setting is an error)."""
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


def check_local_task(args: argparse.Namespace) -> None:
    """Read and check a local data file or folder that ``--task`` names before torch and
    transformers load, so that its problems are one line within a second or two."""
    task = getattr(args, "task", None)
    if task is None or not all(hasattr(args, f.name) for f in fields(DataConfig)):
        return
    from workbench.core.data import load_task
    from workbench.core.names import TASK_NAMES
    from workbench.core.runs import recorded_data

    # a path that does not exist is the command's to refuse, in its own order of checks
    if task not in TASK_NAMES and Path(task).exists():
        sources = getattr(args, "runs", None) or getattr(args, "models", None) or []
        data = recorded_data(from_arguments(DataConfig, args), sources)
        load_task(data, notify=lambda note: None)


def check_local_models(args: argparse.Namespace) -> None:
    """Check the ``config.json`` (bounded read, labels) and the safetensors headers of each
    local model folder a command names (a classifier's folder or a run's model) before torch and
    transformers load; the load checks the rest."""
    from workbench.core.runs import RUN_FILE, Run
    from workbench.core.verify import check_config_file, check_model_files

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
        elif os.path.lexists(path / "config.json"):  # a pipe or a loop too: refused by name
            check_model_files(path)
        if (path / "config.json").is_file():
            check_config_file(path)


def train_and_report(args: argparse.Namespace, train, configs: Iterable[type]) -> None:
    """Train into ``--run-dir`` with ``train`` (the pipeline's ``train_teacher`` or ``distill``)
    on the ``configs`` the options give, tracked as they say; print the results and the folder."""
    from kd.training.distributed import world
    from workbench.core.runs import Run

    path = train(
        *(from_arguments(cls, args) for cls in configs),
        args.run_dir,
        tracking_config=from_arguments(TrackingConfig, args),
    ).path
    if not world().main:  # under torchrun the first process reports for all
        return
    if results := Run.open(path).results():
        print(json.dumps(results, indent=2))
    print(f"run folder: {path}")


def add_task_options(parser: argparse.ArgumentParser, task_help: str) -> None:
    """The data options of a command that scores runs on their own tasks (:func:`task_data`),
    its ``--task`` with the help ``task_help`` and no task unless given."""
    add_arguments(parser, DataConfig)
    next(action for action in parser._actions if action.dest == "task").help = task_help
    parser.set_defaults(task=None)


def task_data(
    args: argparse.Namespace, sources: Sequence[str], own: Sequence[str] = ()
) -> DataConfig | None:
    """The data options of a command that scores ``sources`` (run folders, models) on their own
    tasks unless ``--task`` names one: without ``--task``, a data option given but those in
    ``own`` is refused rather than ignored. A task that a run among ``sources`` recorded is read
    with that run's data settings unless they are given (:func:`recorded_data`)."""
    from workbench.core.runs import recorded_data

    if args.task is not None:
        return recorded_data(from_arguments(DataConfig, args), sources, note)
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


def prompted_models(
    args: argparse.Namespace, names: Sequence[str], data: DataConfig | None
) -> list[str]:
    """``names`` with each causal language model among them made a classifier of ``data``'s
    task by the prompt the options give (:class:`~workbench.core.config.PromptConfig`): the
    folder of each, written once in the user's cache, said in one line. Without ``--prompt``,
    ``names`` as they are."""
    from workbench.core.data import load_task
    from workbench.core.models import is_language_model, is_run, load_config, prompted_model

    config = from_arguments(PromptConfig, args)
    if not config.given:
        return list(names)
    if data is None:
        raise WorkbenchError("--prompt makes a classifier of a task's classes: name it (--task)")
    task = load_task(data, notify=lambda _: None)
    found = []
    for name in names:
        if not is_run(name) and is_language_model(load_config(name)):
            folder = prompted_model(name, config, task.spec, task.splits["train"], data.split_seed)
            note(f"{name} prompted as a classifier of {task.spec.name}: {folder} (a model folder)")
            name = folder
        found.append(name)
    if found == list(names):
        raise WorkbenchError(
            f"--prompt: none of {', '.join(names)} is a causal language model (…ForCausalLM), "
            "whose answer a prompt reads"
        )
    return found


def note(text: str) -> None:
    """Tell the user ``text`` on stderr, as ``kdw: note: TEXT``."""
    print(f"kdw: note: {text}", file=sys.stderr)


def add_sources(parser: argparse.ArgumentParser, verb: str) -> None:
    """The runs and the texts a command works on."""
    parser.add_argument("runs", nargs="+", help=MODELS_HELP)
    parser.add_argument("--out", required=True, help="folder to write the files to")
    parser.add_argument(
        "--text", action="append", help=f"a text to {verb} (repeat the option for several)"
    )
    parser.add_argument("--pair", help="second text of every --text (pair tasks)")
    parser.add_argument(
        "--texts-file", help="CSV or JSONL file with a text column (optional text_pair, label)"
    )
    parser.add_argument(
        "--split", help=f"{verb} examples of this split (train, dev, test) of the task"
    )
    parser.add_argument(
        "--examples", default="0", help="indices of the --split examples, e.g. 0,3,7-9 (default: 0)"
    )


def text_sources(args: argparse.Namespace) -> dict:
    """The texts :func:`add_sources`' options name, and the explainer and ``--words`` of
    :func:`add_explainer`, as keyword arguments of the functions that explain them."""
    return {
        "texts": args.text or (),
        "pair": args.pair,
        "texts_file": args.texts_file,
        "split": args.split,
        "indices": args.examples,
        "explainer": explainer_choice(args),
        "words": args.words,
    }


def add_explainer_settings(group, taken: set[str]) -> None:
    """An option for each registered explainer's setting not among ``taken`` (default: its own),
    read as its first owner's field; a setting several explainers own takes the values any of
    them accepts."""
    settings: dict[str, list] = {}
    for explainer in EXPLAINERS.values():
        for f in fields(explainer.settings):
            if f.name not in taken:
                settings.setdefault(f.name, []).append((explainer, f))
    for name, owners in settings.items():
        typed = [option_type(e.settings, f) for e, f in owners]
        choices = None
        if all(c is not None for _, c in typed):
            choices = sorted({c for _, cs in typed for c in cs}, key=lambda c: (c is None, c))
        defaults = ", ".join(f"{e.name} {f.default}" for e, f in owners)
        group.add_argument(
            option_name(name),
            dest=name,
            type=typed[0][0],
            choices=choices,
            metavar=name.upper(),
            help=f"{owners[0][1].metadata['help']} (default: {defaults})",
        )


def add_explainer(parser: argparse.ArgumentParser) -> None:
    """``--explainer`` (from the registry), the explainer settings the parser lacks, ``--words``."""
    group = parser.add_argument_group(
        "explainer", "which registered explainer scores the tokens (docs/explainers.md)"
    )
    group.add_argument(
        "--explainer",
        choices=list(EXPLAINERS),
        metavar="NAME",
        help="; ".join(f"{e.name}: {e.description}" for e in EXPLAINERS.values())
        + " (default: ig)",
    )
    add_explainer_settings(group, {action.dest for action in parser._actions})
    group.add_argument(
        "--words",
        choices=WORD_AGGREGATIONS,
        help="score words instead of sub-tokens (the fast tokenizer's words): the sum, mean or "
        "largest magnitude (max-abs) of their pieces; [CLS]/[SEP] stay words of their own "
        "(default: sub-tokens)",
    )


def explainer_choices(args: argparse.Namespace, names: Sequence[str]):
    """The explainers ``names`` with the settings the options give each; an option given that
    none of them takes is refused rather than ignored."""
    from workbench.analysis.attribution import ExplainerChoice

    chosen = [get_explainer(name) for name in names]
    own = {f.name for e in chosen for f in fields(e.settings)}
    for explainer in EXPLAINERS.values():
        for f in fields(explainer.settings):
            if f.name not in own and getattr(args, f.name, None) is not None:
                raise WorkbenchError(
                    f"{option_name(f.name)} is a setting of {explainer.name}, not of "
                    f"{', '.join(names)}"
                )
    return [
        ExplainerChoice(
            e.name,
            {f.name: v for f in fields(e.settings) if (v := getattr(args, f.name)) is not None},
        )
        for e in chosen
    ]


def explainer_choice(args: argparse.Namespace):
    """The explainer ``--explainer`` names (default: ig), with the settings its options give."""
    return explainer_choices(args, [args.explainer or "ig"])[0]
