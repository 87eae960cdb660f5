"""Word pieces of an embedding model, counted and located, without loading the model.

Contract: `WordPieces` wraps a Hugging Face `tokenizers.Tokenizer` (the Rust one that ships as
tokenizer.json beside every sentence-transformers model):
  * `count_tokens(text)` is the number of word pieces the model sees for `text`, without the
    special tokens it adds ([CLS], [SEP]: `special_tokens` of them);
  * `token_spans(text)` gives each word piece's (start, end) character offsets in `text`, in
    order, so `text[start:end]` is the stretch that piece came from (a word too long for the
    vocabulary is one [UNK] piece spanning the whole word);
  * `max_tokens` is the model's input limit, special tokens included.
Padding and truncation configured in the file are switched off on a private copy: a count must
be the true length, not the length the model was trained at.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


class WordPieces:
    """See the module docstring."""

    def __init__(self, tokenizer: Tokenizer, max_tokens: int) -> None:
        if max_tokens < 8:
            raise ValueError(f"max_tokens={max_tokens} is too small for any passage; use >= 8")
        # A private copy: the caller's tokenizer may be shared with a model that pads/truncates.
        self._tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.max_tokens = max_tokens
        self.special_tokens = len(self._tokenizer.encode("", add_special_tokens=True).ids)

    @classmethod
    def from_file(cls, path: str | Path, max_tokens: int) -> WordPieces:
        """From a tokenizer.json file."""
        return cls(Tokenizer.from_file(str(path)), max_tokens)

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return self._tokenizer.encode(text, add_special_tokens=False).offsets
