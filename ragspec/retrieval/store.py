"""PassageStore: the searchable, persistent set of passages (LangChain FAISS on our own files).

Contract:
  * `PassageStore.open(dir, embedder)` loads the committed index in `dir` (see persist.py for
    the files and the commit protocol) or starts empty when there is none; nothing is written
    until the first change. Loading never unpickles: the LangChain `FAISS` store is rebuilt from
    index.faiss and passages.jsonl.
  * Search is exact inner product over L2-normalised embeddings, i.e. cosine similarity; the
    score of a Hit is that cosine (higher is better). Mode "hybrid" also ranks the passages by
    BM25 keywords (bm25.py, kept with the index and changed with it) and fuses the two rankings
    by reciprocal rank (fusion.py; each ranking HYBRID_DEPTH deep); Hit.fused holds the fused
    score, Hit.score is still the passage's cosine. `retrieve` also gives the best cosine in the whole index (for a relevance
    floor), whatever the mode.
  * Changes happen inside `with store.writing():`, which takes the directory's write lock
    (retrieval/lock.py: `on_wait` is called when another writer has it, then it waits up to
    `lock_timeout` seconds), first catches up with any commit another process made since this
    store was loaded, and commits once on a clean exit. Keep the block short: do the slow work
    (parsing, embedding) before it, so other writers wait only for commits. If the block raises
    (including KeyboardInterrupt), nothing is written and the store reloads the last commit, so
    memory and disk agree again; if that reload fails too, the original error is raised (the
    second is attached as a note) and the store holds nothing until it can reload.
  * One store may be shared by threads (the chat UI): reads and commits take an in-process
    lock, so a search never sees a commit half applied, and waits only for the commit itself.
  * A document is one source file, identified by `doc_id` (derived from its resolved path) and
    carrying the sha256 of its bytes; replacing it removes all its old passages first.
  * With a GPU build of faiss and a visible GPU, searches run on a GPU copy of the index;
    what is saved is always the CPU index.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import faiss
import numpy as np
from langchain_community.vectorstores import FAISS

from ragspec.retrieval import persist
from ragspec.retrieval.bm25 import BM25Index
from ragspec.retrieval.errors import (
    EmbedderMismatchError,
    IndexCorruptError,
    IndexNotWritableError,
    RetrievalError,
    UnknownDocumentError,
)
from ragspec.retrieval.faiss_store import GpuView, from_lc, gpu_available, new_faiss, to_lc
from ragspec.retrieval.fusion import fuse
from ragspec.retrieval.lock import DEFAULT_LOCK_TIMEOUT, write_lock
from ragspec.retrieval.passages import PassageDraft, TokenCounter
from ragspec.retrieval.records import SEARCH_MODES, DocumentInfo, Hit, Passage, SearchResult

__all__ = ["PassageStore", "PassageEmbedder", "Passage", "Hit", "DocumentInfo", "SearchResult",
           "SEARCH_MODES", "DEFAULT_LOCK_TIMEOUT", "doc_id_for"]

logger = logging.getLogger(__name__)

# How many passages of each ranking take part in the fusion.
HYBRID_DEPTH = 50


def doc_id_for(source: str) -> str:
    """Stable id of the document at `source` (a resolved path): same file, same id."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]


class PassageEmbedder(TokenCounter, Protocol):
    """What the store (and ingest) need from an embedding model: `ragspec.retrieval.embeddings.Embedder`,
    or anything shaped like it (the tests' HashEmbedder)."""

    name: str  # recorded in the index; opening with another model is refused
    dim: int  # length of every vector

    def embed_array(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape (len(texts), dim), rows L2-normalised."""
        ...


class PassageStore:
    """See the module docstring. Create with `PassageStore.open`."""

    def __init__(
        self, index_dir: Path, embedder: PassageEmbedder | None, lock_timeout: float,
        use_gpu: bool | None,
    ) -> None:
        self.index_dir = index_dir
        self.embedder = embedder
        self.lock_timeout = lock_timeout
        self._gpu = GpuView(gpu_available() if use_gpu is None else use_gpu)
        self._writer: int | None = None  # the thread inside writing(), if any
        self._mutex = threading.RLock()  # in-process: reads vs. a commit being applied
        self._dirty = False
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
        if snapshot is None:
            self._commit = None
            self._model_name = getattr(self.embedder, "name", None)
            self._documents: dict[str, DocumentInfo] = {}
            self._lc: FAISS | None = None
            self._keywords = BM25Index()
            self._rows: dict[str, int] | None = None
            return
        name = getattr(self.embedder, "name", None)
        if name is not None and name != snapshot.embedder:
            raise EmbedderMismatchError(
                f"The index in {self.index_dir} was built with embedding model "
                f"{snapshot.embedder!r}, not {name!r}: its vectors are not comparable. Use that "
                f"model (RAGSPEC_EMBEDDER), or rebuild: {persist.rebuild_hint(self.index_dir)}"
            )
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
        self._lc = new_faiss(snapshot.index, self.embedder)
        self._lc.docstore.add({doc.id: doc for doc in lc_docs})
        self._lc.index_to_docstore_id.update({i: doc.id for i, doc in enumerate(lc_docs)})
        self._keywords = BM25Index.restore(
            snapshot.keywords, [(p["id"], p["text"]) for p in snapshot.passages])
        self._rows = None

    # -- reading ------------------------------------------------------------------------------

    def passage_count(self) -> int:
        with self._mutex:
            return 0 if self._lc is None else int(self._lc.index.ntotal)

    def documents(self) -> list[DocumentInfo]:
        with self._mutex:
            return sorted(self._documents.values(), key=lambda d: d.source)

    def document_for_source(self, source: str) -> DocumentInfo | None:
        with self._mutex:
            return self._documents.get(doc_id_for(source))

    def find_document(self, doc: str) -> DocumentInfo:
        """The document named by `doc`: its id, a unique id prefix, or its path."""
        with self._mutex:
            documents = dict(self._documents)
        if doc in documents:
            return documents[doc]
        for candidate in (doc, str(Path(doc).expanduser().resolve())):
            info = documents.get(doc_id_for(candidate))
            if info is not None:
                return info
        matches = [d for d in documents.values() if len(doc) >= 4 and d.doc_id.startswith(doc)]
        if len(matches) == 1:
            return matches[0]
        raise UnknownDocumentError(
            f"no document {doc!r} in the index at {self.index_dir}; `ragspec list` shows the "
            "documents and their ids"
        )

    def passages(self, doc_id: str | None = None) -> list[Passage]:
        """Stored passages in index order, optionally of one document only."""
        with self._mutex:
            if self._lc is None:
                return []
            ids = [self._lc.index_to_docstore_id[i] for i in range(self._lc.index.ntotal)]
            out = [from_lc(self._lc.docstore.search(pid)) for pid in ids]
        return [p for p in out if doc_id is None or p.doc_id == doc_id]

    def search(self, query: str, k: int = 4, mode: str = "dense") -> list[Hit]:
        """The k passages that best match `query`, best first (see `retrieve`)."""
        return self.retrieve(query, k, mode).hits

    def retrieve(self, query: str, k: int = 4, mode: str = "dense") -> SearchResult:
        """The k best passages for `query` by `mode` ("dense": cosine similarity; "hybrid":
        cosine and BM25 rankings fused), and the best cosine of any passage."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if mode not in SEARCH_MODES:
            raise ValueError(f"search mode must be one of {', '.join(SEARCH_MODES)}, got {mode!r}")
        if self.embedder is None:
            raise RuntimeError("this PassageStore was opened without an embedder; pass one to search")
        if self.passage_count() == 0:
            return SearchResult(hits=[], best_score=None, mode=mode)
        vector = np.asarray(self.embedder.embed_array([query])[0], dtype=np.float32)
        with self._mutex:  # a commit replaces the index and docstore: search one or the other
            count = self.passage_count()
            if count == 0:
                return SearchResult(hits=[], best_score=None, mode=mode)
            if vector.shape[0] != self._lc.index.d:
                raise EmbedderMismatchError(
                    f"The embedder makes vectors of size {vector.shape[0]} but the index holds "
                    f"size {self._lc.index.d}. {persist.rebuild_hint(self.index_dir)}"
                )
            depth = max(k, HYBRID_DEPTH) if mode == "hybrid" else k
            view = self._gpu.view(self._lc, self.embedder)
            dense = view.similarity_search_with_score_by_vector(vector, k=min(depth, count))
            if mode == "hybrid":
                hits = self._fuse(query, vector, dense, k)
            else:
                hits = [Hit(score=float(score), passage=from_lc(doc)) for doc, score in dense]
        return SearchResult(hits=hits, best_score=float(dense[0][1]), mode=mode)

    def _fuse(self, query: str, vector: np.ndarray, dense: list, k: int) -> list[Hit]:
        """Reciprocal-rank fusion of the dense results with the BM25 ranking (caller holds
        the mutex)."""
        cosine = {doc.id: float(score) for doc, score in dense}
        keywords = [pid for pid, _ in self._keywords.top(query, HYBRID_DEPTH)]
        hits = []
        for pid, fused in fuse([list(cosine), keywords], k):
            score = cosine.get(pid)
            if score is None:  # found by keywords only: its cosine from the stored vector
                score = float(self._lc.index.reconstruct(self._row_of(pid)) @ vector)
            hits.append(Hit(score=score, passage=from_lc(self._lc.docstore.search(pid)),
                            fused=fused))
        return hits

    def _row_of(self, pid: str) -> int:
        if self._rows is None:
            self._rows = {doc_id: row for row, doc_id in self._lc.index_to_docstore_id.items()}
        return self._rows[pid]

    # -- writing ------------------------------------------------------------------------------

    @contextmanager
    def writing(self, on_wait: Callable[[], None] | None = None) -> Iterator[PassageStore]:
        """Hold the write lock; commit the changes made inside the block once, at its end.

        on_wait: called once if another process is writing (before waiting for it)."""
        if self._writer == threading.get_ident():
            yield self  # nested (e.g. remove() during an ingest): the outer block commits
            return
        persist.check_writable(self.index_dir)
        with write_lock(self.index_dir, self.lock_timeout, on_wait), self._mutex:
            self._writer = threading.get_ident()
            try:
                persist.recover(self.index_dir)
                if persist.current_commit(self.index_dir) != self._commit:
                    self._load()  # another process committed since we loaded: build on its work
                yield self
                if self._dirty:
                    self._save()
            except BaseException as exc:
                # Discard half-made changes so this object matches the disk again; the disk
                # itself was never touched (commits happen only in _save, atomically).
                self._reload_after(exc)
                raise
            finally:
                self._writer = None

    def _reload_after(self, exc: BaseException) -> None:
        try:
            self._load()
        except RetrievalError as reload_error:
            # The error the caller must see is the one that stopped the block; the disk went
            # bad too (or changed under us), which the next open or write will report itself.
            note = f"Reloading the index afterwards failed as well: {reload_error}"
            if hasattr(exc, "add_note"):  # Python >= 3.11
                exc.add_note(note)
            else:
                logger.warning(note)
            self._forget()

    def _forget(self) -> None:
        """Hold nothing, and make the next writing() reload from disk."""
        self._commit = "unknown"
        self._documents = {}
        self._lc = None
        self._keywords = BM25Index()
        self._rows = None
        self._gpu.reset()
        self._dirty = False

    def _save(self) -> None:
        documents = [
            {"doc_id": d.doc_id, "source": d.source, "sha256": d.sha256,
             "size_bytes": d.size_bytes, "ingested_at": d.ingested_at}
            for d in self._documents.values()
        ]
        passages = [
            {"id": p.id, "doc_id": p.doc_id, "page": p.page, "start": p.start, "text": p.text}
            for p in self.passages()
        ]
        index = self._lc.index if self._lc is not None else faiss.IndexFlatIP(self._dim_or_zero())
        keywords = self._keywords.to_bytes([p["id"] for p in passages])
        try:
            self._commit = persist.write_snapshot(
                self.index_dir, self._model_name or "", index.d, documents, passages, index,
                keywords,
            )
        except OSError as exc:
            raise IndexNotWritableError(
                f"Could not save the index in {self.index_dir} ({exc}); the previous index is "
                "unchanged. Check free disk space and permissions."
            ) from exc
        self._dirty = False

    def _dim_or_zero(self) -> int:
        return self.embedder.dim if self.embedder is not None else 0

    def _require_writing(self) -> None:
        if self._writer != threading.get_ident():
            raise RuntimeError("changes to a PassageStore must happen inside `with store.writing():`")

    def add_document(
        self,
        source: str,
        sha256: str,
        size_bytes: int,
        drafts: Sequence[PassageDraft],
        vectors: np.ndarray,
    ) -> DocumentInfo:
        """Store a document's passages (replacing any earlier version of `source`).

        vectors: float32 array of shape (len(drafts), dim), rows L2-normalised.
        """
        self._require_writing()
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(drafts) or not drafts:
            raise ValueError(
                f"need one vector per passage and at least one passage; got {len(drafts)} "
                f"passages and vectors of shape {vectors.shape}"
            )
        self._prepare_index(dim=vectors.shape[1])
        doc_id = doc_id_for(source)
        if doc_id in self._documents:
            self._remove_unlocked(doc_id)
        passages = [
            # The content hash in the id: a changed file's passages never reuse old ids.
            Passage(id=f"{doc_id}-{sha256[:8]}-{i:05d}", doc_id=doc_id, text=d.text,
                    source=source, page=d.page, start=d.start)
            for i, d in enumerate(drafts)
        ]
        self._lc.add_embeddings(
            list(zip([p.text for p in passages], vectors, strict=True)),
            metadatas=[to_lc(p).metadata for p in passages],
            ids=[p.id for p in passages],
        )
        for p in passages:
            self._keywords.add(p.id, p.text)
        info = DocumentInfo(
            doc_id=doc_id, source=source, sha256=sha256, passages=len(passages),
            size_bytes=size_bytes,
            ingested_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        self._documents[doc_id] = info
        self._changed()
        return info

    def _prepare_index(self, dim: int) -> None:
        """Create the FAISS index on the first document; refuse vectors of another size."""
        if self._lc is None:
            self._lc = new_faiss(faiss.IndexFlatIP(dim), self.embedder)
            self._model_name = getattr(self.embedder, "name", None) or self._model_name
        elif dim != self._lc.index.d:
            raise EmbedderMismatchError(
                f"vectors of size {dim} cannot join an index of size "
                f"{self._lc.index.d}. {persist.rebuild_hint(self.index_dir)}"
            )

    def remove(self, doc: str, on_wait: Callable[[], None] | None = None) -> DocumentInfo:
        """Delete a document (by id, id prefix or path) and all its passages; commits.

        on_wait: as for writing()."""
        info = self.find_document(doc)
        with self.writing(on_wait):
            # writing() may have reloaded a newer commit: look the document up again there.
            info = self.find_document(info.doc_id)
            self._remove_unlocked(info.doc_id)
        return info

    def _remove_unlocked(self, doc_id: str) -> None:
        ids = [p.id for p in self.passages(doc_id)]
        if ids:
            self._lc.delete(ids)
        for pid in ids:
            self._keywords.remove(pid)
        del self._documents[doc_id]
        self._changed()

    def _changed(self) -> None:
        self._dirty = True
        self._gpu.reset()
        self._rows = None


def _fields(p: dict) -> dict:
    return {"id": p["id"], "doc_id": p["doc_id"], "text": p["text"], "start": p["start"]}
