"""The Python API behind ``kdw``: fine-tune a teacher, distil a student, evaluate runs.

Each function takes the config dataclasses, writes a run folder (see :mod:`workbench.core.runs`) and
resumes it when the same call is made again after an interruption.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import ClassVar

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from kd.methods.config import ObjectiveConfig
from kd.methods.layer_map import select_layers
from kd.methods.objective import Objective, preset_weights, teacher_terms
from kd.methods.students import cut_student, random_student, set_embeddings_trainable
from kd.training import distributed, tracking
from kd.training.adaptation import (
    ADAPTER_DIR,
    add_lora,
    check_adaptation,
    check_adapter_folder,
    check_fits,
    freeze_to_head,
    head_features,
    head_loss,
    lora_loader,
    merged,
)
from kd.training.config import OptimConfig, StudentConfig, TeacherConfig
from kd.training.teacher_cache import (
    CacheConfig,
    CachedFile,
    CacheRecord,
    add_file,
    cached_teacher,
    check_same,
    checked_file,
    file_digest,
    read_record,
    start_record,
)
from kd.training.tracking import Tracker, TrackingConfig
from kd.training.trainer import Callback, TrainingJob, notify, set_seed, train
from workbench.analysis.deployment import export_onnx_folder
from workbench.analysis.evaluation import evaluate_logits, predict_logits
from workbench.analysis.metrics import loyalty_per_example
from workbench.analysis.settings import OnnxSettings
from workbench.core.cache import (
    ExampleCache,
    Layout,
    Progress,
    build_in_pieces,
    cache_path,
    cached,
    key_digest,
)
from workbench.core.config import DataConfig, option_name, parse_label_map, set_settings, to_dict
from workbench.core.data import (
    EncodedSplit,
    TaskData,
    TaskSpec,
    collate,
    encode,
    load_task,
    pad_id,
    share_words,
    to_device,
    tokenizer_kind,
)
from workbench.core.data.transfer import add_transfer
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import atomic_write_json, atomic_write_text, check_writable
from workbench.core.machine import check_bf16
from workbench.core.models import (
    LoadedModel,
    check_max_length,
    check_pad,
    fingerprint,
    is_run,
    layer_count,
    load_classifier,
    load_config,
    load_for_task,
    load_run,
    load_tokenizer,
    match_pad,
    model_device,
    resolve_device,
    resolve_model,
    set_label_names,
)
from workbench.core.names import BUILTIN_MODELS
from workbench.core.runs import (
    RESOLVED,
    RUN_FILE,
    ResolvedTeacher,
    Run,
    model_card,
    replace_directory,
)
from workbench.core.shards import Shard
from workbench.core.verify import model_digest

# optimisation settings that do not define a run: where, on how many threads or processes and in
# how many micro-batches it runs, how often it logs diagnostics (a CPU run may resume on a GPU)
EXECUTION_SETTINGS = ("threads", "device", "log_every", "accumulation_steps")


def _configure(
    optim: OptimConfig, tracking_config: TrackingConfig | None
) -> tuple[torch.device, TrackingConfig]:
    """Check the trackers ``tracking_config`` asks for (default: none), apply the thread count,
    join the processes ``torchrun`` launched (if any); return this process's training device
    and the tracking config."""
    tracking_config = tracking_config or TrackingConfig()
    tracking.check(tracking_config)
    if optim.threads > 0:
        torch.set_num_threads(optim.threads)
    device = distributed.start(optim.device, optim.batch_size, optim.accumulation_steps)
    if optim.precision == "fp16" and device.type != "cuda":
        raise WorkbenchError(
            f"--precision fp16 needs a CUDA device (training runs on {device}): use bf16 or fp32"
        )
    if optim.precision == "bf16":
        check_bf16(device.type, "--precision bf16", notice)
    return device, tracking_config


def _encode_all(
    data: TaskData, tokenizer, max_length: int, whose: str | None = None
) -> dict[str, EncodedSplit]:
    """Every split encoded by ``tokenizer``, with a note per truncated split; ``whose``
    (``"the student's"``) names the tokenizer where two models read the text."""
    encoded = {
        name: encode(split, tokenizer, max_length, data.spec.regression)
        for name, split in data.splits.items()
    }
    by = "" if whose is None else f" by {whose} {tokenizer_kind(tokenizer)} tokenizer"
    for name, split in encoded.items():
        if split.truncated:
            print(
                f"note: {split.truncated} of {len(split)} {name} examples were truncated to "
                f"{max_length} tokens{by}"
            )
    return encoded


def _manifest(data: TaskData, data_config: DataConfig, optim: OptimConfig) -> dict:
    return {
        "seed": optim.seed,
        "data_source": data.source,
        "data_notes": data.notes,
        "split_fingerprint": data.fingerprint(),
        "split_sizes": {k: len(v) for k, v in data.splits.items()},
        "split_overlap": data.overlap,
        **({"deduped": data.deduped} if data.deduped is not None else {}),
        "max_length": data_config.max_length,
    }


def _record(
    kind: str, method: str, task: TaskData, resolved: Objective, optim: OptimConfig, **configs
) -> dict:
    """``run.json``'s record: kind, method, task, ``configs``, ``optim`` less
    :data:`EXECUTION_SETTINGS`, and what they resolved to (:data:`workbench.core.runs.RESOLVED`)."""
    from importlib import metadata

    identity = {k: v for k, v in to_dict(optim).items() if k not in EXECUTION_SETTINGS}
    return {
        "kind": kind,
        "method": method,
        "task": dataclasses.asdict(task.spec),
        "configs": {name: to_dict(c) for name, c in configs.items()} | {"optim": identity},
        RESOLVED: {
            "objective": resolved.record(),
            "split_fingerprint": task.fingerprint(),
            "package_version": metadata.version("kd-workbench"),
        },
    }


def teacher_pin(teacher: str) -> ResolvedTeacher | None:
    """``run.json``'s pin of a student's teacher: the digests of its weights and tokenizer files, so
    that a changed teacher is refused on resume; none for a hub id."""
    folder = Path(resolve_model(teacher))
    if not folder.is_dir():
        return None
    return ResolvedTeacher(source=str(folder.resolve()), **model_digest(folder))


def _saver(
    run: Run,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    spec: TaskSpec,
    adapted=None,
    base: str = "",
):
    """How a run's model is saved: a Hugging Face checkpoint whose config names the task's
    classes, with its tokenizer and a model card; for a LoRA teacher (``adapted``, the
    ``PeftModel`` around ``model``), its adapters merged into plain weights, and the adapters
    themselves in the run's ``adapter/`` (peft's ``save_pretrained``), naming their base model
    ``base`` as the command named it: a built-in name or a hub id as such, a folder by its
    absolute path (not the folder it was assembled in under this machine's user cache, nor a
    path the base's own files gave), and without peft's ``auto_mapping`` (a pointer to a custom
    model's code: the run's models are transformers' own classes, loaded without their
    ``auto_map``)."""
    set_label_names(model, spec)

    def save_adapter(folder: Path) -> None:
        adapted.save_pretrained(folder)
        path = folder / "adapter_config.json"
        config = json.loads(path.read_text())
        config.pop("auto_mapping", None)
        named = base if base in BUILTIN_MODELS or not Path(base).exists() else Path(base).resolve()
        atomic_write_json(path, config | {"base_model_name_or_path": str(named)})

    def save(directory: Path) -> None:
        (model if adapted is None else merged(adapted)).save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        atomic_write_text(directory / "README.md", model_card(run))
        if adapted is not None:
            replace_directory(run.path / ADAPTER_DIR, save_adapter)

    return save


def _train(
    job: TrainingJob,
    config: TrackingConfig,
    data: TaskData,
    encoded: dict[str, EncodedSplit],
    parent: str | None = None,
    teacher_logits: dict | None = None,
) -> None:
    """Train ``job`` followed by the trackers ``config`` asks for
    (:func:`kd.training.tracking.tracked`, on the process that writes the run), then finish
    the run there. Interrupted (Ctrl-C), the run is marked stopped at its last checkpoint's
    step, where the same command resumes it; so is a run whose results fail to be written
    after its training, which the same command then finishes without training again."""
    main = distributed.world().main
    with tracking.tracked(config, job.run, parent) if main else nullcontext(Tracker()) as tracker:
        job.tracker = tracker
        try:
            trained = train(job)
        except KeyboardInterrupt:
            if main:
                reason = "interrupted: the same command resumes from the last checkpoint"
                _set_state(job.run, "stopped", reason=reason)
            raise
        if trained and main:
            try:
                _finish(job, data, encoded, teacher_logits)
            except Exception as error:  # said with the way to finish the run
                reason = (
                    f"training finished, but its results could not be written "
                    f"({type(error).__name__}: {first_line(error)})"
                )
                _set_state(job.run, "stopped", reason=reason)
                raise WorkbenchError(
                    f"{reason}: the trained model is in {job.run.model_dir}; rerun the same "
                    "command to write them"
                ) from None


def _set_state(run: Run, state: str, **details) -> None:
    """Set ``run``'s state (with ``details``: a ``reason``) where its status stands."""
    kept = run.status().model_dump(include={"step", "total", "seconds"}, exclude_unset=True)
    run.set_status(state, **kept, **details)


def _finish(
    job: TrainingJob, data: TaskData, encoded: dict[str, EncodedSplit], teacher_logits=None
) -> None:
    """Evaluate the best model on dev and test; write ``results.json``, per example
    ``predictions.json`` (ids, gold labels and predictions, and a student's label and
    probability loyalty: what paired statistics need), and add the results to the model card;
    tell the job's tracker the results and the files that describe the run."""
    run, results, predictions = job.run, {}, {}
    for split in [name for name in ("dev", "test") if name in encoded]:
        logits = predict_logits(
            job.model, encoded[split], job.optim.eval_batch_size, job.pad_token_id
        )
        reference = None if teacher_logits is None else teacher_logits.get(split)
        labels = encoded[split].labels
        results[split] = evaluate_logits(data.spec, logits, labels, reference)
        predicted = logits.squeeze(-1) if data.spec.regression else logits.argmax(-1)
        predictions[split] = {
            "uids": data.splits[split].uids,
            "labels": labels.tolist(),
            "predictions": predicted.tolist(),
        }
        if reference is not None:  # a student: its loyalty per example
            predictions[split] |= loyalty_per_example(reference, logits)
    atomic_write_json(run.path / "predictions.json", predictions)
    atomic_write_json(run.path / "results.json", results)
    atomic_write_text(run.model_dir / "README.md", model_card(run))
    job.tracker.log_results(results, run.status().step or 0)
    job.tracker.log_artifacts(
        [run.path / RUN_FILE, run.path / "results.json", run.model_dir / "README.md"]
    )
    _set_state(run, "finished")


def train_teacher(
    data_config: DataConfig,
    teacher_config: TeacherConfig,
    optim: OptimConfig,
    run_dir: str | Path,
    callbacks: Sequence[Callback] = (),
    tracking_config: TrackingConfig | None = None,
) -> Run:
    """Fine-tune a teacher with cross-entropy (MSE for regression) into ``run_dir``, followed
    by the experiment trackers ``tracking_config`` asks for (:mod:`kd.training.tracking`)."""
    check_adaptation(teacher_config)
    device, tracking_config = _configure(optim, tracking_config)
    # from its config alone: refused before any weight is read
    check_fits(
        load_config(teacher_config.model), teacher_config, optim, data_config.max_length, device
    )
    tokenizer = load_tokenizer(teacher_config.model)  # a bad name fails before the data load
    data = load_task(data_config, notice)
    set_seed(optim.seed)
    notes: list[str] = []  # of the model as loaded: said once its training starts from step 0
    model = load_classifier(
        teacher_config.model, data.spec, parse_label_map(teacher_config.label_map), notes.append
    )
    match_pad(model, tokenizer, teacher_config.model, notes.append)
    check_max_length(model, data_config.max_length, "the model")
    if teacher_config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    objective = Objective.resolve(ObjectiveConfig(preset="finetune"), 0, 0)
    record = _record(
        "teacher", "finetune", data, objective, optim, data=data_config, teacher=teacher_config
    )
    adapted = None  # LoRA's PeftModel around ``model``, whose own weights it leaves frozen
    if teacher_config.adapt == "lora":
        adapted, record[RESOLVED]["lora"] = add_lora(model, teacher_config)
    with distributed.run_folder(run_dir, record, _manifest(data, data_config, optim)) as run:
        if run.status().state == "finished":
            run.check_model()  # its results are reported as the model's: a lost one is said
            return run
        if not run.checkpoint.exists():  # resumed, its head and classes are the checkpoint's
            for note in notes:
                notice(note)
        encoded = _encode_all(data, tokenizer, data_config.max_length)
        job = TrainingJob(
            run=run,
            model=model,
            spec=data.spec,
            train_set=encoded["train"],
            dev_set=encoded["dev"],
            optim=optim,
            loss=partial(objective, teacher={}),
            weights=objective.weights,
            units=objective.term_units(),
            save_model=_saver(run, model, tokenizer, data.spec, adapted, teacher_config.model),
            pad_token_id=pad_id(tokenizer),
            callbacks=callbacks,
            device=device,
        )
        if teacher_config.adapt == "head":  # the model does not run in a step
            features = _head_features(job, data, data_config.max_length)
            (term,) = objective.weights
            job.loss = head_loss(freeze_to_head(model), features, term)
        if adapted is not None:  # a resumed run's adapters checked before its first step
            check_adapter_folder(run.path / ADAPTER_DIR)
            job.load_model = lora_loader(adapted, run.path / ADAPTER_DIR)
        _train(job, tracking_config, data, encoded)
    return run


def _cached_by_parts(*args, **options) -> ExampleCache:
    """:func:`~workbench.core.cache.cached` under ``torchrun`` in parts, one per process, saved by
    the first; its notes said as notices."""
    world = distributed.world()
    parts = {"part": (world.rank, world.size), "gather": distributed.gather_objects}
    return cached(*args, **options, **parts, on_note=notice, save=world.main)


def _head_features(job: TrainingJob, data: TaskData, max_length: int) -> ExampleCache:
    """The frozen model's head features of the job's train split (``--adapt head``), computed once
    and kept in the run's cache, keyed by the model's and the split's fingerprints and
    ``max_length``."""
    model = job.model.to(job.device).eval()
    key = {
        "model": fingerprint(model),
        "data": data.fingerprint()["train"],
        "max_length": max_length,
    }
    return _cached_by_parts(
        job.run.cache_dir,
        "head-features-train",
        key,
        job.train_set,
        partial(head_features, model),
        batch_size=job.optim.eval_batch_size,
        pad_token_id=job.pad_token_id,
        description="head features (train)",
        inference=True,
        device=job.device,
        on_progress=partial(notify, job.callbacks, "on_cache"),
    )


STUDENT_LAYERS = 3  # a cut or random student's layers where --num-layers is not given


def build_student(
    teacher: LoadedModel | None,
    config: StudentConfig,
    spec: TaskSpec,
    say: Callable[[str], None] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, list[int] | None]:
    """The student a :class:`StudentConfig` describes for the task ``spec``, its tokenizer and the
    layers of its source it kept (None: random, or a whole checkpoint): cut from the teacher,
    random, or another checkpoint (its own tokenizer: :func:`check_tokens`; the only kind without
    a ``teacher``), cut to ``num_layers`` where given; what is done to it said to ``say``
    (default: :func:`notice`)."""
    say = say or notice
    if teacher is None and config.init != "pretrained":
        raise WorkbenchError(
            "a student without --teacher is a pretrained checkpoint: add --init pretrained "
            "--pretrained MODEL (a cut or random student is made from its teacher)"
        )
    widths = [option_name(n) for n in ("hidden_size", "num_heads") if getattr(config, n)]
    if widths and config.init != "random":
        raise WorkbenchError(
            f"{' and '.join(widths)}: only a random student's width is chosen; a student of "
            f"--init {config.init} has its source's width (use --init random, or leave "
            f"{'it' if len(widths) == 1 else 'them'} out)"
        )
    kept, layers = None, config.num_layers or STUDENT_LAYERS
    if config.init == "pretrained":
        if not config.pretrained:
            raise WorkbenchError("--init pretrained needs --pretrained (hub id or directory)")
        tokenizer = load_tokenizer(config.pretrained)
        student = load_classifier(config.pretrained, spec, notify=say)
        check_pad(student, config.pretrained)
        match_pad(student, tokenizer, config.pretrained, say)
        if config.num_layers is not None:
            count = layer_count(student)
            kept = select_layers(count, config.num_layers, config.layers)
            student = cut_student(student, kept)
            say(
                f"the student keeps layers {','.join(map(str, kept))} of the {count} of "
                f"{config.pretrained} (--layers {config.layers})"
            )
    elif config.init == "cut":
        kept, tokenizer = select_layers(layer_count(teacher.model), layers, config.layers), None
        student = cut_student(teacher.model, kept, say)
    else:
        tokenizer = None
        student = random_student(teacher.model.config, layers, config.hidden_size, config.num_heads)
    if config.freeze_embeddings:
        set_embeddings_trainable(student, False)
    return student, tokenizer or teacher.tokenizer, kept


def check_tokens(
    objective: Objective,
    teacher_tokenizer: PreTrainedTokenizerBase,
    student_tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Refuse, across tokenizers (``objective.words``), a per-token term that declares no way to
    compare on the words both tokenisations share."""
    refused = objective.token_only_terms() if objective.words else []
    if refused:
        raise WorkbenchError(
            f"the student reads the text through another tokenizer ({len(student_tokenizer)} "
            f"tokens, the teacher's {len(teacher_tokenizer)}), and the terms "
            f"{', '.join(refused)} compare tokens with no way to compare words declared "
            "(on_words): choose a student with the teacher's tokenizer, or terms that compare "
            "words or whole examples"
        )


def notice(text: str) -> None:
    """Print ``note: text`` to stderr (under torchrun, on the first process only)."""
    if distributed.world().main:
        print(f"note: {text}", file=sys.stderr)


ALLOW_UNFINISHED = "pass --allow-unfinished to distil from {snapshot}"


def unfinished_teacher(source: str) -> dict | None:
    """Where a teacher run that has not finished stands (``state`` in words, and the ``model``
    ``model/`` holds); None for a finished run or a model the workbench did not train."""
    if not is_run(source):
        return None
    run = Run.open(source)
    state = run.unfinished()
    return None if state is None else {"state": state, "model": run.best_dev()}


def check_teacher(source: str, allow: bool, remedy: str = ALLOW_UNFINISHED) -> None:
    """Refuse an unfinished teacher run in one line naming its state and ``remedy`` (``{snapshot}``:
    the model it would give), unless ``allow``; then say which snapshot is used."""
    state = unfinished_teacher(source)
    if state is None:
        return
    snapshot = Run(Path(source)).snapshot()
    unfinished = f"the teacher {source} has not finished training ({state['state']})"
    if not allow:
        raise WorkbenchError(
            f"{unfinished}: resume it to the end (run its command again), or "
            + remedy.format(snapshot=snapshot)
        )
    notice(f"{unfinished}: distilling from {snapshot}")


def cache_keys(
    teacher_fingerprint: str,
    objective: Objective,
    data: TaskData,
    max_length: int,
    train_key: dict,
    every: bool = False,
) -> dict[str, tuple[list[str], dict]]:
    """Each split's teacher fields and cache key: the objective's cacheable fields on train
    (``every``: all it reads, as ``kdw cache`` stores them) with ``train_key``, logits elsewhere."""
    fingerprints, keys = data.fingerprint(), {}
    train_fields = objective.teacher_fields() if every else objective.cached_fields()
    for split in data.splits:
        if split == "train" and not objective.teacher_terms():
            continue  # no term reads the teacher in training (a student trained alone)
        fields, extra = (train_fields, train_key) if split == "train" else (["logits"], {})
        key = {"teacher": teacher_fingerprint, "max_length": max_length, "split": split}
        key |= {"data": fingerprints[split], **objective.teacher_settings(fields)}
        keys[split] = (fields, key | extra)
    return keys


def teacher_caches(
    setup: Distillation, inputs: TeacherInputs, folder: Path, batch_size: int, on_progress: Progress
) -> dict[str, ExampleCache]:
    """What the frozen teacher says about every example of ``inputs``, computed once per setting
    (:func:`cache_keys`); under ``torchrun`` in parts, one per process."""
    teacher, objective, caches = setup.teacher, setup.objective, {}
    for split, (fields, key) in inputs.keys.items():
        dataset = inputs.teacher_encoded[split]
        caches[split] = _cached_by_parts(
            folder,
            f"teacher-{split}",
            key,
            dataset,
            partial(objective.teacher_batch, teacher.model, fields=fields),
            per_token=[f for f in fields if f in objective.per_token_fields()],
            batch_size=batch_size,
            pad_token_id=pad_id(teacher.tokenizer),
            description=f"teacher cache ({split})",
            inference=not objective.teacher_gradients(fields),
            device=model_device(teacher.model),
            on_progress=on_progress,
        )
    return caches


def read_teacher_caches(setup: Distillation, inputs: TeacherInputs) -> dict[str, ExampleCache]:
    """The caches of ``inputs``' keys that ``kdw cache`` built in the folder ``setup``'s teacher
    stands for; a missing one is one line naming what differs."""
    folder, caches = Path(setup.teacher.source), {}
    for split, (fields, key) in inputs.keys.items():
        path = cache_path(folder, f"teacher-{split}", key)
        if not path.exists():  # built in bf16 (kdw cache --precision bf16)
            path = cache_path(folder, f"teacher-{split}", key | {"precision": "bf16"})
        if not path.exists():
            others = [f.key for f in setup.cache.files if f.key.get("split") == split]
            plain = json.loads(json.dumps(key, default=str))  # as recorded: tuples as lists
            differ = sorted({k for o in others for k in plain | o if o.get(k) != plain.get(k)})
            raise WorkbenchError(
                f"{folder} holds no {split} cache of {', '.join(fields)} for these settings"
                + (f" (its {split} caches differ in {', '.join(differ)})" if differ else "")
                + ": build it with kdw cache and this command's data, student and objective "
                "options"
            )
        checked_file(folder, setup.cache, path.name)
        per_token = [f for f in fields if f in setup.objective.per_token_fields()]
        layout = Layout.of(
            inputs.teacher_encoded[split], fields, per_token, setup.data.spec.num_labels
        )
        caches[split] = ExampleCache.load(path, layout)
    return caches


@dataclasses.dataclass
class TeacherSource:
    """Where a distillation's teacher fields come from, one interface whatever the source
    (:func:`teacher_source`): a student trained alone has none. What a run records of it
    (``pin``, ``manifest``), the fingerprint its caches are keyed by, whether those hold every
    field the objective reads (``every``: as ``kdw cache`` builds them), and the caches of a
    distillation's inputs (:meth:`caches`), checked by :meth:`check` before anything is
    written."""

    setup: Distillation
    pin: ResolvedTeacher | None = None
    fingerprint: str | None = None
    manifest: dict = dataclasses.field(default_factory=dict)
    every: ClassVar[bool] = False

    def check(self, inputs: TeacherInputs) -> None:
        """Refuse, before the run folder is written, caches that cannot be had."""

    def caches(
        self, inputs: TeacherInputs, folder: Path, batch_size: int, on_progress: Progress
    ) -> dict[str, ExampleCache]:
        """Each split's teacher fields (none without a teacher)."""
        return {}


@dataclasses.dataclass
class LiveTeacher(TeacherSource):
    """The teacher model itself, on the student's device: its fields computed once per setting
    into ``folder`` (:func:`teacher_caches`)."""

    def caches(
        self, inputs: TeacherInputs, folder: Path, batch_size: int, on_progress: Progress
    ) -> dict[str, ExampleCache]:
        return teacher_caches(self.setup, inputs, folder, batch_size, on_progress)


@dataclasses.dataclass
class CachedTeacher(TeacherSource):
    """A ``kdw cache`` folder: its fields read as built, every one the objective reads."""

    every: ClassVar[bool] = True
    read: dict[str, ExampleCache] = dataclasses.field(default_factory=dict)

    def check(self, inputs: TeacherInputs) -> None:
        self.read = read_teacher_caches(self.setup, inputs)

    def caches(
        self, inputs: TeacherInputs, folder: Path, batch_size: int, on_progress: Progress
    ) -> dict[str, ExampleCache]:
        return self.read


def teacher_source(setup: Distillation, teacher: str, device: torch.device) -> TeacherSource:
    """Where ``setup``'s teacher fields come from: its teacher cache, the teacher ``teacher``
    names (moved to ``device``), or nowhere for a student trained alone."""
    if setup.cache is not None:
        folder = str(Path(setup.teacher.source).resolve())
        fields = {"teacher_fields": {"cache": folder}}  # where the teacher's fields came from
        return CachedTeacher(setup, setup.cache.teacher, setup.cache.fingerprint, fields)
    if setup.teacher is None:
        return TeacherSource(setup)
    setup.teacher.model.to(device)
    state = unfinished_teacher(teacher)  # what the student learnt from
    manifest = {} if state is None else {"unfinished_teacher": state}
    weights = fingerprint(setup.teacher.model)
    return LiveTeacher(setup, teacher_pin(teacher), weights, manifest)


def check_transfer(objective: Objective, no_labels: bool = False) -> None:
    """Refuse, with a transfer set, an objective whose terms read no teacher (the transfer texts
    would teach nothing) or a term that reads every example's gold label (it says why); with
    ``no_labels``, say which terms add nothing."""
    if not objective.teacher_terms():
        raise WorkbenchError(
            "--transfer: texts without labels teach a student only through a teacher; this "
            "objective has no teacher term (add one, such as --preset kd)"
        )
    if refused := objective.label_refusals():
        raise WorkbenchError(
            "--transfer: the transfer texts have no labels, and "
            + "; ".join(f"{name}: {why}" for name, why in refused.items())
        )
    if no_labels and (terms := objective.label_terms()):
        notice(
            f"--no-labels: {', '.join(terms)} read the labels, which no training text has: "
            "they add nothing, and the teacher's terms alone train the student"
        )


@dataclasses.dataclass
class Distillation:
    """A distillation resolved and checked, before anything is written (:func:`build_student`;
    ``teacher``: None for a student trained alone; ``cache``: the teacher cache folder it
    reads, None: the teacher computes its fields)."""

    teacher: LoadedModel | None
    data: TaskData
    student: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    objective: Objective
    same_tokens: bool
    student_layers: list[int] | None = None
    cache: CacheRecord | None = None


def _cached_teacher(
    data_config: DataConfig, student_config: StudentConfig
) -> tuple[LoadedModel, TaskData, CacheRecord]:
    """The teacher that ``--teacher-cache`` stands for and the task's data, checked against the
    cache (its data; its teacher, where ``--teacher`` names one that exists here)."""
    folder = Path(student_config.teacher_cache)
    record = read_record(folder)
    if student_config.init == "cut":
        raise WorkbenchError(
            "a cut student is made of the teacher's layers, which a teacher cache does not "
            "hold: use --init pretrained or --init random with --teacher-cache"
        )
    pinned = teacher_pin(student_config.teacher) if student_config.teacher else None
    same = {"exclude": {"source"}}  # the digests of its weights and tokenizer
    if pinned and record.teacher and pinned.model_dump(**same) != record.teacher.model_dump(**same):
        raise WorkbenchError(
            f"{folder} caches another teacher than {student_config.teacher} (its weights or "
            "tokenizer differ): leave out --teacher, or build the cache of this one"
        )
    data = load_task(data_config, notice)
    add_transfer_set(data, data_config, student_config)
    check_same(record, folder, None, data, data_config)
    return cached_teacher(folder, record, data_config), data, record


def add_transfer_set(data: TaskData, data_config: DataConfig, config: StudentConfig) -> None:
    """Append the transfer set ``config.transfer`` names to ``data``'s train split, labels
    withheld (:func:`workbench.core.data.transfer.add_transfer`); without ``config.labels``,
    in place of the labelled examples."""
    if config.transfer is None:
        for given, name in (
            (config.max_transfer_examples is not None, "--max-transfer-examples"),
            (not config.labels, "--no-labels"),
        ):
            if given:
                raise WorkbenchError(f"{name} goes with a transfer set: add --transfer")
        return
    if not config.labels:  # the transfer set alone: no labelled example is kept
        data.splits["train"] = data.splits["train"].subset([])
    whole = dataclasses.replace(data_config, max_train_examples=None)
    add_transfer(
        data,
        config.transfer,
        config.max_transfer_examples,
        data_config.split_seed,
        (data_config.text_column, data_config.text_pair_column, data_config.label_column),
        lambda: load_task(whole, notify=lambda _: None).splits["train"],
        notice,
    )


def _student_alone(
    data_config: DataConfig, config: StudentConfig, objective_config: ObjectiveConfig, seed: int
) -> Distillation:
    """A student trained with no teacher (an objective of no teacher term, such as ``finetune``):
    a pretrained checkpoint given the task's classes."""
    if reads := teacher_terms(preset_weights(objective_config)):
        raise WorkbenchError(
            f"distill needs --teacher for the terms {', '.join(reads)}: a run folder from "
            "train-teacher, a sequence classifier's folder or a hub id (or --teacher-cache: a "
            "folder from kdw cache); only an objective of no teacher term (--preset finetune) "
            "trains without one"
        )
    data = load_task(data_config, notice)
    set_seed(seed)
    student, tokenizer, kept = build_student(None, config, data.spec)
    check_max_length(student, data_config.max_length, "the student")
    count, width = layer_count(student), student.config.hidden_size
    objective = Objective.resolve(objective_config, count, count, data.spec.num_labels, width)
    if config.transfer is not None:
        check_transfer(objective)  # refused: no teacher term
    return Distillation(None, data, student, tokenizer, objective, True, kept)


def prepare_distillation(
    data_config: DataConfig,
    student_config: StudentConfig,
    objective_config: ObjectiveConfig,
    seed: int,
    say_student: Callable[[str], None] | None = None,
) -> Distillation:
    """Everything a distillation needs, every check of the settings against the models done writing
    nothing. ``seed`` initialises a random student; the teacher is a run folder, a classifier
    matched to the task's classes, or the teacher cache ``student_config.teacher_cache`` stands for;
    what is done to the student is said to ``say_student`` (default: :func:`notice`).
    """
    record = None
    if student_config.teacher_cache:
        teacher, data, record = _cached_teacher(data_config, student_config)
    elif not student_config.teacher:
        return _student_alone(data_config, student_config, objective_config, seed)
    else:
        check_teacher(student_config.teacher, student_config.allow_unfinished)
        teacher, data = load_for_task(
            student_config.teacher, data_config, student_config.label_map, notice
        )
        add_transfer_set(data, data_config, student_config)
    teacher.model.requires_grad_(False)  # frozen: its gradients w.r.t. inputs need no weights
    set_seed(seed)
    student, tokenizer, kept = build_student(teacher, student_config, data.spec, say_student)
    check_max_length(student, data_config.max_length, "the student")  # the teacher's: loaded
    same_tokens = teacher.tokenizer.get_vocab() == tokenizer.get_vocab()
    objective = Objective.resolve(
        objective_config,
        layer_count(teacher.model),
        layer_count(student),
        data.spec.num_labels,
        teacher.model.config.hidden_size,
        student_width=student.config.hidden_size,
        words=not same_tokens,
    )
    check_tokens(objective, teacher.tokenizer, tokenizer)
    if data.transfer is not None:
        check_transfer(objective, not student_config.labels)
    try:
        objective.prepare_student(teacher.model, student)
    except (NotImplementedError, RuntimeError, WorkbenchError):
        if record is None:
            raise
        # a set-up that reads the weights of a cache's teacher (a model on the meta device)
        raise WorkbenchError(
            f"{', '.join(objective.weights)}: the student's set-up copies the teacher's weights "
            "(GKD: its embeddings, into a student of its tokenizer), which this teacher cache "
            "does not hold: run kdw cache on it with the teacher (which adds them), or distil "
            "with the teacher"
        ) from None
    return Distillation(teacher, data, student, tokenizer, objective, same_tokens, kept, record)


@dataclasses.dataclass
class TeacherInputs:
    """What the teacher reads of a distillation's data: each split in its own tokenisation, the
    cache keys of its fields, and across tokenizers the words both share (``alignment``)."""

    encoded: dict[str, EncodedSplit]
    teacher_encoded: dict[str, EncodedSplit]
    keys: dict[str, tuple[list[str], dict]]
    alignment: dict | None  # None: the per-token fields are not compared on words


def teacher_inputs(
    setup: Distillation, max_length: int, teacher_fingerprint: str, every: bool
) -> TeacherInputs:
    """The data of ``setup`` encoded for student and teacher, with the keys of the teacher's
    caches (``every``: of every field the objective reads, as ``kdw cache`` builds them)."""
    teacher, data = setup.teacher, setup.data
    tokenizer, objective = setup.tokenizer, setup.objective
    # the teacher reads, and its cache is keyed by, its own tokenisation
    same = setup.same_tokens
    encoded = _encode_all(data, tokenizer, max_length, None if same else "the student's")
    if teacher is None:  # a student trained alone
        return TeacherInputs(encoded, {}, {}, None)
    teacher_encoded = (
        encoded if same else _encode_all(data, teacher.tokenizer, max_length, "the teacher's")
    )
    on_words = not same and bool(objective.per_token_terms())
    alignment = None
    if on_words:  # the train split's two encodings get the words they share (``word_ids``)
        words, dropped, wordless = share_words(
            data.splits["train"],
            (teacher_encoded["train"], teacher.tokenizer),
            (encoded["train"], tokenizer),
            max_length,
        )
        notice(
            "teacher and student read the text through different tokenizers: the per-token "
            f"terms compare on the {words} words both tokenisations share; {dropped} words that "
            "one side lacks (characters it drops, text past its truncation) are left out of both"
            + (f"; {wordless} examples share no word and are left out of them" if wordless else "")
        )
        alignment = {
            "train": {"words": words, "left_out": dropped, "examples_without_words": wordless},
            "aggregation": objective.word_aggregation(),
        }
    train_key = {"words": key_digest(tokenizer.get_vocab())} if on_words else {}
    keys = cache_keys(teacher_fingerprint, objective, data, max_length, train_key, every)
    return TeacherInputs(encoded, teacher_encoded, keys, alignment)


def _distillation_loss(
    setup: Distillation,
    inputs: TeacherInputs,
    train_cache: ExampleCache | None,
    device: torch.device,
) -> Callable[[PreTrainedModel, dict], dict]:
    """The step's loss of ``setup``'s objective: its teacher fields gathered from the train
    split's cache, and those no cache holds (CKD's states) computed by the teacher without a
    graph, on its own tokenisation of the batch's examples."""
    teacher, objective = setup.teacher, setup.objective
    cached_fields = inputs.keys["train"][0] if train_cache is not None else []
    live_fields = [name for name in objective.live_fields() if name not in cached_fields]
    on_words = inputs.alignment is not None

    def loss(model: PreTrainedModel, batch: dict) -> dict:
        # per-word teacher fields fill the first W of the teacher's own token rows
        length = None if on_words else batch["input_ids"].shape[1]
        values = {
            name: train_cache.gather(name, batch["index"].cpu(), length).to(device)
            for name in cached_fields
        }
        if live_fields:
            teacher_batch = batch
            if not setup.same_tokens:
                rows = [inputs.teacher_encoded["train"][int(i)] for i in batch["index"]]
                teacher_batch = to_device(collate(rows, pad_id(teacher.tokenizer)), device)
            with torch.no_grad():
                values |= objective.teacher_batch(teacher.model, teacher_batch, live_fields)
        return objective(model, batch, values)

    return loss


def distill(
    data_config: DataConfig,
    student_config: StudentConfig,
    objective_config: ObjectiveConfig,
    optim: OptimConfig,
    run_dir: str | Path,
    callbacks: Sequence[Callback] = (),
    cache_dir: str | Path | None = None,
    tracking_config: TrackingConfig | None = None,
    tracking_parent: str | None = None,
) -> Run:
    """Distil a student from ``student_config.teacher`` into ``run_dir``. The teacher's cache goes
    to ``cache_dir`` (default: the run's folder; keyed by its settings, so a search's trials share
    it); with ``student_config.teacher_cache`` every teacher field is read from that folder. The
    trackers of ``tracking_config`` follow the training (in MLflow nested in ``tracking_parent``).
    """
    device, tracking_config = _configure(optim, tracking_config)
    setup = prepare_distillation(data_config, student_config, objective_config, optim.seed)
    data, student, tokenizer, objective = (
        setup.data,
        setup.student,
        setup.tokenizer,
        setup.objective,
    )
    configs = {"data": data_config, "student": student_config, "objective": objective_config}
    record = _record("student", objective_config.preset, data, objective, optim, **configs)
    source = teacher_source(setup, student_config.teacher, device)
    if source.pin is not None:
        record[RESOLVED]["teacher"] = source.pin.model_dump()
    record[RESOLVED]["student_layers"] = setup.student_layers
    manifest = _manifest(data, data_config, optim) | source.manifest
    if data.transfer is not None:  # which terms saw the transfer texts
        label_terms = objective.label_terms()
        manifest["transfer"] = data.transfer | {"labelled_only": label_terms}
    inputs = teacher_inputs(setup, data_config.max_length, source.fingerprint, source.every)
    encoded = inputs.encoded
    if inputs.alignment is not None:
        manifest["word_alignment"] = inputs.alignment
    source.check(inputs)  # a cache it lacks refused before the run folder is written
    with distributed.run_folder(run_dir, record, manifest) as run:
        status = run.status()
        if status.state == "finished":
            run.check_model()
            return run
        started = time.perf_counter()
        folder = Path(cache_dir) if cache_dir else run.cache_dir
        progress = partial(notify, callbacks, "on_cache")
        caches = source.caches(inputs, folder, optim.eval_batch_size, progress)
        # summed over the processes that resumed the run (a resumed one reads the files)
        cache_seconds = status.seconds.get("teacher_cache", 0.0) + (time.perf_counter() - started)
        teacher_logits = {split: caches[split].per_example["logits"] for split in caches}
        job = TrainingJob(
            run=run,
            model=student,
            spec=data.spec,
            train_set=encoded["train"],
            dev_set=encoded["dev"],
            optim=optim,
            loss=_distillation_loss(setup, inputs, caches.get("train"), device),
            weights=objective.weights,
            modules=objective.modules,
            units=objective.term_units(),
            save_model=_saver(run, student, tokenizer, data.spec),
            pad_token_id=pad_id(tokenizer),
            dev_teacher_logits=teacher_logits.get("dev"),
            callbacks=callbacks,
            device=device,
            timings={"teacher_cache": cache_seconds},
        )
        _train(job, tracking_config, data, encoded, tracking_parent, teacher_logits or None)
    return run


def _check_cache_teacher(student_config: StudentConfig) -> None:
    """Refuse, in one line, a ``kdw cache`` without a teacher or that reads a cache itself."""
    if student_config.teacher_cache:
        raise WorkbenchError("kdw cache computes the teacher's fields: leave out --teacher-cache")
    if not student_config.teacher:
        raise WorkbenchError(
            "kdw cache needs --teacher: a run folder from train-teacher, a sequence classifier's "
            "folder or a hub id"
        )


def build_teacher_cache(
    data_config: DataConfig,
    student_config: StudentConfig,
    objective_config: ObjectiveConfig,
    cache_config: CacheConfig,
    out: str | Path,
    shard: Shard | None = None,
) -> Path | None:
    """``kdw cache``: build in ``out`` every field the distillation these configs describe reads
    from the teacher, so that ``distill`` with ``teacher_cache=out`` needs no teacher. Resumable and
    in shards (:func:`workbench.core.cache.build_in_pieces`); returns ``out`` once every split is
    complete, None while other shards' pieces are missing."""
    out = Path(out)
    _check_cache_teacher(student_config)
    if cache_config.threads > 0:
        torch.set_num_threads(cache_config.threads)
    device = resolve_device(cache_config.device)
    # the student only reads: its head or cut is the distillation's to say
    setup = prepare_distillation(data_config, student_config, objective_config, 0, lambda _: None)
    teacher, objective = setup.teacher, setup.objective
    teacher_fingerprint = fingerprint(teacher.model)
    inputs = teacher_inputs(setup, data_config.max_length, teacher_fingerprint, every=True)
    pin = teacher_pin(student_config.teacher)
    start_record(out, teacher, pin, teacher_fingerprint, setup.data, data_config)
    notice(f"teacher cache in {out.resolve()}")
    teacher.model.to(device)
    bf16 = cache_config.precision == "bf16"
    if bf16:
        check_bf16(device.type, "--precision bf16", notice)

    def compute(batch: dict, seconds: dict[str, float], fields: list[str]) -> dict:
        values = {}
        for name in fields:
            started = time.perf_counter()
            with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
                value = objective.teacher_batch(teacher.model, batch, [name])[name]
            values[name] = value.float() if value.is_floating_point() else value
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started
        return values

    complete, classes = True, setup.data.spec.num_labels
    for split, (fields, key) in inputs.keys.items():
        dataset = inputs.teacher_encoded[split]
        key = key | ({"precision": "bf16"} if bf16 else {})
        path, seconds = cache_path(out, f"teacher-{split}", key), {}
        if path.exists() and any(entry.file == path.name for entry in read_record(out).files):
            continue  # built and recorded (unless its process stopped between the two)
        per_token = [f for f in fields if f in objective.per_token_fields()]
        layout = Layout.of(dataset, fields, per_token, classes)
        if path.exists():  # written, not recorded (its process stopped between the two)
            ExampleCache.load(path, layout)
        else:
            cache, seconds = build_in_pieces(
                out,
                f"teacher-{split}",
                key,
                dataset,
                partial(compute, fields=fields),
                layout,
                cache_config.batch_size,
                pad_id(teacher.tokenizer),
                device,
                inference=not objective.teacher_gradients(fields),
                shard=shard,
                description=f"teacher cache ({split})",
            )
            if cache is None:
                complete = False
                continue
        digest = file_digest(path, "the teacher cache file")
        entry = CachedFile(
            file=path.name, key=key, examples=len(dataset), sha256=digest, seconds=seconds
        )
        add_file(out, entry)
    return out if complete else None


def export_model(
    run_dir: str | Path,
    out: str | Path,
    push_to_hub: str | None = None,
    onnx: bool = False,
    settings: OnnxSettings | None = None,
) -> Path:
    """Write a run's best model into ``out`` (a new or empty folder) as a Hugging Face checkpoint
    with its model card; with ``push_to_hub`` also upload it. With ``onnx``, an ONNX export as
    ``settings`` say instead (:func:`~workbench.analysis.deployment.export_onnx_folder`)."""
    out = Path(out)
    settings = settings or OnnxSettings()
    if out.is_file() or (out.is_dir() and any(out.iterdir())):
        kind = "a file" if out.is_file() else "a folder that is not empty"
        raise WorkbenchError(f"{out} is {kind}: choose a new or empty folder for --out")
    check_writable(out, "--out")
    if (changed := set_settings(settings)) and not onnx:
        raise WorkbenchError(f"{option_name(changed[0])} sets the ONNX export: add --onnx")
    if onnx and push_to_hub:
        raise WorkbenchError("--push-to-hub uploads the checkpoint export: leave out --onnx")
    loaded = load_run(run_dir)
    if onnx:
        export_onnx_folder(loaded, out, settings)
        return out
    replace_directory(out, _saver(loaded.run, loaded.model, loaded.tokenizer, loaded.spec))
    if push_to_hub:
        from huggingface_hub import HfApi

        try:
            api = HfApi()
            repo = api.create_repo(push_to_hub, exist_ok=True).repo_id
            loaded.model.push_to_hub(repo, commit_message=f"Upload {loaded.name}")
            loaded.tokenizer.push_to_hub(repo, commit_message=f"Upload {loaded.name} tokenizer")
            # transformers' push writes a generic card; the run's card replaces it
            api.upload_file(
                path_or_fileobj=str(out / "README.md"),
                path_in_repo="README.md",
                repo_id=repo,
                commit_message="Model card from the kd-workbench run",
            )
        except (OSError, ValueError) as error:  # network, authorisation, invalid repository id
            raise WorkbenchError(f"pushing to {push_to_hub} failed: {first_line(error)}") from None
    return out
