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

Dense search on Milvus Lite: below faiss_ann.THRESHOLD passages, or with RAGSPEC_DENSE=exact,
Milvus' own exact FLAT search. Past it, ragspec's approximate index (milvus_vectors.py: the
committed vectors in a file beside the Milvus data, searched by faiss_ann.ApproxIndex, the
FAISS folder's) picks the passages and their exact cosines, and Milvus gives their rows by row
key. Milvus Lite 2.5 has no approximate index that keeps recall (its IVF_FLAT found 0.62-0.67 of
the true top 10), and an exact scan of a million vectors per question takes ~150 ms here. A
Milvus server keeps its own search: its vectors are meant to live on the server (readers on
several machines, more memory than one client has), and it offers approximate indexes of its
own; copying them into each reader would undo that. An index made with RAGSPEC_MILVUS_INDEX
other than FLAT is searched by that index.

Commit protocol (one writer at a time, under a file lock on this machine): a commit with number
g = G + 1 inserts its passages and documents with gen = g and the versions it retires as
"retired" rows with gen = g, flushes, writes the keyword and vector files when due, then
upserts the manifest with gen = g (the commit point), then deletes the retired versions' rows
and their "retired" rows. Readers see only rows with gen <= G of the manifest they loaded,
minus retired versions, so a crash before the manifest leaves the previous commit exactly as it
was (the extra rows are invisible, and the next writer deletes them), and a crash after it
leaves the new commit whole (the next writer finishes the deletes). Passage ids are the same
as in the FAISS folder store; the row key adds the gen so that a re-added version never shares
a key with the retired one.

Limits: the lock is a file on this machine, so writers to one Milvus server must run on one
machine (readers anywhere); Milvus Lite serves one process at a time.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

import numpy as np

from ragspec.retrieval import faiss_ann, persist
from ragspec.retrieval.errors import IndexCorruptError, IndexNotWritableError, RetrievalError
from ragspec.retrieval.lock import DEFAULT_LOCK_TIMEOUT, write_lock
from ragspec.retrieval.milvus_keywords import MilvusKeywords
from ragspec.retrieval.milvus_location import MilvusLocation
from ragspec.retrieval.milvus_schema import document_row, quiet_imports
from ragspec.retrieval.milvus_vectors import MilvusVectors, Rows
from ragspec.retrieval.records import DocumentInfo, Passage
from ragspec.retrieval.store_base import PassageEmbedder, StoreBase, check_model, passage_doc_id

logger = logging.getLogger(__name__)

_OUT = ["pid", "doc_id", "page", "start", "text"]
_STRONG = {"consistency_level": "Strong"}
_BATCH = 1000  # rows per insert call
_MAX_TEXT = 65535  # Milvus' longest VARCHAR, in bytes


class IndexUnavailableError(RetrievalError):
    """The Milvus server (or Milvus Lite file) cannot be reached or used."""


class MilvusStore(StoreBase):
    """See the module docstring. Create with `MilvusStore.open`."""

    def __init__(self, location: MilvusLocation, embedder, lock_timeout: float) -> None:
        self.location = location
        self.index_dir = location.spec
        self._init_common(embedder, lock_timeout)
        self._client = None
        self._lc = None
        self._keywords = MilvusKeywords(location.keywords_folder())
        self._vectors = _vectors_for(location)
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
        store._keywords = MilvusKeywords(location.keywords_folder())
        store._vectors = _vectors_for(location)
        return store

    # -- connection and names ---------------------------------------------------------------

    def _names(self) -> tuple[str, str, str]:
        c = self.location.collection
        return c, f"{c}_documents", f"{c}_meta"

    def _connected(self, create: bool = False):
        """The pymilvus client; None when a Milvus Lite file does not exist yet (and `create`
        is False: opening must not create anything)."""
        if self._client is None:
            if self.location.lite and not create and not Path(self.location.uri).exists():
                return None
            quiet_imports()
            from pymilvus import MilvusClient
            from pymilvus.exceptions import MilvusException

            try:
                self._client = MilvusClient(uri=self.location.uri,
                                            token=os.environ.get("RAGSPEC_MILVUS_TOKEN", ""))
            except (MilvusException, OSError) as exc:
                raise IndexUnavailableError(
                    f"Cannot open the Milvus index {self.location.spec} ({exc}). For a server, "
                    "check that it runs and is reachable; Milvus Lite files serve one process at "
                    "a time."
                ) from exc
        return self._client

    def _call(self, what: str, fn, *args, **kwargs):
        """A pymilvus call with its failure as one clear line."""
        from pymilvus.exceptions import MilvusException

        try:
            return fn(*args, **kwargs)
        except MilvusException as exc:
            raise IndexUnavailableError(
                f"Milvus could not {what} in {self.location.spec}: {exc}") from exc

    def close(self) -> None:
        """Disconnect (and stop this process's Milvus Lite server for the file)."""
        if self._client is not None:
            self._client.close()
            self._client, self._lc = None, None
            if self.location.lite:
                from milvus_lite.server_manager import server_manager_instance

                server_manager_instance.release_server(self.location.uri)

    # -- loading ------------------------------------------------------------------------------

    def _load(self) -> None:
        self._dirty = False
        self._pending: dict[str, tuple[DocumentInfo, list[Passage], np.ndarray]] = {}
        self._retire: list[tuple[str, int]] = []
        manifest = self._manifest()
        if manifest is None:
            from ragspec.retrieval.milvus_schema import vector_index_from_env

            self._vector_policy = vector_index_from_env()
            self._vector_index = "FLAT" if self._vector_policy == "AUTO" else self._vector_policy
            self._commit, self._gen, self._dim = None, 0, None
            self._model_name = getattr(self.embedder, "name", None)
            self._documents, self._doc_gen, self._retired = {}, {}, []
            self._keywords = MilvusKeywords(self.location.keywords_folder())
            self._vectors = _vectors_for(self.location)
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

        def texts(expr: str) -> list[tuple[str, str]]:
            return [(r["pid"], r["text"]) for r in self._rows(passages, expr, ["pid", "text"])]

        self._keywords.load(manifest.get("keywords"), self.passage_count(), self._doc_gen,
                            newer=lambda g: texts(f"{self._visible()} and gen > {g}"),
                            every=lambda: texts(self._visible()))
        if self._vectors is not None:
            self._vectors.load(manifest.get("vectors"), self.passage_count(), self._doc_gen,
                               newer=lambda g: self._vector_rows(
                                   f"{self._visible()} and gen > {g}"),
                               every=lambda: self._vector_rows(self._visible()))

    def _vector_rows(self, expr: str) -> Rows:
        """The rows matching `expr` as (passage ids, gens, vectors), converted a batch at a time
        (a million rows as Python floats would take ~10 GB)."""
        client = self._connected()
        iterator = self._call("read", client.query_iterator, self._names()[0], batch_size=4096,
                              filter=expr, output_fields=["pid", "gen", "vector"], **_STRONG)
        pids, gens, blocks = [], [], []
        try:
            while batch := self._call("read", iterator.next):
                pids += [r["pid"] for r in batch]
                gens += [int(r["gen"]) for r in batch]
                blocks.append(np.asarray([r["vector"] for r in batch], dtype=np.float32))
        finally:
            iterator.close()
        vectors = np.concatenate(blocks) if blocks else np.zeros((0, self._dim or 0), np.float32)
        return pids, np.asarray(gens, dtype=np.int64), vectors

    def _manifest(self) -> dict | None:
        client = self._connected()
        if client is None:
            return None
        _, _, meta = self._names()
        if not self._call("read the manifest", client.has_collection, meta):
            return None
        found = self._call("read the manifest", client.query, meta, filter='pk == "manifest"',
                           output_fields=["body"], **_STRONG)
        if not found:
            return None
        try:
            return json.loads(found[0]["body"])
        except (KeyError, ValueError) as exc:
            raise IndexCorruptError(f"The index {self.location.spec} has a damaged manifest "
                                    f"({exc}). {self._rebuild_hint()}") from exc

    def _rows(self, collection: str, expr: str, fields: list[str], parse_body=False) -> list:
        """Every row matching `expr` (query_iterator: no limit on how many)."""
        client = self._connected()
        iterator = self._call("read", client.query_iterator, collection, batch_size=4096,
                              filter=expr, output_fields=fields, **_STRONG)
        out = []
        try:
            while batch := self._call("read", iterator.next):
                out.extend(json.loads(r["body"]) if parse_body else r for r in batch)
        finally:
            iterator.close()
        return out

    def _visible(self) -> str:
        """The filter for rows of the loaded commit."""
        expr = f"gen <= {self._gen}"
        if self._retired:
            gone = " or ".join(f'(doc_id == "{d}" and gen == {g})' for d, g in self._retired)
            expr += f" and not ({gone})"
        return expr

    def _forget(self) -> None:
        self._pending, self._retire = {}, []
        self._keywords = MilvusKeywords(self.location.keywords_folder())
        self._vectors = _vectors_for(self.location)

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
        # Milvus then reads only the rows retrieve returns, in one query by row key: a query
        # costs about the same whatever it reads (~5 ms at 100k passages, ~55 ms at 1M).
        return self._vectors.search(vector, k) if self._approximate() else None

    def _dense(self, vector: np.ndarray, k: int) -> list[tuple[Passage, float]]:
        from ragspec.retrieval.milvus_schema import search_params

        hits = self._search("vector", vector.tolist(), k, search_params(self._vector_index), _OUT)
        return sorted(((self._passage(h["entity"]), float(h["distance"])) for h in hits),
                      key=lambda item: (-item[1], item[0].id))

    def _keyword_ids(self, query: str, k: int) -> list[str]:
        return self._keywords.top_ids(query, k)

    def _search(self, field: str, data, k: int, params: dict, fields: list[str]) -> list:
        client = self._connected()
        found = self._call("search", client.search, self._names()[0], data=[data],
                           anns_field=field, limit=k, filter=self._visible(),
                           search_params=params, output_fields=fields, **_STRONG)
        return list(found[0]) if found else []

    def _fetch(self, ids: list[str], vector: np.ndarray) -> dict[str, tuple[Passage, float]]:
        if self._vectors is not None:  # the cosines from the vectors held here
            rows = self._by_key(ids, _OUT)
            cosines = self._vectors.cosines(rows, vector)
            return {pid: (self._passage(r), cosines[pid]) for pid, r in rows.items()}
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
                          output_fields=fields, **_STRONG)
        return {r["pid"]: r for r in rows}

    # -- writing ------------------------------------------------------------------------------

    def _prepare_write(self) -> None:
        folder, _ = self.location.lock_place()
        persist.check_writable(folder)
        persist.check_writable(self.location.keywords_folder())
        if self._vectors is not None:
            persist.check_writable(self._vectors.folder)

    def _lock(self, on_wait):
        folder, name = self.location.lock_place()
        return write_lock(folder, self.lock_timeout, on_wait, name=name)

    def _disk_commit(self) -> str | None:
        manifest = self._manifest()
        return None if manifest is None else manifest["commit"]

    def _recover(self) -> None:
        """Delete what a crashed commit left: rows newer than the manifest, and the rows of
        versions the last commit retired."""
        manifest = self._manifest()
        if manifest is None:
            return
        gen = int(manifest["gen"])
        self._keywords.clean(manifest.get("keywords"))
        if self._vectors is not None:
            self._vectors.clean(manifest.get("vectors"))
        passages, documents, meta = self._names()
        client = self._connected()
        for name in (passages, documents, meta):
            self._call("clean up", client.delete, name, filter=f"gen > {gen}")
        retired = [(r["doc_id"], int(r["old_gen"])) for r in self._rows(
            meta, f'kind == "retired" and gen <= {gen}', ["body"], parse_body=True)]
        self._delete_versions(retired)

    def _delete_versions(self, versions: list[tuple[str, int]]) -> None:
        passages, documents, meta = self._names()
        client = self._connected()
        for first in range(0, len(versions), 100):
            batch = versions[first : first + 100]
            expr = " or ".join(f'(doc_id == "{d}" and gen == {g})' for d, g in batch)
            self._call("delete", client.delete, passages, filter=expr)
            self._call("delete", client.delete, documents, filter=expr)
            keys = [f"retired:{d}@{g}" for d, g in batch]
            self._call("delete", client.delete, meta, filter=f"pk in {json.dumps(keys)}")
        if versions:
            for name in (passages, documents, meta):
                self._call("flush", client.flush, name)

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
        keywords = self._keywords.commit(
            [(doc_id, rows) for doc_id, (_, rows, _) in self._pending.items()],
            [doc_id for doc_id, _ in self._retire], gen)
        vectors = None if self._vectors is None else self._vectors.commit(
            [([p.id for p in rows], v) for _, rows, v in self._pending.values()],
            [doc_id for doc_id, _ in self._retire], gen)
        manifest = {"gen": gen, "commit": commit, "embedder": self._model_name or "",
                    "dim": self._dim or 0, "vector_index": self._vector_index,
                    "vector_policy": self._vector_policy,
                    "keywords": keywords, "vectors": vectors}
        _commit_point(self, client, meta, manifest)
        self._keywords.clean(keywords)
        if self._vectors is not None:
            self._vectors.clean(vectors)
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

    def _grow_vector_index(self, client, passages: str) -> None:
        """Under the AUTO policy, switch to IVF_FLAT once the commit holds APPROX_THRESHOLD
        passages (before the manifest that records it: a crash between leaves an IVF index
        that the next commit rebuilds again, searched meanwhile with Milvus' defaults)."""
        from ragspec.retrieval.milvus_schema import APPROX_THRESHOLD, use_ivf

        if self._vector_policy == "AUTO" and self._vector_index == "FLAT" and \
                self.passage_count() >= APPROX_THRESHOLD:
            self._call("index the vectors", use_ivf, client, passages)
            self._vector_index = "IVF_FLAT"

    def _write_passages(self, gen: int, rows: list[Passage], vectors: np.ndarray) -> None:
        too_long = [p.id for p in rows if len(p.text.encode("utf-8")) > _MAX_TEXT]
        if too_long:
            raise IndexNotWritableError(f"passage {too_long[0]} is longer than Milvus' "
                                        f"{_MAX_TEXT}-byte text field; nothing was changed")
        self._call("add passages", self._vector_store().add_embeddings,
                   [p.text for p in rows], vectors.tolist(),
                   metadatas=[{"pid": p.id, "doc_id": p.doc_id, "gen": gen, "page": p.page or 0,
                               "start": p.start} for p in rows],
                   ids=[f"{p.id}@{gen}" for p in rows], batch_size=_BATCH)

    def _vector_store(self):
        """langchain-milvus's vector store over the passages collection (made once)."""
        if self._lc is None:
            from langchain_milvus import BM25BuiltInFunction, Milvus

            # It warns that its async client needs an event loop; nothing here is async.
            logging.getLogger("langchain_milvus").setLevel(logging.ERROR)

            self._lc = Milvus(
                embedding_function=self.embedder, collection_name=self._names()[0],
                connection_args={"uri": self.location.uri,
                                 "token": os.environ.get("RAGSPEC_MILVUS_TOKEN", "")},
                builtin_function=BM25BuiltInFunction(input_field_names="text",
                                                     output_field_names="sparse"),
                vector_field=["vector", "sparse"], primary_field="pk", text_field="text",
                consistency_level="Strong", auto_id=False,
            )
        return self._lc

    def _create_collections(self) -> None:
        from ragspec.retrieval.milvus_schema import create_collections

        create_collections(self._connected(create=True), self._names(), self._dim or 2,
                           self._vector_index)


def _vectors_for(location: MilvusLocation) -> MilvusVectors | None:
    """The vectors kept beside a Milvus Lite file; None for a server (see the module
    docstring)."""
    folder = location.vectors_folder()
    return None if folder is None else MilvusVectors(folder)


def _commit_point(store: MilvusStore, client, meta: str, manifest: dict) -> None:
    """Upsert the manifest: from here on readers see the new commit (a test breaks it here to
    play a crash)."""
    store._call("commit", client.upsert, meta, [
        {"pk": "manifest", "kind": "manifest", "gen": manifest["gen"],
         "body": json.dumps(manifest), "v": [0.0, 0.0]}])
    store._call("flush", client.flush, meta)
