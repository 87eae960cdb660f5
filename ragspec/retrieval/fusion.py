"""Reciprocal-rank fusion: one ranking out of several, using only the places (not the scores).

Contract: `fuse(rankings, k)` gives each id the sum of 1 / (rrf_k + rank) over the rankings that
hold it (rank 1 = first), and returns the k best (id, sum) pairs, best first. Equal sums are
ordered by the id's place in the first ranking (ids absent from it after those present), then
by the id itself, so the result never depends on set or dict order.

Why ranks: cosine similarities and BM25 scores live on unrelated scales (BM25 grows with the
number of query words); ranks need no calibration. rrf_k = 60 is the constant of Cormack, Clarke
and Büttcher (SIGIR 2009): large enough that a passage both rankings place well beats one that
only a single ranking puts first.

Example: rankings [a, b, c] and [c, d], rrf_k = 60: c = 1/63 + 1/61, a = 1/61, d = 1/62,
b = 1/62; fused order c, a, b, d (b before d: b is in the first ranking).
"""

from __future__ import annotations

from collections.abc import Sequence

RRF_K = 60


def fuse(rankings: Sequence[Sequence[str]], k: int, rrf_k: int = RRF_K) -> list[tuple[str, float]]:
    """The k best ids of the fused rankings with their sums (see the module docstring)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if rrf_k < 0:
        raise ValueError(f"rrf_k must be >= 0, got {rrf_k}")
    sums: dict[str, float] = {}
    for ranking in rankings:
        for rank, pid in enumerate(ranking, 1):
            sums[pid] = sums.get(pid, 0.0) + 1.0 / (rrf_k + rank)
    first = {pid: place for place, pid in enumerate(rankings[0])} if rankings else {}
    order = sorted(sums, key=lambda pid: (-sums[pid], first.get(pid, len(first)), pid))
    return [(pid, sums[pid]) for pid in order[:k]]
