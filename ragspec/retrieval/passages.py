"""Cut loaded documents into passages the embedder can see whole.

Contract: `split_documents(docs, counter)` returns `PassageDraft`s, in document order, such that
for each draft `d` cut from document text `t`:
  * `t[d.start : d.start + len(d.text)] == d.text` (exact provenance: the generator copies from
    passages, the UI points back into the source); offsets are positions the splitter walked
    to, never found by searching, so repeated text (table rows, page headers, "lorem ipsum")
    cannot send a passage to another copy of itself;
  * within one document the starts strictly increase, and passages hold no leading or trailing
    whitespace;
  * `counter.count_tokens(d.text) + counter.special_tokens <= counter.max_tokens` (the embedder
    would silently drop anything past its maximum sequence length: 256 word pieces for
    all-MiniLM-L6-v2, [CLS] and [SEP] included).

How: walk the text once. At each start, the model's own word pieces for the stretch ahead give
the character where `chunk_tokens` pieces end; the passage ends at the best break before it (a
blank line, else a line break, else a sentence end, else any whitespace, as long as at least half
the stretch is kept; else exactly there), and the next passage starts within the last
`overlap_tokens` pieces, at the first break of the same kinds, so a sentence cut at a boundary is
whole in one of them. Each stretch
is tokenised a small constant number of times: time and memory are linear in the text, whatever
it holds (a 10 MB line without spaces is as cheap as prose).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from langchain_core.documents import Document

DEFAULT_CHUNK_TOKENS = 200
DEFAULT_OVERLAP_TOKENS = 32
# The most characters a passage may hold per token of its budget. Prose averages 3-5
# characters a word piece, so this binds only text the tokenizer sees as a few giant pieces (a
# word longer than the vocabulary allows is one [UNK], however long): without it a run without
# spaces would become one passage the size of the document, seen by the model as one token.
MAX_CHARS_PER_TOKEN = 16

# Where a passage prefers to end, best first: (separator, characters of it kept in the passage).
_BREAKS: tuple[tuple[tuple[str, int], ...], ...] = (
    (("\n\n", 0),),
    (("\n", 0),),
    ((". ", 1), ("! ", 1), ("? ", 1), ("。", 1), ("！", 1), ("？", 1)),
    ((" ", 0), ("\t", 0)),
)
_NON_SPACE = re.compile(r"\S")


class TokenCounter(Protocol):
    """What the splitter needs from an embedder."""

    max_tokens: int  # the model's limit, special tokens included
    special_tokens: int  # tokens the model adds to every input

    def count_tokens(self, text: str) -> int: ...

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """(start, end) character offsets of each word piece of `text`, in order."""
        ...


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
        walker = _Walker(doc.page_content, counter, chunk, overlap, budget)
        drafts.extend(PassageDraft(text=text, page=page, start=start) for text, start in walker)
    return drafts


class _Walker:
    """One pass over one text, yielding (passage, start); see the module docstring."""

    def __init__(self, text: str, counter: TokenCounter, chunk: int, overlap: int,
                 budget: int) -> None:
        self.text, self.counter = text, counter
        self.chunk, self.overlap, self.budget = chunk, overlap, budget
        self.max_chars = chunk * MAX_CHARS_PER_TOKEN
        self.window = min(self.max_chars, chunk * 6)  # grown or shrunk to fit the text's density

    def __iter__(self):
        text = self.text
        pos = self._skip_space(0)
        while pos < len(text):
            spans = self._spans_ahead(pos)
            cut = self._cut(pos, spans, self.chunk)
            end = self._rstrip(pos, cut)
            excess = self.counter.count_tokens(text[pos:end]) - self.budget
            while excess > 0:
                # Word pieces are not additive across a cut (a word split in two becomes two
                # word-initial pieces), so a stretch measured at `chunk` can count a few more
                # alone: take fewer pieces and measure again.
                taken = sum(1 for _, e in spans if e <= end)
                cut = self._cut(pos, spans, max(1, taken - excess - 1))
                end = self._rstrip(pos, cut)
                excess = self.counter.count_tokens(text[pos:end]) - self.budget
            yield text[pos:end], pos
            if self._skip_space(cut) >= len(text):
                return  # the rest is whitespace: no overlap passage after the last one
            self.window = min(self.max_chars, max(self.chunk, cut - pos) * 3 // 2 + 16)
            pos = self._next_start(pos, cut, spans)

    def _spans_ahead(self, pos: int) -> list[tuple[int, int]]:
        """Absolute spans of the word pieces from `pos`: more than `chunk` of them, or all up
        to the character cap (or the end of the text). Pieces the window edge may have cut are
        dropped, except a lone giant one."""
        text, limit = self.text, min(len(self.text), pos + self.max_chars)
        window = self.window
        while True:
            stop = min(limit, pos + window)
            spans = [(pos + s, pos + e) for s, e in self.counter.token_spans(text[pos:stop])]
            if stop < len(text) and len(spans) > 1 and spans[-1][1] >= stop:
                spans.pop()
            if len(spans) > self.chunk or stop >= limit:
                return spans
            window *= 2

    def _cut(self, pos: int, spans: list[tuple[int, int]], tokens: int) -> int:
        """Where the passage starting at `pos` ends, taking at most `tokens` word pieces."""
        text = self.text
        if len(spans) <= tokens and pos + self.max_chars >= len(text):
            return len(text)  # the rest fits
        if len(spans) > tokens:
            hard = spans[tokens - 1][1]
        else:  # the character cap binds first
            hard = spans[-1][1] if len(spans) > 1 else min(len(text), pos + self.max_chars)
        low = pos + (hard - pos) // 2
        for group in _BREAKS:
            best = max(_last(text, sep, low, hard, keep) for sep, keep in group)
            if best > pos:
                return best
        return hard

    def _next_start(self, pos: int, cut: int, spans: list[tuple[int, int]]) -> int:
        taken = [s for s, e in spans if e <= cut]
        if self.overlap == 0 or len(taken) < 2:
            return self._skip_space(cut)
        # At least half the passage is new text, so the walk always moves on.
        back = taken[max(len(taken) - self.overlap, (len(taken) + 1) // 2)]
        # Within the overlap, start at the first paragraph, else line, else sentence, else word:
        # the overlap then holds whole units, and a heading stays with the text below it.
        start = next((found for group in _BREAKS if (found := _first(self.text, group, back, cut))
                      >= 0), back)
        return self._skip_space(max(start, pos + 1))

    def _skip_space(self, pos: int) -> int:
        found = _NON_SPACE.search(self.text, pos)
        return found.start() if found else len(self.text)

    def _rstrip(self, pos: int, cut: int) -> int:
        while cut > pos + 1 and self.text[cut - 1].isspace():
            cut -= 1
        return cut


def _first(text: str, group: tuple[tuple[str, int], ...], low: int, high: int) -> int:
    """Where a passage starts after the first separator of `group` in text[low:high], or -1."""
    found = [i + len(sep) for sep, _ in group if (i := text.find(sep, low, high)) >= 0]
    return min(found) if found else -1


def _last(text: str, sep: str, low: int, high: int, keep: int) -> int:
    """The end of a passage broken at the last `sep` inside text[low:high], or -1."""
    found = text.rfind(sep, low, high)
    return found + keep if found >= 0 else -1
