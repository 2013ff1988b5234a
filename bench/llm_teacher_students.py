"""Students of a teacher cache, with seeds and paired intervals: each preset's student (and its
control: the same set-up with the method's own terms at weight 0) distilled from the teacher's
cache per seed, one row per student, and the two-level bootstrap intervals of each method
against its control and against vanilla KD in test accuracy, label loyalty and (with
``--teacher``) saliency loyalty.

    python -m bench.llm_teacher_students --teacher-cache caches/flagship \\
        --teacher runs/smollm2-head --task tweets --max-train-examples 1200 \\
        --max-eval-examples 2000 --max-length 32 --init pretrained --pretrained minilm-l6 \\
        --num-layers 3 --presets kd,gkd,adkd,ckd,pkd-skip --seeds 1,2,3 --epochs 3 \\
        --out flagship

With ``--transfer`` the students learn on the labelled examples and a transfer set (texts whose
labels are withheld, ``kdw distill --transfer``; with ``--no-labels``, on the transfer set
alone), and the presets of ``--labelled-arms`` are
trained on the labelled examples alone too (their cache: ``<teacher-cache>-labelled``). Every
table has the student trained alone (``finetune``, no teacher), and with ``--teacher`` the
reference rows of loyalty: each model of ``--references`` (a second teacher, another seed: what
two equally good models agree on) and, with ``--random-reference``, a student of the arms' shape
with random weights (the floor).

Students go to ``<out>/runs/<preset>[-control][-labelled]-s<seed>``, the student trained alone
first, then the labelled-only arms, then those of ``--presets`` (each arm over every seed before
the next, so that a run stopped early leaves the first methods' claims whole): a finished run is
reused, an interrupted one resumed; a control that trains as an earlier arm of its seed does (CKD's
and PKD's, whose presets weigh CE and KD as vanilla KD does) takes that arm's student.
``bench/results/<--results>.json`` is rewritten after each student; ``--no-training`` writes it
from the students already trained (those of a stopped run, whatever their arm). With ``--teacher``
the cache is first completed with the fields each arm reads that it lacks (vanilla KD and a control
read the logits alone, under a key of their own), and each student's saliency loyalty is measured
on the test split (Grad saliency; on the words both tokenisations share): the teacher's saliency is
computed once and kept in ``<out>/teacher-test.pt``, each student's per-example scores in
``<out>/saliency/<student>.json``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean

import torch

from bench.common import portable, setup, table, write_results
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import Objective, control, preset_weights
from kd.training import distill
from kd.training.config import OptimConfig, StudentConfig
from kd.training.pipeline import build_teacher_cache
from kd.training.teacher_cache import CacheConfig
from workbench.analysis.loyalty import SplitOutputs, saliency_loyalties, split_outputs
from workbench.analysis.stats import (
    Interval,
    pair_predictions,
    pair_scores,
    seeds_needed,
    two_level_bootstrap,
)
from workbench.core.config import DataConfig
from workbench.core.errors import WorkbenchError
from workbench.core.files import atomic_write_json
from workbench.core.models import load_for_task, load_tokenizer
from workbench.core.runs import Run

SALIENCY_NOTE = (
    "Pearson correlation of Grad saliency (each model's predicted class) on the test split, on "
    "the words both tokenisations share; null without --teacher (the cache holds no test "
    "saliency)"
)


def arms(presets: Sequence[str]) -> list[tuple[str, bool, ObjectiveConfig]]:
    """``(preset, is_control, objective)`` per student of a seed: each preset, then its control
    where it differs from the preset (vanilla KD is its own control)."""
    out = []
    for preset in presets:
        objective = ObjectiveConfig(preset=preset)
        out.append((preset, False, objective))
        if control(objective) != objective:
            out.append((preset, True, control(objective)))
    return out


def same_training(a: ObjectiveConfig, b: ObjectiveConfig) -> bool:
    """Whether two objectives without terms of their own train one student: the same weights
    and resolved record (τ, KD form, the student's set-up), as ``run.json`` keeps it. A
    control whose preset weighs CE and KD as vanilla KD does is vanilla KD's training."""
    if control(a) != a or control(b) != b or preset_weights(a) != preset_weights(b):
        return False
    try:  # layer counts matter only to layer-mapping terms, whose layers these cannot tell
        return Objective.resolve(a, 1, 1).record() == Objective.resolve(b, 1, 1).record()
    except WorkbenchError:
        return False


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _tokenizer(folder: Path) -> str:
    """``"BertTokenizer/WordPiece (30,522)"``: the class, its tokenizers model, its vocabulary."""
    tokenizer = load_tokenizer(str(folder))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = f"/{type(backend.model).__name__}" if backend is not None else ""
    return f"{type(tokenizer).__name__}{model} ({len(tokenizer):,})"


def saliency(data: DataConfig, teacher: SplitOutputs, run: Path, out: Path) -> dict:
    """A model's saliency loyalty to the teacher per test example ``{"uids", "scores"}`` (None:
    undefined), its label loyalty (``label_loyalty``, 1 or 0) and whether it is right
    (``correct``), computed once and kept in ``out``."""
    if out.exists():
        return _read(out)
    loaded, task = load_for_task(str(run), data)
    test = task.splits["test"]
    outputs = split_outputs(loaded, test)
    scores = saliency_loyalties(teacher, outputs)
    predicted = outputs.logits.argmax(-1)
    found = {
        "uids": test.uids,
        "scores": [None if math.isnan(x) else x for x in scores.tolist()],
        "label_loyalty": (predicted == teacher.logits.argmax(-1)).int().tolist(),
        "correct": (predicted == torch.tensor(test.labels)).int().tolist(),
    }
    atomic_write_json(out, found)
    return found


def random_reference(data: DataConfig, pretrained: str, layers: int | None, out: Path) -> Path:
    """A student of the arms' shape (``pretrained``'s config, cut to ``layers``) with random
    weights and the task's classes, saved once in ``out``: the floor of saliency loyalty."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from workbench.core.data import load_task
    from workbench.core.models import resolve_model

    if (out / "config.json").exists():
        return out
    names = load_task(data, notify=lambda _: None).spec.label_names
    folder = resolve_model(pretrained)
    config = AutoConfig.from_pretrained(folder)
    config.num_hidden_layers = layers or config.num_hidden_layers
    config.id2label, config.label2id = dict(enumerate(names)), {n: i for i, n in enumerate(names)}
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    load_tokenizer(folder).save_pretrained(out)
    return out


def reference_row(name: str, loyalty: dict) -> dict:
    """A reference row of loyalty (a second teacher, a random student) from :func:`saliency`."""
    scores = [x for x in loyalty["scores"] if x is not None]
    return {
        "method": f"reference: {name}",
        "control": False,
        "seed": None,
        "test_accuracy": fmean(loyalty["correct"]),
        "label_loyalty": fmean(loyalty["label_loyalty"]),
        "saliency_loyalty": fmean(scores) if scores else None,
    }


def teacher_saliency(teacher: str, data: DataConfig, out: Path) -> SplitOutputs:
    """The teacher's logits and Grad saliency on the test split, computed once (a backward pass
    per batch through its weights) and kept in ``out``."""
    if out.exists():
        return SplitOutputs(**torch.load(out, weights_only=True))
    loaded, task = load_for_task(teacher, data)
    found = split_outputs(loaded, task.splits["test"])
    tmp = out.with_suffix(".tmp")
    torch.save(vars(found), tmp)
    tmp.replace(out)
    return found


def row(
    run: Path,
    cache: Path,
    preset: str,
    is_control: bool,
    seed: int,
    student: StudentConfig,
    loyalty: dict | None,
) -> dict:
    """One student's row from its run folder (results, manifest, status, the layers it kept),
    the cache's teacher folder (config and tokenizer) and its saliency loyalty per test example
    (``loyalty``; None: not measured)."""
    test = _read(run / "results.json")["test"]
    record = _read(run / "run.json")
    manifest = _read(run / "manifest.json")
    alignment = manifest.get("word_alignment", {}).get("train", {})
    scores = [x for x in (loyalty or {}).get("scores", []) if x is not None]
    if "label_loyalty" not in test and loyalty:  # a student trained alone: measured here
        test["label_loyalty"] = sum(loyalty["label_loyalty"]) / len(loyalty["label_loyalty"])
    transfer = manifest.get("transfer", {}).get("used", 0)
    return {
        "method": preset,
        "control": is_control,
        "seed": seed,
        "labelled": manifest["split_sizes"]["train"] - transfer,
        "transfer": transfer,
        "teacher_model_type": _read(cache / "teacher" / "config.json")["model_type"],
        "teacher_tokenizer": _tokenizer(cache / "teacher"),
        "student_model_type": _read(run / "model" / "config.json")["model_type"],
        "student_tokenizer": _tokenizer(run / "model"),
        "student_init": " ".join(filter(None, [student.init, portable(student.pretrained)])),
        "student_layers": _read(run / "model" / "config.json")["num_hidden_layers"],
        "student_kept_layers": record["resolved"].get("student_layers"),
        "test_accuracy": test["accuracy"],
        "macro_f1": test["macro_f1"],
        "recall": {k.split("/", 1)[1]: v for k, v in test.items() if k.startswith("recall/")},
        "label_loyalty": test.get("label_loyalty"),
        "probability_loyalty": test.get("probability_loyalty"),
        "saliency_loyalty": sum(scores) / len(scores) if scores else None,
        "words_dropped": alignment.get("left_out"),
        "words_dropped_share": (
            alignment["left_out"] / alignment["words"] if alignment.get("words") else None
        ),
        "training_seconds": _read(run / "status.json")["seconds"]["training"],
        "run": str(run),
    }


def _interval(interval: Interval, groups: list) -> dict:
    return {
        "difference": interval.difference,
        "low": interval.low,
        "high": interval.high,
        "significant": interval.significant,
        "pairs": interval.pairs,
        "seeds": len(groups),
        "seeds_needed": None if interval.significant else seeds_needed(groups, interval.difference),
        "described": interval.describe(),
    }


def _arm(r: dict) -> tuple[str, bool, bool]:
    return r["method"], r["control"], r.get("transfer", 0) > 0


def comparisons(arms: set[tuple[str, bool, bool]]) -> list[tuple[str, str, tuple, tuple]]:
    """``(label, name, arm, other)`` per paired comparison among ``arms`` (method, control,
    transfer set): each method against its control and against vanilla KD on the same data,
    every distilled student against the student trained alone (``finetune``), and vanilla KD
    with the transfer set against vanilla KD without it. Where some arms have a transfer set,
    those without are labelled ``on L``."""
    mixed = len({t for _, _, t in arms}) > 1
    label = lambda m, t: f"{m}{' on L' if mixed and not t else ''}"  # noqa: E731
    alone = ("finetune", False, False)
    found = []
    for method, is_control, t in sorted(arms):
        if method == "finetune":
            continue
        arm = (method, is_control, t)
        others = [] if is_control else [("control", (method, True, t)), ("kd", ("kd", False, t))]
        others += [("finetune", alone)]
        if (method, is_control, t) == ("kd", False, True):
            others.append(("kd on L", ("kd", False, False)))
        name = label(method, t) + (" control" if is_control else "")
        found += [
            (label(method, t), f"{name} − {o}", arm, other)
            for o, other in others
            if other in arms and other != arm
        ]
    return found


def pairs(rows: list[dict], saliency_folder: Path | None = None) -> dict:
    """The paired differences of :func:`comparisons` over the seeds both arms have, in test
    accuracy, label loyalty and (where measured, in ``saliency_folder``) saliency loyalty
    (two-level bootstrap, 95 %), from the runs' per-example test predictions (a student trained
    alone: its loyalty as measured with its saliency)."""
    rows = [r for r in rows if "run" in r]  # not the reference rows
    saliencies = {
        (*_arm(r), r["seed"]): _read(saliency_folder / f"{Path(r['run']).name}.json")
        for r in rows
        if saliency_folder is not None
        and (saliency_folder / f"{Path(r['run']).name}.json").exists()
    }
    tests = {}
    for r in rows:
        test = _read(Path(r["run"]) / "predictions.json")["test"]
        kept = saliencies.get((*_arm(r), r["seed"]), {})
        if "label_loyalty" not in test and "label_loyalty" in kept:
            test["label_loyalty"] = kept["label_loyalty"]
        tests[(*_arm(r), r["seed"])] = test
    out: dict[str, dict] = {}
    for label, name, arm, other in comparisons({_arm(r) for r in rows}):
        seeds = sorted(s for *a, s in tests if tuple(a) == arm and (*other, s) in tests)
        if not seeds:
            continue
        a = [tests[(*arm, s)] for s in seeds]
        b = [tests[(*other, s)] for s in seeds]
        measures = {"test_accuracy": pair_predictions(a, b, by_seed=True)}
        if all("label_loyalty" in t for t in a + b):
            loyalty = [
                [{"uids": t["uids"], "scores": t["label_loyalty"]} for t in x] for x in (a, b)
            ]
            measures["label_loyalty"] = pair_scores(*loyalty, by_seed=True)
        keys = [[(*arm, s) for s in seeds], [(*other, s) for s in seeds]]
        if all(key in saliencies for side in keys for key in side):
            measures["saliency_loyalty"] = pair_scores(
                *([saliencies[key] for key in side] for side in keys), by_seed=True
            )
        found = {
            metric: _interval(two_level_bootstrap(groups), groups)
            for metric, groups in measures.items()
        }
        out.setdefault(label, {})[name] = found
    return out


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher-cache", required=True)
    parser.add_argument("--teacher", help="complete the cache with each arm's missing fields")
    parser.add_argument("--task", default="tweets")
    parser.add_argument("--max-train-examples", type=int)
    parser.add_argument("--max-eval-examples", type=int)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--init", default="pretrained")
    parser.add_argument("--pretrained", default="minilm-l6")
    parser.add_argument("--num-layers", type=int, help="cut the student to this many layers")
    parser.add_argument("--layers", default="skip", help="which layers a cut student keeps")
    parser.add_argument("--presets", default="kd,gkd")
    parser.add_argument("--transfer", help="the students' transfer set (kdw distill --transfer)")
    parser.add_argument("--max-transfer-examples", type=int)
    parser.add_argument(
        "--labelled-arms",
        default="kd",
        help="with --transfer: presets also trained on the labelled examples alone",
    )
    parser.add_argument(
        "--no-alone", action="store_true", help="leave out the student trained alone (finetune)"
    )
    parser.add_argument(
        "--no-labels",
        action="store_true",
        help="with --transfer: the presets' students learn from the transfer set alone, no "
        "labelled example (kdw distill --no-labels)",
    )
    parser.add_argument(
        "--references",
        default="",
        help="with --teacher: comma-separated models whose loyalty to the teacher is a "
        "reference row (a second teacher, trained with another seed)",
    )
    parser.add_argument(
        "--random-reference",
        action="store_true",
        help="with --teacher: a reference row of a student of the arms' shape, random weights",
    )
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="auto", help="the students': cpu, cuda, cuda:N, auto")
    parser.add_argument("--out", default="runs/llm-teacher")
    parser.add_argument("--results", default="llm-teacher", help="bench/results/<name>.json")
    parser.add_argument(
        "--no-training",
        action="store_true",
        help="report the students already trained, train none (a stopped run's whole table)",
    )
    args = parser.parse_args(argv)
    setup(args.threads)
    cache, out = Path(args.teacher_cache), Path(args.out)
    presets, seeds = args.presets.split(","), [int(s) for s in args.seeds.split(",")]
    data = DataConfig(
        task=args.task,
        max_train_examples=args.max_train_examples,
        max_eval_examples=args.max_eval_examples,
        max_length=args.max_length,
    )
    shape = {
        "init": args.init,
        "pretrained": args.pretrained,
        "num_layers": args.num_layers,
        "layers": args.layers,
    }
    labelled_cache = Path(f"{cache}-labelled") if args.transfer else cache
    transfer = {"transfer": args.transfer, "max_transfer_examples": args.max_transfer_examples}
    students = [("finetune", False, ObjectiveConfig(preset="finetune"), False)] * (
        not args.no_alone
    )
    if args.transfer:  # the labelled-only arms first: the cheapest
        labelled = [preset for preset in args.labelled_arms.split(",") if preset]  # "": none
        students += [(*arm, False) for arm in arms(labelled)]
    students += [(*arm, bool(args.transfer)) for arm in arms(presets)]

    def configs(learns_from: dict, with_transfer: bool) -> StudentConfig:
        labels = {"labels": not args.no_labels}  # the transfer set alone, or with the labels
        return StudentConfig(**shape, **learns_from, **(transfer | labels if with_transfer else {}))

    def student_of(preset: str, with_transfer: bool) -> StudentConfig:
        if preset == "finetune":
            return StudentConfig(**shape)  # no teacher
        folder = cache if with_transfer else labelled_cache
        return configs({"teacher_cache": str(folder)}, with_transfer)

    teacher, references = None, []
    if args.teacher:
        for preset, _, objective, with_transfer in students:
            if preset != "finetune":
                folder = cache if with_transfer else labelled_cache
                with_teacher = configs({"teacher": args.teacher}, with_transfer)
                build_teacher_cache(data, with_teacher, objective, CacheConfig(), folder)
        (out / "saliency").mkdir(parents=True, exist_ok=True)
        teacher = teacher_saliency(args.teacher, data, out / "teacher-test.pt")
        named = [(Path(m).name, Path(m)) for m in filter(None, args.references.split(","))]
        if args.random_reference:
            shaped = random_reference(data, args.pretrained, args.num_layers, out / "random")
            named.append(("random student", shaped))
        for name, model in named:
            kept = out / "saliency" / f"reference-{model.name}.json"
            references.append(reference_row(name, saliency(data, teacher, model, kept)))
    rows: list[dict] = []
    trained: dict[tuple, list[tuple[ObjectiveConfig, Path]]] = {}
    for preset, is_control, objective, with_transfer in students:
        student = student_of(preset, with_transfer)
        for seed in seeds:
            labelled = "-labelled" if args.transfer and not with_transfer else ""
            name = f"{preset}{'-control' if is_control else ''}{labelled}-s{seed}"
            optim = OptimConfig(
                epochs=args.epochs,
                batch_size=args.batch_size,
                seed=seed,
                threads=args.threads,
                device=args.device,
            )
            done = trained.setdefault((seed, with_transfer), [])
            path = next((p for o, p in done if same_training(o, objective)), None)
            if path is None and args.no_training:
                run = Run(out / "runs" / name)
                left = run.unfinished() if run.path.is_dir() else "not started"
                if left is not None:
                    print(f"{name}: {left}, left out (--no-training)")
                    continue
            if path is None:
                path = distill(data, student, objective, optim, out / "runs" / name).path
                done.append((objective, path))
            else:
                print(f"{name}: the same training as {path.name}, whose student it reuses")
            name = path.name
            loyalty = None
            if teacher is not None:
                loyalty = saliency(data, teacher, path, out / "saliency" / f"{name}.json")
            rows.append(row(path, cache, preset, is_control, seed, student, loyalty))
            write_results(
                args.results,
                {
                    "settings": vars(args),
                    "saliency_loyalty": SALIENCY_NOTE,
                    "rows": rows,
                    "references": references,
                    "pairs": pairs(rows, out / "saliency" if teacher is not None else None),
                },
            )
            print(table(rows[-1:], ["method", "control", "seed", "transfer", "test_accuracy"]))
    return rows


if __name__ == "__main__":
    main()
