"""AOPC under ``rules="ferret"`` against ferret-xai's own evaluators, on bundled tweets.

ferret-xai is not a dependency (it pulls LIME, SHAP and dataset managers); point this script at
an unpacked copy of its wheel (``pip download --no-deps ferret-xai==0.4.2`` and unzip it):
only its evaluators and their light modules are imported, bypassing the package's ``__init__``.

    python -m bench.ferret_aopc --ferret-src /tmp/ferretsrc [--examples 40]

Per tweet: the Grad × input scores of the bundled MiniLM-L6 (its classifier head random, seed 0:
the check is of the arithmetic, not of a trained model), ferret's comprehensiveness and
sufficiency (``remove_first_last``, positive scores only, 10 %–100 %, tokens deleted, the rest
decoded to text and tokenised again) and this project's ``aopc(..., rules="ferret")`` on the same
token ids. Prints the largest differences and writes ``bench/results/ferret_aopc.json``.

``--on-ids`` feeds ferret's perturbed token ids to the model as they are (its decode → tokenise
round trip replaced by ``[CLS] ids [SEP]``), which separates its rules' arithmetic from the
re-tokenisation of partial word pieces.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from workbench.analysis.attribution import grad_saliency
from workbench.analysis.faithfulness import aopc
from workbench.core.config import DataConfig
from workbench.core.data import load_task
from workbench.core.models import resolve_model

RESULTS = Path(__file__).parent / "results" / "ferret_aopc.json"


def ferret_evaluators(source: Path):
    """ferret's two AOPC evaluators, imported without its package ``__init__``."""
    package = types.ModuleType("ferret")
    package.__path__ = [str(source / "ferret")]
    sys.modules["ferret"] = package
    module = importlib.import_module("ferret.evaluators.faithfulness_measures")
    explanation = importlib.import_module("ferret.explainers.explanation").Explanation
    return module.AOPC_Comprehensiveness_Evaluation, module.AOPC_Sufficiency_Evaluation, explanation


def feed_ids(evaluator, model, tokenizer) -> None:
    """Make ``evaluator`` score its perturbed token ids directly instead of decoding them."""
    helper, forward_text = evaluator.helper, evaluator.helper._forward

    def forward(texts, **options):
        if isinstance(texts, str):
            return forward_text(texts, **options)
        rows = [[tokenizer.cls_token_id, *ids, tokenizer.sep_token_id] for ids in texts]
        batch = tokenizer.pad({"input_ids": rows}, return_tensors="pt")
        with torch.no_grad():
            return None, model(**batch).logits

    helper._forward = forward
    helper.tokenizer = copy.copy(tokenizer)
    helper.tokenizer.decode = lambda ids: [int(i) for i in ids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ferret-src", type=Path, required=True)
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--on-ids", action="store_true", help="skip ferret's decode round trip")
    args = parser.parse_args()
    comprehensiveness, sufficiency, Explanation = ferret_evaluators(args.ferret_src)

    path = resolve_model("minilm-l6")
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3).eval()
    split = load_task(DataConfig(task="tweets", max_eval_examples=args.examples)).splits["test"]
    evaluators = (comprehensiveness(model, tokenizer), sufficiency(model, tokenizer))
    if args.on_ids:
        for evaluator in evaluators:
            feed_ids(evaluator, model, tokenizer)

    rows = []
    for text in split.texts:
        batch = tokenizer([text], return_tensors="pt", truncation=True)
        target = int(model(**batch).logits.argmax(-1))
        scores = grad_saliency(model, **batch, target=target)  # [1, L]
        ours = aopc(model, **batch, scores=scores, target=target, rules="ferret")
        tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
        explanation = Explanation(text, tokens, scores[0].numpy(), "grad", target)
        theirs = [e.compute_evaluation(explanation, target).score for e in evaluators]
        rows.append(
            {
                "text": text,
                "tokens": len(tokens) - 2,
                "ours": [float(ours.comprehensiveness[0]), float(ours.sufficiency[0])],
                "ferret": [float(v) for v in theirs],
            }
        )
    differences = np.abs(
        np.array([r["ours"] for r in rows]) - np.array([r["ferret"] for r in rows])
    )
    summary = {
        "examples": len(rows),
        "on_ids": args.on_ids,
        "max_abs_difference": {
            "comprehensiveness": float(differences[:, 0].max()),
            "sufficiency": float(differences[:, 1].max()),
        },
        "equal_to_1e-6": {
            "comprehensiveness": int((differences[:, 0] < 1e-6).sum()),
            "sufficiency": int((differences[:, 1] < 1e-6).sum()),
        },
    }
    print(json.dumps(summary, indent=2))
    for row, diff in sorted(zip(rows, differences.max(1), strict=True), key=lambda x: -x[1])[:5]:
        print(f"{diff:.2e}  ours {row['ours']}  ferret {row['ferret']}  {row['text'][:60]!r}")
    out = RESULTS.with_stem(RESULTS.stem + ("_on_ids" if args.on_ids else ""))
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
