"""The Python API behind ``kdw``: fine-tune a teacher, distil a student, evaluate runs.

Each function takes the config dataclasses, writes a run folder (see :mod:`workbench.core.runs`) and
resumes it when the same call is made again after an interruption.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from kd.methods.layer_map import select_layers
from kd.methods.objective import Objective
from kd.methods.students import cut_student, random_student
from kd.training import distributed, tracking
from kd.training.tracking import Tracker
from kd.training.trainer import Callback, TrainingJob, notify, set_seed, train
from workbench.analysis.deployment import export_onnx_folder
from workbench.analysis.evaluation import evaluate_logits, predict_logits
from workbench.analysis.metrics import loyalty_per_example
from workbench.core.cache import ExampleCache, Progress, cached, key_digest
from workbench.core.config import (
    DataConfig,
    ObjectiveConfig,
    OnnxSettings,
    OptimConfig,
    StudentConfig,
    TeacherConfig,
    TrackingConfig,
    option_name,
    parse_label_map,
    set_settings,
    to_dict,
)
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
)
from workbench.core.errors import WorkbenchError, first_line
from workbench.core.files import atomic_write_json, atomic_write_text
from workbench.core.models import (
    LoadedModel,
    check_max_length,
    check_pad,
    fingerprint,
    is_run,
    layer_count,
    load_classifier,
    load_for_task,
    load_run,
    load_tokenizer,
    model_device,
    resolve_model,
    set_label_names,
)
from workbench.core.runs import (
    RESOLVED,
    RUN_FILE,
    ResolvedTeacher,
    Run,
    model_card,
    replace_directory,
)
from workbench.core.verify import model_digest

# optimisation settings that do not define a run: where, on how many threads or processes and in
# how many micro-batches it runs, how often it logs diagnostics (a CPU run may resume on a GPU)
EXECUTION_SETTINGS = ("threads", "device", "log_every", "accumulation_steps")


def _configure(optim: OptimConfig) -> torch.device:
    """Apply the thread count, join the processes ``torchrun`` launched (if any) and return
    this process's training device."""
    if optim.threads > 0:
        torch.set_num_threads(optim.threads)
    device = distributed.start(optim.device, optim.batch_size, optim.accumulation_steps)
    if optim.precision == "fp16" and device.type != "cuda":
        raise WorkbenchError(
            f"--precision fp16 needs a CUDA device (training runs on {device}): use bf16 or fp32"
        )
    return device


def _encode_all(data: TaskData, tokenizer, max_length: int) -> dict[str, EncodedSplit]:
    encoded = {
        name: encode(split, tokenizer, max_length, data.spec.regression)
        for name, split in data.splits.items()
    }
    for name, split in encoded.items():
        if split.truncated:
            print(
                f"note: {split.truncated} of {len(split)} {name} examples were truncated to "
                f"{max_length} tokens"
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
    """``run.json``'s record: kind, method, task, ``configs`` and ``optim`` less
    :data:`EXECUTION_SETTINGS`, and what they resolved to (:data:`workbench.core.runs.RESOLVED`:
    the objective, never today's preset table, and the data split: changed data is refused)."""
    from importlib import metadata

    configs = {name: to_dict(config) for name, config in configs.items()}
    identity = {k: v for k, v in to_dict(optim).items() if k not in EXECUTION_SETTINGS}
    return {
        "kind": kind,
        "method": method,
        "task": dataclasses.asdict(task.spec),
        "configs": configs | {"optim": identity},
        RESOLVED: {
            "objective": resolved.record(),
            "split_fingerprint": task.fingerprint(),
            "package_version": metadata.version("kd-workbench"),
        },
    }


def teacher_pin(teacher: str) -> ResolvedTeacher | None:
    """``run.json``'s record of a student's teacher: the digests of its weights and tokenizer files
    (:func:`~workbench.core.verify.model_digest`), so that a rerun or resume against a changed
    teacher is refused, and an evaluation says so; none for a hub id (its revision is the hub's)."""
    folder = Path(resolve_model(teacher))
    if not folder.is_dir():
        return None
    return ResolvedTeacher(source=str(folder.resolve()), **model_digest(folder))


def _saver(run: Run, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, spec: TaskSpec):
    """How a run's model is saved: a Hugging Face checkpoint whose config names the task's
    classes, with its tokenizer and a model card."""
    set_label_names(model, spec)

    def save(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        atomic_write_text(directory / "README.md", model_card(run))

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
    the run there."""
    main = distributed.world().main
    with tracking.tracked(config, job.run, parent) if main else nullcontext(Tracker()) as tracker:
        job.tracker = tracker
        if train(job) and main:
            _finish(job, data, encoded, teacher_logits)


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
    status = run.status()
    job.tracker.log_results(results, status.step or 0)
    job.tracker.log_artifacts(
        [run.path / RUN_FILE, run.path / "results.json", run.model_dir / "README.md"]
    )
    kept = status.model_dump(include={"step", "total", "seconds"}, exclude_unset=True)
    run.set_status("finished", **kept)


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
    tracking_config = tracking_config or TrackingConfig()
    tracking.check(tracking_config)
    device = _configure(optim)
    tokenizer = load_tokenizer(teacher_config.model)  # a bad name fails before the data load
    data = load_task(data_config, notice)
    set_seed(optim.seed)
    notes: list[str] = []  # of the model as loaded: said once its training starts from step 0
    model = load_classifier(
        teacher_config.model, data.spec, parse_label_map(teacher_config.label_map), notes.append
    )
    check_max_length(model, data_config.max_length, "the model")
    objective = Objective.resolve(ObjectiveConfig(preset="finetune"), 0, 0)
    record = _record(
        "teacher", "finetune", data, objective, optim, data=data_config, teacher=teacher_config
    )
    with distributed.run_folder(run_dir, record, _manifest(data, data_config, optim)) as run:
        if run.status().state == "finished":
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
            loss=lambda m, batch: objective(m, batch, {}),
            weights=objective.weights,
            units=objective.term_units(),
            save_model=_saver(run, model, tokenizer, data.spec),
            pad_token_id=pad_id(tokenizer),
            callbacks=callbacks,
            device=device,
        )
        _train(job, tracking_config, data, encoded)
    return run


def build_student(
    teacher: LoadedModel, config: StudentConfig
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The student a :class:`StudentConfig` describes, with its tokenizer: cut from the teacher
    or random (the teacher's tokenizer), or another checkpoint (its own tokenizer, which may
    differ from the teacher's: :func:`check_tokens`)."""
    if config.init == "pretrained":
        if not config.pretrained:
            raise WorkbenchError("--init pretrained needs --pretrained (hub id or directory)")
        tokenizer = load_tokenizer(config.pretrained)
        student = load_classifier(config.pretrained, teacher.spec, notify=notice)
        check_pad(student, config.pretrained)
        return student, tokenizer
    if config.init == "cut":
        layers = select_layers(layer_count(teacher.model), config.num_layers, config.layers)
        student = cut_student(teacher.model, layers, config.freeze_embeddings, notice)
    elif config.init == "random":
        student = random_student(
            teacher.model.config, config.num_layers, config.hidden_size, config.num_heads
        )
    else:
        raise WorkbenchError(f"unknown student init {config.init!r}: use cut, pretrained or random")
    return student, teacher.tokenizer


def check_tokens(
    objective: Objective,
    teacher_tokenizer: PreTrainedTokenizerBase,
    student_tokenizer: PreTrainedTokenizerBase,
) -> None:
    """With another tokenizer (``objective.words``), response-based and [CLS]-state terms
    compare whole examples, and the per-token terms compare on the words both tokenisations
    share (:mod:`workbench.core.data.alignment`); a registered term that declares no way to
    compare on words is refused."""
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
    """Where a teacher run that has not finished stands (``state`` in words and the ``model``
    its ``model/`` holds: :meth:`Run.unfinished`, :meth:`Run.best_dev`); None for a finished
    run and for a model the workbench did not train."""
    if not is_run(source):
        return None
    run = Run.open(source)
    state = run.unfinished()
    return None if state is None else {"state": state, "model": run.best_dev()}


def check_teacher(source: str, allow: bool, remedy: str = ALLOW_UNFINISHED) -> None:
    """Refuse a teacher run that has not finished (stopped, killed, diverged, still training)
    in one line naming its state and ``remedy`` (``{snapshot}``: the model it would give),
    unless ``allow``; then say which snapshot is used: its best dev model so far."""
    state = unfinished_teacher(source)
    if state is None:
        return
    snapshot = Run(Path(source)).snapshot()
    if not allow:
        raise WorkbenchError(
            f"the teacher {source} has not finished training ({state['state']}): resume it "
            "to the end (run its command again), or " + remedy.format(snapshot=snapshot)
        )
    notice(
        f"the teacher {source} has not finished training ({state['state']}): distilling "
        f"from {snapshot}"
    )


def teacher_caches(
    teacher: LoadedModel,
    objective: Objective,
    encoded: dict[str, EncodedSplit],
    data: TaskData,
    max_length: int,
    folder: Path,
    batch_size: int,
    on_progress: Progress | None = None,
    train_key: dict | None = None,
) -> dict[str, ExampleCache]:
    """What the frozen teacher says about every example, computed once per setting: the
    objective's fields on train, logits on dev and test (for loyalty). ``on_progress`` hears of
    each computed batch; ``train_key`` adds to the train cache's key (the student's vocabulary).
    Under ``torchrun`` computed in parts, one per process (docs/distributed.md)."""
    world = distributed.world()
    base_key = {"teacher": fingerprint(teacher.model), "max_length": max_length}
    fingerprints = data.fingerprint()
    caches = {}
    for split, dataset in encoded.items():
        fields = objective.cached_fields() if split == "train" else ["logits"]
        per_token = [f for f in fields if f in objective.per_token_fields()]
        settings = objective.teacher_settings(fields)
        key = {**base_key, "split": split, "data": fingerprints[split], **settings}
        if split == "train":
            key |= train_key or {}
        caches[split] = cached(
            folder,
            f"teacher-{split}",
            key,
            dataset,
            partial(objective.teacher_batch, teacher.model, fields=fields),
            per_token=per_token,
            batch_size=batch_size,
            pad_token_id=pad_id(teacher.tokenizer),
            description=f"teacher cache ({split})",
            inference=not objective.teacher_gradients(fields),
            on_note=notice,
            device=model_device(teacher.model),
            on_progress=on_progress,
            part=(world.rank, world.size),
            gather=distributed.gather_objects,
            save=world.main,
        )
    return caches


@dataclasses.dataclass
class Distillation:
    """A distillation resolved and checked, before anything is written: the frozen teacher and
    the task's data, the student and its tokenizer, the objective, and whether teacher and
    student read the text through the same tokens."""

    teacher: LoadedModel
    data: TaskData
    student: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    objective: Objective
    same_tokens: bool


def prepare_distillation(
    data_config: DataConfig,
    student_config: StudentConfig,
    objective_config: ObjectiveConfig,
    seed: int,
) -> Distillation:
    """Everything a distillation needs, every check of the settings against the models (lengths,
    layers, classes and dimensions the methods ask for, tokenizers) done writing nothing, before
    :func:`distill` or :func:`kd.experiments.tune.tune` creates its folder. ``seed`` initialises a
    random student; the teacher is a run folder (unfinished: :func:`check_teacher`) or a classifier
    matched to the task's classes (``label_map``) and used as it is."""
    if not student_config.teacher:
        raise WorkbenchError(
            "distill needs --teacher: a run folder from train-teacher, a sequence classifier's "
            "folder or a hub id"
        )
    check_teacher(student_config.teacher, student_config.allow_unfinished)
    teacher, data = load_for_task(
        student_config.teacher, data_config, student_config.label_map, notice
    )
    teacher.model.requires_grad_(False)  # frozen: its gradients w.r.t. inputs need no weights
    set_seed(seed)
    student, tokenizer = build_student(teacher, student_config)
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
    objective.prepare_student(teacher.model, student)
    return Distillation(teacher, data, student, tokenizer, objective, same_tokens)


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
    to ``cache_dir`` (default: the run's folder), which students of one teacher and data (a search's
    trials) may share: every file is keyed by its settings. ``tracking_config``'s trackers follow
    the training (:mod:`kd.training.tracking`; in MLflow, a nested run of ``tracking_parent``)."""
    tracking_config = tracking_config or TrackingConfig()
    tracking.check(tracking_config)
    device = _configure(optim)
    setup = prepare_distillation(data_config, student_config, objective_config, optim.seed)
    teacher, data, student, tokenizer = setup.teacher, setup.data, setup.student, setup.tokenizer
    objective, same_tokens = setup.objective, setup.same_tokens
    teacher.model.to(device)
    configs = {"data": data_config, "student": student_config, "objective": objective_config}
    record = _record("student", objective_config.preset, data, objective, optim, **configs)
    if (pinned := teacher_pin(student_config.teacher)) is not None:
        record[RESOLVED]["teacher"] = pinned.model_dump()
    manifest = _manifest(data, data_config, optim)
    if (state := unfinished_teacher(student_config.teacher)) is not None:  # --allow-unfinished
        manifest["unfinished_teacher"] = state  # what the student learnt from
    encoded = _encode_all(data, tokenizer, data_config.max_length)
    # the teacher reads, and its cache is keyed by, its own tokenisation
    teacher_encoded = (
        encoded if same_tokens else _encode_all(data, teacher.tokenizer, data_config.max_length)
    )
    on_words = not same_tokens and bool(objective.per_token_terms())
    if on_words:  # the train split's two encodings get the words they share (``word_ids``)
        words, dropped = share_words(
            data.splits["train"],
            (teacher_encoded["train"], teacher.tokenizer),
            (encoded["train"], tokenizer),
            data_config.max_length,
        )
        notice(
            "teacher and student read the text through different tokenizers: the per-token "
            f"terms compare on the {words} words both tokenisations share; {dropped} words that "
            "one side lacks (characters it drops, text past its truncation) are left out of both"
        )
        manifest["word_alignment"] = {
            "train": {"words": words, "left_out": dropped},
            "aggregation": objective.word_aggregation(),
        }
    with distributed.run_folder(run_dir, record, manifest) as run:
        status = run.status()
        if status.state == "finished":
            return run
        started = time.perf_counter()
        caches = teacher_caches(
            teacher,
            objective,
            teacher_encoded,
            data,
            data_config.max_length,
            Path(cache_dir) if cache_dir else run.cache_dir,
            optim.eval_batch_size,
            lambda *progress: notify(callbacks, "on_cache", *progress),
            {"words": key_digest(tokenizer.get_vocab())} if on_words else {},
        )
        # summed over the processes that resumed the run (a resumed one reads the files)
        cache_seconds = status.seconds.get("teacher_cache", 0.0) + (time.perf_counter() - started)
        train_cache = caches["train"]
        teacher_logits = {split: caches[split].per_example["logits"] for split in ("dev", "test")}
        live_fields = objective.live_fields()

        def loss(model: PreTrainedModel, batch: dict) -> dict:
            # per-word teacher fields fill the first W of the teacher's own token rows
            length = None if on_words else batch["input_ids"].shape[1]
            values = {
                name: train_cache.gather(name, batch["index"].cpu(), length).to(device)
                for name in objective.cached_fields()
            }
            if live_fields:
                teacher_batch = batch
                if not same_tokens:
                    rows = [teacher_encoded["train"][int(i)] for i in batch["index"]]
                    teacher_batch = to_device(collate(rows, pad_id(teacher.tokenizer)), device)
                with torch.no_grad():
                    values |= objective.teacher_batch(teacher.model, teacher_batch, live_fields)
            return objective(model, batch, values)

        job = TrainingJob(
            run=run,
            model=student,
            spec=data.spec,
            train_set=encoded["train"],
            dev_set=encoded["dev"],
            optim=optim,
            loss=loss,
            weights=objective.weights,
            modules=objective.modules,
            units=objective.term_units(),
            save_model=_saver(run, student, tokenizer, data.spec),
            pad_token_id=pad_id(tokenizer),
            dev_teacher_logits=teacher_logits["dev"],
            callbacks=callbacks,
            device=device,
            timings={"teacher_cache": cache_seconds},
        )
        _train(job, tracking_config, data, encoded, tracking_parent, teacher_logits)
    return run


def export_model(
    run_dir: str | Path,
    out: str | Path,
    push_to_hub: str | None = None,
    onnx: bool = False,
    settings: OnnxSettings | None = None,
) -> Path:
    """Write a run's best model into ``out`` (a new or empty folder) as a self-contained Hugging
    Face checkpoint: config with the task's label names, weights, tokenizer and model card; with
    ``push_to_hub`` (a Hub repository id), also upload it (``transformers``' ``push_to_hub``: it
    needs the network and a Hub login). With ``onnx``, an ONNX export instead, built and checked as
    ``settings`` say (:func:`~workbench.analysis.deployment.export_onnx_folder`: float32, and int8
    with ``settings.quantize``), released only once each graph agrees with the PyTorch model on
    the run's test texts."""
    out = Path(out)
    settings = settings or OnnxSettings()
    if out.is_file() or (out.is_dir() and any(out.iterdir())):
        kind = "a file" if out.is_file() else "a folder that is not empty"
        raise WorkbenchError(f"{out} is {kind}: choose a new or empty folder for --out")
    changed = set_settings(settings)
    if changed and not onnx:
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
