"""The keyword side of a Milvus index: ragspec's own BM25 (bm25.py) over the committed passages,
kept in a file beside the Milvus data, so that keyword ranking (the tokenizer, idf and length
statistics) is the FAISS folder's, whichever backend holds the passages.

Contract:
  * `MilvusKeywords.index` holds exactly the passages of the commit the store loaded or made;
    `top_ids(query, k)` ranks them.
  * Files: `gen-<g>.npz` in the location's keywords folder (milvus_location.keywords_folder):
    the BM25 index of commit g with its passage ids (bm25.BM25Index.to_bytes(with_ids=True)),
    written, named, caught up, rewritten and cleaned by the side-file protocol
    (milvus_sidefile.py). Rows (`added`) are (passage id, text) pairs; a rebuild from Milvus
    adds them in id order.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable
from pathlib import Path

from ragspec.fileio import write_atomically
from ragspec.retrieval.base import passage_doc_id
from ragspec.retrieval.bm25.index import BM25Index
from ragspec.retrieval.milvus.sidefile import SideFile

_BATCH = 1000  # pairs per BM25Index.add_many


class MilvusKeywords(SideFile):
    """See the module docstring."""

    PREFIX, SUFFIX, WHAT = "gen-", ".npz", "keyword index"

    def __len__(self) -> int:
        return len(self.index)

    def _reset(self) -> None:
        self.index = BM25Index()
        self._doc_pids: dict[str, list[str]] = {}

    def _read(self, path: Path, sha256: str) -> None:
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ValueError(f"{path.name} does not match its checksum")
        self.index = BM25Index.from_bytes(data, BM25Index.saved_ids(data))
        for pid in self.index.ids():
            self._doc_pids.setdefault(passage_doc_id(pid), []).append(pid)

    def _doc_ids(self) -> Iterable[str]:
        return list(self._doc_pids)

    def _apply(self, removed_docs: Iterable[str], added: Iterable[tuple[str, str]]) -> int:
        changed = 0
        for doc_id in removed_docs:
            for pid in self._doc_pids.pop(doc_id, []):
                self.index.remove(pid)
                changed += 1
        pairs = iter(added)
        while batch := list(itertools.islice(pairs, _BATCH)):
            self.index.add_many(batch)
            for pid, _ in batch:
                self._doc_pids.setdefault(passage_doc_id(pid), []).append(pid)
            changed += len(batch)
        return changed

    def _write(self, path: Path) -> str:
        data = self.index.to_bytes(sorted(self.index.ids()), with_ids=True)
        write_atomically(path, data)
        return hashlib.sha256(data).hexdigest()

    def top_ids(self, query: str, k: int) -> list[str]:
        return [pid for pid, _ in self.index.top(query, k)]
