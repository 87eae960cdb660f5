"""PassageStore: the passages in a folder on this machine (LangChain FAISS on our own files).

Contract: everything `store_base.StoreBase` states (search modes, fusion, the writing
protocol, provenance), with this backend's specifics:
  * `PassageStore.open(dir, embedder)` loads the committed index in `dir` (see persist.py for
    the files and the commit protocol) or starts empty when there is none; nothing is written
    until the first change. Loading never unpickles: the LangChain `FAISS` store is rebuilt from
    index.faiss and passages.jsonl.
  * Keywords: our BM25 (bm25.py), kept in keywords.npz and committed with the vectors.
  * The write lock is `.write.lock` in the folder (retrieval/lock.py). A commit that only adds
    documents appends them (persist.append_snapshot: the new vectors, lines and keyword
    postings after the committed ones, then a small record renamed into place), so a commit
    costs what it adds, not the whole index. A commit that removes or replaces a document, or
    after which the appended passages would outnumber APPEND_RATIO times the base's (and
    COMPACT_MIN), rewrites the folder's three files beside the old ones and renames them into
    place: the appends are folded in, and the total rewriting stays proportional to the index's
    size.
  * Dense search is exact (the flat index) below faiss_ann.THRESHOLD passages (50,000) and
    approximate past it (faiss_ann.py: IVF candidates, exact cosines; RAGSPEC_DENSE=exact
    keeps it exact). With a GPU build of faiss and a visible GPU, searches run exactly on a GPU
    copy of the index; what is saved is always the CPU flat index.
Other backends: ragspec.retrieval.milvus.store (Milvus Lite or a Milvus server);
ragspec.retrieval.backends.open_index picks one from an --index value.
"""

from __future__ import annotations

import os
from pathlib import Path

import faiss
import numpy as np
from langchain_community.vectorstores import FAISS

from ragspec.retrieval.base import (
    HYBRID_DEPTH,
    PassageEmbedder,
    StoreBase,
    check_model,
    doc_id_for,
)
from ragspec.retrieval.bm25.index import BM25Index
from ragspec.retrieval.errors import IndexCorruptError, not_saved
from ragspec.retrieval.faiss import persist
from ragspec.retrieval.faiss.ann import ApproxIndex, wanted
from ragspec.retrieval.faiss.documents import (
    GpuView,
    add_rows,
    from_lc,
    gpu_available,
    new_faiss,
    to_lc,
)
from ragspec.retrieval.lock import DEFAULT_LOCK_TIMEOUT, write_lock
from ragspec.retrieval.records import SEARCH_MODES, DocumentInfo, Hit, Passage, SearchResult

# Appending commits go on while the appended passages are at most APPEND_RATIO times the base's
# count, or COMPACT_MIN: full commits come at geometrically growing sizes, so all of them
# together rewrite O(final size) passages.
APPEND_RATIO = 4
COMPACT_MIN = 50_000

__all__ = ["PassageStore", "PassageEmbedder", "Passage", "Hit", "DocumentInfo", "SearchResult",
           "SEARCH_MODES", "DEFAULT_LOCK_TIMEOUT", "HYBRID_DEPTH", "doc_id_for"]


class PassageStore(StoreBase):
    """See the module docstring. Create with `PassageStore.open`."""

    # False: every commit rewrites the folder (the reference the appending path is tested
    # against, and the full protocol's own tests).
    appending = True

    def __init__(
        self, index_dir: Path, embedder: PassageEmbedder | None, lock_timeout: float,
        use_gpu: bool | None,
    ) -> None:
        self.index_dir = index_dir
        self._init_common(embedder, lock_timeout)
        self._gpu = GpuView(gpu_available() if use_gpu is None else use_gpu)
        self._approx = ApproxIndex()
        self._load()

    @classmethod
    def open(
        cls,
        index_dir: str | os.PathLike,
        embedder: PassageEmbedder | None = None,
        *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        use_gpu: bool | None = None,
    ) -> PassageStore:
        """Load the index in `index_dir` (empty if there is none yet).

        embedder: needed to search and to add documents; None is enough to list and remove.
        lock_timeout: seconds a writer waits for another writer's commit before
            IndexLockedError.
        use_gpu: None = when faiss has GPU support and sees a GPU.
        """
        if lock_timeout < 0:
            raise ValueError(f"lock_timeout must be >= 0 seconds, got {lock_timeout}")
        return cls(Path(index_dir).expanduser(), embedder, lock_timeout, use_gpu)

    # -- loading ------------------------------------------------------------------------------

    def _load(self) -> None:
        snapshot = persist.read_snapshot(self.index_dir)
        self._gpu.reset()
        self._dirty = False
        self._fresh, self._rewrite = [], False
        if snapshot is None:
            self._commit = None
            self._model_name = getattr(self.embedder, "name", None)
            self._documents = {}
            self._forget()
            return
        check_model(self.index_dir, snapshot.embedder, self.embedder, self._rebuild_hint())
        self._commit = snapshot.commit
        self._model_name = snapshot.embedder
        counts: dict[str, int] = {}
        for p in snapshot.passages:
            counts[p["doc_id"]] = counts.get(p["doc_id"], 0) + 1
        try:
            self._documents = {
                d["doc_id"]: DocumentInfo(passages=counts.get(d["doc_id"], 0), **d)
                for d in snapshot.documents
            }
            sources = {d.doc_id: d.source for d in self._documents.values()}
            lc_docs = [
                to_lc(Passage(source=sources[p["doc_id"]], page=p.get("page"), **_fields(p)))
                for p in snapshot.passages
            ]
        except (TypeError, ValueError) as exc:
            raise IndexCorruptError(
                f"The index in {self.index_dir} is damaged: {exc}. "
                f"{persist.rebuild_hint(self.index_dir)}"
            ) from exc
        self._approx.invalidate()
        self._lc = new_faiss(snapshot.index, self.embedder)
        self._lc.docstore.add({doc.id: doc for doc in lc_docs})
        self._lc.index_to_docstore_id.update({i: doc.id for i, doc in enumerate(lc_docs)})
        self._keywords = BM25Index.restore(
            snapshot.keywords, [(p["id"], p["text"]) for p in snapshot.passages],
            snapshot.keyword_parts)
        self._rewrite = self._keywords.rebuilt  # the next commit saves the keywords whole
        self._rows = None
        self._log = snapshot.log
        self._base_passages = len(snapshot.passages) - snapshot.log.passages

    def _forget(self) -> None:
        self._approx.invalidate()
        self._lc: FAISS | None = None
        self._keywords = BM25Index()
        self._rows: dict[str, int] | None = None
        self._gpu.reset()
        self._log: persist.AppendLog | None = None  # None: the next commit writes in full
        self._base_passages = 0
        self._fresh: list[tuple[DocumentInfo, list[Passage], np.ndarray]] = []  # since saving
        self._rewrite = False  # a document was removed since saving: append cannot say it

    def _rebuild_hint(self) -> str:
        return persist.rebuild_hint(self.index_dir)

    # -- reading ------------------------------------------------------------------------------

    def passage_count(self) -> int:
        with self._mutex:
            return 0 if self._lc is None else int(self._lc.index.ntotal)

    def passages(self, doc_id: str | None = None) -> list[Passage]:
        """Stored passages in index order, optionally of one document only."""
        with self._mutex:
            if self._lc is None:
                return []
            ids = [self._lc.index_to_docstore_id[i] for i in range(self._lc.index.ntotal)]
            out = [from_lc(self._lc.docstore.search(pid)) for pid in ids]
        return [p for p in out if doc_id is None or p.doc_id == doc_id]

    def _vector_size(self) -> int | None:
        return None if self._lc is None else int(self._lc.index.d)

    def _dense(self, vector: np.ndarray, k: int) -> list[tuple[Passage, float]]:
        if not self._gpu.enabled and wanted(self._lc.index.ntotal):  # faiss_ann.py
            ids = self._lc.index_to_docstore_id
            return [(from_lc(self._lc.docstore.search(ids[row])), score)
                    for row, score in self._approx.search(self._lc.index, vector, k)]
        view = self._gpu.view(self._lc, self.embedder)
        found = view.similarity_search_with_score_by_vector(vector, k=k)
        return [(from_lc(doc), float(score)) for doc, score in found]

    def _keyword_ids(self, query: str, k: int) -> list[str]:
        return [pid for pid, _ in self._keywords.top(query, k)]

    def _fetch(self, ids: list[str], vector: np.ndarray) -> dict[str, tuple[Passage, float]]:
        if self._rows is None:
            self._rows = {pid: row for row, pid in self._lc.index_to_docstore_id.items()}
        return {pid: (from_lc(self._lc.docstore.search(pid)),
                      float(self._lc.index.reconstruct(self._rows[pid]) @ vector))
                for pid in ids}

    # -- writing ------------------------------------------------------------------------------

    def _prepare_write(self) -> None:
        persist.check_writable(self.index_dir)

    def _lock(self, on_wait):
        return write_lock(self.index_dir, self.lock_timeout, on_wait)

    def _recover(self) -> None:
        persist.recover(self.index_dir)

    def _disk_commit(self) -> str | None:
        return persist.current_commit(self.index_dir)

    def _save(self) -> None:
        added = sum(len(passages) for _, passages, _ in self._fresh)
        try:
            if (self.appending and self._log is not None and self._fresh and not self._rewrite
                    and self._log.passages + added <= max(APPEND_RATIO * self._base_passages,
                                                          COMPACT_MIN)):
                self._append()
            else:
                self._save_all()
        finally:
            self._fresh, self._rewrite = [], False

    def _append(self) -> None:
        documents = [_document(info) for info, _, _ in self._fresh]
        passages = [_passage(p) for _, rows, _ in self._fresh for p in rows]
        vectors = np.concatenate([v for _, _, v in self._fresh])
        keywords = self._keywords.rows_bytes([p["id"] for p in passages])
        try:
            self._log = persist.append_snapshot(self.index_dir, self._log, self._log.base,
                                                documents, passages, vectors, keywords)
        except OSError as exc:
            raise not_saved(self.index_dir, exc) from exc
        self._commit = self._log.commit

    def _save_all(self) -> None:
        documents = [_document(d) for d in self._documents.values()]
        passages = [_passage(p) for p in self.passages()]
        index = self._lc.index if self._lc is not None else faiss.IndexFlatIP(self._dim_or_zero())
        keywords = self._keywords.to_bytes([p["id"] for p in passages])
        try:
            self._commit = persist.write_snapshot(
                self.index_dir, self._model_name or "", index.d, documents, passages, index,
                keywords,
            )
            self._log = persist.AppendLog(self._commit, self._commit, [])
            self._base_passages = len(passages)
        except OSError as exc:
            raise not_saved(self.index_dir, exc) from exc

    def _dim_or_zero(self) -> int:
        return self.embedder.dim if self.embedder is not None else 0

    def _insert(self, info: DocumentInfo, passages: list[Passage], vectors) -> None:
        if self._lc is None:
            self._lc = new_faiss(faiss.IndexFlatIP(vectors.shape[1]), self.embedder)
        add_rows(self._lc, passages, vectors)
        self._keywords.add_many([(p.id, p.text) for p in passages])
        self._fresh.append((info, passages, vectors))
        self._changed()

    def _delete(self, doc_id: str) -> None:
        ids = [p.id for p in self.passages(doc_id)]
        if ids:
            self._lc.delete(ids)
        for pid in ids:
            self._keywords.remove(pid)
        self._approx.invalidate()  # the flat index renumbered the rows after the deleted ones
        self._rewrite = True
        self._changed()

    def _changed(self) -> None:
        self._gpu.reset()
        self._rows = None


def _document(d: DocumentInfo) -> dict:
    return {"doc_id": d.doc_id, "source": d.source, "sha256": d.sha256,
            "size_bytes": d.size_bytes, "ingested_at": d.ingested_at}


def _passage(p: Passage) -> dict:
    return {"id": p.id, "doc_id": p.doc_id, "page": p.page, "start": p.start, "text": p.text}


def _fields(p: dict) -> dict:
    return {"id": p["id"], "doc_id": p["doc_id"], "text": p["text"], "start": p["start"]}
