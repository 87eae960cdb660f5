"""BM25 keyword scoring over the stored passages, updated passage by passage.

Contract:
  * Tokens are the lowercased runs of letters, digits and underscores (`tokenize`), so exact
    names, codes and numbers match whole: "E204", "7432", "max_log_size" are one token each.
  * `score(query)` is Okapi BM25 with k1 = 1.2, b = 0.75 and the always-positive idf
    ln(1 + (N - df + 0.5) / (df + 0.5)) (as Lucene uses), summed over the query's distinct
    tokens. Passages sharing no token with the query score nothing and are not listed.
  * `add(id, text)` / `remove(id)` change one passage; any sequence of them gives the same
    scores, and the same bytes from `to_bytes(order)`, as building from the final set at once.
  * On disk (`to_bytes` / `from_bytes`): an .npz of plain arrays (no pickle): the vocabulary as
    newline-separated UTF-8 (a token never holds a newline), and per passage, in the order the
    caller gives (the FAISS row order), its term ids and counts. The caller keeps the passage
    ids; `from_bytes` needs them in the same order and checks the row count.

Worked example: passages a = "disk full", b = "disk quota full full", query "quota".
N = 2, df(quota) = 1, idf = ln(1 + 1.5 / 1.5) = ln 2; only b has the token (tf 1, length 4,
average length 3): ln 2 * 1 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 4 / 3)) = 0.6100.
"""

from __future__ import annotations

import io
import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

logger = logging.getLogger(__name__)

K1 = 1.2
B = 0.75
_TOKEN = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    """The text's tokens, lowercased, in order (repeats kept)."""
    return _TOKEN.findall(text.lower())


class BM25Index:
    """See the module docstring."""

    def __init__(self) -> None:
        self._terms: dict[str, Counter] = {}  # passage id -> token -> count
        self._postings: dict[str, dict[str, int]] = {}  # token -> passage id -> count
        self._lengths: dict[str, int] = {}  # passage id -> number of tokens
        self._total_length = 0

    @classmethod
    def build(cls, passages: Iterable[tuple[str, str]]) -> BM25Index:
        """An index of (id, text) pairs."""
        index = cls()
        for pid, text in passages:
            index.add(pid, text)
        return index

    def __len__(self) -> int:
        return len(self._terms)

    def __contains__(self, pid: str) -> bool:
        return pid in self._terms

    def add(self, pid: str, text: str) -> None:
        if pid in self._terms:
            raise ValueError(f"passage {pid!r} is already in the keyword index")
        self._insert(pid, Counter(tokenize(text)))

    def _insert(self, pid: str, counts: Counter) -> None:
        self._terms[pid] = counts
        self._lengths[pid] = sum(counts.values())
        self._total_length += self._lengths[pid]
        for token, tf in counts.items():
            self._postings.setdefault(token, {})[pid] = tf

    def remove(self, pid: str) -> None:
        counts = self._terms.pop(pid)
        self._total_length -= self._lengths.pop(pid)
        for token in counts:
            posting = self._postings[token]
            del posting[pid]
            if not posting:
                del self._postings[token]

    def score(self, query: str) -> dict[str, float]:
        """BM25 score of every passage sharing a token with `query`."""
        n = len(self._terms)
        if self._total_length == 0:
            return {}  # no passage holds a token (or there are none): nothing can match
        average = self._total_length / n
        scores: dict[str, float] = {}
        for token in set(tokenize(query)):
            posting = self._postings.get(token)
            if not posting:
                continue
            idf = math.log(1 + (n - len(posting) + 0.5) / (len(posting) + 0.5))
            for pid, tf in posting.items():
                norm = K1 * (1 - B + B * self._lengths[pid] / average)
                scores[pid] = scores.get(pid, 0.0) + idf * tf * (K1 + 1) / (tf + norm)
        return scores

    def top(self, query: str, k: int) -> list[tuple[str, float]]:
        """The k best (id, score) pairs, best first; ties in id order, so results are stable."""
        ranked = sorted(self.score(query).items(), key=lambda item: (-item[1], item[0]))
        return ranked[:k]

    # -- on disk ------------------------------------------------------------------------------

    def to_bytes(self, order: Sequence[str]) -> bytes:
        """The index as .npz bytes, rows in `order` (which must be exactly its passage ids)."""
        if len(order) != len(self._terms) or set(order) != self._terms.keys():
            raise AssertionError("the row order must list every passage of the index once")
        vocabulary = sorted(self._postings)
        ids = {token: i for i, token in enumerate(vocabulary)}
        offsets = np.zeros(len(order) + 1, dtype=np.int64)
        term_ids: list[int] = []
        counts: list[int] = []
        for row, pid in enumerate(order):
            # Tokens sorted within a row: the bytes depend only on the content, not on history.
            for token, tf in sorted(self._terms[pid].items()):
                term_ids.append(ids[token])
                counts.append(tf)
            offsets[row + 1] = len(term_ids)
        buffer = io.BytesIO()
        np.savez(
            buffer,
            vocabulary=np.frombuffer("\n".join(vocabulary).encode("utf-8"), dtype=np.uint8),
            offsets=offsets,
            term_ids=np.asarray(term_ids, dtype=np.int32),
            counts=np.asarray(counts, dtype=np.int32),
        )
        return buffer.getvalue()

    @classmethod
    def restore(cls, data: bytes | None, passages: Sequence[tuple[str, str]]) -> BM25Index:
        """The index of `passages` ((id, text) pairs, in row order): read from `data` when that
        fits them, else built from the texts (an index saved without keywords, or a stale
        file). The texts are the authority, so rebuilding is always safe, only slower."""
        if data is not None:
            try:
                return cls.from_bytes(data, [pid for pid, _ in passages])
            except ValueError as exc:
                logger.info("rebuilding the keyword index: %s", exc)
        return cls.build(passages)

    @classmethod
    def from_bytes(cls, data: bytes, order: Sequence[str]) -> BM25Index:
        """Read `to_bytes` output whose rows are the passages `order`; ValueError if it does
        not fit them."""
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
                raw = arrays["vocabulary"].tobytes().decode("utf-8")
                offsets, term_ids = arrays["offsets"], arrays["term_ids"]
                counts = arrays["counts"]
        except (OSError, KeyError, ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"not a keyword index file ({exc})") from exc
        vocabulary = raw.split("\n") if raw else []
        if len(offsets) != len(order) + 1 or len(term_ids) != len(counts) \
                or (len(order) and offsets[-1] != len(term_ids)):
            raise ValueError(f"the keyword index holds {len(offsets) - 1} rows for "
                             f"{len(order)} passages")
        if len(term_ids) and (term_ids.min() < 0 or term_ids.max() >= len(vocabulary)):
            raise ValueError("the keyword index refers to tokens it does not list")
        index = cls()
        term_list, count_list = term_ids.tolist(), counts.tolist()
        for row, pid in enumerate(order):
            lo, hi = int(offsets[row]), int(offsets[row + 1])
            index._insert(pid, Counter(
                {vocabulary[t]: c for t, c in zip(term_list[lo:hi], count_list[lo:hi], strict=True)}))
        return index
