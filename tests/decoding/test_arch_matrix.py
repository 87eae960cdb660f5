"""Architecture matrix: every family a user may bring, as a tiny random model from its config.

For each family (conftest.FAMILIES): greedy ids with speculation on == off ==
`model.generate(do_sample=False)` on prompts with heavy repetition, all longer than the sliding
window of the families that have one; a draft rejected after the window has been passed is
cropped to exactly the cache built without it; sampling with a fixed seed is reproducible and
stays in the vocabulary; attention is ragspec's where the model allows sdpa and stock elsewhere.
Models whose layers cannot be rolled back (conftest.RECURRENT) generate without drafts, with the
same ids as `model.generate`.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import FAMILIES, RECURRENT, SLIDING_FAMILIES, WINDOW, make_family_model
from transformers import DynamicCache

from ragspec.decoding import cache as kv
from ragspec.decoding.attention import NAME, install
from ragspec.decoding.cache import (
    GrowingLayer,
    SlidingLayer,
    crop_cache,
    new_cache,
    rollback_problem,
)
from ragspec.decoding.engine import Generator
from ragspec.decoding.types import DraftConfig, GenerationConfig, SamplingConfig

NEW_TOKENS = 40


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread; on a shared 2-core machine, two threads made them
    20-50x slower (spinning threads waiting for a busy core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def family_models(tiny_tokenizer):
    """model_type -> (model, Generator); built once per module (each takes milliseconds)."""
    built = {}
    for family in (*FAMILIES, *RECURRENT):
        model = make_family_model(family, len(tiny_tokenizer))
        install(model)
        reason = rollback_problem(model)
        built[family] = model, Generator(model, tiny_tokenizer, eos_token_ids=[2],
                                         speculation_off_reason=reason)
    return built


def matrix_prompts(vocab: int, count: int = 4, seed: int = 0):
    """Prompts of 2.5-4 windows: a short pattern repeated (drafts get accepted), and text
    that repeats only in part (drafts get rejected)."""
    rng = random.Random(seed)
    for i in range(count):
        length = rng.randrange(int(2.5 * WINDOW), 4 * WINDOW)
        pattern = [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 9))]
        if i % 2:
            noise = [rng.randrange(3, vocab) for _ in range(length)]
            yield [noise[j] if j % 7 < 3 else pattern[j % len(pattern)] for j in range(length)]
        else:
            yield (pattern * length)[:length]


def hf_greedy(model, prompt, max_new_tokens):
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=2,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_ids_equal_with_speculation_on_off_and_transformers_generate(family, family_models,
                                                                           tiny_tokenizer):
    model, gen = family_models[family]
    accepted = rejected = 0
    for prompt in matrix_prompts(len(tiny_tokenizer)):
        want = hf_greedy(model, prompt, NEW_TOKENS)
        for draft in (DraftConfig(enabled=False), DraftConfig(adaptive=False), DraftConfig()):
            got = gen.generate(prompt, GenerationConfig(max_new_tokens=NEW_TOKENS, draft=draft))
            assert got.token_ids == want, f"{family}, {draft}, prompt {prompt}"
            accepted += got.stats.accepted_tokens
        # drafts that go wrong every few tokens: rejected after the window has been passed
        wrong = [(t + 1) % len(tiny_tokenizer) if i % 4 == 3 else t for i, t in enumerate(want)]
        got = gen.generate(prompt, GenerationConfig(max_new_tokens=NEW_TOKENS,
                                                    draft=DraftConfig(max_draft=6)),
                           forced_drafts=wrong)
        assert got.token_ids == want, f"{family}, rejected drafts, prompt {prompt}"
        rejected += got.stats.drafted_tokens - got.stats.accepted_tokens
    assert accepted > 0 and rejected > 0


@torch.inference_mode()
def _forward(model, cache, ids):
    return model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True).logits[0]


def _assert_same_layers(ours, theirs):
    for mine, ref in zip(ours.layers, theirs.layers, strict=True):
        assert mine.keys.shape == ref.keys.shape
        torch.testing.assert_close(mine.keys, ref.keys, rtol=0, atol=1e-5)
        torch.testing.assert_close(mine.values, ref.values, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_rejected_drafts_after_the_window_crop_to_the_cache_built_without_them(
        family, family_models, monkeypatch):
    monkeypatch.setattr(kv, "_SPARE", 3)  # sliding buffers drop old positions every few steps
    model, _ = family_models[family]
    rng = torch.Generator().manual_seed(5)
    vocab = model.config.vocab_size
    ours, theirs = new_cache(model), DynamicCache(config=model.config)
    kinds = {type(layer) for layer in ours.layers}
    assert kinds <= {GrowingLayer, SlidingLayer}
    assert (SlidingLayer in kinds) == (family in SLIDING_FAMILIES)
    prompt = torch.randint(3, vocab, (2 * WINDOW + 5,), generator=rng).tolist()
    torch.testing.assert_close(_forward(model, ours, prompt), _forward(model, theirs, prompt),
                               rtol=0, atol=1e-5)
    length = len(prompt)
    for round_ in range(12):
        kept = torch.randint(3, vocab, (1 + round_ % 4,), generator=rng).tolist()
        rejected = torch.randint(3, vocab, (1 + (5 * round_) % 9,), generator=rng).tolist()
        _forward(model, ours, kept + rejected)  # verify [kept..., rejected draft...]
        length += len(kept)
        crop_cache(ours, length)
        _forward(model, theirs, kept)  # the same text, never holding the rejected tokens
        assert ours.get_seq_length() == theirs.get_seq_length() == length
        _assert_same_layers(ours, theirs)
    # and the next forward sees the same context
    nxt = [7]
    a, b = _forward(model, ours, nxt), _forward(model, theirs, nxt)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sampling_with_a_fixed_seed_repeats_and_stays_in_the_vocabulary(family, family_models,
                                                                         tiny_tokenizer):
    model, gen = family_models[family]
    prompt = next(matrix_prompts(len(tiny_tokenizer), seed=3))
    cfg = GenerationConfig(max_new_tokens=NEW_TOKENS, draft=DraftConfig(adaptive=False),
                           sampling=SamplingConfig(temperature=0.8, top_p=0.95, seed=11))
    first, again = gen.generate(prompt, cfg), gen.generate(prompt, cfg)
    assert first.token_ids == again.token_ids
    assert len(first.token_ids) >= 1
    assert all(0 <= t < model.config.vocab_size for t in first.token_ids)
    assert first.stats.drafted_tokens > 0


@pytest.mark.parametrize("family", list(FAMILIES))
def test_attention_is_ragspecs_where_sdpa_is_allowed_and_stock_elsewhere(family, family_models):
    model, _ = family_models[family]
    implementation = model.config._attn_implementation
    if type(model)._supports_sdpa:
        assert implementation == NAME
    else:  # Gemma 2: soft-capped attention logits, which sdpa cannot express
        assert family == "gemma2" and implementation == "eager"


@pytest.mark.parametrize("family", list(RECURRENT))
def test_layers_that_cannot_roll_back_generate_without_drafts_like_generate(family, family_models,
                                                                            tiny_tokenizer):
    model, gen = family_models[family]
    assert gen.speculation_off_reason and "recurrent" in gen.speculation_off_reason
    for prompt in matrix_prompts(len(tiny_tokenizer), count=2):
        want = hf_greedy(model, prompt, 24)
        for draft in (DraftConfig(), DraftConfig(adaptive=False)):
            got = gen.generate(prompt, GenerationConfig(max_new_tokens=24, draft=draft))
            assert got.token_ids == want
            assert got.stats.drafted_tokens == 0
        oracle = gen.generate(prompt, GenerationConfig(max_new_tokens=24), forced_drafts=want)
        assert oracle.token_ids == want and oracle.stats.drafted_tokens == 0


def test_every_family_transformers_lacks_is_named():
    """The families above all have a config class in this transformers; if one disappears, the
    matrix says which instead of failing obscurely."""
    from transformers import CONFIG_MAPPING

    missing = [f for f in (*FAMILIES, *RECURRENT) if f not in CONFIG_MAPPING]
    assert not missing, f"transformers has no config class for: {', '.join(missing)}"
