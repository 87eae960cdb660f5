"""The draft-length policy: expected tokens per second decides, and it learns from outcomes."""

from decoding.ngram import Match
from decoding.policy import AcceptanceModel, DraftPolicy, ForwardCost, expected_tokens
from decoding.types import DraftConfig

# This CPU's shape (design.md): 1 -> 65 ms, 4 -> 115, 8 -> 135, 16 -> 160.
CPU = ForwardCost([0.065, 0.08, 0.1, 0.115, 0.12, 0.125, 0.13, 0.135] + [0.14 + 0.0025 * i for i in range(9)])
FLAT = ForwardCost.flat(17)


def match(extended, available=16):
    return Match(n=min(extended, 4), extended=extended, origin=0, tokens=list(range(available)))


def brute_best(rate, cost, limit):
    options = [(1 / cost(1), 0)] + [(expected_tokens(rate, k) / cost(k + 1), k) for k in range(1, limit + 1)]
    return max(options)[1]


def test_choice_maximises_expected_tokens_per_second():
    for extended in (1, 2, 3, 5, 9, 20, 40):
        for cost in (CPU, FLAT):
            policy = DraftPolicy(DraftConfig(), cost)
            rate = policy.acceptance.rate(extended)
            assert policy.choose(match(extended), 100) == brute_best(rate, cost, 16)


def test_weak_single_token_match_gets_at_most_one_token_on_a_steep_cost_curve():
    # transformers' prompt lookup drafts 10 tokens on a lone repeated token; that is its loss.
    policy = DraftPolicy(DraftConfig(), CPU)
    assert policy.choose(match(1), 100) <= 1
    steeper = ForwardCost([0.065 * (1 + 0.4 * i) for i in range(17)])
    assert DraftPolicy(DraftConfig(), steeper).choose(match(1), 100) == 0


def test_long_quoting_match_gets_a_long_draft():
    policy = DraftPolicy(DraftConfig(), CPU)
    assert policy.choose(match(40), 100) >= 8


def test_flat_cost_drafts_whatever_matches():
    policy = DraftPolicy(DraftConfig(), FLAT)
    assert policy.choose(match(1), 100) > 0


def test_never_drafts_past_the_token_budget_or_the_match():
    policy = DraftPolicy(DraftConfig(adaptive=False), CPU)
    assert policy.choose(match(40, available=16), 5) == 4  # 4 drafts + the model's token = 5
    assert policy.choose(match(40, available=3), 100) == 3
    assert policy.choose(match(40), 1) == 0
    assert policy.choose(None, 100) == 0


def test_rejections_shrink_drafts_and_acceptances_grow_them():
    policy = DraftPolicy(DraftConfig(), CPU)
    before = policy.choose(match(5), 100)
    for _ in range(30):
        policy.observe(match(5), drafted=8, accepted=0)
    assert policy.choose(match(5), 100) < max(before, 1)
    keen = DraftPolicy(DraftConfig(), CPU)
    for _ in range(30):
        keen.observe(match(2), drafted=8, accepted=8)
    assert keen.choose(match(2), 100) >= before


def test_acceptance_prior_grows_with_evidence():
    model = AcceptanceModel()
    rates = [model.rate(e) for e in (1, 2, 4, 9, 30)]
    assert rates == sorted(rates) and rates[0] < 0.5 < rates[-1]


def test_forward_cost_learns_online_and_extrapolates():
    cost = ForwardCost([1.0, 2.0])
    cost.observe(1, 3.0)
    assert 1.0 < cost(1) < 3.0
    assert cost(4) > cost(2)
