"""PassageStore: the searchable, persistent set of passages (LangChain FAISS on our own files).

Contract:
  * `PassageStore.open(dir, embedder)` loads the committed index in `dir` (see persist.py for
    the files and the commit protocol) or starts empty when there is none; nothing is written
    until the first change. Loading never unpickles: the LangChain `FAISS` store is rebuilt from
    index.faiss and passages.jsonl.
  * Search is exact inner product over L2-normalised embeddings, i.e. cosine similarity; the
    score of a Hit is that cosine (higher is better).
  * Changes happen inside `with store.writing():`, which takes the directory's write lock
    (waiting up to `lock_timeout` seconds, then IndexLockedError), first catches up with any
    commit another process made since this store was loaded, and commits once on a clean exit.
    If the block raises (including KeyboardInterrupt), nothing is written and the store
    reloads the last commit, so memory and disk agree again.
  * A document is one source file, identified by `doc_id` (derived from its resolved path) and
    carrying the sha256 of its bytes; replacing it removes all its old passages first.
  * With a GPU build of faiss and a visible GPU, searches run on a GPU copy of the index;
    what is saved is always the CPU index.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import faiss
import numpy as np
from filelock import FileLock, Timeout
from langchain_community.docstore.in_memory import InMemoryDocstore
from langchain_community.vectorstores import FAISS
from langchain_community.vectorstores.utils import DistanceStrategy
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

from retrieval import persist
from retrieval.errors import (
    EmbedderMismatchError,
    IndexCorruptError,
    IndexLockedError,
    IndexNotWritableError,
    UnknownDocumentError,
)
from retrieval.passages import PassageDraft
from retrieval.records import DocumentInfo, Hit, Passage

__all__ = ["PassageStore", "Passage", "Hit", "DocumentInfo", "DEFAULT_LOCK_TIMEOUT", "doc_id_for"]

DEFAULT_LOCK_TIMEOUT = 60.0
logger = logging.getLogger(__name__)


def doc_id_for(source: str) -> str:
    """Stable id of the document at `source` (a resolved path): same file, same id."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]


class _NoEmbedder(Embeddings):
    """Stands in when a store is opened only to list or remove documents."""

    def _fail(self):
        raise RuntimeError("this PassageStore was opened without an embedder; pass one to search")

    def embed_documents(self, texts):
        self._fail()

    def embed_query(self, text):
        self._fail()


class PassageStore:
    """See the module docstring. Create with `PassageStore.open`."""

    def __init__(
        self, index_dir: Path, embedder, lock_timeout: float, use_gpu: bool | None
    ) -> None:
        self.index_dir = index_dir
        self.embedder = embedder
        self.lock_timeout = lock_timeout
        self._use_gpu = _gpu_available() if use_gpu is None else use_gpu
        self._writing = False
        self._dirty = False
        self._load()

    @classmethod
    def open(
        cls,
        index_dir: str | os.PathLike,
        embedder=None,
        *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        use_gpu: bool | None = None,
    ) -> PassageStore:
        """Load the index in `index_dir` (empty if there is none yet).

        embedder: needed to search and to add documents; None is enough to list and remove.
            An `Embedder` or anything with its interface (name, dim, max_tokens,
            special_tokens, count_tokens, embed_array), e.g. the tests' HashEmbedder.
        lock_timeout: seconds a writer waits for another writer before IndexLockedError.
        use_gpu: None = when faiss has GPU support and sees a GPU.
        """
        if lock_timeout < 0:
            raise ValueError(f"lock_timeout must be >= 0 seconds, got {lock_timeout}")
        return cls(Path(index_dir).expanduser(), embedder, lock_timeout, use_gpu)

    # -- loading ------------------------------------------------------------------------------

    def _load(self) -> None:
        snapshot = persist.read_snapshot(self.index_dir)
        self._gpu_view = None
        self._dirty = False
        if snapshot is None:
            self._commit = None
            self._model_name = getattr(self.embedder, "name", None)
            self._documents: dict[str, DocumentInfo] = {}
            self._lc: FAISS | None = None
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
                _to_lc(Passage(source=sources[p["doc_id"]], page=p.get("page"), **_fields(p)))
                for p in snapshot.passages
            ]
        except (TypeError, ValueError) as exc:
            raise IndexCorruptError(
                f"The index in {self.index_dir} is damaged: {exc}. "
                f"{persist.rebuild_hint(self.index_dir)}"
            ) from exc
        self._lc = self._new_lc(snapshot.index)
        self._lc.docstore.add({doc.id: doc for doc in lc_docs})
        self._lc.index_to_docstore_id.update({i: doc.id for i, doc in enumerate(lc_docs)})

    def _new_lc(self, index: faiss.Index) -> FAISS:
        return FAISS(
            embedding_function=self.embedder if self.embedder is not None else _NoEmbedder(),
            index=index,
            docstore=InMemoryDocstore(),
            index_to_docstore_id={},
            distance_strategy=DistanceStrategy.MAX_INNER_PRODUCT,
        )

    # -- reading ------------------------------------------------------------------------------

    def passage_count(self) -> int:
        return 0 if self._lc is None else int(self._lc.index.ntotal)

    def documents(self) -> list[DocumentInfo]:
        return sorted(self._documents.values(), key=lambda d: d.source)

    def document_for_source(self, source: str) -> DocumentInfo | None:
        return self._documents.get(doc_id_for(source))

    def find_document(self, doc: str) -> DocumentInfo:
        """The document named by `doc`: its id, a unique id prefix, or its path."""
        if doc in self._documents:
            return self._documents[doc]
        for candidate in (doc, str(Path(doc).expanduser().resolve())):
            info = self.document_for_source(candidate)
            if info is not None:
                return info
        matches = [d for d in self._documents.values() if len(doc) >= 4 and d.doc_id.startswith(doc)]
        if len(matches) == 1:
            return matches[0]
        raise UnknownDocumentError(
            f"no document {doc!r} in the index at {self.index_dir}; `ragspec list` shows the "
            "documents and their ids"
        )

    def passages(self, doc_id: str | None = None) -> list[Passage]:
        """Stored passages in index order, optionally of one document only."""
        if self._lc is None:
            return []
        ids = [self._lc.index_to_docstore_id[i] for i in range(self.passage_count())]
        out = [_from_lc(self._lc.docstore.search(pid)) for pid in ids]
        return [p for p in out if doc_id is None or p.doc_id == doc_id]

    def search(self, query: str, k: int = 4) -> list[Hit]:
        """The k passages most similar to `query`, best first."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if self.embedder is None:
            raise RuntimeError("this PassageStore was opened without an embedder; pass one to search")
        if self.passage_count() == 0:
            return []
        vector = np.asarray(self.embedder.embed_array([query])[0], dtype=np.float32)
        if vector.shape[0] != self._lc.index.d:
            raise EmbedderMismatchError(
                f"The embedder makes vectors of size {vector.shape[0]} but the index holds "
                f"size {self._lc.index.d}. {persist.rebuild_hint(self.index_dir)}"
            )
        view = self._search_view()
        results = view.similarity_search_with_score_by_vector(vector, k=min(k, self.passage_count()))
        return [Hit(score=float(score), passage=_from_lc(doc)) for doc, score in results]

    def _search_view(self) -> FAISS:
        if not self._use_gpu:
            return self._lc
        if self._gpu_view is None:
            # A GPU copy for searching only: writes go to the CPU index (GPU flat indexes cannot
            # remove rows, and the saved form must be the CPU one). Rebuilt after each change.
            try:
                self._gpu_resources = (
                    getattr(self, "_gpu_resources", None) or faiss.StandardGpuResources()
                )
                gpu_index = faiss.index_cpu_to_gpu(self._gpu_resources, 0, self._lc.index)
            except RuntimeError as exc:  # out of GPU memory, driver trouble: CPU still works
                logger.warning("FAISS GPU copy failed (%s); searching on the CPU instead", exc)
                self._use_gpu = False
                return self._lc
            view = self._new_lc(gpu_index)
            view.docstore = self._lc.docstore
            view.index_to_docstore_id = self._lc.index_to_docstore_id
            self._gpu_view = view
        return self._gpu_view

    # -- writing ------------------------------------------------------------------------------

    @contextmanager
    def writing(self) -> Iterator[PassageStore]:
        """Hold the write lock; commit the changes made inside the block once, at its end."""
        if self._writing:  # nested (e.g. remove() during an ingest): the outer block commits
            yield self
            return
        self._check_writable()
        lock = FileLock(str(self.index_dir / persist.LOCK_NAME), timeout=self.lock_timeout)
        try:
            lock.acquire()
        except Timeout:
            raise IndexLockedError(
                f"Another ragspec process is writing the index in {self.index_dir} (lock "
                f"{lock.lock_file}); waited {self.lock_timeout:g} s. Try again when it has finished."
            ) from None
        self._writing = True
        try:
            persist.recover(self.index_dir)
            if persist.current_commit(self.index_dir) != self._commit:
                self._load()  # another process committed since we loaded: build on its work
            yield self
            if self._dirty:
                self._save()
        except BaseException:
            # Discard half-made changes so this object matches the disk again; the disk itself
            # was never touched (commits happen only in _save, atomically).
            self._writing = False
            self._load()
            raise
        finally:
            self._writing = False
            lock.release()

    def _check_writable(self) -> None:
        try:
            self.index_dir.mkdir(parents=True, exist_ok=True)
            # Creating a file is the only reliable test (permissions, read-only mounts, ACLs).
            fd, probe = tempfile.mkstemp(prefix=".probe-", dir=self.index_dir)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise IndexNotWritableError(
                f"Cannot write to the index directory {self.index_dir} ({exc.strerror or exc}). "
                "Make it writable, or choose another with --index DIR or RAGSPEC_HOME."
            ) from exc

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
        try:
            self._commit = persist.write_snapshot(
                self.index_dir, self._model_name or "", index.d, documents, passages, index
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
        if not self._writing:
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
        if self._lc is None:
            self._lc = self._new_lc(faiss.IndexFlatIP(vectors.shape[1]))
            self._model_name = getattr(self.embedder, "name", None) or self._model_name
        elif vectors.shape[1] != self._lc.index.d:
            raise EmbedderMismatchError(
                f"vectors of size {vectors.shape[1]} cannot join an index of size "
                f"{self._lc.index.d}. {persist.rebuild_hint(self.index_dir)}"
            )
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
            metadatas=[_to_lc(p).metadata for p in passages],
            ids=[p.id for p in passages],
        )
        info = DocumentInfo(
            doc_id=doc_id, source=source, sha256=sha256, passages=len(passages),
            size_bytes=size_bytes,
            ingested_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        self._documents[doc_id] = info
        self._changed()
        return info

    def remove(self, doc: str) -> DocumentInfo:
        """Delete a document (by id, id prefix or path) and all its passages; commits."""
        info = self.find_document(doc)
        with self.writing():
            # writing() may have reloaded a newer commit: look the document up again there.
            info = self.find_document(info.doc_id)
            self._remove_unlocked(info.doc_id)
        return info

    def _remove_unlocked(self, doc_id: str) -> None:
        ids = [p.id for p in self.passages(doc_id)]
        if ids:
            self._lc.delete(ids)
        del self._documents[doc_id]
        self._changed()

    def _changed(self) -> None:
        self._dirty = True
        self._gpu_view = None


def _fields(p: dict) -> dict:
    return {"id": p["id"], "doc_id": p["doc_id"], "text": p["text"], "start": p["start"]}


def _to_lc(p: Passage) -> Document:
    return Document(
        id=p.id, page_content=p.text,
        metadata={"doc_id": p.doc_id, "source": p.source, "page": p.page, "start": p.start},
    )


def _from_lc(doc: Document) -> Passage:
    m = doc.metadata
    return Passage(id=doc.id, doc_id=m["doc_id"], text=doc.page_content, source=m["source"],
                   page=m["page"], start=m["start"])


def _gpu_available() -> bool:
    # faiss-cpu builds have no StandardGpuResources; GPU builds report the visible devices.
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
