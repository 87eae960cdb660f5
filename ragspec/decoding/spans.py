"""The text side of a generation: committed tokens in, Spans with final text out.

Contract: works on token ids and a tokenizer only (no model, no tensors). The engine pushes each
committed token with its kind — the model's own, or part of an accepted draft copied from a given
position — and, once per step, takes the spans that are ready. Then:

  * every span is one kind: a drafted span holds only drafted text and an own span only the
    model's text, whatever is held back or trimmed;
  * the token ids of all spans, in order, are the output's token ids;
  * the texts of all spans, in order, are `text`: the output decoded incrementally
    (ragspec.decoding.detokenize), cut where the first stop string begins;
  * streamed text is final: while the output may still turn into a stop string, its tail
    that could be the start of one is held back and released (as a span of the same kind and
    origin, with no token ids of its own) by a later flush, or dropped if the stop string does
    appear.

Example, stop string "##": the tokens "a", "b#" (drafted from position 7) and "c" come in
three steps. The first flush gives Span("a"); the second gives Span("b", drafted) and holds "#"
back; the third gives Span("#", drafted, no tokens) and Span("c"): the drafted "#" keeps its
highlight and its origin instead of riding along with the model's "c".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ragspec.decoding.detokenize import IncrementalDecoder
from ragspec.decoding.types import Span, SpanOrigin

# (position of the first copied token, number of tokens copied) -> the span's origin
Locate = Callable[[int, int], SpanOrigin]


class SpanText:
    def __init__(self, tokenizer, stop_strings: Sequence[str] = (), locate: Locate | None = None):
        self._decoder = IncrementalDecoder(tokenizer)
        self._stops = tuple(stop_strings)
        self._longest_stop = max((len(s) for s in self._stops), default=0)
        self._locate = locate or (lambda position, count: SpanOrigin(position, in_prompt=False))
        self._pending: list[tuple[Span, int | None]] = []  # this step's spans, raw origin
        self._held: list[Span] = []  # text kept back from earlier steps (no token ids)
        self._searched = 0  # stop strings cannot start before this offset of the decoded text
        self._emitted = 0  # characters streamed so far
        self.stop_at: int | None = None  # where the first stop string begins, once found

    @property
    def text(self) -> str:
        full = self._decoder.text
        return full if self.stop_at is None else full[: self.stop_at]

    def push(self, token: int, drafted: bool = False, copied_from: int | None = None) -> bool:
        """Add one committed token: the model's own, or part of an accepted draft copied from
        position copied_from (None: a draft of unknown origin, e.g. forced by a benchmark).
        Returns True once a stop string has appeared."""
        delta = self._decoder.push([token])
        self._add(token, delta, drafted, copied_from)
        return self._find_stop()

    def flush(self, done: bool) -> list[Span]:
        """The spans ready to stream after a step; done=True releases everything (and cuts at
        the stop string, if one appeared)."""
        if done and self._pending:
            span, origin = self._pending[-1]
            span.text += self._decoder.finish()
        spans = [*self._held, *(self._finished(span, origin) for span, origin in self._pending)]
        self._held, self._pending = [], []
        if done:
            if self.stop_at is not None:
                _trim(spans, self.stop_at - self._emitted)
        else:
            self._held = _split_tail(spans, self._stop_prefix_length())
        self._emitted += sum(len(s.text) for s in spans)
        return _merge([s for s in spans if s.text or s.token_ids])

    # -- internals ------------------------------------------------------------------------------

    def _add(self, token: int, delta: str, drafted: bool, copied_from: int | None) -> None:
        if self._pending:
            span, origin = self._pending[-1]
            if span.drafted == drafted and origin == copied_from:
                span.token_ids.append(token)
                span.text += delta
                return
        self._pending.append((Span(text=delta, token_ids=[token], drafted=drafted), copied_from))

    def _finished(self, span: Span, copied_from: int | None) -> Span:
        if copied_from is not None:
            span.origin = self._locate(copied_from, len(span.token_ids))
        return span

    def _find_stop(self) -> bool:
        if self.stop_at is not None:
            return True
        if not self._stops:
            return False
        text = self._decoder.text
        cuts = [i for i in (text.find(s, self._searched) for s in self._stops) if i >= 0]
        # a stop string found later must end in text not yet searched
        self._searched = max(self._searched, len(text) - self._longest_stop + 1)
        if cuts:
            self.stop_at = min(cuts)
        return self.stop_at is not None

    def _stop_prefix_length(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        text, hold = self._decoder.text, 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), hold, -1):
                if text.endswith(stop[:n]):
                    hold = n
                    break
        return hold


def _trim(spans: list[Span], keep: int) -> None:
    """Keep the first `keep` characters of the spans' text (tokens stay, as in transformers)."""
    for span in spans:
        span.text = span.text[: max(0, keep)]
        keep -= len(span.text)


def _split_tail(spans: list[Span], hold: int) -> list[Span]:
    """Cut the last `hold` characters off the spans; return them as token-less spans of the
    same kind and origin, in order."""
    held: list[Span] = []
    for span in reversed(spans):
        if hold <= 0:
            break
        take = min(hold, len(span.text))
        if take:
            held.insert(0, Span(text=span.text[-take:], token_ids=[], drafted=span.drafted,
                                origin=span.origin))
            span.text = span.text[:-take]
            hold -= take
    return held


def _merge(spans: list[Span]) -> list[Span]:
    """Join neighbours of the same kind and origin (held text with the span that follows it)."""
    out: list[Span] = []
    for span in spans:
        if out and out[-1].drafted == span.drafted and out[-1].origin == span.origin:
            out[-1] = Span(text=out[-1].text + span.text,
                           token_ids=[*out[-1].token_ids, *span.token_ids],
                           drafted=span.drafted, origin=span.origin)
        else:
            out.append(span)
    return out
