"""The dense side of a Milvus Lite index: the committed passages' vectors, in a file beside the
Milvus data, searched past faiss_ann.THRESHOLD passages by the FAISS folder's own approximate
index (faiss_ann.ApproxIndex: IVF candidates over 8-bit copies, exact cosines), so that a
large Milvus Lite index answers as fast as the folder, and with the same passages.

Contract:
  * `MilvusVectors.flat` (a faiss IndexFlatIP, row i for `pids[i]`) holds exactly the vectors
    of the commit the store loaded or made, in the order the FAISS folder holds them:
    documents in the order they were committed, a removed or replaced document's rows dropped
    and the rows after them moved up. `search(vector, k)` gives the best k (passage id,
    cosine), best first; `cosines(ids, vector)` the cosine of each passage it holds.
  * Files: `vectors-<g>.bin` in the location's vectors folder (milvus_location.vectors_folder):
    a header line, the passage ids, then the float32 rows. The same rules as the keyword file
    (milvus_keywords.py): the manifest names the file it relies on ({"file", "gen",
    "sha256"}); a file is written (to a temporary name, fsynced, renamed) before the manifest
    that names it; files the manifest does not name are left-overs, deleted by the next writer
    (`clean`); a file is rewritten when the passages added or removed since its commit reach
    REWRITE_SHARE of the index. A reader catches up from the file: it drops the documents
    removed or replaced after the file's commit and appends the visible rows with a newer gen,
    read from Milvus. When the file is missing, damaged or does not match the commit, the
    vectors are read from Milvus again: Milvus holds the authoritative copy, so rebuilding is
    always safe, only slower. Rows read from Milvus come in (gen, passage id) order.
  * Memory: 4 bytes per dimension per passage (1.5 GB at 1M passages of 384 dimensions), and
    the approximate index's 1 byte per dimension once a search past the threshold built it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import faiss
import numpy as np

from ragspec.fileio import fsync_dir, write_parts_atomically
from ragspec.retrieval.faiss_ann import ApproxIndex
from ragspec.retrieval.store_base import passage_doc_id

logger = logging.getLogger(__name__)

REWRITE_SHARE = 0.25
_PREFIX = "vectors-"
_MAGIC = b"ragspec vectors 1\n"
_CHUNK_ROWS = 65_536  # rows per read or write: bounded memory beside the flat index

# (passage ids, their gens, float32 vectors of shape (len(ids), dim))
Rows = tuple[list[str], np.ndarray, np.ndarray]


class MilvusVectors:
    """See the module docstring."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.flat: faiss.Index | None = None
        self.pids: list[str] = []
        self._doc_pids: dict[str, list[str]] = {}
        self._rows: dict[str, int] | None = None  # passage id -> row, made when asked
        self.approx = ApproxIndex()
        self.file: dict | None = None  # the manifest entry of the file these rows came from
        self._changed = 0  # passages added or removed since that file's commit

    def __len__(self) -> int:
        return 0 if self.flat is None else int(self.flat.ntotal)

    # -- loading ------------------------------------------------------------------------------

    def load(self, entry: dict | None, count: int, doc_gen: dict[str, int],
             newer: Callable[[int], Rows], every: Callable[[], Rows]) -> None:
        """The vectors of the commit whose documents (doc id -> gen) hold `count` passages.
        newer(g): the visible rows with gen > g; every(): all visible rows."""
        self._reset()
        try:
            if entry is None:
                raise ValueError("the index names no vector file")
            self._read(entry)
            gen = int(entry["gen"])
            self.apply([d for d in self._doc_pids if doc_gen.get(d, gen + 1) > gen], [])
            self._append_sorted(newer(gen))
            if len(self) != count:
                raise ValueError(f"it holds {len(self)} passages, the index {count}")
            self.file = entry
            return
        except (OSError, ValueError) as exc:
            logger.info("reading the vectors from Milvus: %s", exc)
        self._reset()
        self._append_sorted(every())
        self._changed = len(self)

    def _reset(self) -> None:
        self.flat, self.pids, self._doc_pids, self._rows = None, [], {}, None
        self.approx.invalidate()
        self.file, self._changed = None, 0

    def _read(self, entry: dict) -> None:
        digest = hashlib.sha256()
        with open(self.folder / entry["file"], "rb") as f:
            head = f.read(len(_MAGIC))
            line = f.readline()
            digest.update(head + line)
            if head != _MAGIC:
                raise ValueError(f"{entry['file']} is not a vector file")
            header = json.loads(line)
            count, dim, size = int(header["count"]), int(header["dim"]), int(header["ids"])
            raw = f.read(size)
            digest.update(raw)
            pids = raw.decode("utf-8").split("\n") if count else []
            if len(pids) != count:
                raise ValueError(f"{entry['file']} is damaged (ids)")
            flat = faiss.IndexFlatIP(dim) if dim else None
            for start in range(0, count, _CHUNK_ROWS):
                rows = min(_CHUNK_ROWS, count - start)
                block = f.read(rows * dim * 4)
                digest.update(block)
                if len(block) != rows * dim * 4:
                    raise ValueError(f"{entry['file']} is truncated")
                flat.add(np.frombuffer(block, dtype="<f4").reshape(rows, dim))
            digest.update(f.read())  # anything after the rows fails the checksum
        if digest.hexdigest() != entry["sha256"]:
            raise ValueError(f"{entry['file']} does not match its checksum")
        self.flat = flat
        self._add_ids(pids)

    def _append_sorted(self, rows: Rows) -> None:
        pids, gens, vectors = rows
        if not pids:
            return
        order = np.asarray(sorted(range(len(pids)), key=lambda i: (int(gens[i]), pids[i])),
                           dtype=np.int64)
        for start in range(0, len(order), _CHUNK_ROWS):  # no second copy of all the rows
            chunk = order[start : start + _CHUNK_ROWS]
            self._add([pids[i] for i in chunk.tolist()], vectors[chunk])

    # -- changing -----------------------------------------------------------------------------

    def apply(self, removed_docs: Iterable[str],
              added: Iterable[tuple[list[str], np.ndarray]]) -> None:
        """Drop every row of `removed_docs`, then append the (ids, vectors) blocks."""
        gone = [pid for doc_id in removed_docs for pid in self._doc_pids.pop(doc_id, [])]
        if gone:
            rows = self._row_of()
            drop = np.fromiter((rows[pid] for pid in gone), dtype=np.int64, count=len(gone))
            self.flat.remove_ids(faiss.IDSelectorBatch(drop))  # keeps the others' order
            keep = np.ones(len(self.pids), dtype=bool)
            keep[drop] = False
            self.pids = [pid for pid, kept in zip(self.pids, keep.tolist(), strict=True) if kept]
            self._rows = None
            self.approx.invalidate()  # the rows after a dropped one moved
            self._changed += len(gone)
        for pids, vectors in added:
            self._add(pids, vectors)
            self._changed += len(pids)

    def _add(self, pids: list[str], vectors: np.ndarray) -> None:
        if not pids:
            return
        if self.flat is None:
            self.flat = faiss.IndexFlatIP(int(vectors.shape[1]))
        self.flat.add(np.ascontiguousarray(vectors, dtype=np.float32))
        self._add_ids(pids)

    def _add_ids(self, pids: list[str]) -> None:
        if self._rows is not None:
            self._rows.update(zip(pids, range(len(self.pids), len(self.pids) + len(pids)),
                                  strict=True))
        self.pids.extend(pids)
        for pid in pids:
            self._doc_pids.setdefault(passage_doc_id(pid), []).append(pid)

    def commit(self, pending: Iterable[tuple[list[str], np.ndarray]], retired: Iterable[str],
               gen: int) -> dict | None:
        """Apply a commit's changes; write the file for `gen` when it is due. Returns the
        manifest entry the commit must name (the new file's, or the one still relied on)."""
        self.apply(retired, pending)
        if self.file is not None and self._changed < REWRITE_SHARE * max(1, len(self)):
            return self.file
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{_PREFIX}{gen}.bin"
        self.file = {"file": name, "gen": gen, "sha256": self._write(self.folder / name)}
        fsync_dir(self.folder)
        self._changed = 0
        return self.file

    def _write(self, path: Path) -> str:
        """Write the rows to `path` atomically (a temporary name, fsynced, renamed); their
        sha256."""
        digest = hashlib.sha256()
        dim = 0 if self.flat is None else int(self.flat.d)
        ids = "\n".join(self.pids).encode("utf-8")
        head = _MAGIC + json.dumps({"count": len(self), "dim": dim, "ids": len(ids)}).encode() \
            + b"\n"

        def rows():  # a chunk of rows at a time: the file is never whole in memory
            for start in range(0, len(self), _CHUNK_ROWS):
                count = min(_CHUNK_ROWS, len(self) - start)
                yield self.flat.reconstruct_n(start, count).astype("<f4").tobytes()

        def hashed(parts):
            for part in parts:
                digest.update(part)
                yield part

        write_parts_atomically(path, hashed(itertools.chain((head, ids), rows())))
        return digest.hexdigest()

    def clean(self, keep: dict | None) -> None:
        """Delete the vector files the manifest (entry `keep`) does not name, and temporary
        files a crash left."""
        if not self.folder.is_dir():
            return
        for path in [*self.folder.glob(f"{_PREFIX}*.bin"),
                     *self.folder.glob(f".{_PREFIX}*.tmp")]:
            if keep is None or path.name != keep["file"]:
                path.unlink(missing_ok=True)

    # -- searching ----------------------------------------------------------------------------

    def search(self, vector: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The best k (passage id, exact cosine), best first (faiss_ann.ApproxIndex)."""
        return [(self.pids[row], score) for row, score in self.approx.search(self.flat, vector, k)]

    def cosines(self, pids: Iterable[str], vector: np.ndarray) -> dict[str, float]:
        """The cosine of each passage in `pids` that is held (as the FAISS folder computes it)."""
        rows = self._row_of()
        return {pid: float(self.flat.reconstruct(rows[pid]) @ vector)
                for pid in pids if pid in rows}

    def _row_of(self) -> dict[str, int]:
        if self._rows is None:
            self._rows = {pid: row for row, pid in enumerate(self.pids)}
        return self._rows
