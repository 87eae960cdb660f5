"""MilvusStore: the passages in Milvus — Milvus Lite (a local file) or a Milvus server.

Contract: everything `store_base.StoreBase` states, on Milvus (backends.py parses the
locations: `milvus:PATH.db` for Milvus Lite, `milvus://HOST:PORT/COLLECTION` for a server).
Passages are added and deleted through langchain-milvus's `Milvus` vector store; searches go to
the same collection through its pymilvus client, because they need a filter (see below) and
the BM25 field, and that vector store's own dense search refuses a collection holding both.

Collections, named from the location's collection name N (default "ragspec"):
  N             one row per passage: pk = "<passage id>@<gen>", pid, doc_id, gen, page (0 =
                none), start, text (analysed: standard tokenizer, lowercase), vector (exact
                inner product, FLAT), sparse (Milvus' own BM25 function of text; kept in
                the schema, not ranked by: see below).
  N_documents   one row per stored document version: pk = "<doc_id>@<gen>", its DocumentInfo.
  N_meta        pk "manifest": the last complete commit (gen, commit id, embedder, dim);
                pk "retired:<doc_id>@<gen>": a document version that commit `gen` replaced or
                removed, until its rows are deleted.

Keyword search is ragspec's own BM25 (milvus_keywords.py: the bm25.py index of the committed
passages, in a file beside the Milvus data that each manifest names), so a hybrid answer is the
same as from the FAISS folder holding the same passages: one tokenizer, one set of statistics.
On Milvus Lite the passages' vectors and records are kept beside it too (milvus_copies.py), and
a search reads the passages it returns from the records file: Milvus Lite answers any query
in about the same time whatever it reads (~55 ms at 1M passages), so a search there never asks
Milvus. A Milvus server is read as before (its rows by row key).

Dense search on Milvus Lite: below faiss_ann.THRESHOLD passages, or with RAGSPEC_DENSE=exact,
Milvus' own exact FLAT search. Past it, ragspec's approximate index (milvus_vectors.py: the
committed vectors in a file beside the Milvus data, searched by faiss_ann.ApproxIndex, the FAISS
folder's) picks the passages and their exact cosines. Milvus Lite 2.5 has no approximate index
that keeps recall (its IVF_FLAT found 0.62-0.67 of the true top 10), and an exact scan of a
million vectors per question takes ~150 ms here. A Milvus server keeps its own search: its
vectors are meant to live on the server (readers on several machines, more memory than one
client has), and it offers approximate indexes of its own; copying them into each reader would
undo that. An index made with RAGSPEC_MILVUS_INDEX other than FLAT is searched by that index.

Commit protocol (one writer at a time, under a file lock on this machine): a commit with number
g = G + 1 inserts its passages and documents with gen = g and the versions it retires as
"retired" rows with gen = g, flushes, writes the local copies' files when due, then upserts
the manifest with gen = g (the commit point), then deletes the retired versions' rows and their
"retired" rows. A writer's `close` (or, for a process that never closes it, its exit) writes the
local copies that lag behind its last commit and names them in a manifest of the same gen with a
new commit id, so the next open reads them whole instead of asking Milvus for the newer rows,
which makes Milvus Lite load the whole collection (~2 min at 1M passages). Readers see only rows
with gen <= G of the manifest they loaded, minus retired versions, so a crash before the
manifest leaves the previous commit exactly as it was (the extra rows are invisible, and the
next writer deletes them), and a crash after it leaves the new commit whole (the next writer
finishes the deletes). Passage ids are the same as in the FAISS folder store; the row key adds
the gen so that a re-added version never shares a key with the retired one.

Limits: the lock is a file on this machine, so writers to one Milvus server must run on one
machine (readers anywhere); Milvus Lite serves one process at a time.
"""

from __future__ import annotations

import atexit
import json
import logging
import uuid
from pathlib import Path

import numpy as np

from ragspec.retrieval.base import PassageEmbedder, StoreBase, check_model, passage_doc_id
from ragspec.retrieval.errors import IndexCorruptError, RetrievalError
from ragspec.retrieval.faiss import ann as faiss_ann
from ragspec.retrieval.faiss import persist
from ragspec.retrieval.lock import DEFAULT_LOCK_TIMEOUT, write_lock
from ragspec.retrieval.milvus import integrity
from ragspec.retrieval.milvus.client import (
    STRONG,
    IndexUnavailableError,
    MilvusCollections,
    commit_point,
)
from ragspec.retrieval.milvus.copies import LocalCopies
from ragspec.retrieval.milvus.location import MilvusLocation
from ragspec.retrieval.milvus.schema import document_row
from ragspec.retrieval.records import DocumentInfo, Passage

__all__ = ["IndexUnavailableError", "MilvusStore"]  # the error is raised from milvus_collections

logger = logging.getLogger(__name__)

_OUT = ["pid", "doc_id", "page", "start", "text"]


class MilvusStore(MilvusCollections, StoreBase):
    """See the module docstring. Create with `MilvusStore.open`."""

    def __init__(self, location: MilvusLocation, embedder, lock_timeout: float) -> None:
        self.location = location
        self.index_dir = location.spec
        self._init_common(embedder, lock_timeout)
        self._client = None
        self._lc = None
        self._copies = LocalCopies(location)
        self._wrote = False  # committed since opened, or since the copies were last saved
        self._unsealed = False  # this writer removed the Milvus Lite file's seal (integrity.py)
        self._load()

    @classmethod
    def open(cls, location: MilvusLocation, embedder: PassageEmbedder | None = None, *,
             lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> MilvusStore:
        return cls(location, embedder, lock_timeout)

    @classmethod
    def peek(cls, location: MilvusLocation) -> MilvusStore:
        """A store that has loaded nothing: enough to ask `_disk_commit()` cheaply."""
        store = cls.__new__(cls)
        store.location, store.index_dir = location, location.spec
        store._init_common(None, DEFAULT_LOCK_TIMEOUT)
        store._client, store._lc = None, None
        store._copies, store._wrote = LocalCopies(location), False
        store._unsealed = False
        return store

    @property
    def _keywords(self):
        return self._copies.keywords

    @property
    def _vectors(self):
        return self._copies.vectors

    @property
    def _records(self):
        return self._copies.records

    def close(self) -> None:
        """Bring the local copies up to this writer's last commit (`finish`), then disconnect
        (and stop this process's Milvus Lite server for the file)."""
        if self._wrote:
            self.finish()
        self._disconnect()
        self._seal()

    def _seal(self) -> None:
        """A writer's last step on a Milvus Lite file: with its server stopped, record what the
        file is (integrity.py), so that a reader can tell a damaged file from this one."""
        atexit.unregister(self._seal)
        if not self._unsealed:
            return
        self._unsealed = False
        self._disconnect()
        if self._commit in (None, "unknown"):
            return  # nothing committed, or a commit this process cannot name: no seal
        try:
            integrity.seal(Path(self.location.uri), self._commit)
        except OSError as exc:
            logger.warning("%s was not sealed (%s); it is opened unchecked until the next "
                           "writer seals it.", self.location.spec, exc)

    # -- loading ------------------------------------------------------------------------------

    def _load(self) -> None:
        self._dirty = False
        self._pending: dict[str, tuple[DocumentInfo, list[Passage], np.ndarray]] = {}
        self._retire: list[tuple[str, int]] = []
        if self.location.lite:  # a damaged file is refused before anything is read from it
            try:
                integrity.check(Path(self.location.uri), self.location.spec, self._disk_commit)
            except RetrievalError:
                self._disconnect()  # the server the check may have started for it
                raise
        manifest = self._manifest()
        if manifest is None:
            from ragspec.retrieval.milvus.schema import vector_index_from_env

            self._vector_policy = vector_index_from_env()
            self._vector_index = "FLAT" if self._vector_policy == "AUTO" else self._vector_policy
            self._commit, self._gen, self._dim = None, 0, None
            self._model_name = getattr(self.embedder, "name", None)
            self._documents, self._doc_gen, self._retired = {}, {}, []
            self._copies = LocalCopies(self.location)
            return
        check_model(self.location.spec, manifest.get("embedder", ""), self.embedder,
                    self._rebuild_hint())
        self._commit, self._gen = manifest["commit"], int(manifest["gen"])
        self._dim, self._model_name = int(manifest["dim"]), manifest.get("embedder")
        self._vector_index = manifest.get("vector_index", "FLAT")
        self._vector_policy = manifest.get("vector_policy", self._vector_index)
        _, documents, meta = self._names()
        client = self._connected()
        self._retired = [(r["doc_id"], int(r["old_gen"])) for r in self._rows(
            meta, f'kind == "retired" and gen <= {self._gen}', ["body"], parse_body=True)]
        rows = self._rows(documents, self._visible(), ["doc_id", "gen", "source", "sha256",
                                                       "size_bytes", "ingested_at", "passages"])
        try:
            self._documents = {
                r["doc_id"]: DocumentInfo(doc_id=r["doc_id"], source=r["source"],
                                          sha256=r["sha256"], passages=int(r["passages"]),
                                          size_bytes=int(r["size_bytes"]),
                                          ingested_at=r["ingested_at"]) for r in rows}
        except (KeyError, TypeError, ValueError) as exc:
            raise IndexCorruptError(f"The index {self.location.spec} is damaged: {exc}. "
                                    f"{self._rebuild_hint()}") from exc
        self._doc_gen = {r["doc_id"]: int(r["gen"]) for r in rows}
        assert client is not None
        passages = self._names()[0]
        self._copies.load(manifest, self.passage_count(), self._doc_gen,
                          lambda expr, fields: self._batches(passages, self._visible() + expr,
                                                             fields), self._dim or 0)

    def _visible(self) -> str:
        """The filter for rows of the loaded commit."""
        expr = f"gen <= {self._gen}"
        if self._retired:
            gone = " or ".join(f'(doc_id == "{d}" and gen == {g})' for d, g in self._retired)
            expr += f" and not ({gone})"
        return expr

    def _forget(self) -> None:
        self._pending, self._retire = {}, []
        self._copies = LocalCopies(self.location)

    def _rebuild_hint(self) -> str:
        what = "delete that file" if self.location.lite else \
            f"drop the collections {', '.join(self._names())}"
        return (f"Nothing was changed. To rebuild, {what} and run `ragspec ingest --index "
                f"{self.location.spec} YOUR_FILES...` again.")

    # -- reading ------------------------------------------------------------------------------

    def passage_count(self) -> int:
        with self._mutex:
            return sum(d.passages for d in self._documents.values())

    def passages(self, doc_id: str | None = None) -> list[Passage]:
        """Stored passages ordered by id, optionally of one document only."""
        with self._mutex:
            if self._commit is None:
                return []
            expr = self._visible() + (f' and doc_id == "{doc_id}"' if doc_id else "")
            rows = self._rows(self._names()[0], expr, _OUT)
            return sorted((self._passage(r) for r in rows), key=lambda p: p.id)

    def _passage_of(self, record) -> Passage:
        """A passage from its record (milvus_records.Record)."""
        doc_id = passage_doc_id(record.pid)
        return Passage(id=record.pid, doc_id=doc_id, text=record.text,
                       source=self._documents[doc_id].source, page=record.page or None,
                       start=record.start)

    def _passage(self, row: dict) -> Passage:
        source = self._documents[row["doc_id"]].source
        return Passage(id=row["pid"], doc_id=row["doc_id"], text=row["text"], source=source,
                       page=int(row["page"]) or None, start=int(row["start"]))

    def _vector_size(self) -> int | None:
        return self._dim

    def _approximate(self) -> bool:
        """Whether dense search goes to ragspec's approximate index (milvus_vectors.py): on
        Milvus Lite with the default FLAT index, past faiss_ann.THRESHOLD passages."""
        return (self._vectors is not None and self._vector_index == "FLAT"
                and faiss_ann.wanted(len(self._vectors)))

    def _dense_ids(self, vector: np.ndarray, k: int) -> list[tuple[str, float]] | None:
        # retrieve then reads only the passages it returns (_fetch: from the records file).
        return self._vectors.search(vector, k) if self._approximate() else None

    def _dense(self, vector: np.ndarray, k: int) -> list[tuple[Passage, float]]:
        from ragspec.retrieval.milvus.schema import search_params

        hits = self._search("vector", vector.tolist(), k, search_params(self._vector_index), _OUT)
        return sorted(((self._passage(h["entity"]), float(h["distance"])) for h in hits),
                      key=lambda item: (-item[1], item[0].id))

    def _keyword_ids(self, query: str, k: int) -> list[str]:
        return self._keywords.top_ids(query, k)

    def _search(self, field: str, data, k: int, params: dict, fields: list[str]) -> list:
        client = self._connected()
        found = self._call("search", client.search, self._names()[0], data=[data],
                           anns_field=field, limit=k, filter=self._visible(),
                           search_params=params, output_fields=fields, **STRONG)
        return list(found[0]) if found else []

    def _fetch(self, ids: list[str], vector: np.ndarray) -> dict[str, tuple[Passage, float]]:
        if self._records is not None:  # Milvus Lite: the records and vectors held here
            found = self._records.get(ids)
            cosines = self._vectors.cosines(found, vector)
            return {pid: (self._passage_of(r), cosines[pid]) for pid, r in found.items()}
        rows = self._by_key(ids, [*_OUT, "vector"])
        return {pid: (self._passage(r), float(np.asarray(r["vector"], np.float32) @ vector))
                for pid, r in rows.items()}

    def _by_key(self, ids: list[str], fields: list[str]) -> dict[str, dict]:
        """The visible rows of passages `ids`, by passage id. By row key ("<pid>@<gen of its
        document's visible version>"): Milvus looks primary keys up, where a filter on pid is
        evaluated over every row (at 1M passages ~100 ms a call)."""
        keys = [f"{pid}@{self._doc_gen[doc]}" for pid in ids
                if (doc := passage_doc_id(pid)) in self._doc_gen]
        if not keys:
            return {}
        client = self._connected()
        rows = self._call("read", client.query, self._names()[0],
                          filter=f"pk in {json.dumps(keys)} and {self._visible()}",
                          output_fields=fields, **STRONG)
        return {r["pid"]: r for r in rows}

    # -- writing ------------------------------------------------------------------------------

    def _prepare_write(self) -> None:
        folder, _ = self.location.lock_place()
        persist.check_writable(folder)
        for copies in self._copies.folders():
            persist.check_writable(copies)

    def _lock(self, on_wait):
        folder, name = self.location.lock_place()
        return write_lock(folder, self.lock_timeout, on_wait, name=name)

    def _disk_commit(self) -> str | None:
        manifest = self._manifest()
        return None if manifest is None else manifest["commit"]

    def _recover(self) -> None:
        """Delete what a crashed commit left: rows newer than the manifest, and the rows of
        versions the last commit retired."""
        if self.location.lite and not self._unsealed:
            # Before Milvus writes anything: a writer that dies leaves no seal, not a false one.
            integrity.unseal(Path(self.location.uri))
            self._unsealed = True
            atexit.register(self._seal)  # after `finish`, which registers later and runs first
        manifest = self._manifest()
        if manifest is None:
            return
        gen = int(manifest["gen"])
        self._copies.clean(manifest)
        passages, documents, meta = self._names()
        client = self._connected()
        for name in (passages, documents, meta):
            self._call("clean up", client.delete, name, filter=f"gen > {gen}")
        retired = [(r["doc_id"], int(r["old_gen"])) for r in self._rows(
            meta, f'kind == "retired" and gen <= {gen}', ["body"], parse_body=True)]
        self._delete_versions(retired)

    def _insert(self, info: DocumentInfo, passages: list[Passage], vectors) -> None:
        if self._dim is None:
            self._dim = int(vectors.shape[1])
        self._pending[info.doc_id] = (info, passages, vectors)

    def _delete(self, doc_id: str) -> None:
        self._pending.pop(doc_id, None)
        gen = self._doc_gen.get(doc_id)
        if gen is not None and (doc_id, gen) not in self._retire:
            self._retire.append((doc_id, gen))

    def _save(self) -> None:
        gen = self._gen + 1
        client = self._connected(create=True)
        passages, documents, meta = self._names()
        self._create_collections()
        for info, rows, vectors in self._pending.values():
            self._write_passages(gen, rows, vectors)
            self._call("add a document", client.insert, documents, [document_row(info, gen)])
        if self._retire:
            self._call("retire documents", client.insert, meta, [
                {"pk": f"retired:{d}@{g}", "kind": "retired", "gen": gen,
                 "body": json.dumps({"doc_id": d, "old_gen": g}), "v": [0.0, 0.0]}
                for d, g in self._retire])
        for name in (passages, documents, meta):
            self._call("flush", client.flush, name)
        self._grow_vector_index(client, passages)
        commit = uuid.uuid4().hex
        copies = self._copies.commit({d: (rows, v) for d, (_, rows, v) in self._pending.items()},
                                     [doc_id for doc_id, _ in self._retire], gen)
        manifest = {"gen": gen, "commit": commit, "embedder": self._model_name or "",
                    "dim": self._dim or 0, "vector_index": self._vector_index,
                    "vector_policy": self._vector_policy, **copies}
        _commit_point(self, client, meta, manifest)
        self._copies.clean(manifest)
        if not self._wrote:
            self._wrote = True
            atexit.register(self.finish)  # a process that never closes it (the CLI)
        self._commit, self._gen = commit, gen
        for doc_id in self._pending:
            self._doc_gen[doc_id] = gen
        for doc_id, _ in self._retire:
            if doc_id not in self._pending:
                self._doc_gen.pop(doc_id, None)
        retired, self._retire, self._pending = self._retire, [], {}
        self._retired = retired  # visible as gone until their rows are deleted
        self._delete_versions(retired)
        self._retired = []

    def finish(self) -> None:
        """Bring the local copies up to the commit this store holds, as a writer's `close`
        does (an index a killed writer left can be finished by any writer). Writes the
        copies that lag behind and names them in a manifest of the same gen with a new commit id (the files first, as in `_save`; the
        old ones deleted after). Nothing when another writer committed since: its own finish
        covers its commit. A failure is logged, not raised: the copies are only slower to
        open until the next writer finishes."""
        atexit.unregister(self.finish)
        self._wrote = False
        if not self._copies.stale:
            return
        try:
            with self._lock(None), self._mutex:
                manifest = self._manifest()
                if manifest is None or manifest["commit"] != self._commit:
                    return
                manifest.update(self._copies.save(self._gen), commit=uuid.uuid4().hex)
                _commit_point(self, self._connected(), self._names()[2], manifest)
                self._commit = manifest["commit"]
                self._copies.clean(manifest)
        except (RetrievalError, OSError) as exc:
            self._commit = "unknown"  # the copies may name files no manifest does: reload
            logger.warning("The files beside %s were not brought up to date (%s); the next "
                           "open reads the newest passages from Milvus.", self.location.spec, exc)

    def _grow_vector_index(self, client, passages: str) -> None:
        """Under the AUTO policy, switch to IVF_FLAT once the commit holds APPROX_THRESHOLD
        passages (before the manifest that records it: a crash between leaves an IVF index
        that the next commit rebuilds again, searched meanwhile with Milvus' defaults)."""
        from ragspec.retrieval.milvus.schema import APPROX_THRESHOLD, use_ivf

        if self._vector_policy == "AUTO" and self._vector_index == "FLAT" and \
                self.passage_count() >= APPROX_THRESHOLD:
            self._call("index the vectors", use_ivf, client, passages)
            self._vector_index = "IVF_FLAT"


def _commit_point(store: MilvusStore, client, meta: str, manifest: dict) -> None:
    """milvus_collections.commit_point, looked up here at each commit (a test breaks it here
    to play a crash)."""
    commit_point(store, client, meta, manifest)
