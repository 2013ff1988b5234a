"""Gradient norms of AD-KD's attribution term under Eq. 9 and under the authors' reduction, of
KD and of CE, at the start of training: the student cut from the suite's tweets teacher, on the
first batches of its epoch-0 order (seed 1).

    python reports/diagnosis/gradient_scale.py [TEACHER_RUN] [BATCHES]   # writes the .json
"""

import json
import sys
from pathlib import Path

import torch

from kd.methods.adkd import attribution_loss, attribution_views
from kd.methods.config import ObjectiveConfig
from kd.methods.objective import Objective
from kd.methods.vanilla import logit_kd_loss, task_loss
from kd.training.config import StudentConfig
from kd.training.pipeline import build_student
from kd.training.trainer import epoch_order, set_seed
from workbench.core.data import collate, encode, load_task
from workbench.core.models import load_run

torch.set_num_threads(1)
default_teacher = Path(__file__).resolve().parent / "runs" / "tweets" / "teacher"
teacher_dir = sys.argv[1] if len(sys.argv) > 1 else str(default_teacher)
batches = int(sys.argv[2]) if len(sys.argv) > 2 else 8
teacher = load_run(teacher_dir)
teacher.model.requires_grad_(False)
data = load_task(teacher.data)
train = encode(data.splits["train"], teacher.tokenizer, teacher.data.max_length)
set_seed(1)
student, _ = build_student(teacher, StudentConfig(teacher=teacher_dir, num_layers=3))
objective = Objective.resolve(ObjectiveConfig(preset="adkd"), 6, 3, data.spec.num_labels)
params = [p for p in student.parameters() if p.requires_grad]
order = epoch_order(len(train), 1, 0)
rows = []
for b in range(batches):
    batch = collate([train[i] for i in order[b * 32 : (b + 1) * 32]], 0)
    tmaps, _ = attribution_views(objective, teacher.model, batch, None, False, None)
    smaps, logits = attribution_views(objective, student, batch, None, True, None)
    mask = batch["attention_mask"]
    with torch.no_grad():
        tlogits = teacher.model(input_ids=batch["input_ids"], attention_mask=mask).logits
    terms = {
        "attr_paper": attribution_loss(smaps, tmaps, mask, reduction="paper"),
        "attr_official": attribution_loss(smaps, tmaps, mask, reduction="official"),
        "kd_kl_tau2": logit_kd_loss(logits, tlogits, 2.0, form="kl"),
        "kd_softce_tau2": logit_kd_loss(logits, tlogits, 2.0, form="soft-ce"),
        "ce": task_loss(logits, batch["labels"]),
    }
    row = {"tokens_per_example": float(mask.sum(1).float().mean())}
    for name, value in terms.items():
        grads = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None))
        row[name] = float(value.detach())
        row[name + "_gradnorm"] = float(norm)
    rows.append(row)
    print(json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)
mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
mean["ratio_official_to_paper_grad"] = mean["attr_official_gradnorm"] / mean["attr_paper_gradnorm"]
print("MEAN", json.dumps({k: round(v, 4) for k, v in mean.items()}))
out = Path(__file__).with_suffix(".json")
out.write_text(
    json.dumps({"command": " ".join(sys.argv), "batches": rows, "mean": mean}, indent=1) + "\n"
)
