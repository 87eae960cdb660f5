"""How many draft tokens to verify this step: expected tokens per second, not hope.

A verify forward over [last token + k draft tokens] costs c(k+1) seconds and yields the accepted
prefix plus one token of the model's own. If each draft token is accepted with probability a
(given the ones before it were), the step yields E(k) = 1 + a + a^2 + ... + a^k tokens. The policy
picks the k that maximises E(k) / c(k+1) and drafts nothing unless that beats 1 / c(1), the rate
of plain decoding. On this CPU c grows quickly with k (see ForwardCost), so weak matches get short
drafts or none; on a GPU at batch 1 c is nearly flat and long drafts pay off.

a is estimated per evidence bucket: how far back the current match agrees with the copied place
(Match.extended). A long agreeing history means the model is quoting; a lone repeated token
means little. Each bucket starts from a prior that grows with the evidence, then learns from the
outcomes of this generator's drafts (acceptances and rejections).

ForwardCost holds c(n) for n = 1..max tokens: measured once per model/device (and cached by the
engine), then refined online from every timed forward.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from decoding.ngram import Match
from decoding.types import DraftConfig

# Upper bounds (inclusive) of the evidence buckets over Match.extended.
_BUCKETS = (1, 2, 3, 5, 8, 12, 20, 32, 10**9)
_PRIOR_STRENGTH = 4.0
_EMA = 0.1  # weight of a new timing sample in ForwardCost


@dataclass
class ForwardCost:
    """seconds[n-1] = measured time of a forward over n new tokens (n = 1..len(seconds))."""

    seconds: list[float]

    def __post_init__(self) -> None:
        if not self.seconds or any(s <= 0 for s in self.seconds):
            raise ValueError("ForwardCost needs a positive time for every n from 1 upwards")

    @property
    def max_tokens(self) -> int:
        return len(self.seconds)

    def __call__(self, n: int) -> float:
        if n <= len(self.seconds):
            return self.seconds[n - 1]
        # beyond the measured range: extend with the last measured slope
        last = self.seconds[-1]
        slope = (last - self.seconds[0]) / max(1, len(self.seconds) - 1)
        return last + slope * (n - len(self.seconds))

    def observe(self, n: int, seconds: float) -> None:
        if 1 <= n <= len(self.seconds) and seconds > 0:
            self.seconds[n - 1] += _EMA * (seconds - self.seconds[n - 1])

    @classmethod
    def flat(cls, max_tokens: int) -> ForwardCost:
        """A cost curve for when nothing was measured: every forward costs the same."""
        return cls([1.0] * max_tokens)


@dataclass
class AcceptanceModel:
    """Per-bucket Beta estimate of the probability that the next draft token is accepted."""

    accepted: list[float] = field(default_factory=lambda: [0.0] * len(_BUCKETS))
    rejected: list[float] = field(default_factory=lambda: [0.0] * len(_BUCKETS))

    @staticmethod
    def bucket(extended: int) -> int:
        return bisect.bisect_left(_BUCKETS, extended)

    @staticmethod
    def prior(bucket: int) -> float:
        # e/(e+2) at the bucket's lower edge: 1 -> 0.33, 2 -> 0.5, 4 -> 0.67, 9 -> 0.82, ...
        low = 1 if bucket == 0 else _BUCKETS[bucket - 1] + 1
        return low / (low + 2.0)

    def rate(self, extended: int) -> float:
        b = self.bucket(extended)
        a0 = self.prior(b) * _PRIOR_STRENGTH
        return (self.accepted[b] + a0) / (self.accepted[b] + self.rejected[b] + _PRIOR_STRENGTH)

    def observe(self, extended: int, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        b = self.bucket(extended)
        self.accepted[b] += accepted
        if accepted < drafted:
            self.rejected[b] += 1


def expected_tokens(rate: float, k: int) -> float:
    """1 + a + ... + a^k: tokens a step yields with k draft tokens."""
    return sum(rate**i for i in range(k + 1))


class DraftPolicy:
    """Chooses each step's draft length; learns from what was accepted."""

    def __init__(self, config: DraftConfig, cost: ForwardCost):
        self.config = config
        self.cost = cost
        self.acceptance = AcceptanceModel()

    def choose(self, match: Match | None, remaining: int) -> int:
        """Number of draft tokens to verify, 0 for a plain step. remaining >= 1 new tokens left."""
        if match is None or not match.tokens:
            return 0
        # the verify step always adds one token of the model's own: never pass max_new_tokens
        limit = min(len(match.tokens), self.config.max_draft, remaining - 1)
        if limit <= 0:
            return 0
        if not self.config.adaptive:
            return limit
        rate = self.acceptance.rate(match.extended)
        best_k, best_rate = 0, 1.0 / self.cost(1)
        for k in range(1, limit + 1):
            tokens_per_s = expected_tokens(rate, k) / self.cost(k + 1)
            if tokens_per_s > best_rate:
                best_k, best_rate = k, tokens_per_s
        return best_k

    def observe(self, match: Match, drafted: int, accepted: int) -> None:
        self.acceptance.observe(match.extended, drafted, accepted)
