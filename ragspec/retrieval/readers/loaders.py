"""Turn one file's bytes into text, with the work and memory it may cost bounded.

Contract: `load_bytes(data, name, limits)` parses exactly `data` (the bytes the caller read and
hashed: a file is read once) as the type `name`'s suffix says, and returns LangChain `Document`s
whose `page_content` is the text passages are cut from and whose metadata holds `source` (`name`
as a string) and `page` (1-based: the PDF page, slide, sheet or chapter; see below). Passage offsets
are character offsets into exactly this text, so it is the reference for provenance.
`load_file(path)` is the same for a file on disk. Anything that stops a file from yielding usable
text raises `LoadError` with a sentence a user can act on; the limits in `IngestLimits` (pages,
characters, inflated sizes) are LoadErrors too.

Per type:
- .pdf: PDFium's text layer (pdf_text.py), one Document per page; pages without text are
  dropped but keep their numbers; a page without text but with pictures is read by OCR when it
  is on (images.py, ocr.py: its Document has `ocr` True and `ocr_words`, the word boxes); a PDF
  without any text is an error. The page count is checked before any page is read. Each page
  read from the text layer also holds `layout` in its metadata: its `PdfPage`, whose boxes give
  every character of `page_content` its place on the page.
- .png, .jpg, .jpeg, .tif, .tiff: OCR, one Document per frame (images.py).
- .txt, .md, .markdown: UTF-8, or the encoding a byte-order mark or charset-normalizer finds
  (see encoding.py; a BOM is dropped; line ends become "\\n"); a file not in UTF-8 has the
  encoding's name in the metadata as `encoding`. Markdown stays as written: its markup is part
  of what users quote.
- .html, .htm: the visible text, in one linear pass (see html_text.py).
- .docx: headers, body and footers, streamed from the archive (see docx_text.py).
- .pptx: one Document per slide, `page` the slide number; text, tables, speaker notes (slides.py).
- .xlsx, .csv: one Document per group of rows, each naming its sheet and rows and repeating the
  header row; `page` is the sheet's number in the workbook, None for .csv (sheets.py).
- .epub: one Document per chapter of the reading order, `page` the chapter number (ebooks.py).
- .odt: one Document; .odp: one per slide, `page` the slide number (opendoc.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from langchain_core.documents import Document

from ragspec.retrieval.errors import LoadError
from ragspec.retrieval.readers.docx_text import docx_text
from ragspec.retrieval.readers.ebooks import epub_pages
from ragspec.retrieval.readers.encoding import decode_text
from ragspec.retrieval.readers.html_text import html_text
from ragspec.retrieval.readers.images import IMAGE_SUFFIXES, image_pages, pdf_scanned_pages
from ragspec.retrieval.readers.limits import IngestLimits, too_many_chars
from ragspec.retrieval.readers.ocr import OcrSettings, missing
from ragspec.retrieval.readers.opendoc import odf_pages
from ragspec.retrieval.readers.pdf_text import PdfPage, read_pdf
from ragspec.retrieval.readers.sheets import csv_pages, xlsx_pages
from ragspec.retrieval.readers.slides import pptx_pages

SUPPORTED_SUFFIXES: tuple[str, ...] = (
    ".pdf", ".txt", ".md", ".markdown", ".html", ".htm", ".docx",
    ".pptx", ".xlsx", ".csv", ".epub", ".odt", ".odp", *IMAGE_SUFFIXES,
)

# Formats whose loader returns (page, text) pairs itself.
_CONTAINERS = {
    ".pptx": pptx_pages, ".xlsx": xlsx_pages, ".csv": csv_pages, ".epub": epub_pages,
    ".odt": lambda data, limits: odf_pages(data, limits, slides=False),
    ".odp": lambda data, limits: odf_pages(data, limits, slides=True),
}

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
        pages, layouts = _load_pdf(data, limits)
    elif suffix in (".html", ".htm"):
        pages = [(None, _checked_text(html_text(data, limits)))]
    elif suffix == ".docx":
        pages = [(None, docx_text(data, limits))]
    elif suffix in _CONTAINERS:
        pages = _CONTAINERS[suffix](data, limits)
    elif suffix in IMAGE_SUFFIXES:
        pages = image_pages(data, OcrSettings.from_env())
    else:
        text, encoding = _load_text(data, limits)
        pages = [(None, text)]
    extra = {} if encoding is None else {"encoding": encoding}
    docs = [Document(page_content=text,
                     metadata={"source": str(name), "page": page, **extra, **dict(*more)})
            for page, text, *more in pages if text.strip()]
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


def _load_pdf(data: bytes, limits: IngestLimits) -> tuple[list, dict[int, PdfPage]]:
    """(pages as (number, text[, metadata]), the text layer's PdfPage of each page that has text).

    One parse: the pictured pages are rendered for OCR from the document PDFium opened to read
    the text layer."""
    settings = OcrSettings.from_env()
    recognised: dict[int, tuple] = {}

    def ocr_pages(document, numbers: list[int]) -> None:
        if settings.enabled and not missing(settings):
            recognised.update((page[0], page)
                              for page in pdf_scanned_pages(document, numbers, settings))

    layers = read_pdf(data, limits, ocr_pages)
    layouts = {page.number: page for page in layers if page.text.strip()}
    pages = [recognised.get(page.number, (page.number, page.text)) for page in layers]
    if not any(text.strip() for _, text, *_ in pages):
        if not any(page.pictured for page in layers):
            why = "its pages draw no pictures either (blank pages?)"
        elif not settings.enabled:
            why = "OCR is turned off (RAGSPEC_OCR=0 or --no-ocr)"
        else:
            why = missing(settings) or "OCR found no words on them"
        raise LoadError(f"no extractable text in {len(pages)} page(s): the PDF has no text "
                        f"layer (scanned images?); {why}")
    return pages, layouts

