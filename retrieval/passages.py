"""Cut loaded documents into passages the embedder can see whole.

Contract: `split_documents(docs, counter)` returns `PassageDraft`s, in document order, such that
for each draft `d` cut from document text `t`:
  * `t[d.start : d.start + len(d.text)] == d.text` (exact provenance: the generator copies from
    passages, the UI points back into the source);
  * `counter.count_tokens(d.text) + counter.special_tokens <= counter.max_tokens` (the embedder
    would silently drop anything past its maximum sequence length: 256 word pieces for
    all-MiniLM-L6-v2, [CLS] and [SEP] included).

Splitting is LangChain's RecursiveCharacterTextSplitter (paragraphs, then lines, then words,
then characters) with its length function counting the embedder's own word pieces, consecutive
passages overlapping by `overlap_tokens` so a sentence cut at a boundary is whole in one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from langchain_core.documents import Document
from langchain_text_splitters import RecursiveCharacterTextSplitter

from retrieval.errors import LoadError

DEFAULT_CHUNK_TOKENS = 200
DEFAULT_OVERLAP_TOKENS = 32


class TokenCounter(Protocol):
    """What the splitter needs from an embedder."""

    max_tokens: int  # the model's limit, special tokens included
    special_tokens: int  # tokens the model adds to every input

    def count_tokens(self, text: str) -> int: ...


@dataclass(frozen=True)
class SplitConfig:
    """chunk_tokens: target passage length in word pieces (capped at what the model sees).
    overlap_tokens: word pieces shared by consecutive passages of one document.
    """

    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS

    def __post_init__(self) -> None:
        if self.chunk_tokens < 16:
            raise ValueError(
                f"chunk_tokens={self.chunk_tokens} is too small to hold a sentence; use >= 16"
            )
        if not 0 <= self.overlap_tokens < self.chunk_tokens // 2:
            raise ValueError(
                f"overlap_tokens must be in [0, chunk_tokens/2), got {self.overlap_tokens} "
                f"with chunk_tokens={self.chunk_tokens}"
            )


@dataclass(frozen=True)
class PassageDraft:
    """A passage before it has an id: its text, page (1-based, PDFs only) and start offset."""

    text: str
    page: int | None
    start: int


def split_documents(
    docs: list[Document], counter: TokenCounter, config: SplitConfig | None = None
) -> list[PassageDraft]:
    config = config or SplitConfig()
    budget = counter.max_tokens - counter.special_tokens
    chunk = min(config.chunk_tokens, budget)
    overlap = min(config.overlap_tokens, chunk // 4)
    drafts: list[PassageDraft] = []
    for doc in docs:
        page = doc.metadata.get("page")
        for text, start in _split_text(doc.page_content, counter, chunk, overlap, budget):
            drafts.append(PassageDraft(text=text, page=page, start=start))
    return drafts


def _split_text(
    text: str, counter: TokenCounter, chunk: int, overlap: int, budget: int
) -> list[tuple[str, int]]:
    splitter = RecursiveCharacterTextSplitter(
        chunk_size=chunk,
        chunk_overlap=overlap,
        length_function=counter.count_tokens,
        add_start_index=True,
    )
    out: list[tuple[str, int]] = []
    previous = -1
    for part in splitter.create_documents([text]):
        piece = part.page_content
        start = part.metadata.get("start_index", -1)
        if not piece.strip():
            continue
        # LangChain computes start_index as "previous start + previous length - chunk_overlap",
        # subtracting a *token* count from a *character* offset, so with a token length
        # function it can skip past the real start. Keep it only when it verifiably points at
        # the passage; otherwise take the first occurrence after the previous passage's start
        # (passages advance through the text, so that is the right one or identical text).
        if start <= previous or text[start : start + len(piece)] != piece:
            start = text.find(piece, previous + 1)
        if start < 0:
            raise LoadError("internal error: a passage could not be located in its text")
        previous = start
        if counter.count_tokens(piece) <= budget:
            out.append((piece, start))
        else:
            # Token counts are not additive across the character-level pieces the splitter
            # joins, so a merged chunk can exceed the budget by a few word pieces: split it
            # again, smaller, keeping offsets relative to the whole text.
            smaller = max(8, int(chunk * 0.8))
            for sub, sub_start in _split_text(piece, counter, smaller, overlap // 2, budget):
                out.append((sub, start + sub_start))
    return out
