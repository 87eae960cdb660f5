"""Shared fixtures: a tiny randomly initialised Llama with a character tokenizer (fast tests),
and the bundled SmolLM2 (slow tests, converted once into a cache shared across runs)."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
# The de-quantised bundled model is reused between test runs (conversion takes ~30 s).
MODEL_CACHE = Path(os.environ.get("RAGSPEC_TEST_MODEL_CACHE", REPO / ".ragspec-home" / "models"))


def make_char_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(string.ascii_letters + string.digits + string.punctuation + " \n") + ["é", "→"]
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def make_tiny_model(vocab_size: int, seed: int = 0, **overrides):
    """A 2-layer Llama with random weights. initializer_range 0.3 (not transformers' 0.02) makes
    its greedy output varied: with tiny weights every prompt makes it repeat one token forever,
    and an engine test on such output checks almost nothing (every draft of that token is
    right)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from decoding.attention import register

    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=True,
        initializer_range=0.3,
    )
    cfg.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    model.set_attn_implementation(register())
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    return make_tiny_model(len(tiny_tokenizer))


@pytest.fixture(scope="session")
def bundled():
    from decoding.model import load_model

    return load_model(None, MODEL_CACHE)
