"""The bundled SmolLM2: conversion, exactness on RAG-style prompts, and text decoding."""

from __future__ import annotations

import pytest
import torch
from test_engine import hf_greedy

from ragspec.decoding.detokenize import IncrementalDecoder
from ragspec.decoding.engine import Generator
from ragspec.decoding.types import DraftConfig, GenerationConfig
from ragspec.models.load import ModelNotFound, bundled_gguf_path, chat_prompt_ids, load_model

pytestmark = pytest.mark.slow

PASSAGES = """[1] The Harbor Street Library opens at 9:00 on weekdays and at 10:00 on Saturdays. It is \
closed on Sundays and public holidays. Members may borrow up to twelve items at a time, of which no \
more than four may be DVDs.
[2] Loans last three weeks. A loan can be renewed twice online or at the desk, unless another \
member has reserved the item. Overdue items cost 25 cents per day, up to a maximum of 5 dollars.
[3] Printing costs 10 cents per black-and-white page and 50 cents per colour page."""

QUESTIONS = [
    "What does printing cost?",
    "When does the library open on Saturdays, and when is it closed?",
    "Write a haiku about rain.",
]


def rag_prompt(tokenizer, question):
    return chat_prompt_ids(tokenizer, [
        {"role": "system", "content": "Answer from the passages. Quote them."},
        {"role": "user", "content": f"{PASSAGES}\n\nQuestion: {question}"},
    ])


@pytest.mark.parametrize("question", QUESTIONS)
def test_bundled_greedy_identical_to_transformers_with_and_without_speculation(bundled, question):
    gen = Generator.from_loaded(bundled)
    prompt = rag_prompt(bundled.tokenizer, question)
    want = hf_greedy(bundled.model, prompt, 64)
    for draft in (DraftConfig(), DraftConfig(enabled=False), DraftConfig(adaptive=False)):
        got = gen.generate(prompt, GenerationConfig(max_new_tokens=64, draft=draft))
        assert got.token_ids == want


def test_quoting_answer_is_mostly_accepted_drafts(bundled):
    gen = Generator.from_loaded(bundled)
    result = gen.generate(rag_prompt(bundled.tokenizer, QUESTIONS[0]), GenerationConfig(max_new_tokens=48))
    assert result.stats.accepted_tokens > 0
    assert result.stats.forward_passes < result.stats.new_tokens - 1


def test_converted_copy_reloads_with_identical_logits(bundled_fp32):
    bundled = bundled_fp32
    from transformers import AutoModelForCausalLM

    gguf = bundled_gguf_path()
    original = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                    dtype=torch.float32).eval()
    ids = torch.tensor([rag_prompt(bundled.tokenizer, QUESTIONS[1])])
    with torch.inference_mode():
        assert torch.equal(original(ids).logits, bundled.model(ids).logits)


def test_incremental_text_never_splits_a_character(bundled):
    tok = bundled.tokenizer
    text = "Prices: 5 € · naïve café 東京 🚲 done"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    dec = IncrementalDecoder(tok)
    pieces = [dec.push([t]) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids)


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFound, match="not found"):
        load_model("no-such-model-anywhere", tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFound, match="config.json"):
        load_model(str(tmp_path / "empty"), tmp_path)
