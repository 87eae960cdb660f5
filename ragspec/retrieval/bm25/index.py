"""BM25 keyword scoring over the stored passages: numpy postings, updated passage by passage.

Contract:
  * Tokens are the lowercased runs of letters, digits and underscores (`tokenize`), so exact
    names, codes and numbers match whole: "E204", "7432", "max_log_size" are one token each.
    TOKENIZER names this rule; it is saved with the index, and a file built by another rule is
    refused (and rebuilt from the texts by `restore`), never read as if it were ours.
  * `score(query)` is Okapi BM25 with k1 = 1.2, b = 0.75 and the always-positive idf
    ln(1 + (N - df + 0.5) / (df + 0.5)) (as Lucene uses), summed over the query's distinct
    tokens. Passages sharing no token with the query score nothing and are not listed.
  * `add(id, text)` / `remove(id)` change one passage; any sequence of them gives the same
    scores, and the same bytes from `to_bytes(order)`, as building from the final set at once.
  * On disk (`to_bytes` / `from_bytes`): an .npz of plain arrays (no pickle): `tokenizer` (the
    rule's name, UTF-8), the vocabulary as newline-separated UTF-8 (a token never holds a
    newline) in sorted order, per passage its token count (`lengths`, in the order the caller
    gives: the FAISS row order), and the postings by token: token i's passages are
    rows[offsets[i]:offsets[i+1]] (increasing) with their counts. The caller keeps the passage
    ids; `from_bytes` needs them in the same order and checks every array against the others.

How it scales: postings live in a few sorted numpy segments (term id, row, count;
bm25_postings.py). `top` runs exact MaxScore document at a time, wholly in
C (bm25_native.py: term lookups, list traversal with galloping skips over common words' lists,
a k-best heap, and the survivors re-scored with the same float operations as numpy, so the same
bits); where no C compiler is, it is exact MaxScore in numpy (bm25_maxscore.py: rare tokens'
lists read whole, common tokens' lists probed for the passages already found).
`top_maxscore` and `top_exhaustive` (every posting, numpy) give the same answer, bit for bit,
and are the references `top` is tested against. Adds
collect in compact pending arrays that become a segment at the next search (or when they grow
large); a new segment is merged with the previous one while that is at most twice its size, so
there are O(log n) segments and each posting is merged O(log n) times. Removed passages are
masked out (df and N count only live passages, so scores stay exact) and dropped from the
segments when they are half dead. Memory: ~12 bytes per (passage, distinct token), plus a
float per (segment, term) for the bounds.

Worked example: passages a = "disk full", b = "disk quota full full", query "quota".
N = 2, df(quota) = 1, idf = ln(1 + 1.5 / 1.5) = ln 2; only b has the token (tf 1, length 4,
average length 3): ln 2 * 1 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 4 / 3)) = 0.6100.
"""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Iterable, Sequence
from itertools import chain, repeat

import numpy as np

from ragspec.retrieval.bm25.maxscore import QueryTerm, top_rows
from ragspec.retrieval.bm25.native import Vocabulary, scorer
from ragspec.retrieval.bm25.postings import K1, B, Column, Segment, contribution, new_pending

logger = logging.getLogger(__name__)

_TOKEN = re.compile(r"\w+")
# The rule `tokenize` applies, saved in every keywords.npz: change the name with the rule.
TOKENIZER = "ragspec-words-1: lowercase, runs of Unicode word characters (re \\w+)"
# Pending adds become a segment once they hold this many postings (~48 MB as int32 arrays), so
# building from a million passages never holds them as Python objects.
_SEAL_POSTINGS = 4_000_000


def tokenize(text: str) -> list[str]:
    """The text's tokens, lowercased, in order (repeats kept)."""
    return _TOKEN.findall(text.lower())


class BM25Index:
    """See the module docstring."""

    rebuilt = False  # True when `restore` built it from the texts (no usable saved file)

    def __init__(self) -> None:
        self._vocabulary: dict[str, int] = {}
        self._tokens: list[str] = []  # term id -> token (the dict's keys in id order)
        self._native_vocab: Vocabulary | None = None  # the C tokenizer's copy (bm25_native)
        self._row_of: dict[str, int] = {}  # live passage id -> row
        self._pids: list[str | None] = []  # row -> passage id (None once removed)
        self._lengths = Column(np.int32)
        self._distinct = Column(np.int32)  # distinct tokens per row: its postings
        self._alive = Column(np.bool_)
        self._total_length = 0
        self._segments: list[Segment] = []
        self._pending = new_pending()
        self._dead_postings = 0
        self._postings = 0
        self._norm: np.ndarray | None = None  # K1 * (1 - B + B * length / average), per row

    @classmethod
    def build(cls, passages: Iterable[tuple[str, str]]) -> BM25Index:
        """An index of (id, text) pairs."""
        index = cls()
        batch: list[tuple[str, str]] = []
        for pair in passages:
            batch.append(pair)
            if len(batch) == 1000:
                index.add_many(batch)
                batch = []
        index.add_many(batch)
        return index

    def __len__(self) -> int:
        return len(self._row_of)

    def __contains__(self, pid: str) -> bool:
        return pid in self._row_of

    def ids(self) -> list[str]:
        """The live passage ids, in the order they were added."""
        return list(self._row_of)

    def add(self, pid: str, text: str) -> None:
        self.add_many([(pid, text)])

    def add_many(self, passages: Sequence[tuple[str, str]]) -> None:
        """`add` for each (id, text) pair, counted in one numpy pass for the whole batch (the
        per-passage Python work was most of ingest); the same index as adding one by one."""
        pids = [pid for pid, _ in passages]
        if len(set(pids)) != len(pids) or any(pid in self._row_of for pid in pids):
            held = next(p for i, p in enumerate(pids) if p in self._row_of or p in pids[:i])
            raise ValueError(f"passage {held!r} is already in the keyword index")
        if not pids:
            return
        first = len(self._pids)
        texts = [text for _, text in passages]
        rows = np.arange(first, first + len(pids), dtype=np.int64)
        lengths = np.zeros(len(pids), dtype=np.int64)
        distinct = np.zeros(len(pids), dtype=np.int64)
        counter = self._counter()
        fast = [i for i, text in enumerate(texts) if text.isascii()] \
            if counter is not None else []
        slow = sorted(set(range(len(texts))) - set(fast)) if fast else range(len(texts))
        terms, pending_rows, counts = self._pending
        postings = 0
        if len(slow):
            slow = np.asarray(slow, dtype=np.int64)
            keys, tfs, width, token_counts = self._count_python([texts[i] for i in slow])
            local = keys // width  # place in `slow`
            terms.frombytes((keys % width).astype(np.int32).tobytes())
            pending_rows.frombytes(rows[slow][local].astype(np.int32).tobytes())
            counts.frombytes(tfs.astype(np.int32).tobytes())
            lengths[slow] = token_counts
            distinct[slow] = np.bincount(local, minlength=len(slow))
            postings += len(keys)
        if fast:
            fast = np.asarray(fast, dtype=np.int64)
            counter.sync(self._tokens)
            counted = counter.count([texts[i] for i in fast], rows[fast])
            for token in counted.new_tokens:  # the C table gave them the next ids
                self._vocabulary[token] = len(self._tokens)
                self._tokens.append(token)
            terms.frombytes(counted.terms.tobytes())
            pending_rows.frombytes(counted.rows.tobytes())
            counts.frombytes(counted.counts.tobytes())
            lengths[fast] = counted.lengths
            distinct[fast] = counted.distinct
            postings += len(counted.terms)
        self._row_of.update(zip(pids, range(first, first + len(pids)), strict=True))
        self._pids.extend(pids)
        self._lengths.extend(lengths.astype(np.int32))
        self._distinct.extend(distinct.astype(np.int32))
        self._alive.extend(np.ones(len(pids), dtype=np.bool_))
        self._total_length += int(lengths.sum())
        self._norm = None
        self._postings += postings
        if len(terms) >= _SEAL_POSTINGS:
            self._seal_pending()

    def _counter(self) -> Vocabulary | None:
        """The C tokenizer's vocabulary beside ours (None without the C build)."""
        if self._native_vocab is None and os.environ.get("RAGSPEC_NATIVE_TOKENIZE") != "0":
            native = scorer()
            if native is not None:
                self._native_vocab = native.vocabulary()
        return self._native_vocab

    def _count_python(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
        """Postings of `texts` by `tokenize` and numpy: (keys = text place * width + term id,
        their counts, width, each text's token count). New tokens get the next ids."""
        token_lists = [tokenize(text) for text in texts]
        flat = list(chain.from_iterable(token_lists))
        vocabulary, tokens = self._vocabulary, self._tokens
        ids = np.fromiter(map(vocabulary.get, flat, repeat(-1)), dtype=np.int64, count=len(flat))
        for i in np.flatnonzero(ids < 0).tolist():  # new words: the next ids, as they appear
            term = vocabulary.get(flat[i])
            if term is None:
                term = vocabulary[flat[i]] = len(tokens)
                tokens.append(flat[i])
            ids[i] = term
        lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
        width = max(len(vocabulary), 1)
        keys, tfs = np.unique(np.repeat(np.arange(len(texts)), lengths) * width + ids,
                              return_counts=True)
        return keys, tfs, width, lengths

    def _append_row(self, pid: str, length: int, distinct: int) -> None:
        self._row_of[pid] = len(self._pids)
        self._pids.append(pid)
        self._lengths.append(length)
        self._distinct.append(distinct)
        self._alive.append(True)
        self._total_length += length
        self._norm = None

    def remove(self, pid: str) -> None:
        row = self._row_of.pop(pid)
        self._pids[row] = None
        self._alive.data[row] = False
        self._total_length -= int(self._lengths.data[row])
        self._norm = None
        self._dead_postings += int(self._distinct.data[row])

    # -- searching ----------------------------------------------------------------------------

    def score(self, query: str) -> dict[str, float]:
        """BM25 score of every passage sharing a token with `query`."""
        scores, touched = self._scores(query)
        return {self._pids[row]: float(scores[row]) for row in touched}

    def top(self, query: str, k: int) -> list[tuple[str, float]]:
        """The k best (id, score) pairs, best first; ties in id order, so results are stable.
        The same answer as `top_exhaustive`: MaxScore in C (bm25_native.py), or in numpy where
        no C compiler is."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if self._total_length == 0:
            return []
        native = scorer()
        if native is None:
            return self.top_maxscore(query, k)
        self._seal()
        n = len(self._row_of)
        average = self._total_length / n
        lengths = self._lengths.view()
        scales, bests = [], []
        for segment in self._segments:
            a0, best = segment.bounds(lengths, average)
            scales.append(max(1.0, average / a0))
            bests.append(best)
        terms = [t for token in sorted(set(tokenize(query)))
                 if (t := self._vocabulary.get(token)) is not None]
        rows, found = native.top(self._segments, scales, bests, terms, n, self._norms(n),
                                 self._alive.view() if self._dead_postings else None, k)
        if len(rows) > k:  # everything at least the k-th best, so ties are ordered by id
            keep = found >= np.partition(found, len(found) - k)[len(found) - k]
            rows, found = rows[keep], found[keep]
        return self._ranked(rows, found, k)

    def top_maxscore(self, query: str, k: int) -> list[tuple[str, float]]:
        """`top` by MaxScore with one bound per list (bm25_maxscore.py): the same answer, kept
        as a second pruned reference and for side-by-side timing."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if self._total_length == 0:
            return []
        self._seal()
        rows, scores = top_rows(self._query_terms(query), self._norms(len(self._row_of)),
                                len(self._pids), k)
        return self._ranked(rows, scores, k)

    def _ranked(self, rows: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[str, float]]:
        ranked = sorted(((self._pids[row], float(score)) for row, score in
                         zip(rows.tolist(), scores.tolist(), strict=True)),
                        key=lambda item: (-item[1], item[0]))
        return ranked[:k]

    def _live_lists(self, query: str):
        """Per distinct known query token, in sorted order (the exhaustive scorer's order):
        (idf, [(segment, term place, live rows, counts) per segment holding it])."""
        n = len(self._row_of)
        alive = self._alive.view() if self._dead_postings else None
        for token in sorted(set(tokenize(query))):
            term = self._vocabulary.get(token)
            if term is None:
                continue
            lists = []
            for segment in self._segments:
                i = segment.find(term)
                if i is None:
                    continue
                lo, hi = segment.starts[i], segment.starts[i + 1]
                rows, tfs = segment.rows[lo:hi], segment.counts[lo:hi]
                if alive is not None:  # removed passages wait in the segments until a merge
                    live = alive[rows]
                    rows, tfs = rows[live], tfs[live]
                if len(rows):
                    lists.append((segment, i, rows, tfs))
            df = sum(len(rows) for _, _, rows, _ in lists)
            if df:
                yield float(np.log(1 + (n - df + 0.5) / (df + 0.5))), lists

    def _query_terms(self, query: str) -> list[QueryTerm]:
        """The query's terms for MaxScore: idf, live postings and one bound per term."""
        average = self._total_length / len(self._row_of)
        terms = []
        for idf, lists in self._live_lists(query):
            factor = 0.0
            for segment, i, _, _ in lists:
                a0, best = segment.bounds(self._lengths.view(), average)
                factor = max(factor, float(best[i]) * max(1.0, average / a0))
            terms.append(QueryTerm(idf, idf * (K1 + 1) * factor,
                                   [(rows, tfs) for _, _, rows, tfs in lists]))
        return terms

    def top_exhaustive(self, query: str, k: int) -> list[tuple[str, float]]:
        """`top` by scoring every posting of every query token (the reference it must equal)."""
        scores, touched = self._scores(query)
        if len(touched) > k:
            # Everything scoring at least the k-th best, so ties at the edge are ordered by id.
            kth = np.partition(scores[touched], len(touched) - k)[len(touched) - k]
            touched = touched[scores[touched] >= kth]
        ranked = sorted(((self._pids[row], float(scores[row])) for row in touched),
                        key=lambda item: (-item[1], item[0]))
        return ranked[:k]

    def _scores(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """(score per row, the rows that share a token with the query)."""
        n = len(self._row_of)
        if self._total_length == 0:
            return np.zeros(0), np.zeros(0, dtype=np.int64)  # nothing holds a token
        self._seal()
        alive, norm = self._alive.view(), self._norms(n)
        scores = np.zeros(len(self._pids))
        touched = np.zeros(len(self._pids), dtype=np.bool_)
        for token in sorted(set(tokenize(query))):
            term = self._vocabulary.get(token)
            if term is None:
                continue
            found = [p for s in self._segments if (p := s.postings(term)) is not None]
            if not found:
                continue
            rows = np.concatenate([r for r, _ in found]) if len(found) > 1 else found[0][0]
            tfs = np.concatenate([t for _, t in found]) if len(found) > 1 else found[0][1]
            live = alive[rows]
            rows, tfs = rows[live], tfs[live]
            df = len(rows)  # each live row holds a token once: its postings are its passages
            if not df:
                continue
            idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
            scores[rows] += contribution(idf, tfs, norm[rows])
            touched[rows] = True
        return scores, np.flatnonzero(touched)

    def _norms(self, n: int) -> np.ndarray:
        if self._norm is None:
            average = self._total_length / n
            self._norm = K1 * (1 - B + B * self._lengths.view() / average)
        return self._norm

    def _seal(self) -> None:
        """Pending adds become a segment; compact when half the postings are dead."""
        self._seal_pending()
        if self._dead_postings * 2 > self._postings:
            self._merge()

    def _seal_pending(self) -> None:
        terms, rows, tfs = self._pending
        if not terms:
            return
        self._segments.append(Segment.build(
            np.frombuffer(terms, dtype=np.int32), np.frombuffer(rows, dtype=np.int32),
            np.frombuffer(tfs, dtype=np.int32)))
        self._pending = new_pending()
        # Binary-counter merging: keep segment sizes decreasing geometrically.
        while len(self._segments) >= 2 and \
                len(self._segments[-2].rows) <= 2 * len(self._segments[-1].rows):
            self._merge(self._segments[-2:])

    def _merge(self, chosen: list[Segment] | None = None) -> None:
        """Merge `chosen` (the last segments; default all) into one, dropping dead postings."""
        chosen = self._segments if chosen is None else chosen
        alive = self._alive.view()
        terms = np.concatenate([s.flat_terms() for s in chosen])
        rows = np.concatenate([s.rows for s in chosen])
        counts = np.concatenate([s.counts for s in chosen])
        dropped = 0
        if self._dead_postings:  # removed passages' postings go now
            live = alive[rows]
            dropped = len(rows) - int(np.count_nonzero(live))
            terms, rows, counts = terms[live], rows[live], counts[live]
        merged = Segment.build(terms, rows, counts, runs=True)  # each segment is a sorted run
        self._segments = self._segments[: len(self._segments) - len(chosen)] + [merged]
        self._postings -= dropped
        self._dead_postings -= dropped

    # -- on disk ------------------------------------------------------------------------------

    def to_bytes(self, order: Sequence[str], *, with_ids: bool = False) -> bytes:
        """The index as .npz bytes, rows in `order` (which must be exactly its passage ids);
        `with_ids` also saves `order` (newline-separated: ids hold no newline), for a caller
        that keeps the ids nowhere else (`saved_ids` reads them back)."""
        if len(order) != len(self._row_of) or set(order) != self._row_of.keys():
            raise AssertionError("the row order must list every passage of the index once")
        self._seal_pending()
        if len(self._segments) > 1 or self._dead_postings:
            self._merge()
        elif not self._segments:
            self._segments = [Segment.build(*(np.zeros(0, dtype=np.int32),) * 3)]
        segment = self._segments[0]
        # Renumber: our row -> its place in `order`.
        place = np.full(len(self._pids), -1, dtype=np.int64)
        place[[self._row_of[pid] for pid in order]] = np.arange(len(order))
        lengths = self._lengths.view()[[self._row_of[pid] for pid in order]] if order else \
            np.zeros(0, dtype=np.int32)
        return self._encode(segment.flat_terms(), place[segment.rows], segment.counts, lengths,
                            {"ids": np.frombuffer("\n".join(order).encode("utf-8"),
                                                  dtype=np.uint8)} if with_ids else {})

    def rows_bytes(self, order: Sequence[str]) -> bytes:
        """`to_bytes` of the newest passages alone: `order` must be the ids of the last rows
        added (none of them removed), in the order they were added. Reads only the pending
        postings and the segments that reach those rows (an appending commit's keywords,
        persist.append_snapshot); `extend_bytes` adds them back on top of the older rows."""
        first = len(self._pids) - len(order)
        if [self._row_of.get(pid) for pid in order] != list(range(first, len(self._pids))):
            raise AssertionError("rows_bytes takes the newest passages, in the order added")
        terms, rows, counts = (np.frombuffer(a, dtype=np.int32) for a in self._pending)
        parts = [(terms, rows, counts)]
        for segment in self._segments:
            if segment.top_row() >= first:
                parts.append((segment.flat_terms(), segment.rows, segment.counts))
        keep = [r >= first for _, r, _ in parts]
        return self._encode(np.concatenate([t[k] for (t, _, _), k in zip(parts, keep, strict=True)]),
                            np.concatenate([r[k] for (_, r, _), k in zip(parts, keep, strict=True)]) - first,
                            np.concatenate([c[k] for (_, _, c), k in zip(parts, keep, strict=True)]),
                            self._lengths.view()[first:], {})

    def _encode(self, terms: np.ndarray, rows: np.ndarray, counts: np.ndarray,
                lengths: np.ndarray, extra: dict) -> bytes:
        """The .npz of postings (our term ids, final rows, counts) and the rows' lengths: token
        ids become their place in sorted order, postings sorted by (token, row)."""
        used = np.flatnonzero(np.bincount(terms, minlength=len(self._tokens)))
        tokens = self._tokens
        names = sorted(tokens[t] for t in used.tolist())  # one sort of the names (str order)
        # The used ids in name order (the vocabulary maps each name back to its id).
        by_name = np.fromiter(map(self._vocabulary.__getitem__, names), dtype=np.int64,
                              count=len(names))
        new_term = np.full(max(len(tokens), 1), -1, dtype=np.int64)
        new_term[by_name] = np.arange(len(used))
        canonical = Segment.build(new_term[terms].astype(np.int32), rows.astype(np.int32),
                                  counts)
        offsets = np.zeros(len(used) + 1, dtype=np.int64)
        offsets[canonical.terms + 1] = np.diff(canonical.starts)
        offsets = np.cumsum(offsets)
        buffer = io.BytesIO()
        np.savez(
            buffer,
            tokenizer=np.frombuffer(TOKENIZER.encode("utf-8"), dtype=np.uint8),
            vocabulary=np.frombuffer("\n".join(names).encode("utf-8"), dtype=np.uint8),
            lengths=np.asarray(lengths, dtype=np.int32),
            offsets=offsets,
            rows=canonical.rows,
            counts=canonical.counts,
            **extra,
        )
        return buffer.getvalue()

    @staticmethod
    def saved_ids(data: bytes) -> list[str]:
        """The row order saved by `to_bytes(..., with_ids=True)`; ValueError without one."""
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
                raw = arrays["ids"].tobytes().decode("utf-8")
        except (OSError, KeyError, ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"the keyword file holds no passage ids ({exc})") from exc
        return raw.split("\n") if raw else []

    @classmethod
    def restore(cls, data: bytes | None, passages: Sequence[tuple[str, str]],
                parts: Sequence[tuple[bytes, int]] = ()) -> BM25Index:
        """The index of `passages` ((id, text) pairs, in row order): read from `data` (the
        first passages) and `parts` (`rows_bytes` of the next ones, each with its passage
        count) when they fit them, else built from the texts (an index saved without keywords,
        by another tokenizer, or a stale or damaged file). The texts are the authority, so
        rebuilding is always safe, only slower."""
        if data is not None:
            ids = [pid for pid, _ in passages]
            at = len(ids) - sum(n for _, n in parts)
            try:
                index = cls.from_bytes(data, ids[:at])
                for blob, n in parts:
                    index.extend_bytes(blob, ids[at : at + n])
                    at += n
                return index
            except ValueError as exc:
                logger.info("rebuilding the keyword index: %s", exc)
        index = cls.build(passages)
        index.rebuilt = True
        return index

    @classmethod
    def from_bytes(cls, data: bytes, order: Sequence[str]) -> BM25Index:
        """Read `to_bytes` output whose rows are the passages `order`; ValueError if it was
        built by another tokenizer or does not fit them."""
        vocabulary, lengths, offsets, rows, counts = _read_arrays(data, len(order))
        index = cls()
        index._vocabulary = {token: i for i, token in enumerate(vocabulary)}
        index._tokens = list(vocabulary)
        distinct = np.bincount(rows, minlength=len(order)).tolist()
        for pid, length, held in zip(order, lengths.tolist(), distinct, strict=True):
            index._append_row(pid, length, held)
        if len(rows):
            terms = np.flatnonzero(np.diff(offsets)).astype(np.int32)
            starts = np.append(offsets[:-1][terms], offsets[-1]).astype(np.int64)
            index._segments = [Segment(terms, starts, rows.astype(np.int32),
                                        counts.astype(np.int32))]
        index._postings = len(rows)
        return index

    def extend_bytes(self, data: bytes, order: Sequence[str]) -> None:
        """Add the passages `order` from `rows_bytes` output (rows after ours); ValueError if
        it was built by another tokenizer or does not fit them."""
        if any(pid in self._row_of for pid in order) or len(set(order)) != len(order):
            raise ValueError("the keyword part repeats a passage")
        vocabulary, lengths, offsets, rows, counts = _read_arrays(data, len(order))
        ids = np.empty(len(vocabulary), dtype=np.int32)
        for i, token in enumerate(vocabulary):
            term = self._vocabulary.get(token)
            if term is None:
                term = self._vocabulary[token] = len(self._tokens)
                self._tokens.append(token)
            ids[i] = term
        first = len(self._pids)
        distinct = np.bincount(rows, minlength=len(order)).tolist()
        for pid, length, held in zip(order, lengths.tolist(), distinct, strict=True):
            self._append_row(pid, length, held)
        terms, pending_rows, pending_counts = self._pending
        terms.frombytes(np.repeat(ids, np.diff(offsets)).astype(np.int32).tobytes())
        pending_rows.frombytes((rows.astype(np.int64) + first).astype(np.int32).tobytes())
        pending_counts.frombytes(counts.astype(np.int32).tobytes())
        self._postings += len(rows)
        if len(terms) >= _SEAL_POSTINGS:
            self._seal_pending()


def _read_arrays(data: bytes, n: int):
    """(vocabulary, lengths, offsets, rows, counts) of a keyword .npz of n rows, checked;
    ValueError if it was built by another tokenizer or is not consistent."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            if "tokenizer" not in arrays.files:
                raise ValueError("the file does not name the tokenizer that built it")
            tokenizer = arrays["tokenizer"].tobytes().decode("utf-8")
            raw = arrays["vocabulary"].tobytes().decode("utf-8")
            lengths, offsets = arrays["lengths"], arrays["offsets"]
            rows, counts = arrays["rows"], arrays["counts"]
    except (OSError, KeyError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a keyword index file ({exc})") from exc
    except ValueError as exc:
        if "tokenizer" in str(exc):
            raise
        raise ValueError(f"not a keyword index file ({exc})") from exc
    if tokenizer != TOKENIZER:
        raise ValueError(f"built by another tokenizer ({tokenizer!r}, not {TOKENIZER!r})")
    vocabulary = raw.split("\n") if raw else []
    _check(vocabulary, lengths, offsets, rows, counts, n)
    return vocabulary, lengths, offsets, rows, counts


def _check(vocabulary, lengths, offsets, rows, counts, n: int) -> None:
    """ValueError unless the saved arrays describe postings of n passages consistently."""
    if len(lengths) != n:
        raise ValueError(f"the keyword index holds {len(lengths)} rows for {n} passages")
    if len(offsets) != len(vocabulary) + 1 or len(rows) != len(counts) or offsets[0] != 0 \
            or offsets[-1] != len(rows):
        raise ValueError("the keyword index's offsets do not match its postings")
    if np.any(np.diff(offsets) < 0):
        raise ValueError("the keyword index's offsets do not increase")
    if len(rows) and (rows.min() < 0 or rows.max() >= n or counts.min() < 1):
        raise ValueError("the keyword index refers to passages it does not hold")
    # Within one token, rows strictly increase (a repeat would count a passage twice).
    steps = np.diff(rows.astype(np.int64))
    first_of_token = np.zeros(len(rows), dtype=np.bool_)
    first_of_token[offsets[:-1][offsets[:-1] < len(rows)]] = True
    if np.any((steps <= 0) & ~first_of_token[1:]):
        raise ValueError("the keyword index's postings are out of order")
    if not np.array_equal(np.bincount(rows, weights=counts, minlength=n).astype(np.int64),
                          lengths.astype(np.int64)):
        raise ValueError("the keyword index's passage lengths do not match its postings")
