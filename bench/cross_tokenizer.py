"""AD-KD and GKD on words across tokenizers, on real weights: the bundled MiniLM teacher
fine-tuned on the tweets teaches a student that reads the text through a byte-level BPE
tokenizer trained on the tweets' train split (a 3-layer model of MiniLM's width, initialised at
random per seed). Five students per seed — vanilla KD, AD-KD (its attribution term compared on
the words both tokenisations share), GKD (per-word gradient saliency) and each method's control
(the same α, τ and student set-up with the method's own term at 0) — and the paired two-level
bootstrap intervals of their test accuracy differences.

    python -m bench.cross_tokenizer                     # 3 seeds into runs/cross-tokenizer
    python -m bench.cross_tokenizer --seeds 1 --train-examples 600   # a quick look

Resumable: each run folder is resumed or reused when the call is made again; the results go to
``bench/results/cross-tokenizer.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedTokenizerFast

from bench.common import write_results
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import control
from kd.training import distill, train_teacher
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from workbench.analysis.stats import pair_predictions, two_level_bootstrap
from workbench.core.config import DataConfig
from workbench.core.data import load_task
from workbench.core.models import quiet_library_output, resolve_model

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
ARMS = {
    "kd": ObjectiveConfig(preset="kd"),
    "adkd": ObjectiveConfig(preset="adkd"),
    "adkd-control": control(ObjectiveConfig(preset="adkd")),
    "gkd": ObjectiveConfig(preset="gkd"),
    "gkd-control": control(ObjectiveConfig(preset="gkd")),
}
# each method against vanilla KD and against its control: the latter credits its own term
COMPARED = [
    (method, other) for method in ("adkd", "gkd") for other in ("kd", f"{method}-control")
] + [(f"{method}-control", "kd") for method in ("adkd", "gkd")]


def bpe_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts``, ``<s> … </s>`` around a text."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    ids = {token: tokenizer.token_to_id(token) for token in SPECIALS}
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", ids["<s>"]), ("</s>", ids["</s>"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        cls_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )


def student_folder(
    folder: Path, tokenizer: PreTrainedTokenizerFast, labels: list[str], layers: int, seed: int
) -> Path:
    """A randomly initialised classifier of MiniLM's width and ``layers`` layers reading
    ``tokenizer``'s tokens, saved in ``folder`` (kept when it exists)."""
    if (folder / "config.json").exists():
        return folder
    config = AutoConfig.from_pretrained(resolve_model("minilm-l6"))
    config.update(
        {
            "vocab_size": len(tokenizer),
            "num_hidden_layers": layers,
            "pad_token_id": tokenizer.pad_token_id,
            "num_labels": len(labels),
            "id2label": dict(enumerate(labels)),
            "label2id": {label: i for i, label in enumerate(labels)},
        }
    )
    torch.manual_seed(seed)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/cross-tokenizer")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--train-examples", type=int, default=3000)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=8000)
    args = parser.parse_args()
    quiet_library_output()
    out, seeds = Path(args.out), [int(s) for s in args.seeds.split(",")]
    data = DataConfig(
        task="tweets", max_train_examples=args.train_examples, max_length=args.max_length
    )
    optim = OptimConfig(epochs=args.epochs)
    teacher = train_teacher(data, TeacherConfig(model="minilm-l6"), optim, out / "teacher")
    task = load_task(data)
    tokenizer = bpe_tokenizer(task.splits["train"].texts, args.vocab_size)
    labels = list(task.spec.label_names)
    predictions: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    accuracy: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for seed in seeds:
        folder = student_folder(out / f"student-init-{seed}", tokenizer, labels, args.layers, seed)
        for arm, objective in ARMS.items():
            student = StudentConfig(
                teacher=str(teacher.path), init="pretrained", pretrained=str(folder)
            )
            seeded = OptimConfig(epochs=args.epochs, seed=seed)
            run = distill(data, student, objective, seeded, out / f"{arm}-{seed}")
            predictions[arm].append(_read(run.path / "predictions.json")["test"])
            accuracy[arm].append(_read(run.path / "results.json")["test"]["accuracy"])
    teacher_accuracy = _read(teacher.path / "results.json")["test"]["accuracy"]
    differences = {}
    for a, b in COMPARED:
        interval = two_level_bootstrap(pair_predictions(predictions[a], predictions[b], True))
        differences[f"{a} − {b}"] = {
            "points": 100 * interval.difference,
            "low": 100 * interval.low,
            "high": 100 * interval.high,
        }
        print(
            f"{a} − {b}: {100 * interval.difference:+.1f} points "
            f"[{100 * interval.low:+.1f}, {100 * interval.high:+.1f}]"
        )
    manifest = _read(out / f"adkd-{seeds[0]}" / "manifest.json")
    write_results(
        "cross-tokenizer",
        {
            "settings": vars(args),
            "teacher_test_accuracy": teacher_accuracy,
            "student_test_accuracy": accuracy,
            "differences": differences,
            "word_alignment": manifest["word_alignment"],
        },
    )


if __name__ == "__main__":
    main()
