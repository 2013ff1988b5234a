"""A causal language model read as a classifier through a prompt: an instruction-tuned LLM
teaches without being fine-tuned.

A prompt template (``{text}`` where the text goes; the tokenizer's chat template around it where
the model has one) and a verbalizer (a few answer words per class) make the model a classifier
(:class:`PromptedClassifier`): a class's score is the log-probability, at the answer position,
of its words (a word of several tokens scored as a whole, the class the log-sum-exp of its
words). The model reads the text's tokens as its input: the template's and the shots' tokens are
embedded inside the forward pass, off the embedding module's hooks, so Integrated Gradients,
saliency and the attribution terms see the text alone, the prompt held fixed on the path.

A prompted teacher is a folder (``prompt.json``: the template, verbalizer, shots, calibration
and the base model, pinned by digest), built by :func:`prompt_record` from a
:class:`~workbench.core.config.PromptConfig` and loaded by
:func:`workbench.core.models.load_model` like any model.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.modeling_outputs import SequenceClassifierOutput

from workbench.core.config import CONTENT_FREE, PromptConfig, parse_verbalizer
from workbench.core.config import PROMPT_ANSWER as ANSWER
from workbench.core.config import PROMPT_TEXT as TEXT
from workbench.core.errors import WorkbenchError
from workbench.core.names import PROMPT_FILE as PROMPT_FILE  # public here too
from workbench.core.parts import LAST, Parts
from workbench.core.records import Record

_MARK = "\u27e6kdw-text\u27e7"  # where the text goes in the rendered prompt
MIN_TEXT_TOKENS = 4
PROMPTED = "PromptedForSequenceClassification"  # a prompted classifier's config names it so


class Shot(Record):
    text: str
    label: str


class PromptRecord(Record):
    """``prompt.json``: the base model (a built-in name, a folder or a hub id) and the digest
    of its files, the template, the verbalizer in class order, the shots, calibration."""

    base: str
    base_digest: str
    template: str
    verbalizer: dict[str, list[str]]
    shots: list[Shot] = Field(default_factory=list)
    calibrate: bool = False


def prompt_record(
    base: str,
    base_digest: str,
    config: PromptConfig,
    label_names: Sequence[str],
    train: tuple[Sequence[str], Sequence[int]] | None,
    seed: int,
) -> PromptRecord:
    """The prompted classifier ``config`` asks of ``base``, its classes ``label_names`` (each
    named by the verbalizer), its shots drawn from ``train`` (texts, label indices) with
    ``seed``; a template without one ``{text}`` or a class without words is a one-line error."""
    if config.prompt.count(TEXT) != 1:
        raise WorkbenchError(f"--prompt {config.prompt!r}: write {TEXT} once, where the text goes")
    if config.prompt.count(ANSWER) > 1 or ANSWER in config.prompt.partition(TEXT)[0]:
        raise WorkbenchError(
            f"--prompt {config.prompt!r}: {ANSWER}, where the model's answer starts, comes once, "
            f"after {TEXT}"
        )
    verbalizer = parse_verbalizer(config.verbalizer)
    if missing := [name for name in label_names if name not in verbalizer]:
        raise WorkbenchError(
            f"--verbalizer names no word for the classes {', '.join(missing)}: give each of "
            f"{', '.join(label_names)} its words"
        )
    if unknown := sorted(set(verbalizer) - set(label_names)):
        raise WorkbenchError(
            f"--verbalizer names {', '.join(unknown)}, which are not classes of the task "
            f"({', '.join(label_names)})"
        )
    shots: list[Shot] = []
    if config.shots:
        if train is None:
            raise WorkbenchError("--shots draws labelled examples of the task: name one (--task)")
        texts, labels = train
        chooser = random.Random(seed)
        for index, name in enumerate(label_names):
            pool = [t for t, label in zip(texts, labels, strict=True) if label == index]
            if len(pool) < config.shots:
                raise WorkbenchError(
                    f"--shots {config.shots}: the training split has {len(pool)} examples of {name}"
                )
            shots += [Shot(text=t, label=name) for t in chooser.sample(pool, config.shots)]
        chooser.shuffle(shots)
    return PromptRecord(
        base=base,
        base_digest=base_digest,
        template=config.prompt,
        verbalizer={name: list(verbalizer[name]) for name in label_names},
        shots=shots,
        calibrate=config.calibrate,
    )


def record_digest(record: PromptRecord) -> str:
    """A digest of everything the record says (the base's digest included)."""
    return hashlib.sha256(json.dumps(record.plain(), sort_keys=True).encode()).hexdigest()


def _then(before: str, word: str) -> str:
    """``word`` after ``before``, a space between them unless ``before`` is empty or ends in
    one (the answer's words are scored the same way)."""
    return before + (" " if before and not before[-1].isspace() else "") + word


def _rendered(tokenizer: PreTrainedTokenizerBase, record: PromptRecord) -> tuple[str, str, bool]:
    """The prompt's text before and after the text, and whether a chat template made it: the
    question (the template up to ``{answer}``) as the user's turn, the answer's start (what
    follows ``{answer}``) opening the assistant's; the shots as earlier turns (a chat) or earlier
    paragraphs, each answered by its class's first word."""
    question, _, opening = record.template.partition(ANSWER)
    shots = [(question.replace(TEXT, s.text), record.verbalizer[s.label][0]) for s in record.shots]
    asked = question.replace(TEXT, _MARK)
    if tokenizer.chat_template:
        turns = [
            turn
            for asking, word in shots
            for turn in (
                {"role": "user", "content": asking},
                {"role": "assistant", "content": _then(opening, word)},
            )
        ]
        turns.append({"role": "user", "content": asked})
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        text += opening
        chat = True
    else:
        text = "".join(f"{_then(asking + opening, word)}\n\n" for asking, word in shots)
        text += asked + opening
        chat = False
    before, _, after = text.partition(_MARK)
    return before, after, chat


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def plain_text_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    """Make ``tokenizer`` add no special token around a text (Llama's begin-of-text): the
    prompt's own tokens frame the text."""
    if tokenizer("a")["input_ids"] == _ids(tokenizer, "a"):
        return
    from tokenizers import processors

    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A", pair="$A $B"
    )


def _word(tokenizer: PreTrainedTokenizerBase, word: str, name: str) -> list[int]:
    ids = _ids(tokenizer, word)
    if not ids or tokenizer.unk_token_id in ids:
        raise WorkbenchError(
            f"--verbalizer: the tokenizer cannot spell {word.strip()!r} (the class {name}): "
            "choose a word of its vocabulary"
        )
    return ids


@dataclass(frozen=True)
class PromptTokens:
    """The prompt as token ids: before the text, after it, each class's words (each a list of
    ids), and ``room``, the tokens of text the model's context leaves."""

    prefix: list[int]
    suffix: list[int]
    words: list[list[list[int]]]
    room: int

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase, record: PromptRecord, config) -> PromptTokens:
        """``record`` tokenized for a language model of ``config`` (its position table is its
        context); a word the tokenizer cannot spell, or a prompt that leaves no room for a
        text, is a one-line error."""
        context = getattr(config, "max_position_embeddings", 1 << 20)
        before, after, chat = _rendered(tokenizer, record)
        prefix = tokenizer(before, add_special_tokens=not chat)["input_ids"] if before else []
        if prefix and prefix[-1] == tokenizer.eos_token_id and not chat:
            prefix = prefix[:-1]  # a tokenizer that closes every text
        space = " " if after and not after[-1].isspace() else ""  # as _then joins them
        words = [
            [_word(tokenizer, space + word, name) for word in choices]
            for name, choices in record.verbalizer.items()
        ]
        suffix = _ids(tokenizer, after)
        longest = max(len(ids) for choices in words for ids in choices)
        room = context - len(prefix) - len(suffix) - longest + 1
        if room < MIN_TEXT_TOKENS:
            raise WorkbenchError(
                f"the prompt takes {context - room} of the {context} tokens the model reads, "
                "leaving no room for a text: shorten the template or use fewer --shots"
            )
        return cls(prefix, suffix, words, room)


class PromptedClassifier(nn.Module):
    """``lm`` (a causal language model) as a classifier of the classes of ``record``.

    Input: a batch of the text's tokens alone, ``input_ids`` and ``attention_mask`` ``[B, L]``
    (padded on the right, no special token around the text). Each row becomes
    ``prefix · text · suffix`` (padding after it), embedded and run; the class scores ``[B, C]``
    are the log-probabilities of the class words at the last prompt position, calibrated
    (minus the content-free text's class log-probabilities, both normalised over the classes)
    when the record asks. Hidden states and attention maps come back at the text's positions:
    ``[B, L, d]`` and ``[B, heads, L, L]``.
    """

    def __init__(
        self, lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, record: PromptRecord
    ) -> None:
        super().__init__()
        # the decoder and the output layer under the names a sequence classifier of the family
        # gives its decoder (``model``, ``transformer``): a teacher cache's embedding stage
        # loads into that classifier
        self.prefix = lm.base_model_prefix
        setattr(self, self.prefix, lm.base_model)
        self.lm_head = lm.get_output_embeddings()
        pieces = PromptTokens.of(tokenizer, record, lm.config)
        self.words = pieces.words
        self.register_buffer("prefix_ids", torch.tensor(pieces.prefix, dtype=torch.long))
        self.register_buffer("suffix_ids", torch.tensor(pieces.suffix, dtype=torch.long))
        digest = bytes.fromhex(record_digest(record))
        self.register_buffer("prompt_digest", torch.tensor(list(digest), dtype=torch.uint8))
        labels = list(record.verbalizer)
        self.config = copy.deepcopy(lm.config)
        self.config.update(
            {
                "architectures": [PROMPTED],
                "num_labels": len(labels),
                "id2label": dict(enumerate(labels)),
                "label2id": {name: i for i, name in enumerate(labels)},
                "max_position_embeddings": pieces.room,
                "pad_token_id": tokenizer.pad_token_id,
                "problem_type": "single_label_classification",
            }
        )
        embeddings = self.get_input_embeddings()
        site = next(n for n, m in self.named_modules() if m is embeddings)
        self.workbench_parts = Parts(
            kind=f"prompted {lm.config.model_type}",
            stage=(site,),
            site=site,
            reads=LAST,
            framed=True,
        )
        self.register_buffer("content_free", torch.zeros(len(labels)))
        self.calibrate = record.calibrate
        if record.calibrate:
            free = torch.tensor([_ids(tokenizer, CONTENT_FREE)])
            with torch.no_grad():
                scores = self._scores(free, torch.ones_like(free))[0]
            self.content_free = scores.log_softmax(-1)[0]

    def reorder(self, order: Sequence[int]) -> None:
        """Permute the classes so that class ``c`` is the one at ``order[c]``."""
        self.words = [self.words[i] for i in order]
        self.content_free = self.content_free[list(order)]

    def get_input_embeddings(self) -> nn.Module:
        return self.decoder.get_input_embeddings()

    @property
    def decoder(self) -> PreTrainedModel:
        """The language model's decoder (its ``base_model``)."""
        return getattr(self, self.prefix)

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.dtype

    @property
    def device(self) -> torch.device:
        return self.decoder.device

    def _run(self, text: Tensor, lengths: Tensor, suffix: Tensor, states: bool, maps: bool):
        """The base model on ``prefix · text · suffix`` per row: its output and the index
        ``[B]`` of each row's last suffix position."""
        batch, width, size = text.shape
        weight = self.get_input_embeddings().weight
        pieces = torch.cat(
            [
                F.embedding(self.prefix_ids, weight).to(text.dtype).expand(batch, -1, -1),
                text,
                F.embedding(suffix, weight).to(text.dtype).expand(batch, -1, -1),
            ],
            1,
        )
        before, after = len(self.prefix_ids), len(suffix)
        at = torch.arange(before + width + after, device=text.device)[None]
        n = lengths[:, None]
        index = torch.where(
            at < before + n, at, torch.where(at < before + n + after, at + width - n, at)
        )
        composed = pieces.gather(1, index[..., None].expand(-1, -1, size))
        out = self.decoder(
            inputs_embeds=composed,
            attention_mask=(at < before + n + after).long(),
            output_hidden_states=states,
            output_attentions=maps,
        )
        return out, before + lengths + after - 1

    def _log_probs(self, hidden: Tensor) -> Tensor:
        """The next-token log-probabilities ``[B, V]`` of final states ``[B, d]``."""
        logits = self.lm_head(hidden).float()
        if cap := getattr(self.config, "final_logit_softcapping", None):
            logits = torch.tanh(logits / cap) * cap
        return logits.log_softmax(-1)

    def _scores(self, input_ids: Tensor, attention_mask: Tensor, states=False, maps=False):
        """The classes' raw scores ``[B, C]`` (log-probabilities of their words) of the texts
        ``input_ids`` ``[B, L]``, and the decoder's output on the prompts."""
        text = self.get_input_embeddings()(input_ids)  # the hooks' tensor: the text alone
        lengths = attention_mask.sum(1).long()
        rows = torch.arange(len(input_ids), device=input_ids.device)
        out, end = self._run(text, lengths, self.suffix_ids, states, maps)
        first = self._log_probs(out.last_hidden_state[rows, end])
        classes = []
        for words in self.words:
            scores = []
            for ids in words:
                if len(ids) == 1:
                    scores.append(first[:, ids[0]])
                    continue
                tail = torch.tensor(ids[:-1], device=input_ids.device)
                longer, _ = self._run(
                    text, lengths, torch.cat([self.suffix_ids, tail]), False, False
                )
                steps = [
                    self._log_probs(longer.last_hidden_state[rows, end + k])[:, token]
                    for k, token in enumerate(ids)
                ]
                scores.append(torch.stack(steps).sum(0))
            classes.append(torch.logsumexp(torch.stack(scores), 0))
        return torch.stack(classes, -1), out

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        **_: object,
    ) -> SequenceClassifierOutput:
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        scores, out = self._scores(input_ids, mask, output_hidden_states, output_attentions)
        if self.calibrate:
            scores = scores.log_softmax(-1) - self.content_free
        start, width = len(self.prefix_ids), input_ids.shape[1]
        text = slice(start, start + width)
        return SequenceClassifierOutput(
            logits=scores,
            hidden_states=tuple(h[:, text] for h in out.hidden_states)
            if output_hidden_states
            else None,
            attentions=tuple(a[:, :, text, text] for a in out.attentions)
            if output_attentions
            else None,
        )
