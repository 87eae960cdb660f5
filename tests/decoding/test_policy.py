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


def test_choice_at_a_context_maximises_along_the_curve_taken_there():
    near = [0.005 * (1 + 0.1 * n) for n in range(17)]
    far = [0.007 * (1 + 0.25 * n) for n in range(17)]
    cost = ForwardCost(near, context=256, far=far, far_context=1024)
    for context in (0, 256, 700, 1024, 3000):
        assert cost.curve(17, context) == [cost(n, context) for n in range(1, 18)]
        assert cost.curve(20, context) == [cost(n, context) for n in range(1, 21)]
        for extended in (1, 3, 9, 40):
            policy = DraftPolicy(DraftConfig(), cost)
            rates = [policy.acceptance.rate(extended, i) for i in range(16)]
            want = brute_best(rates, lambda n, at=context: cost(n, at), 16)
            assert policy.choose(match(extended), 100, context) == want


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


# -- the governor: what drafts may lose to plain decoding in one generation --------------------

# this project's CPU, measured quiet (bundled 135M, 800 cached tokens): c(1) 22.5 ms .. c(16) 92.6
STEEP = ForwardCost([0.0225, 0.0243, 0.0274, 0.0306, 0.036, 0.0415, 0.0471, 0.0527, 0.0577,
                     0.0627, 0.0677, 0.0727, 0.0776, 0.0826, 0.0876, 0.0926, 0.0976])


def lost_plain_steps(cost, drafted, accepted):
    return (cost(drafted + 1) - (accepted + 1) * cost(1)) / cost(1)


def test_governor_bounds_the_loss_of_a_generation_whose_drafts_all_fail():
    from ragspec.decoding.policy import DraftGovernor

    for budget, resumes in ((1.0, 0), (1.0, 2), (2.5, 1)):
        gov = DraftGovernor(STEEP, budget=budget, max_resumes=resumes)
        lost, verified_steps = 0.0, 0
        for _ in range(400):
            k = gov.limit(8)
            if k:
                verified_steps += 1
                gov.record(k, 0)
                lost += lost_plain_steps(STEEP, k, 0)
            else:
                # the shadowed proposal would have been right: it brings drafting back
                gov.shadow([5, 6])
                gov.push(5)
                gov.push(6)
        assert lost <= (1 + resumes) * budget + 1e-9
        assert gov.resumes == resumes and gov.suspended
        assert verified_steps < 400


def test_governor_falls_back_within_a_few_tokens_and_learns_back_from_shadow():
    from ragspec.decoding.policy import DraftGovernor

    gov = DraftGovernor(STEEP, budget=1.0)
    assert gov.limit(16) < 16  # a 16-token miss would lose 3.3 plain steps: cut to fit
    steps = 0
    while gov.limit(8):
        gov.record(gov.limit(8) if not gov.suspended else 0, 0)
        steps += 1
        assert steps < 10
    assert gov.suspended and steps <= 3
    gov.shadow([1, 2, 3])
    gov.push(1)
    assert gov.suspended  # not settled before the proposal is decided
    gov.push(9)  # one of three would have been right: a small gain, the ledger still over 0
    assert gov.suspended
    gov.shadow([4, 5, 6, 7])
    for t in (4, 5, 6, 7):
        gov.push(t)
    assert not gov.suspended and gov.ledger == 0.0 and gov.resumes == 1


def test_governor_never_suspends_drafts_that_pay():
    from ragspec.decoding.policy import DraftGovernor

    gov = DraftGovernor(STEEP, budget=0.5)
    lengths = []
    for _ in range(200):
        k = gov.limit(6)
        lengths.append(k)
        gov.record(k, k - 1)  # all but the last accepted: k tokens for c(k+1)
    # at first only what a total miss could lose within the budget; once gains are banked, all
    assert 0 < lengths[0] < 6 and set(lengths[3:]) == {6}
    assert gov.ledger == -gov.credit and gov.suspensions == 0


def test_governor_counts_drafts_in_measured_time_against_the_live_pace_of_plain_steps():
    from ragspec.decoding.policy import DraftGovernor, StepPace

    def verified_steps(pace, plain_seconds, draft_seconds, accepted=1):
        gov = DraftGovernor(STEEP, budget=1.0, max_resumes=0, pace=pace)
        for _ in range(5):
            gov.record(0, 0, None, plain_seconds)  # plain steps set the pace
        steps = 0
        while steps < 200 and gov.limit(2):
            gov.record(2, accepted, None, draft_seconds)
            steps += 1
        return steps

    # by the curve a 2-token draft with one accepted pays (c(3) = 1.22 c(1) for 2 tokens), but
    # here it takes 2.3 plain steps: measured, it loses 0.3 a step and drafting stops soon
    plain = STEEP(1)
    assert verified_steps(None, plain, 2.3 * plain) == 200  # the curve alone never stops it
    assert verified_steps(StepPace(), plain, 2.3 * plain) <= 5
    # a busy machine slows plain steps and verifies alike: no loss, drafting goes on
    assert verified_steps(StepPace(), 2 * plain, 2 * STEEP(3)) == 200
    # too few plain steps seen to know the pace: the curve decides
    assert verified_steps(StepPace(min_samples=10), plain, 2.3 * plain) == 200


def test_the_policy_prices_verifies_at_the_live_correction_of_the_curve():
    from ragspec.decoding.policy import StepPace

    pace = StepPace()
    policy = DraftPolicy(DraftConfig(), STEEP, pace)
    plain = STEEP(1)
    for _ in range(8):
        pace.observe(2 * plain, plain)  # a busy machine: twice the curve, plain and verify alike
        pace.observe_verify(2 * STEEP(3), STEEP(3))
    assert pace.verify_correction() == 1.0
    rates = [policy.acceptance.rate(2, i) for i in range(16)]
    assert policy.choose(match(2), 100) == brute_best(rates, STEEP, 16) > 0
    for _ in range(32):
        pace.observe_verify(1.4 * STEEP(3), STEEP(3))  # verifies 1.4x dearer than the curve
    assert abs(pace.verify_correction() - 1.4 / 2) < 1e-9  # the window holds the last 32
    pace.reset()
    for _ in range(8):
        pace.observe(plain, plain)
    for _ in range(8):
        pace.observe_verify(1.4 * STEEP(3), STEEP(3))
    assert abs(pace.verify_correction() - 1.4) < 1e-9
    dearer = ForwardCost([STEEP(1)] + [1.4 * STEEP(n) for n in range(2, 18)])
    shorter = 0
    for extended in (1, 2, 3, 5, 9, 20):
        rates = [policy.acceptance.rate(extended, i) for i in range(16)]
        k = policy.choose(match(extended), 100)
        assert k == brute_best(rates, dearer, 16)
        shorter += k < brute_best(rates, STEEP, 16)
    assert shorter >= 1
