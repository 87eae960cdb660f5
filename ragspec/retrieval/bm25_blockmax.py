"""Exact top-k BM25 over blocks of rows: block-max bounds, best blocks first, in numpy.

Contract: `top_rows(terms, norms, n_rows, k)` returns (rows, scores) holding every row whose
BM25 score (the sum of `contribution` over the query's terms, added in the terms' given order,
as the exhaustive scorer adds them) is at least the k-th best score, with exactly those scores;
the caller orders them (score, then id) and keeps k. The same answer as scoring every posting,
to the last bit; only the work differs.

How: rows are cut into blocks of 2**SHIFT consecutive rows. Each term gives, per block, a bound
on its contribution to any row of that block: for a long list the segment's stored per-block
maximum of the term factor (bm25_postings.Segment.block_bounds, rounded up), for a short one
the exact maximum computed now from its few postings. A block's bound is the sum over the
query's terms. Blocks are scored exhaustively (every posting of every query term inside them),
best bound first, in growing batches; theta is the k-th best score found so far. Once the next
block's bound is below theta, no row in it or in any later block can reach the top k, and the
search stops. The rows of a block are scored all at once, term by term in the given order, so
each score is the exhaustive scorer's float. Comparisons keep a relative margin (SLACK) so that
rounding never prunes a row that ties (ties at the k-th place are then ordered by id).

Worked example: k = 1, SHIFT = 2 (blocks of rows 0-3, 4-7, ...), "quota" held only by row 6
(contribution 1.9), "disk" by every row (at most 0.3 in any block): block 1 is bounded by 2.2,
every other block by 0.3. Block 1 is scored first: theta = 1.9 + its "disk" share > 0.3, so no
other block is read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ragspec.retrieval.bm25_postings import BLOCK_SHIFT, K1, contribution

SLACK = 1e-9
_FIRST_BATCH = 4  # blocks scored in the first round; each later round doubles it


@dataclass
class TermList:
    """One segment's live postings of a query term (rows increasing) and, when the segment
    stores them, the per-block maxima of the term factor (uint16 steps of 1/65535, rounded
    up) at the average length `a0` they were computed at."""

    rows: np.ndarray
    tfs: np.ndarray
    block_max: np.ndarray | None = None
    a0: float = 1.0


@dataclass
class BlockTerm:
    """One distinct query token: its idf and its postings, one TermList per segment."""

    idf: float
    lists: list[TermList]


def _block_bounds(term: BlockTerm, norms: np.ndarray, n_blocks: int, shift: int,
                  average: float) -> np.ndarray:
    """Per block, an upper bound on the term's contribution to any row in it."""
    out = np.zeros(n_blocks)
    scale = term.idf * (K1 + 1)
    for held in term.lists:
        if held.block_max is not None:
            # Factor bounds hold at any average a scaled by max(1, a / a0) (bm25_postings).
            stored = held.block_max.astype(np.float64) * (scale * max(1.0, average / held.a0)
                                                          / 65535 * (1 + SLACK))
            np.maximum(out[: len(stored)], stored[:n_blocks], out=out[: len(stored)])
        else:
            np.maximum.at(out, held.rows >> shift,
                          contribution(term.idf, held.tfs, norms[held.rows]))
    return out


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The concatenation of arange(lo[i], hi[i]) over i, without a Python loop."""
    lengths = hi - lo
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    return np.repeat(lo - starts, lengths) + np.arange(total)


def _kth(values: np.ndarray, k: int) -> float:
    """The k-th largest of `values` (-inf when there are fewer than k)."""
    if len(values) < k:
        return -np.inf
    return float(np.partition(values, len(values) - k)[len(values) - k])


def top_rows(terms: list[BlockTerm], norms: np.ndarray, n_rows: int, k: int,
             average: float, shift: int = BLOCK_SHIFT) -> tuple[np.ndarray, np.ndarray]:
    """See the module docstring: the rows that may be in the top k, with their exact scores.
    `average` is the live average passage length the norms were computed with."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not terms or n_rows == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    n_blocks = ((n_rows - 1) >> shift) + 1
    bound = np.zeros(n_blocks)
    for term in terms:
        bound += _block_bounds(term, norms, n_blocks, shift, average)
    blocks = np.flatnonzero(bound > 0)
    blocks = blocks[np.argsort(-bound[blocks], kind="stable")]
    edges_at = np.arange(n_blocks + 1, dtype=np.int64) << shift
    edges = [[np.searchsorted(held.rows, edges_at) for held in term.lists] for term in terms]
    scores = np.zeros(n_rows)
    seen = np.zeros(n_rows, dtype=np.bool_)
    kept_rows = np.zeros(0, dtype=np.int64)
    kept_scores = np.zeros(0)
    theta = -np.inf
    done, batch = 0, _FIRST_BATCH
    while done < len(blocks):
        if bound[blocks[done]] * (1 + SLACK) < theta * (1 - SLACK):
            break  # every block left is bounded below the k-th score found
        chosen = np.sort(blocks[done : done + batch])
        done += len(chosen)
        batch *= 2
        found = []
        for term, term_edges in zip(terms, edges, strict=True):
            for held, edge in zip(term.lists, term_edges, strict=True):
                at = _ranges(edge[chosen], edge[chosen + 1])
                if not len(at):
                    continue
                rows = held.rows[at]
                scores[rows] += contribution(term.idf, held.tfs[at], norms[rows])
                fresh = rows[~seen[rows]]
                seen[fresh] = True
                found.append(fresh)
        if found:
            new_rows = np.concatenate(found).astype(np.int64)
            kept_rows = np.concatenate([kept_rows, new_rows])
            kept_scores = np.concatenate([kept_scores, scores[new_rows]])
            theta = max(theta, _kth(kept_scores, k))
            keep = kept_scores >= theta * (1 - SLACK)
            kept_rows, kept_scores = kept_rows[keep], kept_scores[keep]
    return kept_rows, kept_scores
