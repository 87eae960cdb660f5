"""The draft-length policy: expected tokens per second decides, and it learns from outcomes."""

from ragspec.decoding.ngram import Match
from ragspec.decoding.policy import AcceptanceModel, DraftPolicy, ForwardCost, expected_tokens
from ragspec.decoding.types import DraftConfig

# This CPU's shape (design.md): 1 -> 65 ms, 4 -> 115, 8 -> 135, 16 -> 160.
CPU = ForwardCost([0.065, 0.08, 0.1, 0.115, 0.12, 0.125, 0.13, 0.135] + [0.14 + 0.0025 * i for i in range(9)])
FLAT = ForwardCost.flat(17)


def match(extended, available=16):
    return Match(n=min(extended, 4), extended=extended, origin=0, tokens=list(range(available)))


def brute_best(rates, cost, limit):
    """Enumerate k; expected tokens summed term by term from the per-position rates."""
    best, best_k = 1 / cost(1), 0
    for k in range(1, limit + 1):
        tokens, reach = 1.0, 1.0
        for i in range(k):
            reach *= rates[i]
            tokens += reach
        if tokens / cost(k + 1) > best:
            best, best_k = tokens / cost(k + 1), k
    return best_k


def test_choice_maximises_expected_tokens_per_second():
    for extended in (1, 2, 3, 5, 9, 20, 40):
        for cost in (CPU, FLAT):
            policy = DraftPolicy(DraftConfig(), cost)
            rates = [policy.acceptance.rate(extended, i) for i in range(16)]
            assert policy.choose(match(extended), 100) == brute_best(rates, cost, 16)


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


def test_acceptance_prior_grows_with_evidence_and_along_the_draft():
    model = AcceptanceModel()
    rates = [model.rate(e) for e in (1, 2, 4, 9, 30)]
    assert rates == sorted(rates) and rates[0] < 0.5 < rates[-1]
    along = [model.rate(1, i) for i in range(6)]
    assert along == sorted(along) and along[0] < along[-1]


def test_outcomes_update_the_position_they_happened_at():
    model = AcceptanceModel()
    before = [model.rate(3, i) for i in range(3)]
    model.observe(3, drafted=5, accepted=1)  # token 0 accepted, token 1 rejected
    assert model.rate(3, 0) > before[0]
    assert model.rate(3, 1) < before[1]
    assert model.rate(3, 2) == before[2]


def test_expected_tokens_matches_the_geometric_sum_for_a_constant_rate():
    assert abs(expected_tokens(0.5, 3) - (1 + 0.5 + 0.25 + 0.125)) < 1e-12
    assert expected_tokens([0.5, 1.0], 3) == 1 + 0.5 + 0.5 + 0.5
