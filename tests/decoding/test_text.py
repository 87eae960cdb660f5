"""The text side without a model: incremental detokenising (ragspec.decoding.detokenize) and the spans it
becomes, with stop strings and hold-back (ragspec.decoding.spans), against whole-sequence decoding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspec.decoding.detokenize import IncrementalDecoder
from ragspec.decoding.spans import SpanText
from ragspec.decoding.types import SpanOrigin

SAMPLE = ("Les élèves vont à l'école → 日本語のテキスト 😀 naïve café, "
          "the quick brown fox; ñandú ümlaut façade 🎉 über")


def byte_level_tokenizer():
    """A byte-level BPE (GPT-2 style) trained on mixed scripts: merged tokens hold whole
    multi-byte characters, single-byte tokens hold parts of them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([SAMPLE] * 20, trainer=trainer)
    return _wrap(tok)


def byte_fallback_tokenizer():
    """SentencePiece style: '▁' for spaces, <0xNN> byte tokens, the leading space of a decode
    stripped (Llama 2's decoder)."""
    from tokenizers import Tokenizer, decoders, models

    pieces = ["<eos>", *(f"<0x{b:02X}>" for b in range(256)), "▁", "a", "b", "é", "▁the",
              "▁a", "é▁", "x"]
    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[],
                               byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return _wrap(tok)


def cleanup_tokenizer():
    """Characters, with transformers' clean-up rules on: decoding "a ." gives "a."."""
    from conftest import make_char_tokenizer

    tok = make_char_tokenizer()
    tok.clean_up_tokenization_spaces = True
    return tok


def _wrap(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


TOKENIZERS = {"byte-level": byte_level_tokenizer(), "byte-fallback": byte_fallback_tokenizer(),
              "clean-up": cleanup_tokenizer()}


def pushes(vocab_size: int):
    """Token ids in chunks of 1-3, as the engine commits them."""
    return st.lists(st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=3),
                    max_size=40)


@pytest.mark.parametrize("name", ["byte-level", "byte-fallback"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_deltas_sum_to_the_text_and_the_text_to_a_whole_decode(name, data):
    tok = TOKENIZERS[name]
    # real text (multi-byte characters split across byte tokens), committed 1-3 tokens at a time
    text = data.draw(st.text(alphabet=st.sampled_from(sorted(set(SAMPLE)) + ["\u00fc", "Ω"]),
                             max_size=30))
    ids = tok(text, add_special_tokens=False)["input_ids"]
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=len(ids), max_size=len(ids)))
    dec = IncrementalDecoder(tok)
    deltas, pos = [], 0
    for size in sizes:
        if pos < len(ids):
            deltas.append(dec.push(ids[pos : pos + size]))
            pos += size
    deltas.append(dec.finish())
    assert "".join(deltas) == dec.text
    assert dec.text == tok.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in d for d in deltas)  # no half character is ever streamed


@pytest.mark.parametrize("name", ["byte-level", "byte-fallback"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_ids_stream_text_that_sums_up(name, data):
    """Arbitrary ids (invalid byte sequences included): deltas still sum to the text, and when
    the whole output is valid UTF-8 the text is its decode."""
    tok = TOKENIZERS[name]
    dec = IncrementalDecoder(tok)
    deltas = [dec.push(chunk) for chunk in data.draw(pushes(len(tok)))] + [dec.finish()]
    assert "".join(deltas) == dec.text
    whole = tok.decode(dec.ids, skip_special_tokens=True)
    if "\ufffd" not in whole:
        assert dec.text == whole


@settings(max_examples=150, deadline=None)
@given(chars=st.lists(st.sampled_from(list("ab .,!?'")), max_size=40))
def test_a_rewriting_decoder_never_loses_streamed_or_new_text(chars):
    tok = TOKENIZERS["clean-up"]
    ids = tok.convert_tokens_to_ids(chars)
    dec = IncrementalDecoder(tok)
    deltas = [dec.push([i]) for i in ids] + [dec.finish()]
    assert "".join(deltas) == dec.text
    # clean-up only removes spaces before punctuation: every other character is there, in order
    whole = tok.decode(ids, skip_special_tokens=True)
    assert dec.text.replace(" ", "") == whole.replace(" ", "")


def test_an_incomplete_character_is_held_until_it_completes():
    tok = TOKENIZERS["byte-fallback"]
    ids = tok.convert_tokens_to_ids(["a", "<0xE2>", "<0x86>", "<0x92>", "b"])  # "a→b"
    dec = IncrementalDecoder(tok)
    assert [dec.push([i]) for i in ids] == ["a", "", "", "→", "b"]


# -- spans --------------------------------------------------------------------------------------

def char_ids(text: str) -> list[int]:
    tok = TOKENIZERS["clean-up"]
    return tok.convert_tokens_to_ids(list(text))


def run_steps(steps, stops=(), done_at_end=True):
    """steps: lists of (char, copied_from) committed together; returns (spans, SpanText)."""
    from conftest import make_char_tokenizer

    text = SpanText(make_char_tokenizer(), stops,
                    locate=lambda pos, n: SpanOrigin(pos, in_prompt=True, source="p",
                                                     char_start=pos, char_end=pos + n))
    spans = []
    for number, step in enumerate(steps):
        hit = False
        for char, origin in step:
            hit = text.push(char_ids(char)[0], origin is not None, origin)
            if hit:
                break
        spans += text.flush(done=hit or (done_at_end and number == len(steps) - 1))
        if hit:
            break
    return spans, text


def test_held_back_text_keeps_its_own_kind_and_origin():
    # "b#" drafted from position 7, then the model's "c": the held "#" stays drafted
    spans, text = run_steps([[("a", None)], [("b", 7), ("#", 7)], [("c", None)]], stops=("##",))
    kinds = [(s.text, s.drafted) for s in spans]
    assert kinds == [("a", False), ("b", True), ("#", True), ("c", False)]
    assert spans[2].origin == spans[1].origin and spans[2].token_ids == []
    assert "".join(s.text for s in spans) == text.text == "ab#c"


def test_own_held_text_never_joins_a_drafted_span():
    # the model writes "#" (held: it may start "##"), then a draft "xy" is accepted
    spans, _ = run_steps([[("a", None), ("#", None)], [("x", 3), ("y", 3), ("b", None)]],
                         stops=("##",))
    drafted_text = "".join(s.text for s in spans if s.drafted)
    assert drafted_text == "xy"
    assert [(s.text, s.drafted) for s in spans] == [("a", False), ("#", False), ("xy", True),
                                                     ("b", False)]


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.lists(st.tuples(st.sampled_from(list("ab#")),
                                         st.sampled_from([None, 1, 5])),
                               min_size=1, max_size=4), min_size=1, max_size=12),
       stop=st.sampled_from(["##", "a#b", "b"]))
def test_span_invariants_hold_for_any_steps(steps, stop):
    spans, text = run_steps(steps, stops=(stop,))
    committed = [c for step in steps for c in step]
    # texts sum to the output cut at the stop string; tokens sum to every committed token
    assert "".join(s.text for s in spans) == text.text
    written = "".join(c for c, _ in committed)
    cut = written.find(stop)
    assert text.text == (written if cut < 0 else written[:cut])
    ids = [t for s in spans for t in s.token_ids]
    assert ids == char_ids(written)[: len(ids)]
    # with one character per token, every character keeps the kind of the token it came from
    kinds = [origin is not None for _, origin in committed][: len(text.text)]
    assert [s.drafted for s in spans for _ in s.text] == kinds
