"""Incremental detokenisation: text deltas for a growing list of output token ids.

Decoding a byte-level BPE token by token can cut a multi-byte character in half (the decoder
then shows U+FFFD). We decode the whole output each time and hold back any tail that ends in an
incomplete character, so every emitted delta is final text. Outputs here are hundreds of tokens;
re-decoding them costs microseconds per step.
"""

from __future__ import annotations

_INCOMPLETE = "\ufffd"


class IncrementalDecoder:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""  # everything emitted so far

    def push(self, ids: list[int]) -> str:
        """Add token ids; return the newly completed text (possibly empty)."""
        self.ids.extend(ids)
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if full.endswith(_INCOMPLETE):
            return ""
        if full.startswith(self.text):
            delta = full[len(self.text) :]
        else:
            # A tokenizer whose decode of a longer sequence rewrites earlier text (rare clean-up
            # rules): emit only what extends past the old length; the full text stays right.
            delta = full[len(self.text) :] if len(full) > len(self.text) else ""
        self.text = full
        return delta
