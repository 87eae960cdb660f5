"""How many draft tokens to verify this step: expected tokens per second, not hope.

A verify forward over [last token + k draft tokens] costs c(k+1) seconds and yields the accepted
prefix plus one token of the model's own. If each draft token is accepted with probability a
(given the ones before it were), the step yields E(k) = 1 + a + a^2 + ... + a^k tokens. The policy
picks the k that maximises E(k) / c(k+1) and drafts nothing unless that beats 1 / c(1), the rate
of plain decoding. On a CPU c grows quickly with k (measured per machine: see ForwardCost), so
weak matches get short drafts or none; on a GPU at batch 1 c is nearly flat and long drafts pay
off.

The acceptance chances are estimated per evidence bucket — how far back the current match agrees
with the copied place (Match.extended); a long agreeing history means the model is quoting, a lone
repeated token means little — and per position in the draft, since a draft whose first tokens
were right is likely a real quotation. Each cell starts from a prior that grows with the evidence
and the position, then learns from the outcomes of this generator's drafts. So the rate is not
one a but a_0, a_1, ...: E(k) = 1 + a_0 + a_0·a_1 + ...

Three kinds of copy keep their evidence apart, since the same agreement means different things
for them: copies from the prompt's passages, copies from the answer's own earlier text (a model
repeating itself may stop at any point), and copies found under word variants (Match.kind
"variant": the place agreed only once spelling and case were set aside).

A proposal the policy (or the governor) declined is still learnt from: DraftShadow follows it
against the tokens the model then writes, and its outcome enters the estimates as a verified
draft's would. Without it a policy whose curve or priors say "too dear" never sees the copy that
would prove them wrong — a verbatim quotation on a busy machine would go undrafted throughout.

ForwardCost holds c(n) for n = 1..max tokens, measured once per model and device and cached
(ragspec.decoding.calibrate), at two context lengths: attention over the cached tokens makes a
forward dearer as the context grows, by more for more new tokens, so the policy uses the curve
at the current context (linear between and beyond the two measured ones). It is deliberately
not re-fitted from live timings: on a shared machine a burst of load bends the curve's shape,
while only its shape (c(k+1)/c(1)) matters here. One live correction is kept (StepPace): how
much dearer a real answer's verifies run, relative to its plain steps, than the curve says,
from the medians of recent steps of both kinds (a burst slows both alike); the policy prices
verifies with it, and the governor counts what drafts lost in measured time.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass, field

from ragspec.decoding.ngram import Match
from ragspec.decoding.types import DraftConfig

# Upper bounds (inclusive) of the evidence buckets over Match.extended. Bucket 0 holds the
# proposals with no agreeing history at all (the copy follower's skips past a replaced word).
_BUCKETS = (0, 1, 2, 3, 5, 8, 12, 20, 32, 10**9)
CLASSES = ("passage", "own", "variant")  # evidence kept apart (see the module docstring)


def evidence_class(match: Match) -> int:
    """Index into CLASSES of the evidence a match is judged by."""
    return 2 if match.kind == "variant" else 1 if match.own else 0
_SKIP_PRIOR = 0.25
_PRIOR_STRENGTH = 4.0


@dataclass
class ForwardCost:
    """seconds[n-1] = measured time of a forward over n new tokens (n = 1..len(seconds)) after
    `context` cached tokens; `far` the same after `far_context` ones (None: one context only)."""

    seconds: list[float]
    context: int = 0
    far: list[float] | None = None
    far_context: int = 0

    def __post_init__(self) -> None:
        for curve in (self.seconds, self.far if self.far is not None else [1.0]):
            if not curve or any(s <= 0 for s in curve):
                raise ValueError("ForwardCost needs a positive time for every n from 1 upwards")
        if self.far is not None and (len(self.far) != len(self.seconds)
                                     or self.far_context <= self.context):
            raise ValueError("the far curve needs as many sizes as the near one and a longer "
                             "context")

    @property
    def max_tokens(self) -> int:
        return len(self.seconds)

    @staticmethod
    def _point(curve: list[float], n: int) -> float:
        if n <= len(curve):
            return curve[n - 1]
        # beyond the measured range: extend with the last measured slope
        slope = (curve[-1] - curve[0]) / max(1, len(curve) - 1)
        return curve[-1] + slope * (n - len(curve))

    def __call__(self, n: int, context: int | None = None) -> float:
        near = self._point(self.seconds, n)
        if self.far is None or context is None:
            return near
        far = self._point(self.far, n)
        w = (context - self.context) / (self.far_context - self.context)
        return max(near + (far - near) * w, 0.5 * min(near, far))

    def curve(self, count: int, context: int | None = None) -> list[float]:
        """[c(1), ..., c(count)] at `context`, the values calling the curve n by n gives, in one
        pass (the policy reads it every step)."""
        if self.far is None or context is None or count > len(self.seconds):
            return [self(n, context) for n in range(1, count + 1)]
        w = (context - self.context) / (self.far_context - self.context)
        return [max(near + (far - near) * w, 0.5 * min(near, far))
                for near, far in zip(self.seconds[:count], self.far[:count], strict=True)]

    @classmethod
    def flat(cls, max_tokens: int) -> ForwardCost:
        """A cost curve for when nothing was measured: every forward costs the same."""
        return cls([1.0] * max_tokens)


_POSITIONS = 5  # draft positions 0..3 learned separately; 4 and beyond share one estimate
_ROWS = len(_BUCKETS) * len(CLASSES)
_DECAY = 0.85  # prior: each accepted draft token shrinks the chance of a rejection next by 15%


@dataclass
class AcceptanceModel:
    """Beta estimates of P(draft token i is accepted | tokens 0..i-1 were), per evidence class,
    evidence bucket and position i (rows: class-major, one per class and bucket). Measured on our development prompts, acceptance rises along a draft: after
    a weak one-token match, the first draft token was accepted 34% of the time but the third,
    given two accepted, 93% (the model had started quoting). A single rate per match would
    keep such drafts too short."""

    accepted: list[list[float]] = field(
        default_factory=lambda: [[0.0] * _POSITIONS for _ in range(_ROWS)])
    rejected: list[list[float]] = field(
        default_factory=lambda: [[0.0] * _POSITIONS for _ in range(_ROWS)])

    @staticmethod
    def bucket(extended: int, cls: int = 0) -> int:
        return cls * len(_BUCKETS) + bisect.bisect_left(_BUCKETS, extended)

    @staticmethod
    def prior(bucket: int, position: int = 0) -> float:
        # first token: e/(e+2) at the bucket's lower edge (1 -> 0.33, 2 -> 0.5, 4 -> 0.67, ...);
        # the miss chance then shrinks by _DECAY per accepted token. The same for every class:
        # only the outcomes tell the classes apart.
        bucket %= len(_BUCKETS)
        low = _BUCKETS[bucket - 1] + 1 if bucket else 0
        first = low / (low + 2.0) if low else _SKIP_PRIOR
        return 1.0 - (1.0 - first) * _DECAY ** min(position, _POSITIONS - 1)

    def rate(self, extended: int, position: int = 0, cls: int = 0) -> float:
        b, i = self.bucket(extended, cls), min(position, _POSITIONS - 1)
        a0 = self.prior(b, i) * _PRIOR_STRENGTH
        acc, rej = self.accepted[b][i], self.rejected[b][i]
        return (acc + a0) / (acc + rej + _PRIOR_STRENGTH)

    def observe(self, extended: int, drafted: int, accepted: int, cls: int = 0) -> None:
        b = self.bucket(extended, cls)
        for i in range(min(accepted, drafted)):
            self.accepted[b][min(i, _POSITIONS - 1)] += 1
        if accepted < drafted:
            self.rejected[b][min(accepted, _POSITIONS - 1)] += 1


def expected_tokens(rates: list[float] | float, k: int) -> float:
    """Tokens a step yields with k draft tokens: 1 + r0 + r0*r1 + ... (r_i: chance that draft
    token i is accepted given the ones before were); a float means the same rate throughout."""
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= rates if isinstance(rates, float) else rates[min(i, len(rates) - 1)]
        total += reach
    return total


class DraftPolicy:
    """Chooses each step's draft length; learns from what was accepted."""

    def __init__(self, config: DraftConfig, cost: ForwardCost, pace: StepPace | None = None):
        """pace: the generator's live step times; verifies are priced at the curve times its
        verify_correction (None: the curve as measured)."""
        self.config = config
        self.cost = cost
        self.pace = pace
        self.acceptance = AcceptanceModel()

    def choose(self, match: Match | None, remaining: int, context: int | None = None) -> int:
        """Number of draft tokens to verify, 0 for a plain step. remaining >= 1 new tokens left;
        context: tokens in the cache (the cost curve is taken there)."""
        if match is None or not match.tokens:
            return 0
        # the verify step always adds one token of the model's own: never pass max_new_tokens
        limit = min(len(match.tokens), self.config.max_draft, remaining - 1)
        if limit <= 0:
            return 0
        if not self.config.adaptive:
            return limit
        cls = evidence_class(match)
        rates = [self.acceptance.rate(match.extended, i, cls) for i in range(_POSITIONS)]
        costs = self.cost.curve(limit + 1, context)
        correction = self.pace.verify_correction() if self.pace is not None else 1.0
        if correction != 1.0:
            costs = [costs[0], *(c * correction for c in costs[1:])]
        best_k, best_rate = 0, 1.0 / costs[0]
        tokens, reach = 1.0, 1.0  # expected_tokens(rates, k), one k at a time
        for k in range(1, limit + 1):
            reach *= rates[min(k - 1, _POSITIONS - 1)]
            tokens += reach
            tokens_per_s = tokens / costs[k]
            if tokens_per_s > best_rate:
                best_k, best_rate = k, tokens_per_s
        return best_k

    def observe(self, match: Match, drafted: int, accepted: int) -> None:
        self.acceptance.observe(match.extended, drafted, accepted, evidence_class(match))


class DraftShadow:
    """Per generation: learn from proposals that were not verified. `follow` a declined
    proposal (one at a time, its first `length` tokens); `push` each token the generation
    writes; once the proposal is decided (a token differs, or all `length` agreed) the policy
    observes it as if it had been drafted. Exact: it only changes what the policy has learnt."""

    length = 4

    def __init__(self, policy: DraftPolicy):
        self.policy = policy
        self._pending: tuple[Match, int, int] | None = None  # match, length, agreed so far

    def follow(self, match: Match | None) -> None:
        if match is not None and match.tokens and self._pending is None:
            self._pending = (match, min(self.length, len(match.tokens)), 0)

    def push(self, token: int) -> None:
        if self._pending is None:
            return
        match, length, agreed = self._pending
        if token == match.tokens[agreed]:
            agreed += 1
            if agreed < length:
                self._pending = (match, length, agreed)
                return
        self._pending = None
        self.policy.observe(match, length, agreed)


class StepPace:
    """Live step times against the curve, per generator: recent plain steps' measured seconds
    over the curve's c(1) at their context (`scale`: what a plain step costs now), and recent
    verifies' over the curve's c(n) (`verify_correction`); medians of the last `window` each.

    The curve prices a verify against a plain step as the calibration saw them, and that shape
    can be off for a real answer (measured on the bundled model at ~900 cached tokens: verifies
    of 3 and 5 tokens cost 1.34x and 1.65x a plain step there, where the cached curve said
    1.18x and 1.42x). The governor therefore counts what a verified draft lost in measured
    time: its step's seconds against (accepted + 1) plain steps at this pace."""

    def __init__(self, window: int = 32, min_samples: int = 3, min_verifies: int = 8,
                 max_correction: float = 1.5):
        self.min_samples = min_samples
        self.min_verifies = min_verifies
        self.max_correction = max_correction
        self._ratios: deque[float] = deque(maxlen=window)
        self._verifies: deque[float] = deque(maxlen=window)

    def reset(self) -> None:
        self._ratios.clear()
        self._verifies.clear()

    def observe(self, seconds: float, plain_curve: float) -> None:
        """A plain step took `seconds`; the curve's c(1) at its context is `plain_curve`."""
        self._ratios.append(seconds / plain_curve)

    def observe_verify(self, seconds: float, curve: float) -> None:
        """A verify took `seconds`; the curve's c(n) for its size and context is `curve`."""
        self._verifies.append(seconds / curve)

    def scale(self) -> float | None:
        """Live plain steps over the curve's (None: too few seen yet)."""
        if len(self._ratios) < self.min_samples:
            return None
        return statistics.median(self._ratios)

    def verify_correction(self) -> float:
        """How much dearer verifies run, relative to plain steps, than the curve says: the
        median live/curve ratio of recent verifies over that of recent plain steps, within
        1/max_correction .. max_correction (1.0 until both were seen often enough). A load
        burst slows both kinds of step alike and changes no ratio."""
        plain = self.scale()
        if plain is None or len(self._verifies) < self.min_verifies:
            return 1.0
        correction = statistics.median(self._verifies) / plain
        return min(max(correction, 1.0 / self.max_correction), self.max_correction)


class DraftGovernor:
    """Per generation, the rule that keeps speculation from losing to plain decoding.

    A ledger counts, in plain steps (units of c(1)), what the verified drafts cost beyond plain
    decoding of the same tokens: a step that verified k draft tokens and kept a of them adds
    (c(k+1) - (a+1)·c(1)) / c(1), negative when it paid. Gains are banked only up to `credit`
    plain steps, so an early run of good drafts cannot pay for a long bad stretch later.

      * A draft of k tokens is verified only if its worst case — every token rejected, a loss
        of (c(k+1) - c(1)) / c(1) — keeps the ledger within `budget`; the draft is cut to the
        longest that does.
      * When not even one token fits, drafting is suspended: the generation runs plain steps.
        Proposals are then followed in shadow (`shadow`, settled by `push` as the model's own
        tokens arrive) and their would-be outcome enters the ledger the same way; when it is
        back to <= 0 drafting resumes with the ledger at 0. After `max_resumes` resumptions
        a suspension is final.

    So by the cost curve a generation loses at most (1 + max_resumes) · budget plain steps to
    plain decoding, however its drafts fare, and a question that drafts badly is back to plain
    steps after about `budget` plain steps' worth of rejections. With a `pace` (StepPace) and
    each step's measured seconds (`record`), verified drafts enter the ledger in measured time
    instead, so the bound holds for the time the steps took, not only for the curve's estimate
    of it (up to the worst case of each admitted draft, which only the curve can foretell).
    Exact: it only decides whether to draft, never what the model writes."""

    def __init__(self, cost: ForwardCost, budget: float = 1.0, credit: float = 2.0,
                 max_resumes: int = 2, pace: StepPace | None = None):
        if budget <= 0 or credit < 0 or max_resumes < 0:
            raise ValueError("DraftGovernor needs budget > 0, credit >= 0 and max_resumes >= 0")
        self.cost = cost
        self.budget = budget
        self.credit = credit
        self.max_resumes = max_resumes
        self.pace = pace
        self.ledger = 0.0
        self.suspended = False
        self.suspensions = 0
        self.resumes = 0
        self._pending: tuple[list[int], int, int | None] | None = None  # draft, matched, context

    def _loss(self, drafted: int, accepted: int, context: int | None) -> float:
        plain = self.cost(1, context)
        return (self.cost(drafted + 1, context) - (accepted + 1) * plain) / plain

    def _add(self, loss: float) -> None:
        self.ledger = max(self.ledger + loss, -self.credit)

    def limit(self, k: int, context: int | None = None) -> int:
        """The longest draft, at most k tokens, whose worst case fits the budget (0: suspended
        or nothing fits; the latter suspends)."""
        if self.suspended or k <= 0:
            return 0
        while k > 0 and self.ledger + self._loss(k, 0, context) > self.budget:
            k -= 1
        if k == 0:
            self.suspended = True
            self.suspensions += 1
        return k

    def record(self, drafted: int, accepted: int, context: int | None = None,
               seconds: float | None = None) -> None:
        """A step's outcome: a verified draft's (drafted > 0), or a plain step's. With the
        step's measured `seconds` and a `pace`, a plain step sets the pace and a draft's loss
        is counted in measured time (StepPace); otherwise by the curve."""
        pace = self.pace if seconds is not None else None
        if drafted <= 0:
            if pace is not None:
                pace.observe(seconds, self.cost(1, context))
            return
        if pace is not None:
            pace.observe_verify(seconds, self.cost(drafted + 1, context))
        scale = pace.scale() if pace is not None else None
        if scale is None:
            self._add(self._loss(drafted, accepted, context))
        else:
            plain = self.cost(1, context) * scale  # a plain step now, live
            self._add((seconds - (accepted + 1) * plain) / plain)

    def shadow(self, draft: list[int], context: int | None = None) -> None:
        """While suspended: follow a proposal that was not verified (one at a time)."""
        if self.suspended and draft and self._pending is None:
            self._pending = (list(draft), 0, context)

    def push(self, token: int) -> None:
        """A token the generation wrote: settles a shadowed proposal once it is decided."""
        if self._pending is None:
            return
        draft, matched, context = self._pending
        if token == draft[matched]:
            matched += 1
            if matched < len(draft):
                self._pending = (draft, matched, context)
                return
        self._pending = None
        self._add(self._loss(len(draft), matched, context))
        if self.ledger <= 0 and self.resumes < self.max_resumes:
            self.suspended = False
            self.resumes += 1
            self.ledger = 0.0
