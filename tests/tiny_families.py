"""Tiny random sequence classifiers of today's common architectures, encoders and decoders,
saved as Hugging Face checkpoint folders with a tokenizer of the architecture's kind: WordPiece
over the bundled MiniLM vocabulary (BERT, DistilBERT, ELECTRA, ModernBERT, MPNet), byte-level
BPE (RoBERTa; GPT-2, Llama, Qwen2 and Mistral, which pad with their end-of-text token) or
Unigram (XLM-R, CamemBERT, DeBERTa-v3, ALBERT) trained on the bundled tweets with the
``tokenizers`` library."""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    BertTokenizerFast,
    PreTrainedTokenizerFast,
)

from workbench.core.config import DataConfig
from workbench.core.data import load_task
from workbench.core.models import resolve_model

ENCODER_TYPES = (
    "bert",
    "distilbert",
    "electra",
    "roberta",
    "xlm-roberta",
    "camembert",
    "deberta-v2",
    "modernbert",
    "albert",
    "mpnet",
)
DECODER_TYPES = ("gpt2", "llama", "qwen2", "mistral")
FAMILY_TYPES = ENCODER_TYPES + DECODER_TYPES
WORDPIECE_TYPES = ("bert", "distilbert", "electra", "modernbert", "mpnet")
WIDTH, LAYERS = 32, 4

# special tokens of the trained tokenizers, in id order (the config's pad id follows them)
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
DEBERTA_SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
END_OF_TEXT = "<|endoftext|>"


@functools.cache
def _tweets() -> tuple[str, ...]:
    return tuple(load_task(DataConfig(task="tweets")).splits["train"].texts[:3000])


def _wrap(tokenizer: Tokenizer, specials: list[str], first: str, last: str):
    """A trained ``tokenizers`` tokenizer as a transformers one: ``first … last`` around a text,
    ``first a last last b last`` around a pair (RoBERTa's and XLM-R's layout; DeBERTa's differs
    only in the token names)."""
    ids = {token: tokenizer.token_to_id(token) for token in specials}
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}",
        pair=f"{first} $A {last} {last} $B {last}",
        special_tokens=[(first, ids[first]), (last, ids[last])],
    )
    pad, unk, mask = (t for t in specials if t not in (first, last))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=first,
        cls_token=first,
        eos_token=last,
        sep_token=last,
        pad_token=pad,
        unk_token=unk,
        mask_token=mask,
    )


def _trained_bpe(specials: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_tweets(), trainer)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


@functools.cache
def _wordpiece() -> BertTokenizerFast:
    return BertTokenizerFast.from_pretrained(resolve_model("minilm-l6"))


@functools.cache
def _byte_level_bpe() -> PreTrainedTokenizerFast:
    return _wrap(_trained_bpe(ROBERTA_SPECIALS), ROBERTA_SPECIALS, "<s>", "</s>")


@functools.cache
def decoder_tokenizer() -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE tokenizer: no special token around a text, its end-of-text
    token also its padding (as decoder classifiers are usually set up)."""
    tokenizer = _trained_bpe([END_OF_TEXT])
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
    )


@functools.cache
def _unigram(specials: tuple[str, ...], first: str, last: str) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=600, special_tokens=list(specials), unk_token=specials[3]
    )
    tokenizer.train_from_iterator(_tweets(), trainer)
    return _wrap(tokenizer, list(specials), first, last)


def family_tokenizer(model_type: str):
    """The tokenizer a tiny model of ``model_type`` reads with."""
    if model_type in WORDPIECE_TYPES:
        return _wordpiece()
    if model_type == "roberta":
        return _byte_level_bpe()
    if model_type in DECODER_TYPES:
        return decoder_tokenizer()
    if model_type in ("xlm-roberta", "camembert"):
        return _unigram(tuple(ROBERTA_SPECIALS), "<s>", "</s>")
    return _unigram(tuple(DEBERTA_SPECIALS), "[CLS]", "[SEP]")


def family_config(model_type: str, tokenizer, labels: list[str], layers: int = LAYERS):
    """A small config of ``model_type`` whose classes are ``labels`` (in that output order)."""
    sizes = {
        "vocab_size": len(tokenizer),
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
        "pad_token_id": tokenizer.pad_token_id,
    }
    specials = {  # ids the architectures' defaults put outside a tiny vocabulary
        f"{name}_token_id": tokenizer.convert_tokens_to_ids(getattr(tokenizer, f"{name}_token"))
        for name in ("bos", "eos", "cls", "sep")
        if getattr(tokenizer, f"{name}_token") is not None
    }
    if model_type == "distilbert":
        return AutoConfig.for_model(
            model_type, dim=WIDTH, n_layers=layers, n_heads=2, hidden_dim=2 * WIDTH, **sizes
        )
    if model_type == "gpt2":
        return AutoConfig.for_model(
            model_type, n_embd=WIDTH, n_layer=layers, n_head=2, n_positions=128, **specials, **sizes
        )
    extra = {
        "electra": {"embedding_size": WIDTH // 2},  # with the projection to the hidden width
        "roberta": {"type_vocab_size": 1, "max_position_embeddings": 130},
        "xlm-roberta": {"type_vocab_size": 1, "max_position_embeddings": 130},
        "camembert": {"type_vocab_size": 1, "max_position_embeddings": 130},
        "albert": {"embedding_size": WIDTH // 2},  # with the projection to the hidden width
        "mpnet": {"max_position_embeddings": 130},
        "modernbert": specials,
        **{key: {"num_key_value_heads": 1, **specials} for key in DECODER_TYPES[1:]},
        "deberta-v2": {  # v3's layout: relative positions, no token types, no absolute ones
            "type_vocab_size": 0,
            "relative_attention": True,
            "position_buckets": 16,
            "max_relative_positions": -1,
            "pos_att_type": ["p2c", "c2p"],
            "position_biased_input": False,
            "norm_rel_ebd": "layer_norm",
        },
    }.get(model_type, {})
    return AutoConfig.for_model(
        model_type,
        hidden_size=WIDTH,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * WIDTH,
        **{"max_position_embeddings": 128, **extra},
        **sizes,
    )


def save_family_model(
    model_type: str, folder: Path, labels: list[str], seed: int = 0, layers: int = LAYERS
) -> Path:
    """A tiny random classifier of ``model_type`` and its tokenizer, saved in ``folder``."""
    tokenizer = family_tokenizer(model_type)
    torch.manual_seed(seed)
    config = family_config(model_type, tokenizer, labels, layers)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_causal_lm(folder: Path, seed: int = 0) -> Path:
    """A tiny random Llama language model (no classification head: an LLM to prompt) and the
    byte-level BPE tokenizer of :func:`decoder_tokenizer`, saved in ``folder``."""
    tokenizer = decoder_tokenizer()
    config = AutoConfig.for_model(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        architectures=["LlamaForCausalLM"],
    )
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
