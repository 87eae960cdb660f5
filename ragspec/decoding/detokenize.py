"""Incremental detokenisation: final text deltas for a growing list of output token ids.

Contract: `text == "".join(every delta returned by push() and finish())`, always; a delta, once
returned, is never revised. After finish(), for tokenizers whose decode is a plain concatenation
(byte-level BPE, byte fallback), `text == tokenizer.decode(ids, skip_special_tokens=True)`. A
decoder that rewrites earlier text when more follows (clean-up rules turning "a ." into "a.")
cannot take back what was streamed: the new text is emitted from where the rewrite starts, so
no token's text is ever lost, and only such cosmetic rewrites can differ from a whole decode.

Two things make token-by-token decoding wrong: a multi-byte character split across tokens (its
first bytes decode to U+FFFD), and decoders whose output for a token depends on its neighbours
(SentencePiece drops the leading space of the first token; clean-up rules join punctuation). So
each push decodes a small window — the tokens of the previous delta as context, then the new ones —
and emits what the new tokens add to the context's text, holding everything back while the window
ends in an incomplete character. Each call decodes a few tokens, whatever the output's length.
"""

from __future__ import annotations

from collections.abc import Sequence

_INCOMPLETE = "\ufffd"


class IncrementalDecoder:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""  # everything emitted so far
        self._context = 0  # ids[_context:_emitted] decode to the context of the next window
        self._emitted = 0  # ids before this index have had their text emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, ids: list[int]) -> str:
        """Add token ids; return the newly completed text (possibly empty)."""
        self.ids.extend(ids)
        return self._advance(final=False)

    def finish(self) -> str:
        """The text still held back (an incomplete character at the very end), as it decodes."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._emitted == len(self.ids):
            return ""
        context = self._decode(self.ids[self._context : self._emitted])
        window = self._decode(self.ids[self._context :])
        if window.endswith(_INCOMPLETE) and not final:
            return ""  # a character is still incomplete: wait for more tokens
        return self._emit(window[common_prefix(context, window) :])

    def _emit(self, delta: str) -> str:
        if not delta:
            return ""  # nothing new yet (e.g. a special token): keep the window
        self._context, self._emitted = self._emitted, len(self.ids)
        self.text += delta
        return delta


def common_prefix(a: Sequence, b: Sequence) -> int:
    """How many leading items two sequences share (characters, token ids)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
