"""Batched speculative steps against their oracle: every request run alone with the
single-sequence engine (tiny random models)."""

from __future__ import annotations

import time

import pytest
from conftest import FAMILIES, make_family_model
from test_engine import prompts

from ragspec.decoding.cache import new_cache
from ragspec.decoding.engine import Generator, forward
from ragspec.decoding.ragged import PACKABLE_FAMILIES, Block, packed_forward, packing_problem
from ragspec.decoding.scheduler import QueueFull, Scheduler
from ragspec.decoding.types import DraftConfig, GenerationConfig

DRAFTS = [DraftConfig(), DraftConfig(adaptive=False, max_draft=8), DraftConfig(enabled=False),
          DraftConfig(adaptive=False, min_ngram=2, max_ngram=2, max_draft=3)]


def _requests(vocab: int, count: int, seed: int = 0):
    """Prompts of different lengths (half repetitive, so drafts get accepted), each with its own
    answer length and draft settings."""
    return [(prompt, GenerationConfig(max_new_tokens=24 + 5 * (i % 5), draft=DRAFTS[i % len(DRAFTS)]))
            for i, prompt in enumerate(prompts(vocab, count, seed=seed))]


def _run_batched(gen, requests, **kwargs):
    scheduler = Scheduler(gen, **kwargs)
    try:
        handles = [scheduler.submit(p, c) for p, c in requests]
        return [h.result() for h in handles], scheduler
    finally:
        scheduler.close()


def test_packed_forward_gives_each_block_the_logits_of_its_own_forward(tiny_model):
    a, b, c = list(range(3, 40)), list(range(10, 15)), [5, 6, 7, 5, 6, 7, 5]
    alone = [new_cache(tiny_model) for _ in range(3)]
    packed = [new_cache(tiny_model) for _ in range(3)]
    want = [forward(tiny_model, a, alone[0]), forward(tiny_model, b, alone[1]),
            forward(tiny_model, c[:3], alone[2])]
    got = packed_forward(tiny_model, [Block(packed[0], a, 0, "all"), Block(packed[1], b, 0, "last"),
                                      Block(packed[2], c[:3], 0, "none")])
    assert got[0].shape == want[0].shape and got[1].shape == (1, want[1].shape[-1])
    assert got[2] is None
    assert (got[0] - want[0]).abs().max() < 1e-4
    assert (got[1][0] - want[1][-1]).abs().max() < 1e-4
    # a second step: decode rows of different lengths on top of the caches
    want = [forward(tiny_model, [7, 8, 9], alone[0]), forward(tiny_model, c[3:], alone[2]),
            forward(tiny_model, [4], alone[1])]
    got = packed_forward(tiny_model, [Block(packed[0], [7, 8, 9], len(a)),
                                      Block(packed[2], c[3:], 3), Block(packed[1], [4], len(b))])
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and (g - w).abs().max() < 1e-4
    assert [x.get_seq_length() for x in packed] == [x.get_seq_length() for x in alone]


@pytest.mark.parametrize("max_active,prefill_chunk", [(4, 7), (12, None), (1, 5), (3, None)])
def test_batched_greedy_output_equals_each_request_run_alone(tiny_model, tiny_tokenizer,
                                                            max_active, prefill_chunk):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    requests = _requests(len(tiny_tokenizer), 12, seed=5)
    want = [gen.generate(p, c) for p, c in requests]
    got, scheduler = _run_batched(gen, requests, max_active=max_active,
                                  prefill_chunk=prefill_chunk)
    assert scheduler.packed
    for (prompt, _), g, w in zip(requests, got, want, strict=True):
        assert g.token_ids == w.token_ids, f"prompt {prompt}"
        assert g.text == w.text
        assert [t for s in g.spans for t in s.token_ids] == g.token_ids
    # drafts both accepted and rejected (each rejection crops one sequence's own cache)
    assert sum(g.stats.accepted_tokens for g in got) > 0
    assert sum(g.stats.drafted_tokens - g.stats.accepted_tokens for g in got) > 100
    if max_active > 1:  # fewer steps than the requests' forwards one after another
        assert scheduler.steps < sum(g.stats.forward_passes + 1 for g in got)


def test_drafted_spans_keep_their_origin_in_a_batch(tiny_model, tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    requests = [(p, GenerationConfig(max_new_tokens=40, draft=DraftConfig(adaptive=False)))
                for p in prompts(len(tiny_tokenizer), 8, seed=3)]
    got, _ = _run_batched(gen, requests, max_active=8)
    checked = 0
    for (prompt, _), result in zip(requests, got, strict=True):
        full = prompt + result.token_ids
        at = len(prompt)
        for span in result.spans:
            if span.drafted:
                pos = span.origin.position
                assert full[pos:pos + len(span.token_ids)] == span.token_ids
                checked += 1
            at += len(span.token_ids)
    assert checked > 0


@pytest.mark.parametrize("family", sorted(PACKABLE_FAMILIES))
def test_every_packable_family_batches_to_its_solo_output(tiny_tokenizer, family):
    model = make_family_model(family, len(tiny_tokenizer))
    from ragspec.decoding.attention import install

    install(model)
    assert packing_problem(model) is None
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[2])
    # prompts longer than the sliding window of the families that have one
    requests = [(p * 3, c) for p, c in _requests(len(tiny_tokenizer), 5, seed=11)]
    want = [gen.generate(p, c).token_ids for p, c in requests]
    got, _ = _run_batched(gen, requests, max_active=5, prefill_chunk=16)
    assert [g.token_ids for g in got] == want


@pytest.mark.parametrize("family", ["gemma2", "gpt2", "mamba"])
def test_a_family_that_cannot_be_packed_is_interleaved_with_the_same_output(tiny_tokenizer,
                                                                            family):
    from ragspec.decoding.attention import install
    from ragspec.decoding.cache import rollback_problem

    model = make_family_model(family, len(tiny_tokenizer))
    install(model)
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[2],
                    speculation_off_reason=rollback_problem(model))
    requests = _requests(len(tiny_tokenizer), 4, seed=2)
    want = [gen.generate(p, c).token_ids for p, c in requests]
    got, scheduler = _run_batched(gen, requests, max_active=4, prefill_chunk=16)
    assert scheduler.packing_problem and family in scheduler.packing_problem
    assert [g.token_ids for g in got] == want


def test_families_outside_the_checked_list_are_not_packed(tiny_tokenizer):
    assert "gemma2" in FAMILIES and "gemma2" not in PACKABLE_FAMILIES
    model = make_family_model("gpt_neox", len(tiny_tokenizer))
    assert "gpt_neox" in packing_problem(model)


def test_a_cancelled_request_leaves_within_one_step(tiny_model, tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[10**6])  # never ends by itself
    scheduler = Scheduler(gen, max_active=2)
    try:
        config = GenerationConfig(max_new_tokens=900, draft=DraftConfig(enabled=False))
        keep = scheduler.submit(list(range(3, 30)), config)
        leave = scheduler.submit(list(range(5, 40)), config)
        spans = iter(leave)
        next(spans)
        leave.cancel()
        at = scheduler.steps
        assert leave.done.wait(10)
        assert scheduler.steps <= at + 1
        assert leave.error_kind == "cancelled"
        assert scheduler.load()["active"] == 1 and not keep.done.is_set()
        keep.stop()  # stop keeps what was written
        result = keep.result()
        assert result.stats.stop_reason == "stopped" and result.token_ids
    finally:
        scheduler.close()


def test_a_full_queue_refuses_and_an_invalid_request_fails_alone(tiny_model, tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[10**6])  # never ends by itself
    scheduler = Scheduler(gen, max_active=1, max_waiting=1)
    try:
        long = GenerationConfig(max_new_tokens=500, draft=DraftConfig(enabled=False))
        first = scheduler.submit([5, 6, 7], long)
        deadline = time.monotonic() + 10
        while scheduler.load()["active"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        second = scheduler.submit([5, 6, 7], long)
        with pytest.raises(QueueFull):
            scheduler.submit([5, 6, 7], long)
        first.cancel()
        second.cancel()
        assert second.done.wait(10)
        too_long = scheduler.submit([5] * 1000, GenerationConfig(max_new_tokens=100))
        assert too_long.done.wait(30)
        assert too_long.error_kind == "invalid" and "context" in too_long.error
    finally:
        scheduler.close()


def test_an_idle_scheduler_thread_ends_and_a_new_request_starts_it_again(tiny_model,
                                                                       tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    scheduler = Scheduler(gen, idle_exit_s=0.05)
    try:
        config = GenerationConfig(max_new_tokens=8)
        first = scheduler.submit([5, 6, 7, 8], config).result()
        deadline = time.monotonic() + 10
        while scheduler._thread is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert scheduler._thread is None
        assert scheduler.submit([5, 6, 7, 8], config).result().token_ids == first.token_ids
    finally:
        scheduler.close()


def test_what_a_sequence_learns_goes_back_to_the_generators_policy(tiny_model, tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    config = GenerationConfig(max_new_tokens=40, draft=DraftConfig(adaptive=False))
    shared = gen.policy_for(config).acceptance
    before = sum(map(sum, shared.accepted)) + sum(map(sum, shared.rejected))
    results, _ = _run_batched(gen, [(p, config) for p in prompts(len(tiny_tokenizer), 4)])
    after = sum(map(sum, shared.accepted)) + sum(map(sum, shared.rejected))
    drafted_steps = sum(sum(r.stats.accepted_lengths.values()) for r in results)
    assert drafted_steps > 0 and after > before


def test_lone_decode_steps_feed_the_engines_cost_watch(tiny_model, tiny_tokenizer):
    from ragspec.decoding.policy import ForwardCost

    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[10**6],
                    cost=ForwardCost.flat(17))
    config = GenerationConfig(max_new_tokens=30)
    _run_batched(gen, [(list(range(5, 30)), config)])
    alone = sum(len(v) for v in gen.watch._samples.values())
    assert alone >= 20  # one sample per decode step of the lone sequence
    gen.watch.reset()
    _run_batched(gen, [(list(range(5, 30)), config), (list(range(6, 40)), config)],
                 prefill_chunk=1000)
    # steps shared by two sequences are not what the curve measures
    assert sum(len(v) for v in gen.watch._samples.values()) <= 5


def test_a_request_read_to_its_end_can_be_read_again_without_blocking(tiny_model,
                                                                     tiny_tokenizer):
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    scheduler = Scheduler(gen)
    try:
        request = scheduler.submit([5, 6, 7, 8], GenerationConfig(max_new_tokens=6))
        spans = list(request)
        assert list(request) == [] and request.drain() == ([], True)
        assert request.result().spans == spans  # result() after iterating: no wait
    finally:
        scheduler.close()


def test_step_times_count_prompts_decodes_and_the_decodes_that_waited_for_a_prompt(tiny_model,
                                                                                  tiny_tokenizer):
    from ragspec.decoding.batch import BatchSequence, StepTimes, batch_step

    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[])
    (p1, c1), (p2, c2) = _requests(tiny_model.config.vocab_size, 2)
    times = StepTimes()
    first = BatchSequence(gen, p1, c1)
    batch_step(gen, [first], times=times)  # its prompt alone: nothing decodes yet
    assert times.steps == 1 and times.prefill_seconds > 0 and times.stalled_seconds == 0
    assert times.decode_steps == 0
    second = BatchSequence(gen, p2, c2)
    batch_step(gen, [first, second], times=times)  # the first decodes after the second's prompt
    assert times.steps == 2 and times.decode_steps == 1 and times.decode_sequences == 1
    assert times.decode_rows >= 1 and times.decode_seconds > 0
    assert 0 < times.stalled_seconds <= times.prefill_seconds
    batch_step(gen, [first, second], times=times)  # both decode, no prompt
    assert times.decode_steps == 2 and times.decode_sequences == 3
    scheduler = Scheduler(gen)
    try:
        scheduler.submit(p1, c1).result()
        steps = scheduler.load()["steps"]
    finally:
        scheduler.close()
    assert steps["steps"] == scheduler.steps and steps["decode_steps"] > 0


def test_every_batched_draft_enters_its_generations_governor(tiny_model, tiny_tokenizer,
                                                             monkeypatch):
    from ragspec.decoding.policy import DraftGovernor

    seen = []
    original = DraftGovernor.record

    def record(self, drafted, accepted, context=None, seconds=None):
        if drafted > 0:
            seen.append((drafted, accepted))
        return original(self, drafted, accepted, context, seconds)

    monkeypatch.setattr(DraftGovernor, "record", record)
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])
    config = GenerationConfig(max_new_tokens=40)
    results, _ = _run_batched(gen, [(p, config) for p in prompts(len(tiny_tokenizer), 6)])
    drafted_steps = sum(sum(r.stats.accepted_lengths.values()) for r in results)
    assert drafted_steps > 0 and len(seen) == drafted_steps
