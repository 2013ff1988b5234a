"""One training loop for fine-tuning a teacher and distilling a student.

AdamW with linear warm-up and decay, gradient clipping, evaluation on dev every epoch (or every N
steps), the best model kept, a tqdm bar, callbacks for live progress and a stop button, and
resumable checkpoints: a run killed at any moment restarts from its last checkpoint — weights,
optimizer, scheduler, RNG and the position in the data order — and ends with the same weights as
an uninterrupted run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from safetensors.torch import load_file
from torch import Tensor
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from kd.diagnostics import term_diagnostics
from workbench.config import OptimConfig
from workbench.data import EncodedSplit, TaskSpec, collate, to_device
from workbench.evaluation import evaluate_logits, predict_logits
from workbench.files import atomic_path
from workbench.runs import Run, replace_directory

LossFunction = Callable[[PreTrainedModel, dict[str, Tensor]], dict[str, Tensor]]


class Callback(Protocol):
    """Live progress for the CLI and the app. Every method is optional."""

    def on_step(self, step: int, total: int, losses: dict[str, float]) -> None: ...

    def on_evaluate(self, step: int, metrics: dict[str, float]) -> None: ...

    def on_cache(self, description: str, done: int, total: int) -> None: ...  # teacher cache

    def should_stop(self) -> bool: ...


@dataclass
class TrainingJob:
    """Everything :func:`train` needs; :mod:`kd.pipeline` builds it from the configs."""

    run: Run
    model: PreTrainedModel
    spec: TaskSpec
    train_set: EncodedSplit
    dev_set: EncodedSplit
    optim: OptimConfig
    loss: LossFunction
    save_model: Callable[[Path], None]
    weights: dict[str, float]  # of the terms ``loss`` returns (for the diagnostics)
    pad_token_id: int = 0
    dev_teacher_logits: Tensor | None = None
    device: torch.device | str = "cpu"
    callbacks: Sequence[Callback] = field(default_factory=tuple)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def epoch_order(size: int, seed: int, epoch: int) -> list[int]:
    """The data order of one epoch: a function of the seed and the epoch alone."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=generator).tolist()


def _optimizer(model: PreTrainedModel, optim: OptimConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            plain = name.endswith("bias") or "LayerNorm" in name or "layernorm" in name
            (no_decay if plain else decay).append(parameter)
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": optim.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=optim.learning_rate,
    )


def _schedule(total: int, warmup_ratio: float) -> Callable[[int], float]:
    warmup = int(total * warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def _rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def _restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def _notify(callbacks: Sequence[Callback], method: str, *args) -> None:
    for callback in callbacks:
        hook = getattr(callback, method, None)
        if hook is not None:
            hook(*args)


def main_metric(spec: TaskSpec) -> str:
    return spec.metrics[0]


def train(job: TrainingJob) -> dict[str, float]:
    """Train until the configured number of steps (resuming if the run has a checkpoint) and
    return the dev metrics of the best model, which ends in ``run/model``."""
    optim, run, model = job.optim, job.run, job.model
    steps_per_epoch = math.ceil(len(job.train_set) / optim.batch_size)
    total = max(1, round(optim.epochs * steps_per_epoch))
    optimizer = _optimizer(model, optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(total, optim.warmup_ratio))
    state = {"step": 0, "best": None, "best_step": None}
    model.to(job.device)
    if run.checkpoint.exists():
        saved = run.load_checkpoint(job.device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        _restore_rng(saved["rng"])
        state = saved["state"]
    run.truncate_metrics(state["step"])  # without a checkpoint (deleted), from step 0

    def save_checkpoint() -> None:
        with atomic_path(run.checkpoint) as temporary:
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "rng": _rng_state(),
                    "state": state,
                },
                temporary,
            )

    metric = main_metric(job.spec)
    run.set_status("running", step=state["step"], total=total)
    progress = tqdm(total=total, initial=state["step"], desc=f"training {run.name}", unit="step")
    order: list[int] = []
    model.train()
    while state["step"] < total:
        epoch, position = divmod(state["step"], steps_per_epoch)
        if position == 0 or not order:
            order = epoch_order(len(job.train_set), optim.seed, epoch)
        chunk = order[position * optim.batch_size : (position + 1) * optim.batch_size]
        batch = to_device(collate([job.train_set[i] for i in chunk], job.pad_token_id), job.device)
        losses = job.loss(model, batch)
        step = state["step"] + 1
        if optim.log_every and (step == 1 or step % optim.log_every == 0 or step == total):
            diagnostics = term_diagnostics(losses, job.weights, model.parameters())
            run.append_metrics(
                {
                    "step": step,
                    "epoch": step / steps_per_epoch,
                    "split": "train",
                    "lr": scheduler.get_last_lr()[0],
                    **diagnostics,
                }
            )
        losses["loss"].backward()
        values = {name: float(value.detach()) for name, value in losses.items()}
        if optim.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), optim.max_grad_norm)
            values["grad_norm"] = float(norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] = step
        progress.update(1)
        progress.set_postfix(loss=f"{values['loss']:.4f}")
        _notify(job.callbacks, "on_step", step, total, values)

        end_of_epoch = step % steps_per_epoch == 0
        due = step % optim.eval_every == 0 if optim.eval_every else end_of_epoch
        if due or step == total:
            metrics = evaluate_logits(
                job.spec,
                predict_logits(model, job.dev_set, optim.eval_batch_size, job.pad_token_id),
                job.dev_set.labels,
                job.dev_teacher_logits,
            )
            model.train()
            record = {
                "step": step,
                "epoch": step / steps_per_epoch,
                "split": "dev",
                "lr": scheduler.get_last_lr()[0],
                **values,
                **metrics,
            }
            run.append_metrics(record)
            _notify(job.callbacks, "on_evaluate", step, metrics)
            if state["best"] is None or metrics[metric] > state["best"]:
                state["best"], state["best_step"] = metrics[metric], step
                replace_directory(run.model_dir, job.save_model)
            progress.write(f"step {step}/{total} dev {metric} {metrics[metric]:.4f}")
        stop = any(getattr(c, "should_stop", lambda: False)() for c in job.callbacks)
        if due or stop or step == total or step % optim.checkpoint_every == 0:
            save_checkpoint()
            run.set_status("running", step=step, total=total)
        if stop:
            progress.close()
            run.set_status("stopped", step=step, total=total)
            return {}
    progress.close()
    best = load_file(str(run.model_dir / "model.safetensors"), device=str(job.device))
    model.load_state_dict(best)
    return {"best_step": state["best_step"], metric: state["best"]}
