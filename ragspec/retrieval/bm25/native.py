"""Exact top-k BM25 in C (MaxScore), compiled on first use; None when it cannot be (the caller
then searches in numpy, with the same result).

Contract: `scorer()` returns a `Native` (or None when no C compiler is found or the build
fails). `Native.top(segments, scales, bests, terms, n, norms, alive, k)` finds the term ids'
posting ranges in each segment (binary search in C), counts their live document frequencies,
takes idf as the numpy scorers do, and runs MaxScore wholly in C (bm25_native.c): it returns
every row whose score is at least the k-th best, each with the score the exhaustive numpy
scorer gives it to the last bit (the same float operations, summed in the order of `terms`).
Every row the segments hold must be below len(norms) and len(alive) (the caller's postings
refer to its own rows; the C loops do not check each one). It imports only ragspec.paths,
bm25_postings (the segments, K1) and bm25_maxscore's SLACK.

Two knobs, both giving the same answer: `term_at_a_time` (default True: each essential list
read straight through into scratch scores kept between searches under a lock; False: the lists
merged row by row) and `seed_rows` (rows of the rarest terms' lists scored first, whose k-th
best starts the threshold; 128). At 1M passages the two traversals measured within 30% of each
other on the 103 questions (docs/changelog.md, "keyword MaxScore wholly in C").

The source (bm25_native.c) is compiled with the system C compiler (`$CC`, else `cc`) with -O3,
-march=native and -ffp-contract=off (no fused multiply-add, so no rounding differs from
numpy's), into ragspec.paths.kernels_dir() (where the generator's kernels go too, shared by
every RAGSPEC_HOME), under a name that covers the source, the compiler and the CPU, so a
copied cache for another machine is rebuilt, not run. RAGSPEC_NATIVE_BM25=0 keeps numpy.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ragspec import paths
from ragspec.retrieval.bm25.maxscore import SLACK
from ragspec.retrieval.bm25.postings import K1, Segment

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("bm25_native.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
_lock = threading.Lock()
_loaded: list = []  # [Native | None] once tried


def _folder() -> Path:
    return paths.kernels_dir()


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return platform.machine() + line
    except OSError:
        pass
    return platform.machine()


def _pointers(arrays) -> ctypes.Array:
    return (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])


class Native:
    """The loaded C functions (see the module docstring)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        p, i64, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
        self._lookup = library.ragspec_bm25_lookup
        self._lookup.restype = None
        self._lookup.argtypes = [i64, p, p, p, p, p, p, i64, p, p, p, p, p, p]
        self._maxscore = library.ragspec_bm25_maxscore
        self._maxscore.restype = i64
        self._maxscore.argtypes = [i64, p, p, i64, p, p, p, p, f64, p, p, i64, f64, i64, p, p, p, p,
                                   p, i64]
        self.seed_rows = 128  # rows of the rarest terms' lists scored first, for theta
        self.term_at_a_time = True  # essential lists into scratch scores (False: merged)
        self._scratch: tuple[np.ndarray, np.ndarray] | None = None
        self._scratch_lock = threading.Lock()
        self.visited = 0  # postings the last search read (for tests and benchmarks)
        self._vocab_new = library.ragspec_vocab_new
        self._vocab_new.restype = p
        self._vocab_new.argtypes = []
        self._vocab_free = library.ragspec_vocab_free
        self._vocab_free.restype = None
        self._vocab_free.argtypes = [p]
        self._vocab_size = library.ragspec_vocab_size
        self._vocab_size.restype = i64
        self._vocab_size.argtypes = [p]
        self._vocab_add = library.ragspec_vocab_add
        self._vocab_add.restype = i64
        self._vocab_add.argtypes = [p, p, p, i64]
        self._tokenize_count = library.ragspec_tokenize_count
        self._tokenize_count.restype = i64
        self._tokenize_count.argtypes = [p, p, p, i64, p, p, p, p, p, p, p, p, p]

    def vocabulary(self) -> Vocabulary:
        """An empty C vocabulary, for `count` (bm25.BM25Index keeps one beside its dict)."""
        handle = self._vocab_new()
        if not handle:
            raise MemoryError("the keyword tokenizer ran out of memory")
        return Vocabulary(self, handle)

    def top(self, segments: Sequence[Segment], scales: Sequence[float],
            bests: Sequence[np.ndarray], terms: Sequence[int], n: int, norms: np.ndarray,
            alive: np.ndarray | None, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, exact scores): every row whose BM25 score over the term ids `terms` (added in
        that order) is at least the k-th best, found by MaxScore. `n` is the number of live
        rows (for idf), `alive` None when no row is dead; `bests[s]` and `scales[s]` are
        segment s's per-term bounds and the factor that keeps them valid at today's average
        length (bm25_postings.Segment.bounds)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if norms.dtype != np.float64 or not norms.flags.c_contiguous:
            raise TypeError("norms must be a contiguous float64 array")
        if alive is not None and (alive.dtype != np.bool_ or not alive.flags.c_contiguous
                                  or len(alive) < len(norms)):
            raise TypeError("alive must be a contiguous bool array covering every row")
        if not segments or not terms:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        n_seg, n_q = len(segments), len(terms)
        term_ids = np.asarray(terms, dtype=np.int32)
        bests = [np.ascontiguousarray(b, dtype=np.float64) for b in bests]
        scale = np.asarray(scales, dtype=np.float64)
        nterms = np.asarray([len(s.terms) for s in segments], dtype=np.int64)
        lo = np.zeros(n_q * n_seg, dtype=np.int64)
        hi = np.zeros(n_q * n_seg, dtype=np.int64)
        df = np.zeros(n_q, dtype=np.int64)
        factor = np.zeros(n_q)
        alive_ptr = None if alive is None else alive.ctypes.data
        rows_ptrs = _pointers([s.rows for s in segments])
        self._lookup(n_seg, _pointers([s.terms for s in segments]), nterms.ctypes.data,
                     _pointers([s.starts for s in segments]), rows_ptrs, _pointers(bests),
                     scale.ctypes.data, n_q, term_ids.ctypes.data, alive_ptr, lo.ctypes.data,
                     hi.ctypes.data, df.ctypes.data, factor.ctypes.data)
        held = [q for q in range(n_q) if df[q]]
        if not held:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        # idf as the numpy scorers compute it (np.log of a Python float: the same bits).
        idf = np.asarray([float(np.log(1 + (n - int(df[q]) + 0.5) / (int(df[q]) + 0.5)))
                          for q in held])
        bound = idf * (K1 + 1) * factor[held]
        at = (np.asarray(held)[:, None] * n_seg + np.arange(n_seg)).ravel()
        lo, hi = np.ascontiguousarray(lo[at]), np.ascontiguousarray(hi[at])
        counts_ptrs = _pointers([s.counts for s in segments])
        cap = max(4 * k, 256)
        with self._scratch_lock:  # scores and marks per row, left zeroed by each search
            if self.term_at_a_time and (self._scratch is None or
                                        len(self._scratch[0]) < len(norms)):
                self._scratch = (np.zeros(len(norms)), np.zeros(len(norms), dtype=np.uint8))
            scratch = self._scratch if self.term_at_a_time else None
            return self._run(n_seg, rows_ptrs, counts_ptrs, held, lo, hi, idf, bound, norms,
                             alive_ptr, k, cap, scratch)

    def _run(self, n_seg, rows_ptrs, counts_ptrs, held, lo, hi, idf, bound, norms, alive_ptr,
             k, cap, scratch):
        visited = np.zeros(1, dtype=np.int64)
        while True:
            out_rows = np.zeros(cap, dtype=np.int64)
            out_scores = np.zeros(cap)
            got = int(self._maxscore(n_seg, rows_ptrs, counts_ptrs, len(held), lo.ctypes.data,
                                     hi.ctypes.data, idf.ctypes.data, bound.ctypes.data,
                                     float(K1 + 1), norms.ctypes.data, alive_ptr, int(k),
                                     SLACK, cap, out_rows.ctypes.data, out_scores.ctypes.data,
                                     visited.ctypes.data,
                                     None if scratch is None else scratch[0].ctypes.data,
                                     None if scratch is None else scratch[1].ctypes.data,
                                     int(self.seed_rows)))
            if got >= 0:
                self.visited = int(visited[0])
                return out_rows[:got], out_scores[:got]
            if got < -(2 ** 62):
                raise MemoryError("the keyword scorer ran out of memory")
            cap = -got


@dataclass
class Counted:
    """What `Vocabulary.count` found: postings (term id, row, count; one per text and distinct
    token), per text its token count and distinct tokens, and the tokens new to the vocabulary
    in the order they got their ids."""

    terms: np.ndarray
    rows: np.ndarray
    counts: np.ndarray
    lengths: np.ndarray
    distinct: np.ndarray
    new_tokens: list[str]


class Vocabulary:
    """Token -> id in C, mirroring a Python dict whose ids are 0, 1, 2, ... in insertion order:
    `sync(tokens)` adds the tokens of the id-ordered list it lacks; `count(texts, rows)`
    tokenises and counts ASCII texts as bm25.tokenize does (bm25_native.c) and gives new tokens
    the next ids. One writer at a time (BM25Index is not thread-safe for writes either)."""

    def __init__(self, native: Native, handle: int) -> None:
        self._native, self._handle = native, handle

    def __del__(self) -> None:
        if getattr(self, "_handle", None):
            self._native._vocab_free(self._handle)
            self._handle = None

    def __len__(self) -> int:
        return int(self._native._vocab_size(self._handle))

    def sync(self, tokens: Sequence[str]) -> None:
        have = len(self)
        if have >= len(tokens):
            return
        encoded = [t.encode("utf-8") for t in tokens[have:]]
        starts = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)),
                  out=starts[1:])
        buf = b"".join(encoded)
        got = self._native._vocab_add(self._handle, buf, starts.ctypes.data, len(encoded))
        if got == -1:
            raise MemoryError("the keyword tokenizer ran out of memory")
        if got == -2:
            raise ValueError("the vocabulary repeats a token")

    def count(self, texts: Sequence[str], rows: np.ndarray) -> Counted:
        """`texts` must all be ASCII (str.isascii()); text i is row rows[i]."""
        n = len(texts)
        buf = "".join(texts).encode("ascii")
        ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=n))
        rows_of = np.ascontiguousarray(rows, dtype=np.int32)
        cap = (len(buf) + n) // 2 + 1  # a token takes a character and a gap
        terms, out_rows, counts = (np.empty(cap, dtype=np.int32) for _ in range(3))
        lengths, distinct = np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int32)
        new_at, new_len = np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.int64)
        n_new = np.zeros(1, dtype=np.int64)
        got = int(self._native._tokenize_count(
            self._handle, buf, ends.ctypes.data, n, rows_of.ctypes.data, terms.ctypes.data,
            out_rows.ctypes.data, counts.ctypes.data, lengths.ctypes.data, distinct.ctypes.data,
            new_at.ctypes.data, new_len.ctypes.data, n_new.ctypes.data))
        if got < 0:
            raise MemoryError("the keyword tokenizer ran out of memory")
        fresh = int(n_new[0])
        new_tokens = [buf[a : a + b].decode("ascii").lower()
                      for a, b in zip(new_at[:fresh].tolist(), new_len[:fresh].tolist(),
                                      strict=True)]
        return Counted(terms[:got], out_rows[:got], counts[:got], lengths, distinct,
                       new_tokens)


def _build() -> Native | None:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        logger.info("no C compiler (%r): keyword scoring stays in numpy", cc)
        return None
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
        digest = hashlib.sha256(_SOURCE.read_bytes() + version.encode() + _cpu().encode() +
                                " ".join(FLAGS).encode()).hexdigest()[:16]
        target = _folder() / f"bm25-{digest}.so"
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            # Built beside the target and renamed: a reader never loads a half-written file.
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                built = Path(tmp) / target.name
                subprocess.run([cc, *FLAGS, str(_SOURCE), "-o", str(built)], check=True,
                               capture_output=True, timeout=120)
                os.replace(built, target)
        return Native(ctypes.CDLL(str(target)))
    except (OSError, subprocess.SubprocessError) as exc:
        logger.info("the keyword scorer's C build failed (%s): scoring stays in numpy", exc)
        return None


def scorer() -> Native | None:
    """The compiled scorer, built on the first call (None where it cannot be)."""
    with _lock:
        if not _loaded:
            _loaded.append(None if os.environ.get("RAGSPEC_NATIVE_BM25") == "0" else _build())
        return _loaded[0]
