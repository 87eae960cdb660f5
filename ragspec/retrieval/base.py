"""What every index backend shares: documents, search modes, fusion, and the writing protocol.

Contract (the same on every backend, and tested on each by one suite):
  * Search is exact inner product over L2-normalised embeddings, i.e. cosine similarity; the
    score of a Hit is that cosine (higher is better). Mode "hybrid" also ranks the passages by
    BM25 keywords and fuses the two rankings by reciprocal rank (fusion.py; each ranking
    HYBRID_DEPTH deep); Hit.fused holds the fused score, Hit.score is still the passage's
    cosine. `retrieve` also gives the best cosine in the whole index (for a relevance floor),
    whatever the mode.
  * Changes happen inside `with store.writing():`, which takes the index's write lock (`on_wait`
    is called when another writer has it, then it waits up to `lock_timeout` seconds), first
    finishes any commit a crashed writer left half done, catches up with commits another
    process made since this store was loaded, and commits once on a clean exit. Keep the block
    short: do the slow work (parsing, embedding) before it. If the block raises (including
    KeyboardInterrupt), nothing is committed and the store reloads the last commit; if that
    reload fails too, the original error is raised (the second attached as a note) and the
    store holds nothing until it can reload.
  * A crash at any point of a commit leaves the previous commit searchable, whole: readers never
    see a commit half applied.
  * One store may be shared by threads (the chat UI): reads and commits take an in-process lock.
  * A document is one source file, identified by `doc_id` (derived from its resolved path) and
    carrying the sha256 of its bytes; replacing it removes all its old passages first. Passage
    ids hold the content hash, so a changed file's passages never reuse old ids; every passage
    keeps its exact provenance (document, page, character offset of its text).

A backend subclass implements the hooks below (`_load`, `_save`, `_dense`, ...); it never
re-implements the rules above.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import numpy as np

from ragspec.retrieval.errors import EmbedderMismatchError, RetrievalError, UnknownDocumentError
from ragspec.retrieval.fusion import fuse
from ragspec.retrieval.passages import PassageDraft, TokenCounter
from ragspec.retrieval.records import SEARCH_MODES, DocumentInfo, Hit, Passage, SearchResult

logger = logging.getLogger(__name__)

# How many passages of each ranking take part in the fusion.
HYBRID_DEPTH = 50
# Extra dense hits fetched so that ties at the cut are ordered by id on every backend.
TIE_MARGIN = 8


def doc_id_for(source: str) -> str:
    """Stable id of the document at `source` (a resolved path): same file, same id."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]


def passage_id(doc_id: str, sha256: str, i: int) -> str:
    """Passage i of the document version with content hash `sha256`: the hash in the id, so a
    changed file's passages never reuse old ids."""
    return f"{doc_id}-{sha256[:8]}-{i:05d}"


def passage_doc_id(pid: str) -> str:
    """The document id a passage id (passage_id) starts with."""
    return pid.rsplit("-", 2)[0]


class PassageEmbedder(TokenCounter, Protocol):
    """What a store (and ingest) need from an embedding model: `ragspec.retrieval.embeddings.embedder.Embedder`,
    or anything shaped like it (the tests' HashEmbedder)."""

    name: str  # recorded in the index; opening with another model is refused
    dim: int  # length of every vector

    def embed_array(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape (len(texts), dim), rows L2-normalised."""
        ...


class StoreBase:
    """See the module docstring. `index_dir` names the index in messages (a folder, or a
    Milvus location)."""

    index_dir: Path | str
    embedder: PassageEmbedder | None
    lock_timeout: float

    def _init_common(self, embedder, lock_timeout: float) -> None:
        if lock_timeout < 0:
            raise ValueError(f"lock_timeout must be >= 0 seconds, got {lock_timeout}")
        self.embedder = embedder
        self.lock_timeout = lock_timeout
        self._writer: int | None = None  # the thread inside writing(), if any
        self._mutex = threading.RLock()  # in-process: reads vs. a commit being applied
        self._dirty = False
        self._commit: str | None = None
        self._model_name: str | None = getattr(embedder, "name", None)
        self._documents: dict[str, DocumentInfo] = {}

    # -- hooks a backend implements ---------------------------------------------------------

    def _load(self) -> None: ...  # read the last commit: _commit, _model_name, _documents
    def _forget(self) -> None: ...  # hold nothing of the index's contents
    def _save(self) -> None: ...  # commit what changed since the last load or save
    def _lock(self, on_wait) -> AbstractContextManager: ...  # the writers' lock
    def _prepare_write(self) -> None: ...  # before the lock: can this index be written?
    def _recover(self) -> None: ...  # under the lock: finish or discard a crashed commit
    def _disk_commit(self) -> str | None: ...  # the commit the index holds now (cheap)
    def _vector_size(self) -> int | None: ...  # the stored vectors' size (None: empty)
    def _insert(self, info: DocumentInfo, passages: list[Passage], vectors) -> None: ...
    def _delete(self, doc_id: str) -> None: ...  # all passages of one stored document

    def passage_count(self) -> int: ...

    def passages(self, doc_id: str | None = None) -> list[Passage]: ...

    def _dense(self, vector: np.ndarray, k: int) -> list[tuple[Passage, float]]: ...

    def _dense_ids(self, vector: np.ndarray, k: int) -> list[tuple[str, float]] | None:
        """(passage id, cosine) of the best k, for a backend that ranks without reading the
        passages: `retrieve` then reads (`_fetch`) only the hits it returns, in one call. None
        (the default): `_dense` ranks and reads."""
        return None

    def _keyword_ids(self, query: str, k: int) -> list[str]: ...

    def _fetch(self, ids: list[str], vector: np.ndarray) -> dict[str, tuple[Passage, float]]:
        """Passages by id with their cosine to `vector` (hybrid hits found by keywords only)."""
        ...

    def close(self) -> None:
        """Release connections (a folder store holds none)."""

    # -- reading ------------------------------------------------------------------------------

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
        with self._mutex:  # a commit replaces what is searched: search one or the other
            count = self.passage_count()
            if count == 0:
                return SearchResult(hits=[], best_score=None, mode=mode)
            size = self._vector_size()
            if size is not None and vector.shape[0] != size:
                raise EmbedderMismatchError(
                    f"The embedder makes vectors of size {vector.shape[0]} but the index holds "
                    f"size {size}. {self._rebuild_hint()}"
                )
            depth = max(k, HYBRID_DEPTH) if mode == "hybrid" else k
            # Equal cosines come back in each engine's own order: fetch a few more and order
            # them by (cosine, id), so every backend ranks (and cuts) ties the same way.
            ranked = self._dense_ids(vector, min(depth + TIE_MARGIN, count))
            if ranked is not None:
                dense_ids = sorted(ranked, key=lambda item: (-item[1], item[0]))[:depth]
                hits = self._hits_by_id(query, vector, dense_ids, k, mode)
                best = dense_ids[0][1] if dense_ids else None
                return SearchResult(hits=hits, best_score=best, mode=mode)
            dense = sorted(self._dense(vector, min(depth + TIE_MARGIN, count)),
                           key=lambda item: (-item[1], item[0].id))[:depth]
            if mode == "hybrid":
                hits = self._fuse(query, vector, dense, k)
            else:
                hits = [Hit(score=score, passage=p) for p, score in dense]
        best = dense[0][1] if dense else None
        return SearchResult(hits=hits, best_score=best, mode=mode)

    def indexed_words(self, words: Iterable[str]) -> set[str]:
        """Which of `words` (lowercased keyword tokens, see bm25.index.tokenize) occur in some
        stored passage: one keyword look-up each, no embedding."""
        with self._mutex:
            return {w for w in words if self._keyword_ids(w, 1)}

    def _hits_by_id(self, query: str, vector: np.ndarray, dense: list[tuple[str, float]],
                    k: int, mode: str) -> list[Hit]:
        """The hits from a ranking of (id, cosine): fused with the keywords in hybrid mode, the
        passages read in one `_fetch` (caller holds the mutex). The same hits as `_fuse` and
        `_dense` give: a dense hit's score is its cosine from the ranking."""
        scores = dict(dense)
        if mode == "hybrid":
            fused = fuse([list(scores), self._keyword_ids(query, HYBRID_DEPTH)], k)
        else:
            fused = [(pid, None) for pid, _ in dense[:k]]
        found = self._fetch([pid for pid, _ in fused], vector)
        return [Hit(score=scores[pid] if pid in scores else found[pid][1],
                    passage=found[pid][0], fused=score) for pid, score in fused]

    def _fuse(self, query: str, vector: np.ndarray, dense: list, k: int) -> list[Hit]:
        """Reciprocal-rank fusion of the dense results with the BM25 ranking (caller holds
        the mutex)."""
        found = {p.id: (p, score) for p, score in dense}
        keywords = self._keyword_ids(query, HYBRID_DEPTH)
        fused = fuse([list(found), keywords], k)
        missing = [pid for pid, _ in fused if pid not in found]
        if missing:  # found by keywords only: the cosine from the stored vector
            found.update(self._fetch(missing, vector))
        return [Hit(score=found[pid][1], passage=found[pid][0], fused=score)
                for pid, score in fused]

    def _rebuild_hint(self) -> str:
        return (f"Nothing was changed. To rebuild, remove the index {self.index_dir} and run "
                f"`ragspec ingest --index {self.index_dir} YOUR_FILES...` again.")

    # -- writing ------------------------------------------------------------------------------

    @contextmanager
    def writing(self, on_wait: Callable[[], None] | None = None) -> Iterator[StoreBase]:
        """Hold the write lock; commit the changes made inside the block once, at its end.

        on_wait: called once if another process is writing (before waiting for it)."""
        if self._writer == threading.get_ident():
            yield self  # nested (e.g. remove() during an ingest): the outer block commits
            return
        self._prepare_write()
        with self._lock(on_wait), self._mutex:
            self._writer = threading.get_ident()
            try:
                self._recover()
                if self._disk_commit() != self._commit:
                    self._load()  # another process committed since we loaded: build on its work
                yield self
                if self._dirty:
                    self._save()
                    self._dirty = False
            except BaseException as exc:
                # Discard half-made changes so this object matches the index again; the index
                # itself holds the last commit (commits happen only in _save, atomically).
                self._reload_after(exc)
                raise
            finally:
                self._writer = None

    def _reload_after(self, exc: BaseException) -> None:
        try:
            self._load()
        except RetrievalError as reload_error:
            # The error the caller must see is the one that stopped the block; the index went
            # bad too (or changed under us), which the next open or write will report itself.
            note = f"Reloading the index afterwards failed as well: {reload_error}"
            if hasattr(exc, "add_note"):  # Python >= 3.11
                exc.add_note(note)
            else:
                logger.warning(note)
            self._commit = "unknown"  # the next writing() reloads
            self._documents = {}
            self._dirty = False
            self._forget()

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
        size = self._vector_size()
        if size is not None and vectors.shape[1] != size:
            raise EmbedderMismatchError(
                f"vectors of size {vectors.shape[1]} cannot join an index of size {size}. "
                f"{self._rebuild_hint()}"
            )
        doc_id = doc_id_for(source)
        if doc_id in self._documents:
            self._remove_unlocked(doc_id)
        passages = [
            Passage(id=passage_id(doc_id, sha256, i), doc_id=doc_id, text=d.text,
                    source=source, page=d.page, start=d.start)
            for i, d in enumerate(drafts)
        ]
        info = DocumentInfo(
            doc_id=doc_id, source=source, sha256=sha256, passages=len(passages),
            size_bytes=size_bytes,
            ingested_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        if self._model_name is None:
            self._model_name = getattr(self.embedder, "name", None)
        self._insert(info, passages, vectors)
        self._documents[doc_id] = info
        self._dirty = True
        return info

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
        self._delete(doc_id)
        del self._documents[doc_id]
        self._dirty = True


def check_model(location, stored: str, embedder, hint: str) -> None:
    """EmbedderMismatchError when `embedder` is not the model the index was built with."""
    name = getattr(embedder, "name", None)
    if name is not None and stored and name != stored:
        raise EmbedderMismatchError(
            f"The index in {location} was built with embedding model {stored!r}, not "
            f"{name!r}: its vectors are not comparable. Use that model (RAGSPEC_EMBEDDER), or "
            f"rebuild: {hint}"
        )
