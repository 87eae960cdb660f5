"""The engine against its oracles: transformers' greedy generate, and exact sampling probabilities."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import pytest
import torch

from ragspec.decoding import sampling as sampling_mod
from ragspec.decoding.engine import Generator
from ragspec.decoding.policy import ForwardCost
from ragspec.decoding.types import (
    DraftConfig,
    GenerationConfig,
    SamplingConfig,
    SourceRegion,
)


def hf_greedy(model, prompt, max_new_tokens, eos=None, **settings):
    """transformers' greedy tokens: ``eos`` None keeps the model's EOS, ``()`` has none;
    ``settings`` go into the generation config (e.g. repetition_penalty)."""
    config = copy.deepcopy(model.generation_config)
    config.do_sample, config.max_new_tokens = False, max_new_tokens
    for name, value in settings.items():
        setattr(config, name, value)
    if eos is not None:
        config.eos_token_id = eos or None
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             generation_config=config)
    return out[0, len(prompt) :].tolist()


def prompts(vocab: int, count: int, seed: int = 0):
    """Random prompts, half of them with heavy repetition (where drafts get accepted)."""
    rng = random.Random(seed)
    for i in range(count):
        base = [rng.randrange(3, vocab) for _ in range(rng.randrange(5, 40))]
        if i % 2:
            base = (base[: rng.randrange(3, 8)] * 6)[: rng.randrange(20, 60)]
        yield base


DRAFT_CONFIGS = [
    DraftConfig(enabled=False),
    DraftConfig(),
    DraftConfig(adaptive=False, max_draft=8),
    DraftConfig(adaptive=False, min_ngram=2, max_ngram=2, max_draft=3),
    DraftConfig(max_ngram=8, max_draft=32),
    DraftConfig(occurrences=1, governed=False),
]


@pytest.mark.parametrize("draft", DRAFT_CONFIGS, ids=lambda d: (f"spec{int(d.enabled)}-a{int(d.adaptive)}-n{d.max_ngram}-k{d.max_draft}"
                                    f"-o{d.occurrences}-g{int(d.governed)}"))
def test_greedy_ids_identical_to_transformers_generate(tiny_model, tiny_tokenizer, draft):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    drafted = 0
    for prompt in prompts(len(tiny_tokenizer), 24):
        want = hf_greedy(tiny_model, prompt, 48)
        got = gen.generate(prompt, GenerationConfig(max_new_tokens=48, draft=draft))
        assert got.token_ids == want, f"prompt {prompt}"
        drafted += got.stats.accepted_tokens
    if draft.enabled:
        assert drafted > 0, "these prompts should exercise accepted drafts"


def test_spans_reassemble_output_and_drafts_copy_their_origin(tiny_model, tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    cfg = GenerationConfig(max_new_tokens=64, draft=DraftConfig(adaptive=False))
    seen_drafts = 0
    for prompt in prompts(len(tiny_tokenizer), 12, seed=3):
        result = gen.generate(prompt, cfg)
        assert [t for s in result.spans for t in s.token_ids] == result.token_ids
        assert "".join(s.text for s in result.spans) == result.text
        assert result.text == tiny_tokenizer.decode(result.token_ids, skip_special_tokens=True)
        full = prompt + result.token_ids
        for span in result.spans:
            if span.drafted:
                seen_drafts += 1
                pos = span.origin.position
                assert full[pos : pos + len(span.token_ids)] == span.token_ids
                assert span.origin.in_prompt == (pos < len(prompt))
            else:
                assert span.origin is None
        s = result.stats
        assert s.new_tokens == len(result.token_ids)
        assert s.accepted_tokens == sum(len(sp.token_ids) for sp in result.spans if sp.drafted)
        assert s.accepted_tokens == sum(a * n for a, n in s.accepted_lengths.items())
        assert len(s.accepted_per_step) == s.forward_passes
        assert sum(s.accepted_per_step) == s.accepted_tokens
        assert [a for a in s.accepted_per_step if a] == [
            len(sp.token_ids) for sp in result.spans if sp.drafted and sp.token_ids]
        # every forward adds its accepted drafts and one own token, except a last step cut
        # inside its accepted draft (by EOS or the limit), which has no own token
        cut_in_draft = [sp for sp in result.spans if sp.token_ids][-1].drafted
        assert s.forward_passes == len(result.token_ids) - 1 - s.accepted_tokens + cut_in_draft
    assert seen_drafts > 0


@pytest.mark.parametrize("limit", [1, 2, 5, 17])
def test_never_generates_past_max_new_tokens(tiny_model, tiny_tokenizer, limit):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[-1])  # the limit ends it
    prompt = [9, 10, 11, 12, 13] * 6
    cfg = GenerationConfig(max_new_tokens=limit, draft=DraftConfig(adaptive=False))
    result = gen.generate(prompt, cfg)
    assert len(result.token_ids) == limit and result.stats.stop_reason == "max_new_tokens"
    assert result.token_ids == hf_greedy(tiny_model, prompt, limit, eos=())


def test_stops_at_eos_like_transformers(tiny_model, tiny_tokenizer):
    prompt = [9, 10, 11, 12, 13] * 6
    free = hf_greedy(tiny_model, prompt, 40)
    eos = free[7]  # pretend a token the model writes is the end of sequence
    assert free.index(eos) == 7  # ...and first writes there: the output must stop at 8 tokens
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[eos])
    result = gen.generate(prompt, GenerationConfig(max_new_tokens=40))
    assert result.token_ids == hf_greedy(tiny_model, prompt, 40, eos=eos)
    assert result.token_ids[-1] == eos and result.stats.stop_reason == "eos"


def test_stop_string_ends_generation_and_is_cut_from_text(tiny_model, tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    prompt = [20, 21, 22, 23] * 8
    free = gen.generate(prompt, GenerationConfig(max_new_tokens=40))
    stop = free.text[10:12]
    cut = free.text.find(stop)
    result = gen.generate(prompt, GenerationConfig(max_new_tokens=40, stop_strings=(stop,)))
    assert result.stats.stop_reason == "stop_string"
    assert result.text == free.text[:cut]
    assert "".join(s.text for s in result.spans) == result.text
    assert free.token_ids[: len(result.token_ids)] == result.token_ids


def test_drafts_from_registered_passages_carry_char_ranges(tiny_tokenizer):
    # A model with tiny random weights writes one token forever: a passage of that token is
    # what its drafts copy, and it accepts them.
    from conftest import make_tiny_model

    repeater = make_tiny_model(len(tiny_tokenizer), initializer_range=0.02)
    question = tiny_tokenizer("Which port? ", add_special_tokens=False)["input_ids"]
    token = hf_greedy(repeater, question, 1)[0]
    ids = [token] * 20
    passage = tiny_tokenizer.decode(ids)
    prompt = question + ids + question
    region = SourceRegion(
        token_start=len(question), token_end=len(question) + len(ids), source="p1",
        char_offsets=tuple((i, i + 1) for i in range(len(ids))),  # one character per token
    )
    gen = Generator(repeater, tiny_tokenizer, eos_token_ids=[2])
    result = gen.generate(prompt, GenerationConfig(max_new_tokens=24, draft=DraftConfig(adaptive=False)),
                          sources=[region])
    assert result.token_ids == hf_greedy(repeater, prompt, 24)
    located = [s for s in result.spans if s.drafted and s.origin.source == "p1"]
    assert sum(len(s.token_ids) for s in located) >= 8
    for span in located:
        o = span.origin
        assert region.token_start <= o.position < region.token_end
        assert o.char_start == o.position - region.token_start
        assert o.char_end - o.char_start == min(len(span.token_ids), region.token_end - o.position)
        assert passage[o.char_start : o.char_end] == span.text[: o.char_end - o.char_start]


def test_forced_oracle_drafts_are_all_accepted(tiny_model, tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    prompt = list(range(3, 30))
    truth = hf_greedy(tiny_model, prompt, 40)
    cfg = GenerationConfig(max_new_tokens=40, draft=DraftConfig(max_draft=8))
    result = gen.generate(prompt, cfg, forced_drafts=truth)
    assert result.token_ids == truth
    assert result.stats.accepted_tokens == result.stats.drafted_tokens
    assert result.stats.forward_passes == 5  # 40 tokens = first + 4 verify steps of 8+1 + ... <= 5


def test_bad_prompts_raise_clear_errors(tiny_model, tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    with pytest.raises(ValueError, match="empty"):
        gen.stream([], GenerationConfig())
    with pytest.raises(ValueError, match="context"):
        gen.stream([5] * 1000, GenerationConfig(max_new_tokens=100))
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationConfig(max_new_tokens=0)


def test_adaptive_policy_spends_fewer_forwards_than_plain_decoding_on_repetitive_text(
    tiny_tokenizer
):
    # A steep measured cost (like this CPU's) still lets strong matches through: the repeater
    # model (see above) writes one token forever, which the drafter finds in the context.
    from conftest import make_tiny_model

    repeater = make_tiny_model(len(tiny_tokenizer), initializer_range=0.02)
    cost = ForwardCost([1.0 + 0.1 * n for n in range(17)])
    gen = Generator(repeater, tiny_tokenizer, eos_token_ids=[2], cost=cost)
    gen.pace = None  # judged by this curve alone, not by this machine's live step times
    prompt = [7, 8, 9, 10, 11, 12] * 8
    truth = hf_greedy(repeater, prompt, 60)
    context = prompt + truth[:30] + prompt
    plain = gen.generate(context, GenerationConfig(max_new_tokens=40, draft=DraftConfig(enabled=False)))
    result = gen.generate(context, GenerationConfig(max_new_tokens=40))
    assert result.token_ids == plain.token_ids
    assert result.stats.accepted_tokens >= 10
    assert result.stats.forward_passes <= 0.75 * plain.stats.forward_passes


def test_governor_suspends_failing_drafts_without_changing_the_answer(tiny_model, tiny_tokenizer):
    # random weights rarely follow the prompt's pattern: on a steep cost curve the governor
    # stops verifying drafts after about a plain step's worth of rejections; the ids stay
    cost = ForwardCost([0.02 * (1 + 0.12 * n) for n in range(17)])
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[], cost=cost)
    # judged by this curve alone: live step times (the pace) differ with the machine and its
    # load, and would make what the policy drafts and the governor suspends differ with them
    gen.pace = None
    suspended = 0
    for prompt in prompts(len(tiny_tokenizer), 10, seed=4):
        free = DraftConfig(adaptive=False, max_draft=6, governed=False)
        ungoverned = gen.generate(prompt, GenerationConfig(max_new_tokens=40, draft=free))
        stream = gen.stream(prompt, GenerationConfig(max_new_tokens=40,
                                                     draft=replace(free, adaptive=True, governed=True)))
        governed = stream.result()
        assert governed.token_ids == ungoverned.token_ids == hf_greedy(tiny_model, prompt, 40, ())
        gov = stream._governor
        suspended += gov.suspensions > 0
        wasted = governed.stats.drafted_tokens - governed.stats.accepted_tokens
        assert wasted <= ungoverned.stats.drafted_tokens - ungoverned.stats.accepted_tokens + 6
    assert suspended >= 1


# -- sampling: the point-mass rule keeps the distribution ---------------------------------------

def exact_distribution(model, prompt, cfg: SamplingConfig, length: int) -> dict[tuple, float]:
    """P(continuation) for every continuation of `length` tokens, by enumeration."""
    dist = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for seq, p in dist.items():
            with torch.inference_mode():
                logits = model(torch.tensor([prompt + list(seq)])).logits[0, -1:]
            probs = sampling_mod.target_probs(logits, cfg)[0]
            for t in torch.nonzero(probs).flatten().tolist():
                nxt[seq + (t,)] = p * float(probs[t])
        dist = nxt
    return dist


def sampled_tv(gen, prompt, cfg, forced, exact, n):
    counts: dict[tuple, int] = {}
    for seed in range(n):
        c = GenerationConfig(max_new_tokens=3, sampling=SamplingConfig(
            temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=seed))
        ids = tuple(gen.generate(prompt, c, forced_drafts=forced).token_ids)
        counts[ids] = counts.get(ids, 0) + 1
    keys = set(counts) | set(exact)
    return 0.5 * sum(abs(counts.get(k, 0) / n - exact.get(k, 0.0)) for k in keys)


SAMPLES = 3000
# Expected TV of an empirical distribution over <= 27 outcomes (top-k 3, 3 tokens) from 3000
# draws is ~0.04–0.05 (half the sum of sqrt(2p(1-p)/(pi*n))). The buggy rule below lands near
# 0.2 on the same data. (A wide support such as top-p alone would need far more samples.)
TV_BOUND = 0.08


@pytest.mark.parametrize("cfg", [
    SamplingConfig(temperature=1.0, top_k=3),
    SamplingConfig(temperature=0.7, top_k=3, top_p=0.9),
], ids=["t1-top3", "t0.7-top3-p0.9"])
def test_speculative_sampling_matches_exact_distribution(tiny_tokenizer, cfg):
    from conftest import make_tiny_model

    model = make_tiny_model(len(tiny_tokenizer), seed=1, initializer_range=0.1)
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[2])
    prompt = [10, 11, 12, 10, 11]
    exact = exact_distribution(model, prompt, cfg, 3)
    # forced drafts: the most likely token after the first: accepted often, rejected often
    best = max(exact, key=exact.get)
    forced = list(best)
    tv = sampled_tv(gen, prompt, cfg, forced, exact, SAMPLES)
    assert tv < TV_BOUND, f"TV distance {tv:.3f}"


def test_a_wrong_accept_rule_fails_the_distribution_check(tiny_tokenizer, monkeypatch):
    """The bound has power: resampling from p *without* removing the rejected draft token
    (a classic bug) over-weights drafts and is caught."""
    from conftest import make_tiny_model

    def buggy(logits, draft, cfg, uniforms):
        probs = sampling_mod.target_probs(logits, cfg)
        rng = random.Random(int(uniforms[0] * 2**53))
        for i, t in enumerate(draft):
            if rng.random() < float(probs[i, t]):
                continue
            return i, sampling_mod.sample(probs[i], rng.random())
        return len(draft), sampling_mod.sample(probs[len(draft)], rng.random())

    import ragspec.decoding.engine as engine_mod

    monkeypatch.setattr(engine_mod, "accept_sampled", buggy)
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    model = make_tiny_model(len(tiny_tokenizer), seed=1, initializer_range=0.1)
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[2])
    prompt = [10, 11, 12, 10, 11]
    exact = exact_distribution(model, prompt, cfg, 3)
    best = max(exact, key=exact.get)
    tv = sampled_tv(gen, prompt, cfg, list(best), exact, SAMPLES)
    assert tv > TV_BOUND, f"TV distance {tv:.3f} should expose the bug"


def test_a_seed_writes_the_same_tokens_with_speculation_on_or_off_and_after_learning(
        tiny_tokenizer):
    """The uniform of each output position depends on the seed and the position alone, so the
    draft policy's state (which persists across calls) and speculation itself change nothing
    where verify rows equal one-token steps (fp32 tiny model: checked against plain steps)."""
    from conftest import make_tiny_model

    model = make_tiny_model(len(tiny_tokenizer), seed=1, initializer_range=0.1)
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[2])
    prompt = [9, 10, 11, 12, 13] * 6
    sampling = SamplingConfig(temperature=0.9, top_k=8, seed=77)
    plain = gen.generate(prompt, GenerationConfig(max_new_tokens=40, sampling=sampling,
                                                  draft=DraftConfig(enabled=False)))
    runs = [gen.generate(prompt, GenerationConfig(max_new_tokens=40, sampling=sampling))
            for _ in range(3)]
    assert sum(r.stats.drafted_tokens for r in runs) > 0  # drafts were verified and judged
    for run in runs:
        assert run.token_ids == plain.token_ids
    other = gen.generate(prompt, GenerationConfig(max_new_tokens=40, sampling=replace(
        sampling, seed=78), draft=DraftConfig(enabled=False)))
    assert other.token_ids != plain.token_ids


def test_the_inverse_cdf_draw_never_picks_a_zero_weight_token_and_follows_u():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]])
    picks = [int(sampling_mod.draw(probs, [u])[0]) for u in (0.0, 0.49, 0.5, 0.79, 0.8,
                                                               1 - 2**-53)]
    assert picks == [1, 1, 3, 3, 4, 4]
    # unnormalised rows: the same tokens; a product that rounds up to the total still lands on
    # the last token with weight
    assert int(sampling_mod.draw(probs * 7, [0.79])[0]) == 3
    assert int(sampling_mod.draw(torch.tensor([[0.1, 0.3, 0.0]]), [1 - 2**-53])[0]) == 1


def test_stop_ends_the_stream_at_the_next_step_and_keeps_what_was_written(tiny_model, tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    prompt = [9, 10, 11, 12, 13] * 6
    full = gen.generate(prompt, GenerationConfig(max_new_tokens=40, draft=DraftConfig(enabled=False)))
    stream = gen.stream(prompt, GenerationConfig(max_new_tokens=40, draft=DraftConfig(enabled=False)))
    seen = []
    for span in stream:
        seen.extend(span.token_ids)
        if len(seen) >= 3:
            stream.stop()
    assert stream.stats.stop_reason == "stopped"
    assert len(stream.token_ids) == 3 < len(full.token_ids)
    assert stream.token_ids == full.token_ids[:3] == seen


def test_held_back_stop_prefix_keeps_the_kind_of_the_tokens_that_wrote_it(tiny_model, tiny_tokenizer):
    # Forced (oracle) drafts make every step "drafts, then one own token". With a stop string
    # that starts with the own token's character but never completes, that character is held
    # back at the end of each step and streamed with the next step: it must stay unhighlighted.
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    prompt = [20, 21, 22, 23] * 8
    truth = hf_greedy(tiny_model, prompt, 40)
    cfg = GenerationConfig(max_new_tokens=40, draft=DraftConfig(max_draft=3))
    plain = gen.generate(prompt, cfg, forced_drafts=truth)
    own_chars = {s.text[-1] for s in plain.spans if not s.drafted and s.text}
    stop = sorted(own_chars)[0] + "\x7f never written"
    result = gen.generate(prompt, replace(cfg, stop_strings=(stop,)), forced_drafts=truth)
    assert result.token_ids == truth
    # one character per token here: each character's highlight is its token's kind
    by_char = [s.drafted for s in result.spans for _ in s.text]
    by_token = [s.drafted for s in result.spans for _ in s.token_ids]
    assert "".join(s.text for s in result.spans) == result.text == plain.text
    assert by_char == by_token


def test_drafts_accepted_after_eos_are_not_counted(tiny_model, tiny_tokenizer):
    prompt = [9, 10, 11, 12, 13] * 6
    free = hf_greedy(tiny_model, prompt, 40, eos=())
    # the EOS: the first token from the fourth on that the model has not written before
    cut = next(i for i in range(3, 16) if free[i] not in free[:i])
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[free[cut]])
    # the forced draft runs past the EOS: the model accepts all 16, the output ends at the EOS
    result = gen.generate(prompt, GenerationConfig(max_new_tokens=40, draft=DraftConfig(max_draft=16)),
                          forced_drafts=free)
    assert result.token_ids == free[:cut + 1] and result.stats.stop_reason == "eos"
    s = result.stats
    kept = sum(len(sp.token_ids) for sp in result.spans if sp.drafted)
    assert s.accepted_tokens == kept == cut
    assert s.accepted_lengths == {cut: 1} and s.accepted_per_step == [cut]
    assert s.new_tokens == len(result.token_ids) == cut + 1


def test_speed_figures_match_a_clock_outside_the_engine(tiny_model, tiny_tokenizer, monkeypatch):
    """The prefill is counted once: seconds, decode_seconds and tokens/s agree with the wall
    clock of consuming the stream (a slow prefill made decode_seconds include it too).

    Machine-independent: the prefill is held for a whole second, and every check allows half of
    it, so counting the prefill twice (or not at all) fails on any machine, while a slow or busy
    machine's decoding and the work outside the engine's clock do not."""
    import time

    from ragspec.decoding import engine

    real_forward = engine.forward
    prefill_pause = 1.0
    margin = prefill_pause / 2

    def slow_prefill(model, ids, cache, logits_to_keep=0):
        if logits_to_keep == 1:  # only the prefill keeps one row of logits
            time.sleep(prefill_pause)
        return real_forward(model, ids, cache, logits_to_keep)

    monkeypatch.setattr(engine, "forward", slow_prefill)
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[-1])
    started = time.perf_counter()
    result = gen.generate([9, 10, 11, 12, 13] * 6, GenerationConfig(max_new_tokens=24))
    wall = time.perf_counter() - started
    s = result.stats
    assert s.prefill_seconds >= prefill_pause
    assert s.decode_seconds <= wall - s.prefill_seconds + margin, \
        "the prefill was counted in the decode time"
    assert s.seconds <= wall and wall - s.seconds < margin
    assert s.new_tokens / wall <= s.tokens_per_s < s.new_tokens / (wall - margin)


@pytest.mark.parametrize("kernels", [True, False], ids=["native-argmax", "torch-argmax"])
def test_the_cpu_accept_rule_is_the_device_rule(kernels, monkeypatch):
    """CPU steps read the rows' picks as ints and compare in Python; other devices run tensor
    ops and one transfer. Both must accept the same drafts and write the same token."""
    from conftest import MODEL_CACHE

    from ragspec.decoding import native

    if kernels:
        native.ops(MODEL_CACHE)
    else:
        monkeypatch.setattr(native, "loaded", lambda: False)
    rng = random.Random(7)
    gen = torch.Generator().manual_seed(7)
    seen = set()
    for trial in range(300):
        rows = rng.randrange(1, 10)
        logits = torch.randn(rows, rng.choice([5, 49, 4099]), generator=gen)
        if trial % 5 == 0:
            logits[:, 1] = logits[:, 3] = logits.max() + 1  # ties: the first index is the pick
        best = logits.argmax(-1).tolist()
        agree = rng.randrange(0, rows)  # the draft agrees with the first `agree` picks
        draft = best[:agree] + [(b + 1) % logits.shape[1] for b in best[agree:rows - 1]]
        want = sampling_mod.accept_greedy_on_device(logits, draft)
        assert sampling_mod.accept_greedy(logits, draft) == want == (agree, best[agree])
        seen.add(agree == rows - 1)
    assert seen == {True, False}, "both a fully accepted draft and a rejection"
    row = torch.randn(4099, generator=gen)
    assert sampling_mod.next_token(row, SamplingConfig(), None) == int(row.argmax())
