"""A causal language model prompted as a classifier: its class scores against the model run
directly on each whole prompt, its maps on the text alone, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.tiny_families import decoder_tokenizer, save_causal_lm
from tests.tolerances import assert_close_to_scale
from workbench.analysis.attribution.gradients import ig_completeness
from workbench.core.config import DataConfig, PromptConfig
from workbench.core.data import TaskSpec, load_task
from workbench.core.errors import WorkbenchError
from workbench.core.models import forward, load_for_task, load_model, prompted_model
from workbench.core.prompted import PROMPT_FILE

TEMPLATE = "Tweet: {text}\nSentiment:"
# multi-token words in the tiny vocabulary: each scored as a whole
VERBALIZER = "negative=negative|bad,neutral=neutral,positive=positive|good"
TEXTS = ["what a lovely day", "no", "the train was late again and nobody said why"]
CHAT = (
    "{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory) -> Path:
    return save_causal_lm(tmp_path_factory.mktemp("causal-lm"))


@pytest.fixture(scope="module")
def tweets():
    return load_task(DataConfig(task="tweets", max_train_examples=60, max_eval_examples=30))


def _prompted(base: Path, tweets, **settings) -> str:
    config = PromptConfig(prompt=TEMPLATE, verbalizer=VERBALIZER, **settings)
    return prompted_model(str(base), config, tweets.spec, tweets.splits["train"], 13)


def _direct_scores(base: Path, texts: list[str], prefix: str, suffix: str) -> torch.Tensor:
    """Each class's log-probability of its words, the model run on each whole prompt alone
    (no batch, no padding), the prompt tokenized piece by piece as the prompted model does."""
    tokenizer = decoder_tokenizer()
    lm = AutoModelForCausalLM.from_pretrained(base).eval()
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = []
    for text in texts:
        start = ids(prefix) + ids(text) + ids(suffix)
        classes = []
        for words in (("negative", "bad"), ("neutral",), ("positive", "good")):
            scores = []
            for word in words:
                tokens = ids(" " + word)
                with torch.no_grad():
                    logits = lm(torch.tensor([start + tokens])).logits[0].log_softmax(-1)
                at = len(start) - 1
                scores.append(sum(logits[at + k, t] for k, t in enumerate(tokens)))
            classes.append(torch.logsumexp(torch.stack(scores), 0))
        rows.append(torch.stack(classes))
    return torch.stack(rows)


def test_class_scores_are_the_words_log_probabilities_of_each_whole_prompt(causal_lm, tweets):
    folder = _prompted(causal_lm, tweets)
    loaded = load_model(folder, tweets.spec)
    assert loaded.spec.label_names == ("negative", "neutral", "positive")
    batch = loaded.tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert batch["input_ids"].shape[1] == max(len(loaded.tokenizer(t)["input_ids"]) for t in TEXTS)
    with torch.no_grad():
        out = forward(loaded.model, batch, hidden_states=True, attentions=True)
    expected = _direct_scores(causal_lm, TEXTS, "Tweet: ", "\nSentiment:")
    assert any(len(decoder_tokenizer()(" " + w)["input_ids"]) > 1 for w in ("bad", "negative"))
    assert_close_to_scale(out.logits, expected)
    # hidden states and attention maps at the text's positions alone
    length = batch["input_ids"].shape[1]
    assert [tuple(h.shape) for h in out.hidden_states] == [(3, length, 32)] * 3
    assert tuple(out.attentions[0].shape) == (3, 2, length, length)

    # calibration: the content-free text's class probabilities divided out
    calibrated = load_model(_prompted(causal_lm, tweets, calibrate=True), tweets.spec)
    with torch.no_grad():
        scores = forward(calibrated.model, batch).logits
    free = _direct_scores(causal_lm, ["N/A"], "Tweet: ", "\nSentiment:")[0].log_softmax(-1)
    # a difference of log-probabilities computed from scores of ``expected``'s magnitude
    assert_close_to_scale(scores, expected.log_softmax(-1) - free, operands=(expected,))
    assert calibrated.model.prompt_digest.tolist() != loaded.model.prompt_digest.tolist()


def test_shots_and_the_chat_template_frame_the_text(causal_lm, tweets, tmp_path):
    chat = tmp_path / "chat-lm"
    chat.mkdir()
    for item in causal_lm.iterdir():
        (chat / item.name).write_bytes(item.read_bytes())
    settings = json.loads((chat / "tokenizer_config.json").read_text())
    (chat / "tokenizer_config.json").write_text(json.dumps(settings | {"chat_template": CHAT}))
    folder = Path(_prompted(chat, tweets, shots=1))
    record = json.loads((folder / PROMPT_FILE).read_text())
    assert sorted(s["label"] for s in record["shots"]) == ["negative", "neutral", "positive"]
    train = dict(zip(tweets.splits["train"].texts, tweets.splits["train"].labels, strict=True))
    names = tweets.spec.label_names
    assert all(names[train[s["text"]]] == s["label"] for s in record["shots"])
    loaded = load_model(str(folder), tweets.spec)
    tokenizer = loaded.tokenizer
    turns = "".join(
        f"<|endoftext|>user\n{TEMPLATE.replace('{text}', s['text'])}\n"
        f"<|endoftext|>assistant\n{record['verbalizer'][s['label']][0]}\n"
        for s in record["shots"]
    )
    before = turns + "<|endoftext|>user\n" + TEMPLATE.split("{text}")[0]
    prefix = tokenizer(before, add_special_tokens=False)["input_ids"]
    suffix = tokenizer("\nSentiment:\n<|endoftext|>assistant\n", add_special_tokens=False)
    assert loaded.model.prefix_ids.tolist() == prefix
    assert loaded.model.suffix_ids.tolist() == suffix["input_ids"]

    # {answer}: what follows it opens the assistant's turn, the words after it and a space
    opened = PromptConfig(prompt="{text}{answer}It is", verbalizer=VERBALIZER)
    folder = prompted_model(str(chat), opened, tweets.spec, None, 13)
    model = load_model(folder, tweets.spec).model
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert model.suffix_ids.tolist() == ids("\n<|endoftext|>assistant\nIt is")
    assert model.words[2] == [ids(" positive"), ids(" good")]


def test_integrated_gradients_attribute_to_the_text_alone(causal_lm, tweets):
    """The template is fixed on the path: the map has one row per text token, and its sum
    approaches the change of the explained probability as the steps grow."""
    loaded = load_model(_prompted(causal_lm, tweets), tweets.spec)
    batch = loaded.tokenizer(TEXTS[:1], return_tensors="pt")
    gaps = []
    for steps in (1, 256):
        attributed, change = ig_completeness(
            loaded.model, batch["input_ids"], batch["attention_mask"], target=0, steps=steps
        )
        gaps.append(float((attributed - change).abs() / change.abs()))
    assert gaps[1] < 0.05 and gaps[1] < gaps[0]


def test_a_prompt_that_cannot_classify_is_one_line(causal_lm, tweets, tiny_model_dir):
    def refused(match: str, base=causal_lm, **settings) -> None:
        options = {"prompt": TEMPLATE, "verbalizer": VERBALIZER} | settings
        with pytest.raises(WorkbenchError, match=match):
            prompted_model(
                str(base), PromptConfig(**options), tweets.spec, tweets.splits["train"], 13
            )

    refused("write \\{text\\} once", prompt="Sentiment:")
    refused("comes once, after", prompt="{answer}{text}")
    refused("names no word for the classes neutral", verbalizer="negative=bad,positive=good")
    refused("which are not classes of the task", verbalizer=VERBALIZER + ",angry=mad")
    refused("the training split has", shots=100)
    refused("leaving no room for a text", prompt="word " * 1100 + "{text}")
    refused("is BertModel, not one", base=tiny_model_dir)
    pairs = TaskSpec("pairs", ("negative", "neutral", "positive"), ("accuracy",), pair=True)
    with pytest.raises(WorkbenchError, match="pairs is a task of text pairs: fine-tune"):
        prompted_model(
            str(causal_lm), PromptConfig(prompt=TEMPLATE, verbalizer=VERBALIZER), pairs, None, 1
        )
    with pytest.raises(WorkbenchError, match="write CLASS=WORD pairs"):
        PromptConfig(prompt=TEMPLATE, verbalizer="negative")
    with pytest.raises(WorkbenchError, match="--prompt needs --verbalizer"):
        assert PromptConfig(prompt=TEMPLATE).given


def test_a_changed_base_model_is_refused(causal_lm, tweets, tmp_path):
    base = tmp_path / "lm"
    base.mkdir()
    for item in causal_lm.iterdir():
        (base / item.name).write_bytes(item.read_bytes())
    folder = _prompted(base, tweets)
    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    model.save_pretrained(base)
    with pytest.raises(WorkbenchError, match="has changed since the prompt was written"):
        load_for_task(folder, DataConfig(task="tweets", max_train_examples=60))
