"""A fast, deterministic stand-in for `Embedder`, for tests (ours and the pipeline's).

`HashEmbedder` has the same interface as `retrieval.embeddings.Embedder` (name, dim,
max_tokens, special_tokens, count_tokens, embed_array, embed_documents, embed_query) but needs no
torch: token counts come from the bundled all-MiniLM-L6-v2 tokenizer (the real word pieces, so
passage lengths are checked against the real limit), and vectors are normalised bags of hashed
lower-cased words, so texts that share words score higher. Same text, same vector, in every
process (hashlib, not Python's salted hash()).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
from langchain_core.embeddings import Embeddings

from retrieval.embeddings import bundled_model_dir

_WORD = re.compile(r"\w+")


class HashEmbedder(Embeddings):
    def __init__(self, dim: int = 64, max_tokens: int = 256, name: str = "test:hash") -> None:
        if dim < 2:
            raise ValueError(f"dim must be >= 2, got {dim}")
        from tokenizers import Tokenizer

        self.name = name
        self.dim = dim
        self.max_tokens = max_tokens
        self.special_tokens = 2
        self._tokenizer = Tokenizer.from_file(str(bundled_model_dir() / "tokenizer.json"))
        # The file configures padding and truncation to 128 for the model's training; counting
        # needs neither (transformers switches them off on its copy too).
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def embed_array(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.lower()):
                digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                out[row, value % self.dim] += 1.0 if (value >> 32) & 1 else -1.0
            norm = np.linalg.norm(out[row])
            if norm == 0:
                out[row, 0], norm = 1.0, 1.0  # wordless text: any fixed unit vector
            out[row] /= norm
        return out

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embed_array(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_array([text])[0].tolist()


# -- bad inputs, built on the fly (no binary fixtures in the repository) ---------------------


def blank_pdf_bytes(pages: int = 1) -> bytes:
    """A valid PDF whose pages have no text layer (like a scan without OCR)."""
    import io

    from pypdf import PdfWriter

    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(width=612, height=792)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def encrypted_pdf_bytes(source_pdf: str, user_password: str = "secret") -> bytes:
    """`source_pdf` re-saved with RC4 encryption (pypdf needs no extra package for RC4)."""
    import io

    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    writer.append(PdfReader(source_pdf))
    writer.encrypt(user_password=user_password, owner_password="owner", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()
