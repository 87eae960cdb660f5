"""Approximate dense search for a large index: candidates from an inverted-file index over 8-bit
copies of the vectors, re-scored exactly against the stored vectors. One implementation for
both backends that hold their vectors on this machine: the FAISS folder store (its flat index)
and Milvus Lite (milvus_vectors.py: a flat index of the vectors kept beside the Milvus file).

Contract:
  * Below THRESHOLD passages (or with RAGSPEC_DENSE=exact) the store searches its flat index:
    exact. At or above, `ApproxIndex.search(flat, vector, k)` returns the best k (row, cosine)
    pairs among max(RERANK * k, MIN_CANDIDATES) candidates that an IVF index with scalar
    quantisation (IndexIVFScalarQuantizer, 8 bits per dimension, ~sqrt(n) lists) finds probing
    PROBED_LISTS of its lists (all of them when it has fewer): questions sit farther from the
    passages than passages from each other, so their neighbours spread over many lists. What
    recall needs is a number of lists, not a share: recall@10 was 0.987 probing 110 of 316
    lists at 100k passages (32 lists: 0.896) and 0.985 probing 100 of 1,000 at 1M (200: 0.995;
    50: 0.957), so a fixed 128 keeps ~0.99 while the share scanned, and the time, falls as the
    index grows (more candidates did not change recall). The cosines are exact (computed from
    the flat index's float32 vectors): only which passages are candidates is approximate. Its
    recall@10 against exact search is measured by benchmarks/bench_scale.py (`recall`).
  * Derived data, in memory only (each backend saves the flat vectors): built from them at
    the first search past the threshold (k-means on a sample, then every vector assigned to a
    list), extended in place when rows are appended, and rebuilt after a delete, because
    deleting from the flat index renumbers the rows after it.
  * Memory: 1 byte per dimension per passage (384 MB at 1M passages of 384 dimensions) beside
    the flat index's 4 bytes; the search scans PROBED_LISTS / sqrt(n) of them (13% at 1M).
"""

from __future__ import annotations

import logging
import math
import os

import faiss
import numpy as np

logger = logging.getLogger(__name__)

THRESHOLD = 50_000
MIN_PROBE = 32
PROBED_LISTS = 128
RERANK = 4
MIN_CANDIDATES = 200
_TRAIN_PER_LIST = 40  # k-means sample: enough points per list for stable centroids
MODE_ENV = "RAGSPEC_DENSE"


def wanted(count: int) -> bool:
    """Whether a flat index of `count` rows is searched approximately."""
    mode = (os.environ.get(MODE_ENV) or "auto").lower()
    if mode not in ("auto", "exact"):
        raise ValueError(f"{MODE_ENV}={mode!r}: use auto (approximate past {THRESHOLD:,} "
                         "passages) or exact")
    return mode == "auto" and count >= THRESHOLD


def lists_for(count: int) -> int:
    return max(16, int(math.sqrt(count)))


def _probes(lists: int, share: float | None) -> int:
    if share is None:
        return min(lists, PROBED_LISTS)
    return min(lists, max(MIN_PROBE, int(lists * share)))


class ApproxIndex:
    """See the module docstring. One per store; `invalidate()` after rows were deleted."""

    def __init__(self, probe_share: float | None = None) -> None:
        """probe_share None: PROBED_LISTS lists; else that share of the lists (benchmarks)."""
        if probe_share is not None and not 0 < probe_share <= 1:
            raise ValueError(f"probe_share must be in (0, 1], got {probe_share}")
        self.probe_share = probe_share
        self._ivf: faiss.Index | None = None
        self._quantizer: faiss.Index | None = None  # the IVF index refers to it: keep it alive

    def invalidate(self) -> None:
        self._ivf = self._quantizer = None

    def _synced(self, flat: faiss.Index) -> faiss.Index:
        if self._ivf is None or self._ivf.ntotal > flat.ntotal:
            self._ivf, self._quantizer = self._train(flat)
        if self._ivf.ntotal < flat.ntotal:  # rows appended since: same numbering, add them
            first = self._ivf.ntotal
            for start in range(first, flat.ntotal, 65_536):
                stop = min(flat.ntotal, start + 65_536)
                self._ivf.add(flat.reconstruct_n(start, stop - start))
        return self._ivf

    def set_probe_share(self, share: float | None) -> None:
        """Probe `share` of the lists from the next search on (benchmarks sweep it); None goes
        back to PROBED_LISTS."""
        if share is not None and not 0 < share <= 1:
            raise ValueError(f"probe_share must be in (0, 1], got {share}")
        self.probe_share = share
        if self._ivf is not None:
            self._ivf.nprobe = _probes(self._ivf.nlist, share)

    def _train(self, flat: faiss.Index) -> tuple[faiss.Index, faiss.Index]:
        n, lists = flat.ntotal, lists_for(flat.ntotal)
        quantizer = faiss.IndexFlatIP(flat.d)
        ivf = faiss.IndexIVFScalarQuantizer(quantizer, flat.d, lists,
                                            faiss.ScalarQuantizer.QT_8bit,
                                            faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(0).choice(n, min(n, lists * _TRAIN_PER_LIST),
                                                 replace=False)
        ivf.train(flat.reconstruct_batch(np.sort(sample).astype(np.int64)))
        ivf.nprobe = _probes(lists, self.probe_share)
        logger.info("approximate dense index: %d lists over %d passages", lists, n)
        return ivf, quantizer

    def search(self, flat: faiss.Index, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The best k (row, exact cosine) among the candidates, best first."""
        ivf = self._synced(flat)
        want = min(flat.ntotal, max(RERANK * k, MIN_CANDIDATES))
        _, found = ivf.search(vector.reshape(1, -1).astype(np.float32), want)
        rows = found[0][found[0] >= 0]
        scores = flat.reconstruct_batch(rows) @ vector.astype(np.float32)
        best = np.argsort(-scores, kind="stable")[:k]
        return [(int(rows[i]), float(scores[i])) for i in best]
