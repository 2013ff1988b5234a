"""One training loop for fine-tuning a teacher and distilling a student.

AdamW with linear warm-up and decay, gradient clipping, evaluation on dev every epoch (or every N
steps), the best model kept, a tqdm bar, callbacks for live progress and a stop button, and
resumable checkpoints: a run killed at any moment restarts from its last checkpoint — weights,
optimizer, scheduler, RNG and the position in the data order — and ends with the same weights as
an uninterrupted run. A step may run as several micro-batches (gradient accumulation), in
mixed precision, and on several processes (:mod:`kd.training.distributed`, which states why the
result is the one-process gradient).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from safetensors.torch import load_file
from torch import Tensor
from tqdm.auto import tqdm
from transformers import PreTrainedModel, get_linear_schedule_with_warmup

from kd.methods.objective import EXAMPLES
from kd.training import distributed
from kd.training.config import OptimConfig
from kd.training.diagnostics import gradient_summary, term_gradients
from kd.training.tracking import Tracker
from workbench.analysis.evaluation import evaluate_logits, predict_logits
from workbench.core.data import EncodedSplit, TaskSpec, collate, to_device
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import atomic_path
from workbench.core.runs import Run, replace_directory

LossFunction = Callable[[PreTrainedModel, dict[str, Tensor]], dict[str, Tensor]]


class Callback(Protocol):
    """Live progress for the CLI and the app. Every method is optional."""

    def on_step(self, step: int, total: int, losses: dict[str, float]) -> None: ...

    def on_evaluate(self, step: int, metrics: dict[str, float]) -> None: ...

    def on_cache(self, description: str, done: int, total: int) -> None: ...  # teacher cache

    def should_stop(self) -> bool: ...


def load_weights(model: PreTrainedModel, folder: Path) -> None:
    """Load the weights a ``save_pretrained`` wrote to ``folder`` into ``model`` (on its
    device)."""
    device = str(next(model.parameters()).device)
    model.load_state_dict(load_file(str(folder / "model.safetensors"), device=device))


@dataclass
class TrainingJob:
    """Everything :func:`train` needs; :mod:`kd.training.pipeline` builds it from the configs."""

    run: Run
    model: PreTrainedModel
    spec: TaskSpec
    train_set: EncodedSplit
    dev_set: EncodedSplit
    optim: OptimConfig
    loss: LossFunction
    save_model: Callable[[Path], None]
    weights: dict[str, float]  # of the terms ``loss`` returns
    # trainable modules of the objective (PKD's projection between widths): trained with the
    # model, kept in the checkpoint, left out of the saved model
    modules: torch.nn.Module = field(default_factory=torch.nn.ModuleDict)
    units: dict[str, str] = field(default_factory=dict)  # term → "examples"/"tokens" (default:
    # examples): what its value is a mean over, to weight micro-batches and shards exactly
    pad_token_id: int = 0
    dev_teacher_logits: Tensor | None = None
    device: torch.device | str = "cpu"
    callbacks: Sequence[Callback] = field(default_factory=tuple)
    tracker: Tracker = field(default_factory=Tracker)  # told every metrics.jsonl record
    # seconds of the run's set-up before training (the teacher cache), recorded in status.json
    # beside the training's own
    timings: dict[str, float] = field(default_factory=dict)
    # how the best model ``save_model`` wrote to a folder returns to ``model`` at the end
    load_model: Callable[[PreTrainedModel, Path], None] = load_weights


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def epoch_order(size: int, seed: int, epoch: int) -> list[int]:
    """The data order of one epoch: a function of the seed and the epoch alone."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=generator).tolist()


def _optimizer(
    named: list[tuple[str, torch.nn.Parameter]], optim: OptimConfig
) -> torch.optim.Optimizer:
    """AdamW over the trained parameters ``named``; biases and norms without weight decay."""
    decay, no_decay = [], []
    for name, parameter in named:
        plain = name.endswith("bias") or "LayerNorm" in name or "layernorm" in name
        (no_decay if plain else decay).append(parameter)
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": optim.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=optim.learning_rate,
    )


def _rng_state() -> dict:
    """This process's random generators' states as tensors, numbers and tuples, which a
    checkpoint loads without running code (:meth:`Run.load_checkpoint`): torch's, Python's
    ``random``'s, numpy's (its key array as an int64 tensor) and, once CUDA is in use, the
    current CUDA device's."""
    kind, key, position, has_gauss, gaussian = np.random.get_state(legacy=True)
    key = torch.from_numpy(key.astype(np.int64))
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (kind, key, int(position), int(has_gauss), float(gaussian)),
    }
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _restore_rng(state: dict) -> None:
    """Set the generators to a state :func:`_rng_state` gave (CUDA's where it was recorded
    and CUDA is available: a run may resume on another device)."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    kind, key, *rest = state["numpy"]
    np.random.set_state((kind, key.cpu().numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


class TrainingDiverged(WorkbenchError):
    """A training stopped at the step where a loss term, the loss, the gradient norm or a
    weight went non-finite (NaN or infinite): its run's status is ``diverged``, it keeps its
    last checkpoint (written at a finite step) and gets no results."""


def _non_finite_values(terms: dict[str, float], loss: float) -> list[str]:
    """What is non-finite among a step's term values, or the loss their weighted sum makes
    (finite terms whose weighted sum overflows)."""
    problems = [
        f"the term {name} is {value}" for name, value in terms.items() if not math.isfinite(value)
    ]
    return problems or ([] if math.isfinite(loss) else [f"the loss is {loss}"])


def _non_finite_weights(named: list[tuple[str, torch.nn.Parameter]]) -> list[str]:
    """The weights that are NaN or infinite after an update, as one phrase (none: [])."""
    finite = torch.stack([torch.isfinite(p).all() for _, p in named]).cpu()
    if bool(finite.all()):
        return []
    bad = [name for (name, _), ok in zip(named, finite.tolist(), strict=True) if not ok]
    return [f"{len(bad)} weight tensor(s) are not finite after the update (first {bad[0]})"]


def notify(callbacks: Sequence[Callback], method: str, *args) -> None:
    """Call ``method`` on every callback that has it (the pipeline also reports cache progress)."""
    for callback in callbacks:
        hook = getattr(callback, method, None)
        if hook is not None:
            hook(*args)


def main_metric(spec: TaskSpec) -> str:
    return spec.metrics[0]


def _weights_misfit(saved: dict[str, Tensor], model: PreTrainedModel) -> str | None:
    """How a checkpoint's weights ``saved`` differ from ``model``'s (names and shapes), or
    None when they fit."""
    own = model.state_dict()
    misfits = {
        "weights missing": [name for name in own if name not in saved],
        "weights this model lacks": [name for name in saved if name not in own],
        "weights of other shapes": [
            n for n in own if n in saved and getattr(saved[n], "shape", None) != own[n].shape
        ],
    }
    parts = [f"{len(names)} {what} (first {names[0]})" for what, names in misfits.items() if names]
    return "; ".join(parts) or None


def _resume(run: Run, saved: dict, job: TrainingJob, stateful: dict, world) -> None:
    """Restore the model and the objective's modules, the optimizer, scheduler and scaler
    (``stateful``) and this process's RNG from a checkpoint read by :meth:`Run.load_checkpoint`;
    one written by another run (other weights) or of another version is a one-line error naming
    the file."""
    remedy = (
        "delete it to train this run again from step 0 (the same command), or choose another "
        "--run-dir"
    )
    if misfit := _weights_misfit(saved["model"], job.model):
        raise WorkbenchError(
            f"{run.checkpoint} does not hold this run's model ({misfit}): it comes from "
            f"another run: {remedy}"
        )
    try:
        if len(saved["rng"]) != world.size:  # one state per process
            raise WorkbenchError(
                f"this checkpoint was written by {len(saved['rng'])} process(es): resume it "
                f"with torchrun --nproc_per_node {len(saved['rng'])}, not {world.size}"
            )
        _restore_rng(saved["rng"][world.rank])
        for name, part in stateful.items():
            part.load_state_dict(saved[name])
    except WorkbenchError as error:
        raise WorkbenchError(f"{run.checkpoint}: {error}") from None
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
        raise WorkbenchError(
            f"{run.checkpoint} does not fit this run ({type(error).__name__}: "
            f"{first_line(error)}): {remedy}"
        ) from None


def _micro_batches(job: TrainingJob, chunk: list[int], world: distributed.World) -> list[dict]:
    """This process's shard of the global batch ``chunk``, as the micro-batches it runs."""
    local, steps = distributed.shard(chunk, world.size, world.rank), job.optim.accumulation_steps
    parts = [part for i in range(steps) if (part := distributed.shard(local, steps, i))]
    rows = [[job.train_set[i] for i in part] for part in parts]
    return [to_device(collate(r, job.pad_token_id), job.device) for r in rows]


def _accumulate_gradients(
    job: TrainingJob,
    batches: list[dict],
    parameters: list[torch.nn.Parameter],
    scaler: torch.amp.GradScaler,
    measured: Sequence[str],
) -> tuple[Tensor, dict[str, Tensor]]:
    """Forward and backward this process's micro-batches of one step, leaving in ``.grad`` its
    part of the global batch's gradient: each term ``k`` of a micro-batch weighted by the
    micro-batch's share of the global batch's units of ``k`` (:mod:`kd.training.distributed`).

    Returns the terms' values ``[K]`` (float64, this process's part of the batch's) and the
    weighted gradient ``[P]`` of each term named in ``measured`` (this process's part: one
    extra backward pass per term)."""
    device = torch.device(job.device)
    units = [distributed.unit_index(job.units.get(n, EXAMPLES)) for n in job.weights]
    counts = [distributed.unit_counts(batch) for batch in batches]
    totals = distributed.all_reduce(
        sum(counts, torch.zeros(len(distributed.UNITS), dtype=torch.float64))
    )
    values = torch.zeros(len(job.weights), dtype=torch.float64)
    size = sum(p.numel() for p in parameters)
    term_grads = {n: torch.zeros(size, dtype=torch.float64, device=device) for n in measured}
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(job.optim.precision)  # autocast
    for batch, count in zip(batches, counts, strict=True):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            losses = job.loss(job.model, batch)
            shares = distributed.unit_shares(count, totals, units)
            parts = {n: losses[n] * share for n, share in zip(job.weights, shares, strict=True)}
            loss = torch.stack([job.weights[n] * part for n, part in parts.items()]).sum()
        values += torch.stack([part.detach().double().cpu() for part in parts.values()])
        weights = {name: job.weights[name] for name in measured}
        for name, grad in term_gradients(parts, weights, parameters).items():
            term_grads[name] += grad
        scaler.scale(loss).backward()
    return values, term_grads


def logged_terms(names: list[str], step: int, total: int, every: int) -> list[str]:
    """The terms whose gradient shares step ``step`` of ``total`` measures, each at the cost of
    one backward pass: every term at the first and the last step, one term in turn at every
    ``every``-th step between (so that the diagnostics cost about one backward pass in
    ``every`` steps, whatever the number of terms), none otherwise or with ``every`` 0."""
    if not every:
        return []
    if step in (1, total):
        return names
    return [names[(step // every) % len(names)]] if step % every == 0 else []


class TrainingLoop:
    """One training of a :class:`TrainingJob`: its optimiser, schedule and gradient scaler, the
    state a checkpoint holds (step, best dev score and its step, the seconds trained), and the
    loop's parts — a step, a dev evaluation, a checkpoint, the run's status — each a method."""

    def __init__(self, job: TrainingJob) -> None:
        optim, model = job.optim, job.model
        self.job, self.run, self.model, self.world = job, job.run, model, distributed.world()
        self.device = torch.device(job.device)
        self.steps_per_epoch = math.ceil(len(job.train_set) / optim.batch_size)
        self.total = max(1, round(optim.epochs * self.steps_per_epoch))
        named = [*model.named_parameters(), *job.modules.named_parameters(prefix="objective")]
        self.named = [(n, p) for n, p in named if p.requires_grad]
        self.parameters = [p for _, p in self.named]
        self.optimizer = _optimizer(self.named, optim)
        # Hugging Face's schedule (as its Trainer's): step k (from 0) at k/W of the rate during
        # the W = ⌊ratio·total⌋ warm-up steps — so the first step at 0 — then a linear decay to 0
        self.scheduler = get_linear_schedule_with_warmup(
            self.optimizer, int(self.total * optim.warmup_ratio), self.total
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=optim.precision == "fp16")
        self.stateful = {  # what a checkpoint holds the state of, under these names
            "model": model,
            "objective": job.modules,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
        }
        self.state = {"step": 0, "best": None, "best_step": None}
        # of training (evaluations on dev included), summed over the processes that resumed it
        self.seconds = 0.0
        for module in (model, job.modules):  # every process starts from rank 0's weights
            distributed.broadcast_parameters(module.to(self.device))
        if self.world.size > 1:  # each process its own dropout stream
            set_seed(optim.seed + 1_000_003 * self.world.rank)
        if self.run.checkpoint.exists():
            saved = self.run.load_checkpoint(self.device)
            _resume(self.run, saved, job, self.stateful, self.world)
            self.state, self.seconds = saved["state"], saved["seconds"]
        self.checkpoint_step = self.state["step"]  # of the last checkpoint (0: none)
        self.save_error: Exception | None = None  # of the best model's last save, if it failed
        self.clock = time.perf_counter()
        self.metric = main_metric(job.spec)
        self.progress: tqdm | None = None

    def tick(self) -> None:
        """Add the time since the last tick to the seconds trained."""
        now = time.perf_counter()
        self.seconds += now - self.clock
        self.clock = now

    def set_status(self, name: str, step: int, **details) -> None:
        """status.json (rank 0 only): ``name`` at ``step``, with the seconds spent so far."""
        self.tick()
        if self.world.main:
            spent = {**self.job.timings, "training": self.seconds}
            self.run.set_status(
                name,
                step=step,
                total=self.total,
                seconds={key: round(value, 1) for key, value in spent.items()},
                **details,
            )

    def record(self, step: int, split: str, values: dict) -> None:
        """A ``metrics.jsonl`` record of ``step``, told to the tracker."""
        entry = {
            "step": step,
            "epoch": step / self.steps_per_epoch,
            "split": split,
            "lr": self.scheduler.get_last_lr()[0],
            **values,
        }
        self.run.append_metrics(entry)
        self.job.tracker.log(entry)

    def save_checkpoint(self) -> None:
        """The checkpoint of the current step (every process's random state, rank 0 writes)."""
        rng = distributed.gather_objects(_rng_state())
        self.checkpoint_step = self.state["step"]
        self.tick()  # the checkpoint holds the seconds trained
        if not self.world.main:
            return
        states = {name: part.state_dict() for name, part in self.stateful.items()}
        with atomic_path(self.run.checkpoint) as temporary:
            torch.save(
                {**states, "rng": rng, "state": self.state, "seconds": self.seconds}, temporary
            )
        self.set_status("running", self.state["step"])

    def diverged(self, step: int, problems: list[str]) -> TrainingDiverged:
        """Mark the run diverged at ``step`` (nothing of that step is saved) and say so."""
        self.progress.close()
        self.set_status("diverged", step, reason="; ".join(problems))
        kept = (
            f"the checkpoint of step {self.checkpoint_step} is kept"
            if self.checkpoint_step
            else "no checkpoint had been written"
        )
        return TrainingDiverged(
            f"training diverged at step {step}: {'; '.join(problems)} (lr "
            f"{self.scheduler.get_last_lr()[0]:g}): {kept}; lower --learning-rate or check "
            "--weights and --temperature"
        )

    def step(self, chunk: list[int]) -> dict[str, float]:
        """One optimiser step on the examples ``chunk`` (all processes together): the terms'
        values, the loss and the gradient norm; a non-finite one stops the training."""
        job, step = self.job, self.state["step"] + 1
        measured = logged_terms(list(job.weights), step, self.total, job.optim.log_every)
        values, term_grads = _accumulate_gradients(
            job, _micro_batches(job, chunk, self.world), self.parameters, self.scaler, measured
        )
        distributed.all_reduce_gradients(self.parameters)
        distributed.all_reduce(values)
        terms = {name: float(v) for name, v in zip(job.weights, values, strict=True)}
        summary = {name: job.weights[name] * value for name, value in terms.items()}
        if problems := _non_finite_values(terms, sum(summary.values())):
            raise self.diverged(step, problems)
        self.scaler.unscale_(self.optimizer)
        if measured:
            flat = {name: distributed.all_reduce(g) for name, g in term_grads.items()}
            whole = torch.cat([distributed.flat_gradient(p) for p in self.parameters]).double()
            if self.world.main:
                self.record(step, "train", gradient_summary(flat, summary, whole))
        # an infinite clipping norm (--max-grad-norm 0) scales the gradient by exactly 1
        clip = job.optim.max_grad_norm or math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, clip))
        values_out = {**terms, "loss": sum(summary.values()), "grad_norm": norm}
        if not math.isfinite(norm) and not self.scaler.is_enabled():
            # (fp16's scaler skips a step whose scaled gradient overflowed, and scales down)
            raise self.diverged(step, [f"the gradient norm is {norm}"])
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if problems := _non_finite_weights(self.named):
            raise self.diverged(step, problems)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state["step"] = step
        return values_out

    def evaluate(self, step: int, values: dict[str, float]) -> None:
        """Score the model on dev at ``step`` (rank 0): record it with the step's ``values``,
        and keep the model in ``run/model`` when it is the best so far."""
        job, metric = self.job, self.metric
        metrics = evaluate_logits(
            job.spec,
            predict_logits(self.model, job.dev_set, job.optim.eval_batch_size, job.pad_token_id),
            job.dev_set.labels,
            job.dev_teacher_logits,
        )
        self.model.train()
        self.record(step, "dev", values | metrics)
        notify(job.callbacks, "on_evaluate", step, metrics)
        if self.state["best"] is None or metrics[metric] > self.state["best"]:
            self.state["best"], self.state["best_step"] = metrics[metric], step
            self.save_best()
        self.progress.write(f"step {step}/{self.total} dev {metric} {metrics[metric]:.4f}")

    def save_best(self) -> None:
        """Write the model, the best so far, to ``run/model``. A save that fails (whatever
        ``save_pretrained`` or the file system raises) marks the state ``unsaved``: the
        checkpoint the step writes next holds the model, and a rerun saves it from there."""
        try:
            replace_directory(self.run.model_dir, self.job.save_model)
        except Exception as error:  # said with the way to save the weights
            self.state["unsaved"], self.save_error = True, error
        else:
            self.state.pop("unsaved", None)

    def not_saved(self, step: int) -> WorkbenchError:
        """Mark the run stopped at ``step``, whose checkpoint holds the model that failed to
        save, and say how to save it (every process stops: the other processes say that
        rank 0 could not save)."""
        self.progress.close()
        if not self.world.main:
            return WorkbenchError(
                f"training stopped at step {step}: rank 0 could not save the model; the trained "
                f"weights are in {self.run.checkpoint}"
            )
        error = self.save_error
        reason = (
            f"the model of step {self.state['best_step']} could not be saved "
            f"({type(error).__name__}: {first_line(error)})"
        )
        self.set_status("stopped", step, reason=reason)
        done = "training finished" if step == self.total else f"training stopped at step {step}"
        return WorkbenchError(
            f"{reason}: {done}; the trained weights are in {self.run.checkpoint}; rerun the same "
            "command to save them"
        )

    def __call__(self) -> dict[str, float]:
        """Train to the last step (or a callback's stop) and return the best dev metrics."""
        job, optim, state = self.job, self.job.optim, self.state
        if self.world.main:
            self.run.truncate_metrics(state["step"])  # without a checkpoint (deleted), from 0
            job.tracker.start(state["step"])
        self.set_status("running", state["step"])
        self.progress = tqdm(
            total=self.total,
            initial=state["step"],
            desc=f"training {self.run.name}",
            unit="step",
            disable=not self.world.main,
        )
        if state.get("unsaved"):  # the checkpoint's model is the best
            if self.world.main:
                self.save_best()
            if distributed.any_process(self.save_error is not None):
                raise self.not_saved(state["step"])
        order: list[int] = []
        self.model.train()
        while state["step"] < self.total:
            epoch, position = divmod(state["step"], self.steps_per_epoch)
            if position == 0 or not order:
                order = epoch_order(len(job.train_set), optim.seed, epoch)
            chunk = order[position * optim.batch_size : (position + 1) * optim.batch_size]
            values = self.step(chunk)
            step = state["step"]
            self.progress.update(1)
            self.progress.set_postfix(loss=f"{values['loss']:.4f}")
            notify(job.callbacks, "on_step", step, self.total, values)
            end_of_epoch = step % self.steps_per_epoch == 0
            due = step % optim.eval_every == 0 if optim.eval_every else end_of_epoch
            evaluated = due or step == self.total
            if evaluated and self.world.main:
                self.evaluate(step, values)
            stop = distributed.any_process(
                any(getattr(c, "should_stop", lambda: False)() for c in job.callbacks)
            )
            if evaluated or stop or step % optim.checkpoint_every == 0:
                self.save_checkpoint()
            if evaluated and distributed.any_process(self.save_error is not None):
                raise self.not_saved(step)  # (after an evaluation, so with its checkpoint)
            if stop:
                self.progress.close()
                self.set_status("stopped", step)
                return {}
        self.progress.close()
        distributed.barrier()  # rank 0 has written the best model
        job.load_model(self.model, self.run.model_dir)
        return {"best_step": state["best_step"], self.metric: state["best"]}


def train(job: TrainingJob) -> dict[str, float]:
    """Train until the configured number of steps (resuming if the run has a checkpoint) and
    return the dev metrics of the best model, which ends in ``run/model``; under ``torchrun``,
    every process calls it (:mod:`kd.training.distributed`): :class:`TrainingLoop`."""
    return TrainingLoop(job)()
