"""Bring your own classifier: encoders and decoder classifiers of today's common architectures
read through one adaptor whose parts are found by what they are, their classes matched to a
task's by name, distilled, evaluated and exported — on tiny random models of each architecture
with a tokenizer of its kind (tests/tiny_families.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertConfig

from kd.cli import main
from kd.methods.layer_map import select_layers
from kd.methods.students import cut_student
from tests.conftest import assert_same_weights, kill_at_step
from tests.tiny_families import DECODER_TYPES, FAMILY_TYPES, family_tokenizer, save_family_model
from workbench.core.data import TaskSpec
from workbench.core.errors import WorkbenchError
from workbench.core.models import (
    class_order,
    embed,
    encoder_layers,
    forward,
    input_positions,
    load_model,
)
from workbench.core.parts import head_positions, parts_of

MODEL_LABELS = ["Positive", "neutral", "NEGATIVE"]  # the model's output order and spelling
TASK = TaskSpec("sentiment", ("negative", "neutral", "positive"), ("accuracy", "macro_f1"))
FAST = ["--epochs", "1", "--max-length", "24", "--batch-size", "16", "--eval-batch-size", "32"]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {t: save_family_model(t, root / t, MODEL_LABELS) for t in FAMILY_TYPES}


def _batch(loaded, texts=("what a great flight", "bad & awful, never again!")):
    return dict(loaded.tokenizer(list(texts), padding=True, return_tensors="pt"))


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
@pytest.mark.slow
def test_the_adaptor_reads_every_family(model_type, family_dirs):
    """The embedding output is the model's own first hidden state (ELECTRA's after its
    projection), swapping it back in changes nothing, and a cut student keeps the embeddings
    and exactly the chosen layers."""
    loaded = load_model(str(family_dirs[model_type]), TASK)
    model, batch = loaded.model, _batch(loaded)
    out = forward(model, batch, hidden_states=True)
    embedded = embed(model, batch)
    torch.testing.assert_close(embedded, out.hidden_states[0])
    torch.testing.assert_close(forward(model, batch, embedding_output=embedded).logits, out.logits)
    assert len(out.hidden_states) - 1 == 4
    if parts_of(model).layers is None:  # ALBERT: one shared layer group, applied 4 times
        with pytest.raises(WorkbenchError, match="cannot find a list of distinct layers"):
            cut_student(model, [1, 3])
        return
    assert len(encoder_layers(model)) == 4
    student = cut_student(model, select_layers(4, 2, "skip")).eval()
    assert len(encoder_layers(student)) == 2
    torch.testing.assert_close(
        forward(student, batch, hidden_states=True).hidden_states[0], embedded
    )
    for theirs, ours in zip([1, 3], encoder_layers(student), strict=True):
        expected = encoder_layers(model)[theirs].state_dict()
        for name, value in ours.state_dict().items():
            torch.testing.assert_close(expected[name], value, msg=name)


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_the_head_found_gives_the_logits_from_the_position_it_reads(model_type, family_dirs):
    """The head output found is the linear map whose output is the logits: for an encoder
    directly, for a decoder at each text's last real token (right padding here)."""
    loaded = load_model(str(family_dirs[model_type]), TASK)
    batch = _batch(loaded)
    seen = []
    head = loaded.model.get_submodule(parts_of(loaded.model).head)
    handle = head.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        logits = forward(loaded.model, batch).logits
    finally:
        handle.remove()
    positions = head_positions(loaded.model, batch)
    if model_type in DECODER_TYPES:
        torch.testing.assert_close(positions, batch["attention_mask"].sum(1) - 1)
        torch.testing.assert_close(seen[0][torch.arange(2), positions], logits)
    else:
        assert positions.tolist() == [0, 0]
        torch.testing.assert_close(seen[0], logits)


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_a_decoder_pads_with_its_configs_pad_token(model_type, family_dirs, tmp_path):
    """A decoder whose config's pad_token_id (7) is not its tokenizer's pad token (0) is padded
    with the config's, said once: each text's logits in a padded batch are its logits alone,
    which padding with the tokenizer's own id does not give. A pad id outside the tokenizer's
    table is one line (GPT-2's; Llama's embeddings refuse it as they are built)."""
    folder = shutil.copytree(family_dirs[model_type], tmp_path / model_type)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "pad_token_id": 7}))
    notes = []
    loaded = load_model(str(folder), TASK, notify=notes.append)
    assert notes == [
        f"{folder.name}: its tokenizer pads with id 0, its config's pad_token_id is 7 (the token "
        "its head reads past): batches are padded with 7"
    ]
    texts = ("what a great flight", "bad & awful, never again! so late")
    batch = _batch(loaded, texts)
    assert (batch["input_ids"][batch["attention_mask"] == 0] == 7).all()
    alone = torch.cat([forward(loaded.model, _batch(loaded, [t])).logits for t in texts])
    torch.testing.assert_close(forward(loaded.model, batch).logits, alone)
    own = {**batch, "input_ids": batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 0)}
    assert not torch.allclose(forward(loaded.model, own).logits, alone, atol=1e-4)
    if model_type == "gpt2":
        (folder / "config.json").write_text(json.dumps({**config, "pad_token_id": 10**6}))
        with pytest.raises(
            WorkbenchError,
            match="pad_token_id is 1000000, not an id of the 600 rows of its embeddings",
        ):
            load_model(str(folder), TASK)


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_classes_are_matched_by_name_and_the_head_reordered(model_type, family_dirs):
    folder = family_dirs[model_type]
    raw = AutoModelForSequenceClassification.from_pretrained(folder, attn_implementation="eager")
    loaded = load_model(str(folder), TASK)
    batch = _batch(loaded)
    with torch.no_grad():
        original = raw.eval()(**batch).logits
    # task order negative, neutral, positive = the model's outputs 2, 1, 0
    torch.testing.assert_close(forward(loaded.model, batch).logits, original[:, [2, 1, 0]])
    assert loaded.model.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    assert loaded.origin == "model folder" and loaded.run is None


def test_roberta_pad_baseline_keeps_the_input_positions(family_dirs):
    """RoBERTa counts positions over real tokens: an all-[PAD] baseline gets the input's
    position ids, so that its [PAD]s sit where the input's tokens are."""
    loaded = load_model(str(family_dirs["roberta"]), TASK)
    batch = _batch(loaded)
    positions = input_positions(loaded.model, batch)
    pad = loaded.tokenizer.pad_token_id
    mask = batch["attention_mask"]
    expected = (mask.cumsum(1) * mask) + pad  # independent: RoBERTa's rule
    torch.testing.assert_close(positions, expected)
    assert input_positions(load_model(str(family_dirs["bert"]), TASK).model, batch) is None


def test_class_order_rules():
    order, note = class_order(["LABEL_0", "LABEL_1"], ["neg", "pos"], {}, "m")
    assert order == [0, 1] and "by position" in note
    assert class_order(["POS", "NEG"], ["neg", "pos"], {}, "m") == ([1, 0], None)
    assert class_order(["yes", "no"], ["neg", "pos"], {"neg": "no", "pos": "YES"}, "m") == (
        [1, 0],
        None,
    )
    with pytest.raises(WorkbenchError) as error:
        class_order(["a", "b", "c"], ["neg", "pos"], {}, "m")
    assert str(error.value) == (
        "m has the classes ['a', 'b', 'c'], the task ['neg', 'pos']: name the correspondence "
        "with --label-map neg=a,pos=b (task class=model label)"
    )
    with pytest.raises(WorkbenchError, match=r"--label-map neg=yes"):
        class_order(["yes", "no"], ["neg", "pos"], {}, "m")
    with pytest.raises(WorkbenchError, match="not classes of the task"):
        class_order(["yes", "no"], ["neg", "pos"], {"maybe": "yes"}, "m")


def _task_csv(folder: Path, sentences) -> Path:
    folder.mkdir(parents=True)
    frame = sentences
    frame.iloc[:240].to_csv(folder / "train.csv", index=False)
    frame.iloc[240:300].to_csv(folder / "dev.csv", index=False)
    frame.iloc[300:].to_csv(folder / "test.csv", index=False)
    return folder


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    from tests.conftest import make_sentences

    return _task_csv(tmp_path_factory.mktemp("task") / "task", make_sentences(400))


METHODS = ("kd", "pkd-skip", "ckd", "adkd", "gkd")


@pytest.mark.slow
@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_distil_evaluate_and_export_a_classifier_of_each_family(
    model_type, family_dirs, task_dir, tmp_path, capsys
):
    """A classifier the workbench never trained is the teacher: each method distils a cut
    student from it, ``kdw evaluate`` scores teacher and students (the students' loyalty
    measured against that folder), and a student exports to a checkpoint that answers like
    the run's model."""
    teacher = str(family_dirs[model_type])
    runs = []
    for preset in METHODS:
        run = tmp_path / preset
        command = ["distill", "--run-dir", str(run), "--teacher", teacher, "--task", str(task_dir)]
        init = ["--init", "random"] if model_type == "albert" else []  # no layers to cut
        init += ["--max-train-examples", "48"]  # 3 steps: each method runs, none need learn
        assert main([*command, "--preset", preset, "--num-layers", "2", *init, *FAST]) == 0, preset
        runs.append(str(run))
        record = json.loads((run / "run.json").read_text())
        assert record["configs"]["student"]["teacher"] == teacher
    capsys.readouterr()
    table = tmp_path / "rows.json"
    assert main(["evaluate", teacher, *runs, "--task", str(task_dir), "--json", str(table)]) == 0
    rows = json.loads(table.read_text())
    assert [row["kind"] for row in rows] == ["model", *(["student"] * len(METHODS))]
    results = json.loads((tmp_path / "kd" / "results.json").read_text())["test"]
    assert rows[1]["accuracy"] == pytest.approx(results["accuracy"])
    assert rows[1]["label_loyalty"] == pytest.approx(results["label_loyalty"])
    exported = tmp_path / "exported"
    assert main(["export-model", runs[0], "--out", str(exported)]) == 0
    again = load_model(str(exported), TASK)
    kd_run = load_model(runs[0])
    batch = _batch(kd_run)
    torch.testing.assert_close(
        forward(again.model, batch).logits, forward(kd_run.model, batch).logits
    )


# slow: a kdw process killed mid-run, then the run resumed and a clean one distilled
@pytest.mark.slow
def test_a_killed_distillation_from_a_model_folder_resumes_to_the_same_student(
    family_dirs, task_dir, tmp_path
):
    """A RoBERTa teacher folder: a run stopped after its first checkpoint and resumed ends
    with the weights of an uninterrupted one."""
    teacher = str(family_dirs["roberta"])
    common = ["--teacher", teacher, "--task", str(task_dir), "--preset", "kd", "--num-layers", "2"]
    options = [*common, *FAST, "--epochs", "4", "--checkpoint-every", "5", "--threads", "1"]
    killed = tmp_path / "killed"
    state = kill_at_step(["distill", "--run-dir", str(killed), *options], killed, 12)
    assert state["step"] < state["total"], state
    assert main(["distill", "--run-dir", str(killed), *options]) == 0
    assert main(["distill", "--run-dir", str(tmp_path / "clean"), *options]) == 0
    assert_same_weights(
        load_model(str(killed)).model.state_dict(),
        load_model(str(tmp_path / "clean")).model.state_dict(),
    )


# slow: five distillations, each an epoch of the 240 train texts (over 1000 words to align)
@pytest.mark.slow
@pytest.mark.parametrize("teacher_type", ["roberta", "qwen2"])
def test_a_student_of_another_tokenizer_learns_on_words(
    teacher_type, family_dirs, task_dir, tmp_path
):
    """A byte-level BPE teacher (RoBERTa, or a Qwen2 decoder classifier) and a BERT student
    reading MiniLM's WordPiece tokens: vanilla KD and PKD-skip compare whole examples, AD-KD,
    CKD and GKD the words both tokenisations share (counted in the manifest); GKD's student
    keeps its own embeddings."""
    teacher, student = str(family_dirs[teacher_type]), str(family_dirs["bert"])
    base = ["--teacher", teacher, "--task", str(task_dir), "--init", "pretrained"]
    base += ["--pretrained", student, *FAST]
    for preset in ("kd", "pkd-skip", "adkd", "ckd", "gkd"):
        assert (
            main(["distill", "--run-dir", str(tmp_path / preset), *base, "--preset", preset]) == 0
        )
        results = json.loads((tmp_path / preset / "results.json").read_text())
        assert 0 <= results["test"]["label_loyalty"] <= 1
        manifest = json.loads((tmp_path / preset / "manifest.json").read_text())
        words = manifest.get("word_alignment")
        if preset in ("adkd", "ckd", "gkd"):
            assert words["train"]["words"] > 1000 and 0 <= words["train"]["left_out"] < 200
        else:
            assert words is None
    record = json.loads((tmp_path / "gkd" / "run.json").read_text())["resolved"]["objective"]
    assert record["student_embeddings"] == "own"


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_bad_teachers_are_one_line_and_write_nothing(
    family_dirs, task_dir, tmp_path, capsys, monkeypatch
):
    no_tokenizer = tmp_path / "no-tokenizer"
    shutil.copytree(family_dirs["bert"], no_tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (no_tokenizer / name).unlink(missing_ok=True)
    from transformers import BertForTokenClassification, BertModel

    config = BertConfig(
        vocab_size=len(family_tokenizer("bert")),
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=8,
    )
    token_classifier, base_model = tmp_path / "token-classifier", tmp_path / "base-model"
    for build, folder in ((BertForTokenClassification, token_classifier), (BertModel, base_model)):
        build(config).save_pretrained(folder)
        family_tokenizer("bert").save_pretrained(folder)
    other_classes = save_family_model("bert", tmp_path / "two-classes", ["yes", "no"])
    no_pad = save_family_model("gpt2", tmp_path / "no-pad", MODEL_LABELS)
    saved = json.loads((no_pad / "config.json").read_text())
    (no_pad / "config.json").write_text(json.dumps({**saved, "pad_token_id": None}))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        path = no_pad / name
        if path.exists():
            path.write_text(
                path.read_text().replace('"pad_token": "<|endoftext|>"', '"pad_token": null')
            )
    cases = {
        str(no_tokenizer): "has no tokenizer",
        str(
            token_classifier
        ): "is a BertForTokenClassification: the workbench distils and explains "
        "sequence classifiers",
        str(other_classes): "has the classes ['yes', 'no'], the task ['negative', 'neutral', "
        "'positive']: name the correspondence with --label-map",
        "no-such-org/no-such-model": "cannot load the config of 'no-such-org/no-such-model': "
        "the hub is unreachable (HF_HUB_OFFLINE is set)",
        str(base_model): "(BertModel) has no sequence-classification head: fine-tune it first",
        str(no_pad): "is a decoder classifier without pad_token_id: its head reads each text's "
        "last token that is not padding",
        str(family_dirs["albert"]): "AlbertForSequenceClassification (albert): the workbench "
        "cannot find a list of distinct layers, which a student cut from the teacher (--init "
        "cut) needs",
    }
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    capsys.readouterr()
    for teacher, expected in cases.items():
        run = tmp_path / "run"
        assert (
            main(["distill", "--run-dir", str(run), "--teacher", teacher, "--task", str(task_dir)])
            == 2
        )
        assert expected in _error(capsys)
        assert not run.exists()


def test_a_plain_checkpoint_folder_teaches_exactly_as_its_run(task_dir, tiny_model_dir, tmp_path):
    """A BERT encoder fine-tuned as a teacher run, its model saved as a plain
    ``BertForSequenceClassification`` folder (no run files): a student distilled from the
    folder equals, weight for weight, the one distilled from the run."""
    small = ["--max-length", "24", "--max-train-examples", "60", "--batch-size", "16"]
    teacher_run = tmp_path / "teacher"
    command = ["train-teacher", "--run-dir", str(teacher_run), "--task", str(task_dir)]
    assert main([*command, "--model", str(tiny_model_dir), "--epochs", "1", *small]) == 0
    folder = tmp_path / "plain"
    shutil.copytree(teacher_run / "model", folder, ignore=shutil.ignore_patterns("README.md"))
    assert json.loads((folder / "config.json").read_text())["architectures"] == [
        "BertForSequenceClassification"
    ]
    students = {}
    for name, teacher in (("from-run", teacher_run), ("from-folder", folder)):
        run = tmp_path / name
        command = ["distill", "--run-dir", str(run), "--teacher", str(teacher)]
        assert main([*command, "--task", str(task_dir), "--num-layers", "2", *small]) == 0
        students[name] = load_model(str(run)).model.state_dict()
    assert students["from-run"].keys() == students["from-folder"].keys()
    for key, value in students["from-run"].items():
        assert torch.equal(value, students["from-folder"][key]), key


def test_train_teacher_keeps_a_classifiers_head_and_matches_its_classes(
    family_dirs, task_dir, tmp_path, capsys
):
    """``train-teacher --model`` of a classifier: its head is kept with its classes matched to
    the task's (a label set of other names is refused until --label-map names them)."""
    from workbench.core.models import load_classifier

    folder = str(family_dirs["bert"])
    raw = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    loaded = load_classifier(folder, TASK).eval()
    batch = _batch(load_model(folder, TASK))
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, raw(**batch).logits[:, [2, 1, 0]])
    renamed = save_family_model("bert", tmp_path / "renamed", ["POS", "NEU", "NEG"])
    run = tmp_path / "teacher"
    command = ["train-teacher", "--run-dir", str(run), "--task", str(task_dir)]
    command += ["--model", str(renamed), *FAST, "--max-train-examples", "30"]
    capsys.readouterr()
    assert main(command) == 2
    assert "--label-map negative=POS,neutral=NEU,positive=NEG" in _error(capsys)
    assert not run.exists()
    assert main([*command, "--label-map", "negative=NEG,neutral=NEU,positive=POS"]) == 0
    recorded = json.loads((run / "run.json").read_text())["configs"]["teacher"]
    assert recorded["label_map"] == "negative=NEG,neutral=NEU,positive=POS"


@pytest.mark.slow
def test_a_student_of_another_family_with_the_same_tokenizer(
    family_dirs, task_dir, tmp_path, capsys
):
    """A BERT teacher and a DistilBERT student reading the same WordPiece tokens: every method
    that compares tokens works across the families; GKD, which copies the teacher's embeddings
    into the student, is refused in one line when the embedding stages differ."""
    base = ["--teacher", str(family_dirs["bert"]), "--task", str(task_dir), "--init"]
    base += ["pretrained", "--pretrained", str(family_dirs["distilbert"]), *FAST]
    for preset in ("adkd", "ckd"):
        assert (
            main(["distill", "--run-dir", str(tmp_path / preset), *base, "--preset", preset]) == 0
        )
    capsys.readouterr()
    assert main(["distill", "--run-dir", str(tmp_path / "gkd"), *base, "--preset", "gkd"]) == 2
    assert "the student's (distilbert) differ from the teacher's (bert)" in _error(capsys)
    assert not (tmp_path / "gkd").exists()
