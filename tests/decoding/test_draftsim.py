"""The offline replay of drafting against the engine itself, and its accounting of misses."""

from __future__ import annotations

import random

from ragspec.decoding import draftsim
from ragspec.decoding.engine import Generator
from ragspec.decoding.policy import DraftGovernor, DraftPolicy, ForwardCost
from ragspec.decoding.types import DraftConfig, GenerationConfig

STEEP = ForwardCost([0.0225 * (1 + 0.11 * n) for n in range(17)])


def repetitive_prompts(vocab: int, count: int, seed: int = 3):
    rng = random.Random(seed)
    for _ in range(count):
        base = [rng.randrange(3, vocab) for _ in range(rng.randrange(4, 9))]
        yield (base * 8)[: rng.randrange(30, 60)]


def test_replay_takes_exactly_the_engines_steps(tiny_model, tiny_tokenizer):
    # the same policy state and cost on both sides: the replay must verify the same drafts
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[], cost=STEEP)
    gen.pace = None  # the replay has no step times: both governors judge by the curve
    cfg = GenerationConfig(max_new_tokens=40, draft=DraftConfig())
    compared = 0
    for prompt in repetitive_prompts(len(tiny_tokenizer), 12):
        state = gen.policy_state()
        result = gen.generate(prompt, cfg)
        if result.stats.stop_reason != "max_new_tokens":
            continue
        after = gen.policy_state()
        gen.restore_policy_state(state)
        policy = gen.policy_for(cfg)
        w = draftsim.walk(prompt, result.token_ids, STEEP, cfg.draft, policy,
                          governor=DraftGovernor(STEEP), occurrences=cfg.draft.occurrences,
                          keys=gen.word_keys)
        gen.restore_policy_state(after)
        assert w.forwards == result.stats.forward_passes
        assert sum(s.accepted for s in w.steps) == result.stats.accepted_tokens
        assert sum(s.drafted for s in w.steps) == result.stats.drafted_tokens
        compared += 1
    assert compared >= 6


def test_longest_copies_separate_a_new_quotation_from_a_continued_one():
    seq = [1, 2, 3, 4, 5, 9, 7, 8]
    # 7 8 is followed by nothing earlier; "3 4 5" is in the context but not after an 8
    assert draftsim.longest_copies(seq, [3, 4, 5, 6]) == (3, 0)
    # after "... 2" the copy "3 4 5" is reachable through the last token
    assert draftsim.longest_copies([1, 2, 3, 4, 5, 2], [3, 4, 5, 6]) == (3, 3)
    assert draftsim.longest_copies(seq, [6]) == (0, 0)


def test_missed_tokens_are_split_by_cause():
    step = draftsim.StepTrace(pos=1, drafted=2, accepted=1, best_any=9, best_suffix=6,
                              proposed=4, matched=True, seconds=0.0)
    assert step.cause == "quote_start"  # 3 to the quote start, 2 to the place, 3 to length
    w = draftsim.Walk([step, draftsim.StepTrace(2, 0, 0, 0, 0, 0, False, 0.0)])
    s = w.summary()
    assert (s["missed_quote_start"], s["missed_wrong_place"], s["missed_too_short"],
            s["wasted"], s["steps_not_in_context"], s["steps_quote_start"],
            s["steps_rejected"]) == (3, 2, 3, 1, 1, 1, 1)


def test_the_governor_keeps_a_badly_drafting_answer_near_plain_cost():
    # a prompt full of one repeated pattern, an answer that never follows it: every proposal
    # is wrong; ungoverned drafting pays for each rejection, the governor stops paying
    prompt = [5, 6, 7, 8] * 30
    rng = random.Random(1)
    truth = [5]
    for _ in range(80):  # never the prompt's successor: 5 -> 6 -> 7 -> 8 -> 5
        truth.append(rng.choice([t for t in (5, 6, 7, 8) if t != 5 + (truth[-1] - 4) % 4]))
    cfg = DraftConfig(adaptive=False, max_draft=8)
    free = draftsim.walk(prompt, truth, STEEP, cfg, DraftPolicy(cfg, STEEP))
    gov = DraftGovernor(STEEP, budget=1.0, max_resumes=2)
    governed = draftsim.walk(prompt, truth, STEEP, cfg, DraftPolicy(cfg, STEEP), governor=gov)
    plain = draftsim.plain_seconds(truth, STEEP)
    assert free.seconds > 1.2 * plain
    assert governed.seconds <= plain + 3 * 1.0 * STEEP(1) + 1e-9
    assert [s.accepted for s in free.steps] and gov.suspended


def test_oracle_and_plain_costs():
    truth = list(range(40))
    assert abs(draftsim.plain_seconds(truth, STEEP) - 39 * STEEP(1)) < 1e-12
    assert abs(draftsim.oracle_seconds(truth, STEEP, 16) - (2 * STEEP(17) + STEEP(5))) < 1e-12
    rate = DraftPolicy(DraftConfig(), STEEP)
    assert rate.choose(None, 10) == 0
