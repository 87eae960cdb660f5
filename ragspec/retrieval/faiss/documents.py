"""LangChain's FAISS vector store as the PassageStore keeps it: passages in and out of LangChain
`Document`s, the store built around a given FAISS index, and whether a GPU is there to use.

Contract: `to_lc(p)` and `from_lc(doc)` are inverses for every `Passage`; `new_faiss(index,
embedder)` searches by exact inner product (the vectors are normalised: cosine similarity) and
never embeds by itself unless given an embedder (searches pass vectors); `add_rows` appends
passages and their vectors in time proportional to what is added. `GpuView` keeps a GPU
copy of a store for searching, when there is a GPU to use.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import faiss
import numpy as np
from langchain_community.docstore.in_memory import InMemoryDocstore
from langchain_community.vectorstores import FAISS
from langchain_community.vectorstores.utils import DistanceStrategy
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

from ragspec.retrieval.records import Passage

logger = logging.getLogger(__name__)


class _NoEmbedder(Embeddings):
    """Stands in when a store is opened only to list or remove documents."""

    def _fail(self):
        raise RuntimeError("this PassageStore was opened without an embedder; pass one to search")

    def embed_documents(self, texts):
        self._fail()

    def embed_query(self, text):
        self._fail()


def new_faiss(index: faiss.Index, embedder) -> FAISS:
    """An empty LangChain FAISS store around `index` (rows are added with their passages)."""
    return FAISS(
        embedding_function=embedder if embedder is not None else _NoEmbedder(),
        index=index,
        docstore=InMemoryDocstore(),
        index_to_docstore_id={},
        distance_strategy=DistanceStrategy.MAX_INNER_PRODUCT,
    )


def add_rows(lc: FAISS, passages: Sequence[Passage], vectors: np.ndarray) -> None:
    """Append `passages` with their vectors (row i for passages[i]) to the store: what
    `FAISS.add_embeddings` does, without its InMemoryDocstore.add, which checks and copies the
    whole docstore on every call (O(passages stored) per document: quadratic over an ingest)."""
    docs = {p.id: to_lc(p) for p in passages}
    held = lc.docstore._dict  # the docstore's own dict (LangChain keeps no other index of it)
    if len(docs) != len(passages) or any(pid in held for pid in docs):
        raise ValueError("a passage id is already in the store")
    first = lc.index.ntotal
    lc.index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    held.update(docs)
    lc.index_to_docstore_id.update(zip(range(first, first + len(docs)), docs, strict=True))


def to_lc(p: Passage) -> Document:
    return Document(
        id=p.id, page_content=p.text,
        metadata={"doc_id": p.doc_id, "source": p.source, "page": p.page, "start": p.start},
    )


def from_lc(doc: Document) -> Passage:
    m = doc.metadata
    return Passage(id=doc.id, doc_id=m["doc_id"], text=doc.page_content, source=m["source"],
                   page=m["page"], start=m["start"])


def gpu_available() -> bool:
    # faiss-cpu builds have no StandardGpuResources; GPU builds report the visible devices.
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class GpuView:
    """A GPU copy of a LangChain FAISS store, for searching only: writes go to the CPU index
    (GPU flat indexes cannot remove rows, and the saved form must be the CPU one). `reset()`
    after each change; the next `view()` copies again. Without a GPU, or when copying fails
    (out of GPU memory, driver trouble), `view()` is the CPU store itself."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._resources = None
        self._view: FAISS | None = None

    def reset(self) -> None:
        self._view = None

    def view(self, lc: FAISS, embedder) -> FAISS:
        if not self.enabled:
            return lc
        if self._view is None:
            try:
                self._resources = self._resources or faiss.StandardGpuResources()
                gpu_index = faiss.index_cpu_to_gpu(self._resources, 0, lc.index)
            except RuntimeError as exc:
                logger.warning("FAISS GPU copy failed (%s); searching on the CPU instead", exc)
                self.enabled = False
                return lc
            view = new_faiss(gpu_index, embedder)
            view.docstore = lc.docstore
            view.index_to_docstore_id = lc.index_to_docstore_id
            self._view = view
        return self._view
