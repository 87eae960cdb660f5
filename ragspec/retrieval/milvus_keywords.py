"""The keyword side of a Milvus index: ragspec's own BM25 (bm25.py) over the committed passages,
kept in a file beside the Milvus data, so that keyword ranking (the tokenizer, idf and length
statistics) is the FAISS folder's, whichever backend holds the passages.

Contract:
  * `MilvusKeywords.index` holds exactly the passages of the commit the store loaded or made.
  * Files: `gen-<g>.npz` in the location's keywords folder (milvus_location.keywords_folder):
    the BM25 index of commit g with its passage ids (bm25.BM25Index.to_bytes(with_ids=True)).
    The manifest names the file it relies on ({"file", "gen", "sha256"}); a file is written
    (atomically, fsynced) before the manifest that names it, so a crash leaves either the old
    manifest and its file, or the new ones; files the manifest does not name are left-overs,
    deleted by the next writer (`clean`).
  * Not every commit rewrites the file (that would make a long ingest quadratic): it is
    rewritten when the passages added or removed since the file's commit reach a quarter of
    the index (REWRITE_SHARE), so the bytes written stay within a constant factor of the
    index's size. A reader catches up from the file: it drops the documents that were removed
    or replaced after the file's commit and adds the visible passages with a newer gen, read
    from Milvus. When the file is missing or does not match (another machine reading a server,
    a damaged file), the index is built from the passages' texts: they are the authority, so
    rebuilding is always safe, only slower.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from ragspec.fileio import fsync_dir, write_atomically
from ragspec.retrieval.bm25 import BM25Index
from ragspec.retrieval.records import Passage
from ragspec.retrieval.store_base import passage_doc_id

logger = logging.getLogger(__name__)

REWRITE_SHARE = 0.25
_PREFIX = "gen-"


class MilvusKeywords:
    """See the module docstring."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.index = BM25Index()
        self._doc_pids: dict[str, list[str]] = {}
        self.file: dict | None = None  # the manifest entry of the file this index came from
        self._changed = 0  # passages added or removed since that file's commit

    def load(self, entry: dict | None, count: int, doc_gen: dict[str, int],
             newer: Callable[[int], list[tuple[str, str]]],
             every: Callable[[], list[tuple[str, str]]]) -> None:
        """The index of the commit whose documents (doc id -> gen) hold `count` passages.
        newer(g): visible (id, text) pairs with gen > g; every(): all visible pairs."""
        self.file, self._changed = None, 0
        try:
            if entry is None:
                raise ValueError("the index names no keyword file")
            self._from_file(entry, doc_gen, newer)
            if len(self.index) != count:
                raise ValueError(f"it holds {len(self.index)} passages, the index {count}")
            self.file = entry
            return
        except (OSError, ValueError) as exc:
            logger.info("building the keyword index from the passages: %s", exc)
        self._set(BM25Index.build(sorted(every())))
        self._changed = len(self.index)

    def _from_file(self, entry: dict, doc_gen: dict[str, int], newer) -> None:
        data = (self.folder / entry["file"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError(f"{entry['file']} does not match its checksum")
        self._set(BM25Index.from_bytes(data, BM25Index.saved_ids(data)))
        gen = int(entry["gen"])
        gone = [d for d in self._doc_pids if doc_gen.get(d, gen + 1) > gen]
        added = newer(gen)
        self.apply(gone, added)

    def _set(self, index: BM25Index) -> None:
        self.index = index
        self._doc_pids = {}
        for pid in index.ids():
            self._doc_pids.setdefault(passage_doc_id(pid), []).append(pid)

    def apply(self, removed_docs: Iterable[str], added: Iterable[tuple[str, str]]) -> None:
        """Drop every passage of `removed_docs`, then add the (id, text) pairs."""
        for doc_id in removed_docs:
            for pid in self._doc_pids.pop(doc_id, []):
                self.index.remove(pid)
                self._changed += 1
        for pid, text in added:
            self.index.add(pid, text)
            self._doc_pids.setdefault(passage_doc_id(pid), []).append(pid)
            self._changed += 1

    def commit(self, pending: Iterable[tuple[str, list[Passage]]], retired: Iterable[str],
               gen: int) -> dict | None:
        """Apply a commit's changes; write the file for `gen` when it is due. Returns the
        manifest entry the commit must name (the new file's, or the one still relied on)."""
        self.apply(retired, ((p.id, p.text) for _, rows in pending for p in rows))
        if self.file is not None and self._changed < REWRITE_SHARE * max(1, len(self.index)):
            return self.file
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{_PREFIX}{gen}.npz"
        data = self.index.to_bytes(sorted(self.index.ids()), with_ids=True)
        write_atomically(self.folder / name, data)
        fsync_dir(self.folder)
        self.file = {"file": name, "gen": gen, "sha256": hashlib.sha256(data).hexdigest()}
        self._changed = 0
        return self.file

    def clean(self, keep: dict | None) -> None:
        """Delete the keyword files the manifest (entry `keep`) does not name."""
        if not self.folder.is_dir():
            return
        for path in self.folder.glob(f"{_PREFIX}*.npz"):
            if keep is None or path.name != keep["file"]:
                path.unlink(missing_ok=True)

    def top_ids(self, query: str, k: int) -> list[str]:
        return [pid for pid, _ in self.index.top(query, k)]
