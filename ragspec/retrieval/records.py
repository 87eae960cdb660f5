"""The plain records the store hands out: Passage, Hit, DocumentInfo.

Immutable, validated on construction, free of LangChain and FAISS types, so the pipeline and the
UI can keep and compare them freely. Import them from `ragspec.retrieval.faiss.store` (re-exported there).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Passage:
    """One stored passage and where it came from.

    source: the document's resolved file path. page: 1-based page for PDFs, else None.
    start: character offset of `text` in the loaded text of that page (or whole document), so
        `loaded_text[start : start + len(text)] == text`.
    """

    id: str
    doc_id: str
    text: str
    source: str
    page: int | None
    start: int

    def __post_init__(self) -> None:
        if not self.text:
            raise ValueError(f"passage {self.id!r} has empty text; passages must hold words")
        if self.start < 0:
            raise ValueError(f"passage {self.id!r} has start={self.start}; offsets are >= 0")
        if self.page is not None and self.page < 1:
            raise ValueError(f"passage {self.id!r} has page={self.page}; pages count from 1")


SEARCH_MODES = ("dense", "hybrid")


@dataclass(frozen=True)
class Hit:
    """A search result: cosine similarity to the query (in [-1, 1]) and the passage; in a hybrid
    search, `fused` is its reciprocal-rank fusion score (what the hits are ordered by)."""

    score: float
    passage: Passage
    fused: float | None = None


@dataclass(frozen=True)
class SearchResult:
    """The hits of one search, best first, and the best cosine similarity of any passage in the
    index to the query (None when the index is empty): in a hybrid search the passage with the
    best cosine may rank below the hits returned."""

    hits: list[Hit]
    best_score: float | None
    mode: str

    def __post_init__(self) -> None:
        if self.mode not in SEARCH_MODES:
            raise ValueError(f"search mode must be one of {', '.join(SEARCH_MODES)}, "
                             f"got {self.mode!r}")


@dataclass(frozen=True)
class DocumentInfo:
    """One ingested file: ids, content hash, passage count, size, ingestion time (ISO 8601)."""

    doc_id: str
    source: str
    sha256: str
    passages: int
    size_bytes: int
    ingested_at: str

    def __post_init__(self) -> None:
        if len(self.sha256) != 64:
            raise ValueError(f"sha256 must be 64 hex digits, got {self.sha256!r}")
        if self.passages < 0 or self.size_bytes < 0:
            raise ValueError("passages and size_bytes cannot be negative")
