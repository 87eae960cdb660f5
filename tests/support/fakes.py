"""A fast, deterministic stand-in for `Embedder`, for tests (ours and the pipeline's).

`HashEmbedder` has the same interface as `ragspec.retrieval.embeddings.embedder.Embedder` (name, dim,
max_tokens, special_tokens, count_tokens, token_spans, embed_array, embed_documents, embed_query)
but needs no torch: token counts come from the bundled all-MiniLM-L6-v2 tokenizer (the real word pieces, so
passage lengths are checked against the real limit), and vectors are normalised bags of hashed
lower-cased words, so texts that share words score higher. Same text, same vector, in every
process (hashlib, not Python's salted hash()).

`tiny_sentence_transformer` saves a tiny random real model instead, for tests of the embedder's
own forward (onnxruntime, precision): torch is imported only when it is called.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
from langchain_core.embeddings import Embeddings

from ragspec.retrieval.embeddings.embedder import bundled_model_dir
from ragspec.retrieval.embeddings.tokens import WordPieces

_WORD = re.compile(r"\w+")


class HashEmbedder(Embeddings):
    def __init__(self, dim: int = 64, max_tokens: int = 256, name: str = "test:hash") -> None:
        if dim < 2:
            raise ValueError(f"dim must be >= 2, got {dim}")
        self.name = name
        self.dim = dim
        self._pieces = WordPieces.from_file(bundled_model_dir() / "tokenizer.json", max_tokens)
        self.max_tokens = max_tokens
        self.special_tokens = self._pieces.special_tokens

    def count_tokens(self, text: str) -> int:
        return self._pieces.count_tokens(text)

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return self._pieces.token_spans(text)

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


# -- Word files and zip damage, built on the fly ---------------------------------------------

_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_CONTENT_TYPES = (
    '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/'
    'package/2006/content-types"><Override PartName="/word/document.xml" ContentType="application/'
    'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>'
)


def docx_bytes(paragraphs=("Hello.",), *, document_xml: str | bytes | None = None) -> bytes:
    """A minimal .docx: one paragraph per string, or `document_xml` verbatim (for damage)."""
    import io
    import zipfile
    from xml.sax.saxutils import escape

    if document_xml is None:
        body = "".join(f"<w:p><w:r><w:t>{escape(p)}</w:t></w:r></w:p>" for p in paragraphs)
        document_xml = f'<w:document xmlns:w="{_W}"><w:body>{body}</w:body></w:document>'
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", _CONTENT_TYPES)
        z.writestr("word/document.xml", document_xml)
    return out.getvalue()


def docx_bomb_bytes(inflated_bytes: int) -> bytes:
    """A .docx whose word/document.xml inflates to `inflated_bytes` (one run of the letter A:
    about 1000:1), written in pieces so building it never holds the inflated text."""
    import io
    import zipfile

    head = f'<w:document xmlns:w="{_W}"><w:body><w:p><w:r><w:t>'.encode()
    tail = b"</w:t></w:r></w:p></w:body></w:document>"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", _CONTENT_TYPES)
        with z.open("word/document.xml", "w", force_zip64=inflated_bytes > 2**31) as member:
            member.write(head)
            left = inflated_bytes - len(head) - len(tail)
            block = b"A" * 2**20
            while left > 0:
                member.write(block[: min(left, len(block))])
                left -= len(block)
            member.write(tail)
    return out.getvalue()


def damaged_zip(data: bytes, member: str, *, encrypt: bool = False, method: int | None = None,
                garble: bool = False) -> bytes:
    """`data` (a zip) with one member marked encrypted, given an unknown compression method,
    or with its compressed bytes overwritten by noise; both headers are patched alike."""
    import struct
    import zipfile

    raw = bytearray(data)
    with zipfile.ZipFile(io_bytes(data)) as z:
        info = z.getinfo(member)
    local = info.header_offset
    name_len, extra_len = struct.unpack_from("<HH", raw, local + 26)
    central = _central_entry(raw, member)
    for flags_at, method_at in ((local + 6, local + 8), (central + 8, central + 10)):
        if encrypt:
            struct.pack_into("<H", raw, flags_at, struct.unpack_from("<H", raw, flags_at)[0] | 1)
        if method is not None:
            struct.pack_into("<H", raw, method_at, method)
    if garble:
        start = local + 30 + name_len + extra_len
        noise = bytes((i * 151 + 89) % 256 for i in range(info.compress_size))
        raw[start : start + info.compress_size] = noise
    return bytes(raw)


def io_bytes(data: bytes):
    import io

    return io.BytesIO(data)


def _central_entry(raw: bytearray, member: str) -> int:
    import struct

    end = raw.rfind(b"PK\x05\x06")
    offset = struct.unpack_from("<I", raw, end + 16)[0]
    while raw[offset : offset + 4] == b"PK\x01\x02":
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", raw, offset + 28)
        if raw[offset + 46 : offset + 46 + name_len].decode() == member:
            return offset
        offset += 46 + name_len + extra_len + comment_len
    raise KeyError(member)


# -- another process holding the index's write lock ------------------------------------------

_HOLD_LOCK = """
import sys
from filelock import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
print("locked", flush=True)
sys.stdin.readline()  # hold until told
lock.release()
"""


def hold_lock(index_dir):
    """A process holding the write lock of the index in `index_dir` until `release(it)` (or
    until it is killed). Returns once the lock is held."""
    import subprocess
    import sys
    from pathlib import Path

    from ragspec.retrieval.faiss.persist import LOCK_NAME

    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(Path(index_dir) / LOCK_NAME)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if holder.stdout.readline().strip() != "locked":
        raise RuntimeError("the lock holder did not start")
    return holder


def release(holder) -> None:
    """Let a `hold_lock` process release the lock and exit."""
    holder.stdin.write("go\n")
    holder.stdin.flush()


def tiny_sentence_transformer(root):
    """A randomly initialised 2-layer BERT (hidden size 32, the bundled tokenizer, mean pooling,
    normalised) saved as a sentence-transformers folder under `root`; returns that folder."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    BertModel(config).save_pretrained(root / "bert")
    AutoTokenizer.from_pretrained(str(bundled_model_dir())).save_pretrained(root / "bert")
    layers = [models.Transformer(str(root / "bert"), max_seq_length=64),
              models.Pooling(32, "mean"), models.Normalize()]
    SentenceTransformer(modules=layers, device="cpu").save(str(root / "st"))
    return root / "st"
