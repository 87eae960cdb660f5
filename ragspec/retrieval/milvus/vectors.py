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
    a header line, the passage ids, then the float32 rows; written, named, caught up,
    rewritten and cleaned by the side-file protocol (milvus_sidefile.py). Rows (`added`) are
    (passage ids, vectors) blocks; `sorted_blocks` puts rows read from Milvus in (gen, passage
    id) order, the order their commits added them.
  * Memory: 4 bytes per dimension per passage (1.5 GB at 1M passages of 384 dimensions), and
    the approximate index's 1 byte per dimension once a search past the threshold built it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import faiss
import numpy as np

from ragspec.fileio import write_parts_atomically
from ragspec.retrieval.base import passage_doc_id
from ragspec.retrieval.faiss.ann import ApproxIndex
from ragspec.retrieval.milvus.sidefile import SideFile

_MAGIC = b"ragspec vectors 1\n"
_CHUNK_ROWS = 65_536  # rows per read or write: bounded memory beside the flat index

# (passage ids, their gens, float32 vectors of shape (len(ids), dim))
Rows = tuple[list[str], np.ndarray, np.ndarray]


def sorted_blocks(rows: Rows) -> Iterator[tuple[list[str], np.ndarray]]:
    """Rows read from Milvus as (ids, vectors) blocks in (gen, passage id) order, made a chunk
    at a time as they are consumed (no second copy of all the rows)."""
    pids, gens, vectors = rows
    order = np.asarray(sorted(range(len(pids)), key=lambda i: (int(gens[i]), pids[i])),
                       dtype=np.int64)
    for start in range(0, len(order), _CHUNK_ROWS):
        chunk = order[start : start + _CHUNK_ROWS]
        yield [pids[i] for i in chunk.tolist()], vectors[chunk]


class MilvusVectors(SideFile):
    """See the module docstring."""

    PREFIX, SUFFIX, WHAT = "vectors-", ".bin", "vectors"

    def __init__(self, folder: Path) -> None:
        self.approx = ApproxIndex()
        super().__init__(folder)

    def __len__(self) -> int:
        return 0 if self.flat is None else int(self.flat.ntotal)

    def _reset(self) -> None:
        self.flat: faiss.Index | None = None
        self.pids: list[str] = []
        self._doc_pids: dict[str, list[str]] = {}
        self._rows: dict[str, int] | None = None  # passage id -> row, made when asked
        self.approx.invalidate()

    def _read(self, path: Path, sha256: str) -> None:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            head = f.read(len(_MAGIC))
            line = f.readline()
            digest.update(head + line)
            if head != _MAGIC:
                raise ValueError(f"{path.name} is not a vector file")
            header = json.loads(line)
            count, dim, size = int(header["count"]), int(header["dim"]), int(header["ids"])
            raw = f.read(size)
            digest.update(raw)
            pids = raw.decode("utf-8").split("\n") if count else []
            if len(pids) != count:
                raise ValueError(f"{path.name} is damaged (ids)")
            flat = faiss.IndexFlatIP(dim) if dim else None
            for start in range(0, count, _CHUNK_ROWS):
                rows = min(_CHUNK_ROWS, count - start)
                block = f.read(rows * dim * 4)
                digest.update(block)
                if len(block) != rows * dim * 4:
                    raise ValueError(f"{path.name} is truncated")
                flat.add(np.frombuffer(block, dtype="<f4").reshape(rows, dim))
            digest.update(f.read())  # anything after the rows fails the checksum
        if digest.hexdigest() != sha256:
            raise ValueError(f"{path.name} does not match its checksum")
        self.flat = flat
        self._add_ids(pids)

    def _doc_ids(self) -> Iterable[str]:
        return list(self._doc_pids)

    def _apply(self, removed_docs: Iterable[str],
               added: Iterable[tuple[list[str], np.ndarray]]) -> int:
        """Drop every row of `removed_docs`, then append the (ids, vectors) blocks."""
        changed = 0
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
            changed += len(gone)
        for pids, vectors in added:
            self._add(pids, vectors)
            changed += len(pids)
        return changed

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

    def _write(self, path: Path) -> str:
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
