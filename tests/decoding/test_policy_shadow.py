"""The policy learns from proposals it declined, and keeps the evidence of passage copies,
self-repetition and word-variant copies apart."""

from dataclasses import replace

from ragspec.decoding import draftsim
from ragspec.decoding.ngram import Match
from ragspec.decoding.policy import DraftPolicy, DraftShadow, ForwardCost, evidence_class
from ragspec.decoding.types import DraftConfig

# a machine measured under heavy load: every extra row costs nearly a whole step
BUSY = ForwardCost([0.02 * (1 + 0.96 * n) for n in range(17)])


def quoting(extended=40, own=False, kind="suffix"):
    return Match(n=4, extended=extended, origin=0, tokens=list(range(100, 116)), kind=kind,
                 own=own)


def test_a_declined_verbatim_copy_is_learnt_from_and_then_drafted():
    policy = DraftPolicy(DraftConfig(), BUSY)
    m = quoting()
    assert policy.choose(m, 100) == 0  # the prior alone says "too dear" on this curve
    shadow = DraftShadow(policy)
    for _ in range(40):  # the model writes the proposal's tokens, step after step
        shadow.follow(m)
        for token in m.tokens[: DraftShadow.length]:
            shadow.push(token)
    assert policy.choose(m, 100) > 0


def test_a_declined_proposal_the_model_did_not_write_teaches_rejection():
    policy = DraftPolicy(DraftConfig(), ForwardCost.flat(17))
    m = quoting(extended=3)
    before = policy.acceptance.rate(3, 0)
    shadow = DraftShadow(policy)
    for _ in range(10):
        shadow.follow(m)
        shadow.push(999)  # not the proposal's first token
    assert policy.acceptance.rate(3, 0) < before / 2


def test_evidence_classes_are_kept_apart():
    assert [evidence_class(quoting()), evidence_class(quoting(own=True)),
            evidence_class(quoting(kind="variant"))] == [0, 1, 2]
    policy = DraftPolicy(DraftConfig(), ForwardCost.flat(17))
    for _ in range(30):  # the answer's own repetitions keep failing
        policy.observe(quoting(extended=5, own=True), 4, 0)
    a = policy.acceptance
    assert a.rate(5, 0, cls=1) < 0.2
    assert a.rate(5, 0, cls=0) == a.rate(5, 0, cls=2) == a.prior(a.bucket(5))


def test_replay_of_a_verbatim_copy_on_a_busy_curve_drafts_only_when_learning_from_declines():
    prompt = [(7 * i + 3) % 97 + 3 for i in range(120)]  # no repeats inside the passage
    truth = prompt[20:100]  # the answer quotes it verbatim
    cfg = replace(DraftConfig(), variants=False)
    drafted = {}
    for learn in (False, True):
        w = draftsim.walk(prompt, truth, BUSY, cfg, DraftPolicy(cfg, BUSY), occurrences=8,
                          learn_declined=learn)
        drafted[learn] = sum(s.drafted for s in w.steps)
        if learn:
            assert w.seconds < draftsim.plain_seconds(truth, BUSY)
    assert drafted[False] == 0 and drafted[True] > 0
