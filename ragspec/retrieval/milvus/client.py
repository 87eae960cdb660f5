"""How a Milvus store talks to Milvus: the connection (a failure as one clear line), the three
collections' names, rows read in batches, the manifest row, and rows written and deleted.

Contract: `MilvusCollections` is a base class of milvus_store.MilvusStore (see there for what
each collection holds and the commit protocol); it uses the store's `location`, `embedder`,
`_client`, `_lc`, `_dim`, `_vector_index` and `_rebuild_hint`, and decides nothing about
commits itself. `commit_point` upserts the manifest: the instant a commit becomes visible.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from ragspec.retrieval.errors import IndexCorruptError, IndexNotWritableError, RetrievalError
from ragspec.retrieval.milvus.schema import quiet_imports
from ragspec.retrieval.records import Passage

STRONG = {"consistency_level": "Strong"}
_BATCH = 1000  # rows per insert call
_MAX_TEXT = 65535  # Milvus' longest VARCHAR, in bytes


class IndexUnavailableError(RetrievalError):
    """The Milvus server (or Milvus Lite file) cannot be reached or used."""


class MilvusCollections:
    """See the module docstring."""

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

    def _disconnect(self) -> None:
        """Close the client (and stop this process's Milvus Lite server for the file)."""
        if self._client is not None:
            self._client.close()
            self._client, self._lc = None, None
            if self.location.lite:
                from milvus_lite.server_manager import server_manager_instance

                server_manager_instance.release_server(self.location.uri)

    def _manifest(self) -> dict | None:
        client = self._connected()
        if client is None:
            return None
        _, _, meta = self._names()
        if not self._call("read the manifest", client.has_collection, meta):
            return None
        found = self._call("read the manifest", client.query, meta, filter='pk == "manifest"',
                           output_fields=["body"], **STRONG)
        if not found:
            return None
        try:
            return json.loads(found[0]["body"])
        except (KeyError, ValueError) as exc:
            raise IndexCorruptError(f"The index {self.location.spec} has a damaged manifest "
                                    f"({exc}). {self._rebuild_hint()}") from exc

    def _rows(self, collection: str, expr: str, fields: list[str], parse_body=False) -> list:
        """Every row matching `expr` (query_iterator: no limit on how many)."""
        return [json.loads(r["body"]) if parse_body else r
                for batch in self._batches(collection, expr, fields) for r in batch]

    def _batches(self, collection: str, expr: str, fields: list[str]):
        """The rows matching `expr`, a batch (list of dicts) at a time."""
        client = self._connected()
        iterator = self._call("read", client.query_iterator, collection, batch_size=4096,
                              filter=expr, output_fields=fields, **STRONG)
        try:
            while batch := self._call("read", iterator.next):
                yield batch
        finally:
            iterator.close()

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
        from ragspec.retrieval.milvus.schema import create_collections

        create_collections(self._connected(create=True), self._names(), self._dim or 2,
                           self._vector_index)


def commit_point(store: MilvusCollections, client, meta: str, manifest: dict) -> None:
    """Upsert the manifest: from here on readers see the new commit (a test breaks it here to
    play a crash)."""
    store._call("commit", client.upsert, meta, [
        {"pk": "manifest", "kind": "manifest", "gen": manifest["gen"],
         "body": json.dumps(manifest), "v": [0.0, 0.0]}])
    store._call("flush", client.flush, meta)
