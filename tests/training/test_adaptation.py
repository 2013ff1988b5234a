"""``train-teacher --adapt``: LoRA adapters and a head trained alone, and the memory check that
refuses a teacher that cannot fit."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForSequenceClassification

from kd.training import adaptation
from kd.training.config import OptimConfig, TeacherConfig
from kd.training.pipeline import train_teacher
from tests.conftest import id_batch, kdw_here, kill_at_step
from tests.tiny_families import save_family_model
from tests.training.test_trainer import StopAfter, _teacher_arguments
from workbench.core.cache import ExampleCache
from workbench.core.config import DataConfig

LABELS = ["negative", "neutral", "positive"]  # the tiny task's classes, in its order
# the modules peft adapts by default, and the head
ARCHITECTURES = {
    "bert": (["query", "value"], "classifier"),
    "llama": (["q_proj", "v_proj"], "score"),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """A tiny random BERT and Llama classifier of the task's classes, saved."""
    root = tmp_path_factory.mktemp("sources")
    return {kind: save_family_model(kind, root / kind, LABELS, seed=3) for kind in ARCHITECTURES}


def _train(task: Path, model: Path, run_dir: Path, callbacks=(), **teacher) -> Path:
    """A teacher of 10 steps of 8 examples (300 of the task's), evaluated at its end only."""
    train_teacher(
        DataConfig(task=str(task), max_length=16),
        TeacherConfig(model=str(model), **teacher),
        OptimConfig(epochs=0.27, batch_size=8, learning_rate=1e-2, threads=1, checkpoint_every=2),
        run_dir,
        callbacks,
    )
    return run_dir


def _batch(kind: str) -> dict[str, torch.Tensor]:
    """Two texts of token ids of the tiny vocabularies, unpadded; no token types for
    decoders."""
    batch = id_batch([[5, 9, 12, 7, 3], [6, 11, 4, 8, 10]])
    return batch if kind == "bert" else {k: v for k, v in batch.items() if k != "token_type_ids"}


def _plain_name(key: str) -> str:
    """A LoRA-adapted model's weight name as the plain model names it."""
    return key.replace(".base_layer", "").replace(".original_module", "")


@pytest.mark.parametrize("kind", list(ARCHITECTURES))
def test_lora_trains_only_adapters_and_head_and_saves_a_plain_merged_classifier(
    kind, sources, tiny_task_dir, tmp_path
):
    from peft import PeftModel

    targets, head = ARCHITECTURES[kind]
    run_dir = _train(tiny_task_dir, sources[kind], tmp_path / "run", adapt="lora", lora_rank=4)
    source = load_file(str(sources[kind] / "model.safetensors"))
    trained = torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]
    adapters = [k for k in trained if "lora_" in k or ".modules_to_save." in k]
    assert {k.split(".")[0] for k in adapters if ".modules_to_save." in k} == {head}
    assert any("lora_B" in k and trained[k].abs().sum() > 0 for k in adapters)  # 0 at start
    for key, value in trained.items():
        if key not in adapters:  # every other weight bitwise as loaded, the head's original too
            assert torch.equal(value, source[_plain_name(key)]), key
    resolved = json.loads((run_dir / "run.json").read_text())["resolved"]["lora"]
    assert resolved == {
        "rank": 4,
        "alpha": 16.0,
        "dropout": 0.05,
        "target_modules": targets,
        "modules_to_save": [head],
    }

    plain = AutoModelForSequenceClassification.from_pretrained(run_dir / "model").eval()
    base = AutoModelForSequenceClassification.from_pretrained(sources[kind])
    adapted = PeftModel.from_pretrained(base, run_dir / "adapter").eval()
    batch = _batch(kind)
    with torch.no_grad():
        expected = adapted(**batch).logits
        torch.testing.assert_close(plain(**batch).logits, expected, rtol=0, atol=1e-5)
        with adapted.disable_adapter():  # the model as it was loaded: other logits
            assert not torch.allclose(adapted(**batch).logits, expected, atol=1e-3)
    saved = load_file(str(run_dir / "model" / "model.safetensors"))
    assert saved.keys() == source.keys()  # a plain classifier's names
    changed = {k for k in source if not torch.equal(saved[k], source[k])}
    assert changed and all(k.startswith(head) or k.split(".")[-2] in targets for k in changed)


def test_lora_layers_adapt_only_the_top_layers(sources, tiny_task_dir, tmp_path):
    run_dir = _train(
        tiny_task_dir, sources["llama"], tmp_path / "run", adapt="lora", lora_rank=4, lora_layers=2
    )
    trained = torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]
    adapted = {int(k.split(".layers.")[1].split(".")[0]) for k in trained if "lora_" in k}
    assert adapted == {2, 3}  # the top 2 of its 4 layers
    resolved = json.loads((run_dir / "run.json").read_text())["resolved"]["lora"]
    assert resolved["layers"] == [2, 3]
    config = AutoModelForSequenceClassification.from_pretrained(sources["llama"]).config
    every, top = (
        adaptation.memory_need(
            config, TeacherConfig(adapt="lora", lora_layers=n), OptimConfig(), 16
        )
        for n in (None, 2)
    )
    assert top.activations * 2 == every.activations  # kept for 2 of the 4 layers


def test_a_lora_run_keeps_no_pointer_to_code_nor_the_base_files_own_paths(
    sources, tiny_task_dir, tmp_path
):
    """A base whose config names remote code (``auto_map``) and a path of its own: the run's
    model config names no code, and its adapter names the base as the command did (its
    absolute path), with no ``auto_mapping``."""
    base = tmp_path / "base"
    shutil.copytree(sources["bert"], base)
    config = json.loads((base / "config.json").read_text())
    hostile = {"AutoModelForSequenceClassification": "someone/repo--evil.Model"}
    config |= {"auto_map": hostile, "_name_or_path": "../../etc"}
    (base / "config.json").write_text(json.dumps(config))
    run_dir = _train(tiny_task_dir, base, tmp_path / "run", adapt="lora", lora_rank=4)
    assert "auto_map" not in json.loads((run_dir / "model" / "config.json").read_text())
    adapter = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(base.resolve())
    assert "auto_mapping" not in adapter


# slow: three trainings of 10 steps (stopped, resumed, whole)
@pytest.mark.slow
def test_a_lora_run_stopped_and_resumed_ends_with_the_uninterrupted_weights(
    sources, tiny_task_dir, tmp_path
):
    options = {"adapt": "lora", "lora_targets": "all-linear"}
    stopped = _train(
        tiny_task_dir, sources["bert"], tmp_path / "stopped", (StopAfter(3),), **options
    )
    assert json.loads((stopped / "status.json").read_text())["state"] == "stopped"
    _train(tiny_task_dir, sources["bert"], stopped, **options)
    whole = _train(tiny_task_dir, sources["bert"], tmp_path / "whole", **options)
    for folder, name in (("model", "model.safetensors"), ("adapter", "adapter_model.safetensors")):
        one, other = (load_file(str(run / folder / name)) for run in (stopped, whole))
        assert one.keys() == other.keys()
        assert all(torch.equal(one[k], other[k]) for k in one), folder
    targets = json.loads((whole / "run.json").read_text())["resolved"]["lora"]["target_modules"]
    assert targets == ["dense", "key", "query", "value"]  # every linear layer but the head


@pytest.mark.parametrize("kind", list(ARCHITECTURES))
def test_head_trains_the_head_alone_on_features_computed_once(
    kind, sources, tiny_task_dir, tmp_path, monkeypatch
):
    computed = []
    compute = ExampleCache.compute.__func__

    def counted(cls, *arguments, **options):
        computed.append(options["description"])
        return compute(cls, *arguments, **options)

    monkeypatch.setattr(ExampleCache, "compute", classmethod(counted))
    run_dir = tmp_path / "run"
    _train(tiny_task_dir, sources[kind], run_dir, (StopAfter(3),), adapt="head")
    _train(tiny_task_dir, sources[kind], run_dir, adapt="head")  # resumed: reads the cache
    assert computed == ["head features (train)"]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"

    head = ARCHITECTURES[kind][1]
    source = load_file(str(sources[kind] / "model.safetensors"))
    saved = load_file(str(run_dir / "model" / "model.safetensors"))
    changed = {k for k in source if not torch.equal(saved[k], source[k])}
    assert changed == {k for k in source if k.startswith(f"{head}.")}

    # the cached features: what the head reads, from the frozen backbone
    (file,) = (run_dir / "teacher_cache").glob("head-features-train-*.safetensors")
    features = ExampleCache.load(file).per_example["features"]
    model = AutoModelForSequenceClassification.from_pretrained(sources[kind]).eval()
    tokenizer_dir = sources[kind]
    from workbench.core.data import load_task
    from workbench.core.models import load_tokenizer

    text = load_task(DataConfig(task=str(tiny_task_dir), max_length=16)).splits["train"].texts[0]
    ids = load_tokenizer(str(tokenizer_dir))(
        text, truncation=True, max_length=16, return_tensors="pt"
    )
    with torch.no_grad():
        if kind == "bert":
            expected = model.bert(**ids).pooler_output[0]
        else:
            expected = model.model(input_ids=ids["input_ids"]).last_hidden_state[0, -1]
    torch.testing.assert_close(features[0], expected, rtol=0, atol=1e-5)


def test_a_teacher_that_cannot_fit_is_refused_in_one_line_before_anything_loads(
    sources, tiny_task_dir, tmp_path, monkeypatch
):
    free = 64 * 1024  # bytes: less than the tiny model's weights
    monkeypatch.setattr(adaptation, "free_memory", lambda device: free)
    monkeypatch.setattr(
        "kd.training.pipeline.load_tokenizer", lambda *_: pytest.fail("the tokenizer was read")
    )
    run_dir = tmp_path / "run"
    status, stderr = kdw_here(
        _teacher_arguments(run_dir, sources["llama"], tiny_task_dir), tmp_path
    )
    assert status == 2
    (line,) = stderr.strip().splitlines()
    assert "--adapt full would need about" in line and "GB is free on cpu" in line
    assert "--adapt lora, --adapt head, a smaller --batch-size" in line
    assert not run_dir.exists()


@pytest.mark.parametrize("adapt", ["full", "lora", "head"])
def test_the_memory_need_counts_the_parameters_the_training_keeps(adapt, sources):
    config = AutoConfig.from_pretrained(sources["llama"])
    teacher = TeacherConfig(model=str(sources["llama"]), adapt=adapt)
    need = adaptation.memory_need(config, teacher, OptimConfig(batch_size=8), 16)
    model = AutoModelForSequenceClassification.from_pretrained(sources["llama"])
    count = sum(p.numel() for p in model.parameters())
    head = sum(p.numel() for p in model.score.parameters())
    adapters = sum(  # rank 8 × (in + out) for each of Llama's default targets
        8 * (module.in_features + module.out_features)
        for name, module in model.named_modules()
        if name.endswith(("q_proj", "v_proj"))
    )
    trained = {"full": count, "lora": adapters + head, "head": head}[adapt]
    assert need.parameters == count and need.trained == trained
    assert need.weights == 4 * count * (2 if adapt == "lora" else 1)
    assert need.training == 3 * 4 * trained
    checkpointed = adaptation.memory_need(
        config,
        dataclasses.replace(teacher, gradient_checkpointing=adapt != "head"),
        OptimConfig(batch_size=8),
        16,
    )
    assert (checkpointed.activations < need.activations) == (adapt != "head")


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        (["--lora-rank", "4"], "--lora-rank sets LoRA's adapters: add --adapt lora"),
        (["--adapt", "head", "--gradient-checkpointing"], "--adapt head does not take"),
        (
            ["--adapt", "lora", "--lora-layers", "9"],
            "--lora-layers 9: BertForSequenceClassification has 4 layers",
        ),
        (
            ["--adapt", "lora", "--lora-targets", "nothing_here"],
            "'nothing_here' names no layer of BertForSequenceClassification that LoRA adapts: name "
            "some of its linear layers (dense, key, query, value) or all-linear",
        ),
    ],
)
def test_settings_that_do_not_fit_the_adaptation_are_refused(
    extra, refusal, sources, tiny_task_dir, tmp_path
):
    run_dir = tmp_path / "run"
    status, stderr = kdw_here(
        [*_teacher_arguments(run_dir, sources["bert"], tiny_task_dir), *extra], tmp_path
    )
    assert status == 2 and refusal in stderr and len(stderr.strip().splitlines()) == 1
    assert not run_dir.exists()


# slow: a kdw process killed mid-run, then the run resumed and a clean one trained
@pytest.mark.slow
def test_a_lora_run_killed_and_resumed_ends_with_the_uninterrupted_weights(
    tiny_model_dir, tiny_task_dir, tmp_path
):
    killed, clean = tmp_path / "killed", tmp_path / "clean"

    def arguments(run_dir: Path) -> list[str]:
        return [*_teacher_arguments(run_dir, tiny_model_dir, tiny_task_dir), "--adapt", "lora"]

    state = kill_at_step(arguments(killed), killed, 100)
    assert state.get("state") == "running" and state["step"] < state["total"], state
    # its adapters damaged while it was stopped: refused before the first step, nothing trained
    for name, damage, said in (
        ("link", lambda a: a.symlink_to("/dev/zero"), "is not the run's adapter folder"),
        ("pickle", lambda a: torch.save({}, a / "adapter_model.bin"), "is a pickle"),
    ):
        damaged = tmp_path / name
        shutil.copytree(killed, damaged)
        shutil.rmtree(damaged / "adapter", ignore_errors=True)
        if name == "pickle":
            (damaged / "adapter").mkdir()
        damage(damaged / "adapter")
        status, stderr = kdw_here(arguments(damaged), tmp_path)
        assert status == 2 and said in stderr and stderr.startswith("kdw: error: "), stderr
        assert json.loads((damaged / "status.json").read_text())["step"] == state["step"]
    for run_dir in (killed, clean):
        status, stderr = kdw_here(arguments(run_dir), tmp_path)
        assert status == 0, stderr
    for folder, name in (("model", "model.safetensors"), ("adapter", "adapter_model.safetensors")):
        one, other = (load_file(str(run / folder / name)) for run in (killed, clean))
        assert one.keys() == other.keys()
        assert all(torch.equal(one[k], other[k]) for k in one), folder


@pytest.mark.slow  # a LoRA run of MiniLM-L6: seconds
def test_a_lora_adapter_of_a_built_in_model_names_its_base_by_name(tiny_task_dir, tmp_path):
    """The adapter folder of a LoRA teacher on a built-in model names its base as the command
    did, not by the folder it was assembled in under this machine's user cache; it loads as a
    model and gives the run's merged model's logits."""
    from workbench.core.models import load_model

    run_dir = _train(tiny_task_dir, "minilm-l6", tmp_path / "run", adapt="lora", lora_rank=4)
    config = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "minilm-l6"
    adapter, merged = (load_model(str(run_dir / f)) for f in ("adapter", "model"))
    batch = merged.tokenizer(["good movie but sad story"], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(
            adapter.model(**batch).logits, merged.model(**batch).logits, rtol=0, atol=1e-5
        )
