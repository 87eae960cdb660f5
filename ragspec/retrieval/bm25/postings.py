"""The storage under bm25.BM25Index: sorted posting segments, growable columns, and the
per-term score bounds that let a top-k search skip most postings (bm25_maxscore.py).

Contract:
  * A `Segment` holds postings sorted by (term id, row): term `terms[i]` owns the rows
    rows[starts[i]:starts[i+1]] (strictly increasing) with their counts. It never changes once
    built; merging builds a new one.
  * `Segment.bounds(lengths, average)` is, per term, the largest tf / (tf + K1 * (1 - B + B *
    length / a0)) over the term's postings, for the average length a0 it was computed at (kept
    with it). For any other average a, a posting's term factor is at most bound * max(1, a / a0):
    the denominator shrinks by at most the factor a0 / a as a grows. So the bounds stay valid
    while passages come and go, and are computed once per segment, not per query.
  * `contribution(idf, tfs, norms)` is the one BM25 term formula every scorer uses, so the
    pruned and the exhaustive search add the very same floats.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

K1 = 1.2
B = 0.75
# Postings per step when computing bounds: bounds a temporary to ~100 MB at a million passages.
_BOUND_CHUNK = 4_000_000


def contribution(idf: float, tfs: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """BM25's share of one term in each passage: idf * tf * (K1 + 1) / (tf + norm), where
    norm = K1 * (1 - B + B * length / average length)."""
    return idf * tfs * (K1 + 1) / (tfs + norms)


@dataclass
class Segment:
    """Postings sorted by (term, row): term ids `terms[i]` own rows[starts[i]:starts[i+1]]."""

    terms: np.ndarray  # int32, increasing
    starts: np.ndarray  # int64, len(terms) + 1
    rows: np.ndarray  # int32
    counts: np.ndarray  # int32
    _bounds: tuple[float, np.ndarray] | None = field(default=None, repr=False)
    _top_row: int | None = field(default=None, repr=False)

    @classmethod
    def build(cls, terms: np.ndarray, rows: np.ndarray, counts: np.ndarray, *,
              runs: bool = False) -> Segment:
        """The segment of these postings, in any order. `runs`: they are a few runs each
        sorted by (term, row) already (segments being merged), which a stable sort (timsort)
        merges in linear time, ~4x faster than sorting them afresh."""
        # One sort of (term, row) packed in an int64 (both are non-negative int32 values): the
        # order lexsort gives, faster. A (term, row) pair is never there twice (each row's
        # postings come from one place), so any sort gives the same order.
        order = np.argsort(terms.astype(np.int64) << 32 | rows.astype(np.int64),
                           kind="stable" if runs else None)
        terms = np.asarray(terms, dtype=np.int32)[order]
        rows = np.asarray(rows, dtype=np.int32)[order]
        counts = np.asarray(counts, dtype=np.int32)[order]
        # Sorted terms: each new one starts where it differs from the one before.
        first = np.flatnonzero(terms[1:] != terms[:-1]) + 1
        starts = np.concatenate([[0] if len(terms) else [], first, [len(terms)]]
                                ).astype(np.int64)
        return cls(terms[starts[:-1]], starts, rows, counts)

    def find(self, term: int) -> int | None:
        """The term's place in `terms`, or None when this segment does not hold it."""
        # An int32 needle: a Python int would make numpy cast the whole (int32) array first.
        i = int(np.searchsorted(self.terms, np.int32(term)))
        return i if i < len(self.terms) and self.terms[i] == term else None

    def postings(self, term: int) -> tuple[np.ndarray, np.ndarray] | None:
        i = self.find(term)
        if i is None:
            return None
        lo, hi = self.starts[i], self.starts[i + 1]
        return self.rows[lo:hi], self.counts[lo:hi]

    def top_row(self) -> int:
        """The largest row it holds (-1 when empty)."""
        if self._top_row is None:
            self._top_row = int(self.rows.max()) if len(self.rows) else -1
        return self._top_row

    def flat_terms(self) -> np.ndarray:
        return np.repeat(self.terms, np.diff(self.starts))

    def bounds(self, lengths: np.ndarray, average: float) -> tuple[float, np.ndarray]:
        """(a0, per-term largest term factor at average length a0); see the module docstring.
        Computed at the first call (with `average` as a0) and kept."""
        if self._bounds is None:
            best = np.zeros(len(self.terms))
            first = 0
            while first < len(self.terms):  # whole terms per step, ~_BOUND_CHUNK postings
                last = int(np.searchsorted(self.starts, self.starts[first] + _BOUND_CHUNK,
                                           side="right")) - 1
                last = min(max(last, first + 1), len(self.terms))
                lo, hi = self.starts[first], self.starts[last]
                tfs = self.counts[lo:hi].astype(np.float64)
                factor = tfs / (tfs + K1 * (1 - B + B * lengths[self.rows[lo:hi]] / average))
                best[first:last] = np.maximum.reduceat(factor, self.starts[first:last] - lo)
                first = last
            self._bounds = (float(average), best)
        return self._bounds


class Column:
    """A numpy array that grows by appending (capacity doubles)."""

    def __init__(self, dtype) -> None:
        self.data = np.zeros(16, dtype=dtype)
        self.size = 0

    def append(self, value) -> None:
        if self.size == len(self.data):
            self.data = np.concatenate([self.data, np.zeros_like(self.data)])
        self.data[self.size] = value
        self.size += 1

    def extend(self, values: np.ndarray) -> None:
        while self.size + len(values) > len(self.data):
            self.data = np.concatenate([self.data, np.zeros_like(self.data)])
        self.data[self.size : self.size + len(values)] = values
        self.size += len(values)

    def view(self) -> np.ndarray:
        return self.data[: self.size]


def new_pending() -> tuple[array, array, array]:
    """Pending postings: term ids, rows, counts (compact int32 arrays, not Python lists)."""
    return array("i"), array("i"), array("i")
