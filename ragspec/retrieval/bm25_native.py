"""The exhaustive BM25 scorer's inner loop in C, compiled on first use; numpy when it cannot be.

Contract: `scorer()` returns an `Accumulator` (or None when no C compiler is found or the build
fails: the caller then scores in numpy, with the same result). `Accumulator.add(rows, tfs,
idf, norms, scores, touched, touched_rows, n_touched)` adds one term's BM25 contribution
(bm25_postings.contribution) to `scores[rows]` with the same floating-point operations in the
same order as numpy does, so the scores are equal to the last bit; it also lists each newly
touched row. Every row in `rows` must be below len(norms) (the caller's postings refer to its
own rows; the loop does not check each one). It imports only ragspec.paths and bm25_postings' constants.

The source (bm25_native.c) is compiled with the system C compiler (`$CC`, else `cc`) with -O3,
-march=native and -ffp-contract=off (no fused multiply-add, so no rounding differs from
numpy's), into `$RAGSPEC_KERNELS_DIR` (where the generator's kernels go too) or
`$RAGSPEC_HOME/kernels`, under a name that covers the source, the compiler and the CPU, so a
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
from pathlib import Path

import numpy as np

from ragspec import paths
from ragspec.retrieval.bm25_postings import K1

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("bm25_native.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
_lock = threading.Lock()
_loaded: list = []  # [Accumulator | None] once tried


def _folder() -> Path:
    return Path(os.environ.get("RAGSPEC_KERNELS_DIR") or paths.home() / "kernels")


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return platform.machine() + line
    except OSError:
        pass
    return platform.machine()


class Accumulator:
    """The loaded C function (see the module docstring)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.ragspec_bm25_accumulate
        self._fn.restype = ctypes.c_int64
        pointer = ctypes.c_void_p
        self._fn.argtypes = [pointer, pointer, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                             pointer, pointer, pointer, pointer, ctypes.c_int64]

    def add(self, rows: np.ndarray, tfs: np.ndarray, idf: float, norms: np.ndarray,
            scores: np.ndarray, touched: np.ndarray, touched_rows: np.ndarray,
            n_touched: int) -> int:
        rows = np.ascontiguousarray(rows, dtype=np.int32)
        tfs = np.ascontiguousarray(tfs, dtype=np.int32)
        for array, dtype in ((norms, np.float64), (scores, np.float64), (touched, np.uint8),
                             (touched_rows, np.int64)):
            if array.dtype != dtype or not array.flags.c_contiguous:
                raise TypeError(f"expected a contiguous {dtype} array, got {array.dtype}")
        if min(len(scores), len(touched), len(touched_rows)) < len(norms):
            raise IndexError("the score arrays must hold a place per row")
        return int(self._fn(rows.ctypes.data, tfs.ctypes.data, len(rows), float(idf),
                            float(K1 + 1), norms.ctypes.data, scores.ctypes.data,
                            touched.ctypes.data, touched_rows.ctypes.data, int(n_touched)))


def _build() -> Accumulator | None:
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
        return Accumulator(ctypes.CDLL(str(target)))
    except (OSError, subprocess.SubprocessError) as exc:
        logger.info("the keyword scorer's C build failed (%s): scoring stays in numpy", exc)
        return None


def scorer() -> Accumulator | None:
    """The compiled accumulator, built on the first call (None where it cannot be)."""
    with _lock:
        if not _loaded:
            _loaded.append(None if os.environ.get("RAGSPEC_NATIVE_BM25") == "0" else _build())
        return _loaded[0]
