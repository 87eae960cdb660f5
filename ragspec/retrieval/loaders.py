"""Turn one file's bytes into text, with the work and memory it may cost bounded.

Contract: `load_bytes(data, name, limits)` parses exactly `data` (the bytes the caller read and
hashed: a file is read once) as the type `name`'s suffix says, and returns LangChain `Document`s
whose `page_content` is the text passages are cut from and whose metadata holds `source` (`name`
as a string) and `page` (1-based page number for PDFs, None for every other type). Passage offsets
are character offsets into exactly this text, so it is the reference for provenance.
`load_file(path)` is the same for a file on disk. Anything that stops a file from yielding usable
text raises `LoadError` with a sentence a user can act on; the limits in `IngestLimits` (pages,
characters, inflated sizes) are LoadErrors too.

Per type:
- .pdf: PDFium's text layer (pdf_text.py), one Document per page; pages without text are
  dropped but keep their numbers; a PDF without any text layer is an error (it needs OCR first).
  The page count is checked before any page is read. Each page's metadata also holds `layout`:
  its `PdfPage`, whose boxes give every character of `page_content` its place on the page.
- .txt, .md, .markdown: UTF-8, or the encoding a byte-order mark or charset-normalizer finds
  (see encoding.py; a BOM is dropped; line ends become "\\n"); a file not in UTF-8 has the
  encoding's name in the metadata as `encoding`. Markdown stays as written: its markup is part
  of what users quote.
- .html, .htm: the visible text, in one linear pass (see html_text.py).
- .docx: headers, body and footers, streamed from the archive (see docx_text.py).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from langchain_core.documents import Document

from ragspec.retrieval.docx_text import docx_text
from ragspec.retrieval.encoding import decode_text
from ragspec.retrieval.errors import LoadError
from ragspec.retrieval.html_text import html_text
from ragspec.retrieval.limits import IngestLimits, too_many_chars
from ragspec.retrieval.pdf_text import PdfPage, read_pdf

SUPPORTED_SUFFIXES: tuple[str, ...] = (
    ".pdf", ".txt", ".md", ".markdown", ".html", ".htm", ".docx",
)

# Share of control characters (other than tab/newline/CR/form feed) above which decoded "text"
# is really binary data that happened to be valid UTF-8 (runs of NUL bytes are).
_MAX_CONTROL_SHARE = 0.01
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")


def supported(path: Path) -> bool:
    return path.suffix.lower() in SUPPORTED_SUFFIXES


def unsupported_message(path: Path) -> str:
    kind = f"'{path.suffix}'" if path.suffix else "(no extension)"
    return f"unsupported type {kind}; supported are {', '.join(SUPPORTED_SUFFIXES)}"


def load_file(path: str | Path, limits: IngestLimits | None = None) -> list[Document]:
    """Read `path` and load it (see the module docstring); raises LoadError."""
    path = Path(path)
    if not supported(path):
        raise LoadError(unsupported_message(path))
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LoadError(f"cannot read the file ({exc.strerror or exc})") from exc
    return load_bytes(data, path, limits)


def load_bytes(
    data: bytes, name: str | Path, limits: IngestLimits | None = None
) -> list[Document]:
    """Load `data` as the type of `name` (see the module docstring); raises LoadError."""
    name = Path(name)
    limits = limits or IngestLimits()
    suffix = name.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise LoadError(unsupported_message(name))
    encoding = None
    layouts: dict[int, PdfPage] = {}
    if suffix == ".pdf":
        layouts = {page.number: page for page in _load_pdf(data, limits)}
        pages = [(number, page.text) for number, page in layouts.items()]
    elif suffix in (".html", ".htm"):
        pages = [(None, _checked_text(html_text(data, limits)))]
    elif suffix == ".docx":
        pages = [(None, docx_text(data, limits))]
    else:
        text, encoding = _load_text(data, limits)
        pages = [(None, text)]
    extra = {} if encoding is None else {"encoding": encoding}
    docs = [Document(page_content=text, metadata={"source": str(name), "page": page, **extra})
            for page, text in pages if text.strip()]
    for doc in docs:
        if doc.metadata["page"] in layouts:
            doc.metadata["layout"] = layouts[doc.metadata["page"]]
    if not docs:
        raise LoadError("no extractable text: the file contains no words")
    return docs


def _load_text(data: bytes, limits: IngestLimits) -> tuple[str, str | None]:
    """(text, encoding name or None for UTF-8)."""
    if len(data) > 4 * limits.max_chars:  # no encoding spends more than 4 bytes a character
        raise too_many_chars(limits.max_chars)
    text, encoding = decode_text(data)
    if len(text) > limits.max_chars:
        raise too_many_chars(limits.max_chars)
    # Universal newlines, as reading the file in text mode would give.
    return _checked_text(text.replace("\r\n", "\n").replace("\r", "\n")), encoding


def _checked_text(text: str) -> str:
    if text and len(_CONTROL.findall(text)) > _MAX_CONTROL_SHARE * len(text):
        raise LoadError("looks like binary data, not text (many control characters)")
    return text


def _load_pdf(data: bytes, limits: IngestLimits) -> list[PdfPage]:
    pages = read_pdf(data, limits)
    if not any(page.text.strip() for page in pages):
        raise LoadError(
            f"no extractable text in {len(pages)} page(s): the PDF has no text layer "
            "(scanned images?); run OCR on it (e.g. `ocrmypdf in.pdf out.pdf`) and ingest the result"
        )
    return pages


@contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Silence a library's warnings ("EOF marker not found", ...) while it parses one file:
    we report a failure ourselves, in one sentence, and they would clutter `ragspec ingest`."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
