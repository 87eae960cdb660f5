"""Exact top-k BM25 that reads only part of the postings: MaxScore, term at a time, in numpy.

Contract: `top_rows(terms, norms, n_rows, k)` returns (rows, scores) holding every row whose
BM25 score (the sum of `contribution` over the query's terms, added in the terms' given order,
as the exhaustive scorer adds them) is at least the k-th best score, with exactly those scores;
the caller orders them (score, then id) and keeps k. It is the same answer as scoring every
posting; only the work differs. Each QueryTerm carries an upper bound on its contribution to
any one row (bm25_postings.Segment.bounds); bounds may be loose, never low.

How: the terms are read in decreasing order of their bound. After each one, theta is the k-th
best partial score so far (a floor under the final k-th score: scores only grow). Once the
bounds of the terms still unread sum to less than theta, no row that none of the read terms
holds can reach the top k, so the unread ("non-essential") terms are only probed for the rows
already found (a binary search per row in each posting list instead of a pass over it), and a
row is dropped as soon as its partial score plus the bounds still unread falls below theta.
Rare terms have the high bounds, so the long lists of common words are the ones skipped.
Comparisons keep a relative margin (SLACK) so that rounding never prunes a row that ties.

Worked example: k = 1, terms "quota" (bound 2.0, rows {7}), "disk" (bound 0.3, rows 1..9000).
After "quota": theta = score(7) = 1.9 > 0.3, so "disk" is probed for row 7 alone (one binary
search) instead of scoring 9,000 rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ragspec.retrieval.bm25.postings import contribution

SLACK = 1e-9


@dataclass
class QueryTerm:
    """One distinct query token: its idf, a bound on its contribution to any row, and its
    live postings, one (rows, counts) pair per segment (rows increasing within a pair)."""

    idf: float
    bound: float
    lists: list[tuple[np.ndarray, np.ndarray]]

    def __post_init__(self) -> None:
        if self.bound < 0 or self.idf < 0:
            raise ValueError(f"idf and bound must be >= 0, got {self.idf} and {self.bound}")

    def probe(self, rows: np.ndarray, norms: np.ndarray) -> np.ndarray:
        """This term's contribution to each of `rows` (0 where it has no posting)."""
        out = np.zeros(len(rows))
        for held, tfs in self.lists:
            at = np.searchsorted(held, rows)
            hit = at < len(held)
            hit[hit] = held[at[hit]] == rows[hit]
            out[hit] = contribution(self.idf, tfs[at[hit]], norms[rows[hit]])
        return out


def _kth(values: np.ndarray, k: int) -> float:
    """The k-th largest of `values` (-inf when there are fewer than k)."""
    if len(values) < k:
        return -np.inf
    return float(np.partition(values, len(values) - k)[len(values) - k])


def top_rows(terms: list[QueryTerm], norms: np.ndarray, n_rows: int,
             k: int) -> tuple[np.ndarray, np.ndarray]:
    """See the module docstring: the rows that may be in the top k, with their exact scores."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not terms:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    order = sorted(range(len(terms)), key=lambda i: -terms[i].bound)
    # rest[i]: what the terms order[i:] can still add to one row, rounded up.
    rest = np.append(np.cumsum([terms[i].bound for i in order][::-1])[::-1], 0.0) * (1 + SLACK)
    partial = np.zeros(n_rows)
    seen = np.zeros(n_rows, dtype=np.bool_)
    found: list[np.ndarray] = []
    theta = -np.inf
    read = 0
    while read < len(order):  # essential terms: every posting
        term = terms[order[read]]
        for rows, tfs in term.lists:
            partial[rows] += contribution(term.idf, tfs, norms[rows])
            fresh = rows[~seen[rows]]
            seen[fresh] = True
            found.append(fresh)
        read += 1
        candidates = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
        theta = _kth(partial[candidates], k)
        if rest[read] < theta * (1 - SLACK):
            break
    scores = partial[candidates]
    for position in range(read, len(order)):  # non-essential terms: probe the candidates only
        keep = scores + rest[position] >= theta * (1 - SLACK)
        candidates, scores = candidates[keep], scores[keep]
        scores = scores + terms[order[position]].probe(candidates, norms)
        theta = max(theta, _kth(scores, k))
    candidates = candidates[scores >= theta * (1 - SLACK)]
    # The survivors' exact scores, summed in the caller's term order like the exhaustive scorer.
    exact = np.zeros(len(candidates))
    for term in terms:
        exact += term.probe(candidates, norms)
    return candidates, exact
