"""The passages' records of a Milvus Lite index (text, page, character offset), in a file beside
the Milvus data, so that a search reads the passages it returns without asking Milvus: Milvus
Lite answers a query by row key in about the same time whatever it reads (~55 ms at 1M
passages), which is most of a search's time.

Contract:
  * `MilvusRecords` holds exactly the records of the commit the store loaded or made;
    `get(ids)` gives {passage id: Record} for the ids it holds (others are left out), in well
    under a millisecond for tens of ids at 1M passages. A passage's document id is the start
    of its id (store_base.passage_doc_id); its source is the document's (the store has it).
  * Files: `records-<g>.bin` in the location's records folder (milvus_location.records_folder),
    rows sorted by passage id: a header line {"count", "width", "docs": [[doc id, rows]...]},
    then, each 8-byte aligned, the ids (fixed width, zero padded), the pages (int32, 0 = none),
    the offsets of the texts (int64), the text offsets into the blob (int64, count + 1) and the
    UTF-8 texts. Written, named, caught up, rewritten and cleaned by the side-file protocol
    (milvus_sidefile.py). Rows (`added`) are Records.
  * Memory: the file is mapped, not read: what a search touches is paged in (the ids' binary
    search and the texts returned). Records added since the file (caught up at open, or
    committed since) are held in a dict until the file is rewritten (then the new file is
    mapped instead); a removed document's rows in the file are hidden by its id.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import mmap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ragspec.fileio import write_parts_atomically
from ragspec.retrieval.base import passage_doc_id
from ragspec.retrieval.milvus.sidefile import SideFile

_MAGIC = b"ragspec records 1\n"
_CHUNK_ROWS = 65_536  # rows per piece written
_HASH_BLOCK = 1 << 24  # bytes hashed at a time when a file is read


@dataclass(frozen=True)
class Record:
    """What a passage's row holds beside its vector: page 0 means none."""

    pid: str
    page: int
    start: int
    text: str


class MilvusRecords(SideFile):
    """See the module docstring."""

    PREFIX, SUFFIX, WHAT = "records-", ".bin", "passage records"

    def __len__(self) -> int:
        return self._count - self._hidden_rows + len(self._added)

    def _reset(self) -> None:
        self._map: mmap.mmap | None = None
        self._count = 0
        self._ids = np.zeros(0, dtype="S1")  # the file's ids, sorted
        self._pages = self._starts = np.zeros(0, dtype=np.int64)
        self._offsets = np.zeros(1, dtype=np.int64)
        self._texts_at = 0  # where the texts start in the file
        self._docs: dict[str, tuple[int, int]] = {}  # the file's documents: (first row, rows)
        self._hidden: set[str] = set()  # documents of the file removed since
        self._hidden_rows = 0
        self._added: dict[str, Record] = {}  # records since the file, by id
        self._added_docs: dict[str, list[str]] = {}

    # -- the file -----------------------------------------------------------------------------

    def _read(self, path: Path, sha256: str) -> None:
        with open(path, "rb") as f:
            digest = hashlib.sha256()
            while block := f.read(_HASH_BLOCK):
                digest.update(block)
        if digest.hexdigest() != sha256:
            raise ValueError(f"{path.name} does not match its checksum")
        self._map_file(path)

    def _map_file(self, path: Path) -> None:
        with open(path, "rb") as f:
            if not f.seek(0, 2):
                raise ValueError(f"{path.name} is empty")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if self._map[: len(_MAGIC)] != _MAGIC:
            raise ValueError(f"{path.name} is not a records file")
        end = self._map.find(b"\n", len(_MAGIC))
        header = json.loads(self._map[len(_MAGIC) : end])
        n, width = int(header["count"]), int(header["width"])
        at = _aligned(end + 1)
        parts = {}
        for name, dtype, size in (("ids", f"S{width}", n), ("pages", "<i4", n),
                                  ("starts", "<i8", n), ("offsets", "<i8", n + 1)):
            parts[name] = np.frombuffer(self._map, dtype=dtype, count=size, offset=at)
            at = _aligned(at + parts[name].nbytes)
        self._ids, self._pages, self._starts = parts["ids"], parts["pages"], parts["starts"]
        self._offsets, self._texts_at, self._count = parts["offsets"], at, n
        if at + int(self._offsets[-1]) != len(self._map):
            raise ValueError(f"{path.name} is damaged (size)")
        first = 0
        for doc_id, rows in header["docs"]:
            self._docs[doc_id] = (first, int(rows))
            first += int(rows)
        if first != n:
            raise ValueError(f"{path.name} is damaged (documents)")

    def _write(self, path: Path) -> str:
        """The file's records and those added, minus the hidden, merged in id order."""
        kept = np.ones(self._count, dtype=bool)
        for doc_id in self._hidden:
            first, rows = self._docs[doc_id]
            kept[first : first + rows] = False
        old = np.flatnonzero(kept)
        new = sorted(self._added)
        width = max([self._ids.dtype.itemsize if self._count else 1,
                     *(len(pid.encode()) for pid in new)])
        ids = np.concatenate([self._ids[old].astype(f"S{width}"),
                              np.array([pid.encode() for pid in new], dtype=f"S{width}")])
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        texts = [self._added[pid].text.encode("utf-8") for pid in new]
        pages = np.concatenate([self._pages[old], np.array(
            [self._added[p].page for p in new], dtype=np.int64)])[order]
        starts = np.concatenate([self._starts[old], np.array(
            [self._added[p].start for p in new], dtype=np.int64)])[order]
        lengths = np.concatenate([np.diff(self._offsets)[old],
                                  np.array([len(t) for t in texts], dtype=np.int64)])[order]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<i8")
        docs = [[doc_id, len(list(rows))] for doc_id, rows in itertools.groupby(
            passage_doc_id(pid.decode()) for pid in ids.tolist())]
        header = _MAGIC + json.dumps({"count": len(ids), "width": width, "docs": docs}).encode() \
            + b"\n"

        def text_parts() -> Iterator[bytes]:
            for first in range(0, len(order), _CHUNK_ROWS):
                yield b"".join(self._text_bytes(int(i), old, texts)
                               for i in order[first : first + _CHUNK_ROWS].tolist())

        arrays = (ids, pages.astype("<i4"), starts.astype("<i8"), offsets)
        digest = hashlib.sha256()

        def parts() -> Iterator[bytes]:
            at = len(header)
            yield header
            for array in arrays:
                pad = _aligned(at) - at
                data = b"\0" * pad + array.tobytes()
                at += len(data)
                yield data
            yield b"\0" * (_aligned(at) - at)
            yield from text_parts()

        def hashed(pieces: Iterable[bytes]) -> Iterator[bytes]:
            for piece in pieces:
                digest.update(piece)
                yield piece

        write_parts_atomically(path, hashed(parts()))
        self._reset()  # the records held since the last file now live in the new one
        self._map_file(path)
        return digest.hexdigest()

    def _text_bytes(self, i: int, old: np.ndarray, texts: list[bytes]) -> bytes:
        """Row i of the merge: a row of the file (the first len(old)) or an added one."""
        if i < len(old):
            row = int(old[i])
            return self._map[self._texts_at + int(self._offsets[row]) :
                             self._texts_at + int(self._offsets[row + 1])]
        return texts[i - len(old)]

    # -- changing -----------------------------------------------------------------------------

    def _doc_ids(self) -> Iterable[str]:
        return [d for d in self._docs if d not in self._hidden] + list(self._added_docs)

    def _apply(self, removed_docs: Iterable[str], added: Iterable[Record]) -> int:
        changed = 0
        for doc_id in removed_docs:
            if doc_id in self._docs and doc_id not in self._hidden:
                self._hidden.add(doc_id)
                self._hidden_rows += self._docs[doc_id][1]
                changed += self._docs[doc_id][1]
            for pid in self._added_docs.pop(doc_id, []):
                del self._added[pid]
                changed += 1
        for record in added:
            self._added[record.pid] = record
            self._added_docs.setdefault(passage_doc_id(record.pid), []).append(record.pid)
            changed += 1
        return changed

    # -- reading ------------------------------------------------------------------------------

    def get(self, pids: Iterable[str]) -> dict[str, Record]:
        """The records of the passages in `pids` that are held."""
        out, look = {}, []
        for pid in pids:
            if pid in self._added:
                out[pid] = self._added[pid]
            elif self._count and passage_doc_id(pid) not in self._hidden:
                look.append(pid)
        if not look:
            return out
        keys = np.array([pid.encode() for pid in look], dtype=object)
        rows = np.searchsorted(self._ids, keys.astype(self._ids.dtype))
        for pid, key, row in zip(look, keys.tolist(), rows.tolist(), strict=True):
            if row < self._count and self._ids[row] == key:
                text = self._map[self._texts_at + int(self._offsets[row]) :
                                 self._texts_at + int(self._offsets[row + 1])]
                out[pid] = Record(pid, int(self._pages[row]), int(self._starts[row]),
                                  text.decode("utf-8"))
        return out


def _aligned(at: int) -> int:
    return (at + 7) // 8 * 8
