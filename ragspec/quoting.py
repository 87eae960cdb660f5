"""Quoted spans: the stretches of an answer that appear word for word in the passages.

A server that does not report its drafts (vLLM, llama.cpp's server, any OpenAI-compatible
endpoint) still writes answers that copy from the passages; the page shows those stretches as
*quoted* — computed from the text alone, named and coloured differently from accepted drafts,
so it never claims a draft it did not see.

Contract:
  * `QuotedSpan` is a Span with `drafted = False`, `quoted = True` and the passage and character
    range it matches (`origin.source`, `origin.char_start/char_end`; `origin.position` is the
    character offset in the answer, since no token positions are known). `to_dict()` adds
    `"quoted": true`; `span_from_dict` reads either kind back.
  * `QuoteFinder(passages)` cuts an answer into spans whose texts concatenate to the answer:
    left to right, at each token it takes the longest run of tokens (words and single
    punctuation marks, compared exactly; whitespace between them may differ) that occurs in
    one passage, if it holds at least MIN_QUOTE_WORDS words; the rest are plain spans. The
    earliest passage (then the earliest place in it) wins ties. `feed(text_so_far)` gives the
    spans it can decide while text is still arriving (a run that may still grow waits), and
    `finish(text)` the rest: fed or at once, the quoted spans are the same and the texts of
    all spans concatenate to the answer (plain text may come in more pieces).
  * `locate(text, passages)` is where a copied text (a draft a server reported without its
    passage) lies: (passage index, start, end) of its first occurrence, or None.

Example: passages ["Workers poll the queue every 5 seconds."], answer "They poll the queue
every 5 seconds, always." -> "They " plain, "poll the queue every 5 seconds" quoted (passage 0,
characters 8-38), ", always." plain.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ragspec.decoding.types import Span, SpanOrigin

MIN_QUOTE_WORDS = 4
_TOKEN = re.compile(r"\w+|[^\w\s]")
_KEY = 3  # tokens in the lookup key (a quote holds at least MIN_QUOTE_WORDS words >= this)


@dataclass
class QuotedSpan(Span):
    """A stretch of the answer found verbatim in a passage (not a draft); see the module."""

    quoted: bool = True

    def to_dict(self) -> dict:
        return {**super().to_dict(), "quoted": True}


def span_from_dict(d: dict) -> Span:
    """A Span (or QuotedSpan) from its `to_dict()` form."""
    origin = d.get("origin")
    kind = QuotedSpan if d.get("quoted") else Span
    return kind(text=d["text"], token_ids=list(d.get("token_ids") or []),
                drafted=bool(d.get("drafted")), origin=SpanOrigin(**origin) if origin else None)


def _tokens(text: str) -> list[tuple[str, int, int]]:
    return [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]


class QuoteFinder:
    """See the module docstring."""

    def __init__(self, passages: Sequence[str]) -> None:
        self._passages = [_tokens(p) for p in passages]
        self._where: dict[tuple[str, ...], list[tuple[int, int]]] = {}
        for number, tokens in enumerate(self._passages):
            words = [t for t, _, _ in tokens]
            for i in range(len(words) - _KEY + 1):
                self._where.setdefault(tuple(words[i : i + _KEY]), []).append((number, i))
        self._done = 0  # characters of the answer already cut into spans
        self._spans: list[Span] = []

    def feed(self, text: str) -> list[Span]:
        """New spans decided for the answer so far (text only ever grows)."""
        return self._cut(text, final=False)

    def finish(self, text: str) -> list[Span]:
        """The remaining spans of the whole answer."""
        return self._cut(text, final=True)

    def _cut(self, text: str, final: bool) -> list[Span]:
        tokens = _tokens(text[self._done :])
        if not final and tokens and tokens[-1][2] == len(text) - self._done:
            tokens = tokens[:-1]  # the last token may be a word still being written
        out: list[Span] = []
        plain_from = 0  # relative start of the plain text not yet emitted
        i = 0
        while i < len(tokens):
            match = self._longest(tokens, i)
            if match is None:  # no run can start here
                i += 1
                continue
            length, number, at, open_ended = match
            if open_ended and not final:
                break  # the run reaches the end of what arrived: it may grow
            if sum(t[0][0].isalnum() or t[0][0] == "_" for t in tokens[i : i + length]) \
                    < MIN_QUOTE_WORDS:
                i += 1
                continue
            start, end = tokens[i][1], tokens[i + length - 1][2]
            if start > plain_from:
                out.append(Span(text[self._done + plain_from : self._done + start], [], False))
            p = self._passages[number]
            origin = SpanOrigin(position=self._done + start, in_prompt=True, source=number,
                                char_start=p[at][1], char_end=p[at + length - 1][2])
            out.append(QuotedSpan(text[self._done + start : self._done + end], [], False,
                                  origin))
            plain_from = end
            i += length
        # Plain text is final up to the next token that may still start a quote.
        stop = len(text) - self._done if final else (tokens[i][1] if i < len(tokens) else
                                                    (tokens[-1][2] if tokens else 0))
        if stop > plain_from:
            out.append(Span(text[self._done + plain_from : self._done + stop], [], False))
            plain_from = stop
        self._done += plain_from
        self._spans.extend(out)
        return out

    def _longest(self, tokens, i: int):
        """(length, passage, token index there, reaches the end) of the longest run of
        answer tokens from i found in a passage, or None when none could start here."""
        key = tuple(t for t, _, _ in tokens[i : i + _KEY])
        if len(key) < _KEY:
            # Too few tokens left to look up: a run may start here once more text arrives.
            return (len(key), 0, 0, True) if key else None
        best = None
        for number, at in self._where.get(key, ()):
            p = self._passages[number]
            length = _KEY
            while i + length < len(tokens) and at + length < len(p) \
                    and tokens[i + length][0] == p[at + length][0]:
                length += 1
            open_ended = i + length == len(tokens) and at + length < len(p)
            if best is None or length > best[0]:
                best = (length, number, at, open_ended)
            elif length == best[0] and open_ended:
                best = (length, best[1], best[2], True)
        return best


def quote_spans(text: str, passages: Sequence[str]) -> list[Span]:
    """The answer cut into plain and quoted spans (see QuoteFinder)."""
    return QuoteFinder(passages).finish(text)


def locate(text: str, passages: Sequence[str]) -> tuple[int, int, int] | None:
    """(passage index, start, end) of the first passage holding `text` exactly, or None."""
    needle = text.strip()
    if not needle:
        return None
    for number, passage in enumerate(passages):
        at = passage.find(needle)
        if at >= 0:
            return number, at, at + len(needle)
    return None
