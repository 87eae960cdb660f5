"""The repetition stop rule, measures and penalty windows against brute-force oracles, and the
engine with the rule and the penalty against transformers' generate (speculation on and off)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspec.decoding.engine import Generator
from ragspec.decoding.repetition import (
    RepetitionGuard,
    max_repeats,
    penalty_windows,
    repeated_share,
    stop_point,
)
from ragspec.decoding.types import DraftConfig, GenerationConfig, RepeatConfig
from tests.decoding.test_engine import hf_greedy

TOKENS = st.lists(st.integers(0, 4), max_size=60)


def brute_stop_point(tokens, n, count):
    """The shortest prefix in which some n-gram occurs `count` times."""
    for length in range(1, len(tokens) + 1):
        prefix = tokens[:length]
        grams = [tuple(prefix[i : i + n]) for i in range(length - n + 1)]
        if any(grams.count(g) >= count for g in grams):
            return length
    return None


@settings(max_examples=300, deadline=None)
@given(TOKENS, st.integers(1, 6), st.integers(2, 4))
def test_stop_point_matches_brute_force(tokens, n, count):
    assert stop_point(tokens, n, count) == brute_stop_point(tokens, n, count)


@settings(max_examples=200, deadline=None)
@given(TOKENS, st.integers(1, 6))
def test_max_repeats_and_repeated_share_match_brute_force(tokens, n):
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    assert max_repeats(tokens, n) == max((grams.count(g) for g in grams), default=0)
    covered = set()
    for i, g in enumerate(grams):
        if g in grams[:i]:
            covered.update(range(i, i + n))
    assert repeated_share(tokens, n) == (len(covered) / len(tokens) if tokens else 0.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=30), st.lists(st.integers(0, 9), max_size=8),
       st.integers(1, 12))
def test_penalty_windows_are_the_tokens_before_each_row(context, draft, last_n):
    windows = penalty_windows(context, draft, last_n)
    assert len(windows) == len(draft) + 1
    for j, window in enumerate(windows):
        assert window == frozenset((context + draft[:j])[-last_n:])


def test_worked_example_from_docstring():
    guard = RepetitionGuard(3, 2)
    assert [guard.push(t) for t in [5, 6, 7, 8, 5, 6, 7]] == [False] * 6 + [True]
    assert guard.fired_at == 7
    assert stop_point([5, 6, 7, 8, 5, 6, 7], 3, 2) == 7
    assert stop_point([5, 6, 7, 8, 5, 6], 3, 2) is None


@pytest.mark.parametrize("kwargs, message", [
    ({"stop_ngram": -1}, "stop_ngram"), ({"stop_count": 1}, "stop_count"),
    ({"penalty": 0.9}, "penalty"), ({"penalty_last_n": 0}, "penalty_last_n"),
])
def test_bad_repeat_config_says_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RepeatConfig(**kwargs)


# -- in the engine ------------------------------------------------------------------------------

def loopy_prompts(vocab: int):
    """Prompts on which the tiny model's greedy output repeats itself."""
    import random

    rng = random.Random(7)
    for i in range(16):
        base = [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 9))]
        yield (base * 8)[: 20 + i]


DRAFTS = [DraftConfig(enabled=False), DraftConfig(), DraftConfig(adaptive=False, max_draft=8)]


def test_stop_rule_keeps_a_prefix_of_the_output_without_it(tiny_model, tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    rule = RepeatConfig(stop_ngram=3, stop_count=2)
    fired = 0
    for prompt in loopy_prompts(len(tiny_tokenizer)):
        free = gen.generate(prompt, GenerationConfig(max_new_tokens=64,
                                                     draft=DraftConfig(enabled=False))).token_ids
        cut = stop_point(free, 3, 2)
        for draft in DRAFTS:
            got = gen.generate(prompt, GenerationConfig(max_new_tokens=64, draft=draft,
                                                        repeat=rule))
            if cut is None:
                assert got.token_ids == free and got.stats.stop_reason != "repetition"
            else:
                assert got.token_ids == free[:cut], f"prompt {prompt}, {draft}"
                assert got.stats.stop_reason == "repetition"
                assert "".join(s.text for s in got.spans) == got.text
        fired += cut is not None
    assert fired >= 4, "these prompts should make the rule fire"


@pytest.mark.parametrize("draft", DRAFTS, ids=["off", "adaptive", "fixed8"])
def test_penalty_over_the_whole_sequence_equals_transformers_repetition_penalty(
        tiny_model, tiny_tokenizer, draft):
    """With a window longer than the sequence the penalty is transformers' own
    repetition_penalty; speculation on or off, every draft position is penalised by the tokens
    before it, so the tokens are the same."""
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    config = GenerationConfig(max_new_tokens=40, draft=draft,
                              repeat=RepeatConfig(penalty=1.3, penalty_last_n=1024))
    runs = {tuple(p): gen.generate(p, config) for p in loopy_prompts(len(tiny_tokenizer))}
    for prompt, got in runs.items():
        assert got.token_ids == hf_greedy(tiny_model, list(prompt), 40, repetition_penalty=1.3)
    if draft.enabled:  # drafts are accepted under the penalty too
        assert sum(got.stats.accepted_tokens for got in runs.values()) > 0


def test_windowed_penalty_is_the_same_with_speculation_on_and_off(tiny_model, tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    repeat = RepeatConfig(stop_ngram=6, penalty=1.2, penalty_last_n=8)
    for prompt in loopy_prompts(len(tiny_tokenizer)):
        runs = [gen.generate(prompt, GenerationConfig(max_new_tokens=48, draft=d, repeat=repeat))
                for d in DRAFTS]
        assert runs[1].token_ids == runs[0].token_ids == runs[2].token_ids, f"prompt {prompt}"


def test_each_draft_position_is_penalised_by_the_tokens_before_it(tiny_model, tiny_tokenizer):
    """Drafting the true penalised continuation (every draft right): each verify row must see
    the earlier draft tokens in its window, or its argmax differs from the plain step's."""
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    repeat = RepeatConfig(penalty=1.8, penalty_last_n=6)
    accepted = 0
    for prompt in loopy_prompts(len(tiny_tokenizer)):
        plain = gen.generate(prompt, GenerationConfig(max_new_tokens=40, repeat=repeat,
                                                      draft=DraftConfig(enabled=False)))
        forced = gen.generate(prompt, GenerationConfig(max_new_tokens=40, repeat=repeat,
                                                       draft=DraftConfig(max_draft=8)),
                              forced_drafts=plain.token_ids)
        assert forced.token_ids == plain.token_ids, f"prompt {prompt}"
        accepted += forced.stats.accepted_tokens
    assert accepted > 100


@pytest.mark.slow
def test_bundled_model_stops_its_loops_with_the_same_tokens_speculation_on_and_off(bundled):
    """The product's stop rule on the bundled model: each answer is model.generate's greedy
    output cut where the rule fires, speculation on or off; and the model does loop here."""
    from test_bundled_model import QUESTIONS, rag_prompt

    from ragspec.pipeline import ANSWER_REPEAT

    gen = Generator.from_loaded(bundled)
    fired = 0
    for question in QUESTIONS:
        prompt = rag_prompt(bundled.tokenizer, question)
        free = hf_greedy(bundled.model, prompt, 160)
        cut = stop_point(free, ANSWER_REPEAT.stop_ngram, ANSWER_REPEAT.stop_count)
        for draft in (DraftConfig(), DraftConfig(enabled=False)):
            got = gen.generate(prompt, GenerationConfig(max_new_tokens=160, draft=draft,
                                                        repeat=ANSWER_REPEAT))
            assert got.token_ids == free[:cut], question
            assert (got.stats.stop_reason == "repetition") == (cut is not None)
        fired += cut is not None
    assert fired, "the bundled model should repeat itself on at least one of these questions"
