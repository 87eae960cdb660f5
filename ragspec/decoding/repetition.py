"""When an answer repeats itself: the stop rule, the repetition measures, and which tokens a
repetition penalty looks at.

Contract: pure Python over lists of ints (no torch, no text), like the drafter.

  * `RepetitionGuard` is the stop rule. The engine pushes every committed output token; `push`
    returns True at the token that completes an n-gram written `count` times in the output
    (overlapping occurrences count, so a run of one token is caught too). The decision is made
    on committed tokens only, so the output is always a prefix of the model's own output
    without the rule: speculation stays exact. O(1) per token.
  * `stop_point(tokens, ngram, count)` is the same rule applied to a finished output: how many
    tokens the rule would have kept (None: it never fires).
  * `max_repeats` and `repeated_share` measure repetition in a finished output (the quality
    evaluation): the most times any n-gram occurs, and the share of tokens that repeat an
    n-gram written before.
  * `penalty_windows(context, draft, last_n)` lists, for every row of a verify forward over
    [last, d1..dk], the distinct tokens among the `last_n` tokens before that row's prediction:
    row j sees context + d1..dj. A penalty applied row by row with these windows gives every
    draft position exactly the logits a one-token step would have had there, so speculation on
    and off still write the same tokens.

Worked example, ngram=3, count=2: output tokens 5 6 7 8 5 6 7 -> push returns False six times
and True at the seventh token: "5 6 7" has now been written twice. stop_point(...) == 7.
"""

from __future__ import annotations

from collections.abc import Sequence


class RepetitionGuard:
    """The stop rule over a growing output (see the module docstring)."""

    def __init__(self, ngram: int, count: int):
        if ngram < 1:
            raise ValueError(f"the stop rule's n-gram length must be >= 1, got {ngram}")
        if count < 2:
            raise ValueError(f"the stop rule needs an n-gram written at least twice (count >= 2), "
                             f"got {count}")
        self.ngram, self.count = ngram, count
        self._tail: list[int] = []
        self._seen: dict[tuple[int, ...], int] = {}
        self._length = 0  # output tokens pushed
        self.fired_at: int | None = None  # output length when the rule fired

    def push(self, token: int) -> bool:
        """Add one committed output token; True once the rule has fired (and from then on)."""
        if self.fired_at is not None:
            return True
        self._tail.append(int(token))
        if len(self._tail) > self.ngram:
            del self._tail[0]
        self._length += 1
        if len(self._tail) < self.ngram:
            return False
        key = tuple(self._tail)
        seen = self._seen.get(key, 0) + 1
        self._seen[key] = seen
        if seen >= self.count:
            self.fired_at = self._length
            return True
        return False


def stop_point(tokens: Sequence[int], ngram: int, count: int) -> int | None:
    """How many of `tokens` the stop rule keeps: the length at which it fires, or None."""
    guard = RepetitionGuard(ngram, count)
    for token in tokens:
        if guard.push(token):
            return guard.fired_at
    return None


def _ngram_counts(tokens: Sequence[int], n: int) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for i in range(len(tokens) - n + 1):
        key = tuple(tokens[i : i + n])
        counts[key] = counts.get(key, 0) + 1
    return counts


def max_repeats(tokens: Sequence[int], n: int) -> int:
    """The most times any n-gram occurs in `tokens` (overlaps count; 0 when shorter than n)."""
    return max(_ngram_counts(tokens, n).values(), default=0)


def repeated_share(tokens: Sequence[int], n: int) -> float:
    """The share of `tokens` covered by an n-gram that already occurred earlier in `tokens`
    (0.0 for an output shorter than n): how much of an answer is the answer again."""
    if len(tokens) < n:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    covered = [False] * len(tokens)
    for i in range(len(tokens) - n + 1):
        key = tuple(tokens[i : i + n])
        if key in seen:
            covered[i : i + n] = [True] * n
        seen.add(key)
    return sum(covered) / len(tokens)


def penalty_windows(context: Sequence[int], draft: Sequence[int],
                    last_n: int) -> list[frozenset[int]]:
    """For a verify forward over [last, d1..dk]: len(draft) + 1 windows, row j holding the
    distinct tokens among the last `last_n` of context + draft[:j] (context ends with `last`)."""
    if last_n < 1:
        raise ValueError(f"the penalty window must hold at least one token, got {last_n}")
    tail = list(context[-last_n:])
    windows = [frozenset(tail)]
    for token in draft:
        tail.append(int(token))
        if len(tail) > last_n:
            del tail[0]
        windows.append(frozenset(tail))
    return windows
