"""PDF text with the box of every character, from PDFium's own text layer (pypdfium2).

Contract: `read_pdf(data, limits, pictured=None)` returns one `PdfPage` per page (numbers from
1), such that for every page `p`:
  * `p.text` is the page's text as PDFium reads it, with line ends as "\\n" (PDFium's "\\r\\n"),
    PDFium's end-of-line hyphen marker as "-", ligature glyphs (U+FB00..U+FB06: "ﬁ", "ﬂ", ...)
    spelled out in their letters, and NULs and other control characters PDFium emits for
    glyphs it cannot map dropped;
  * `p.boxes[i]` is the box of `p.text[i]` as [x0, y0, x1, y1] in PDF user space (points, origin
    at the page's bottom left, before the page's /Rotate), or NaNs where the character has no
    glyph of its own on the page: whitespace, line ends PDFium generated, characters it made up.
    The letters of a ligature share the ligature glyph's box. So for any range [a, b) of
    `p.text`, the finite boxes of `p.boxes[a:b]` are exactly the glyphs of those characters:
    never a box on other words;
  * `p.size` is the page's (width, height) in points, unrotated, and `p.rotation` its /Rotate
    (0, 90, 180, 270);
  * `p.section` is the PDF's outline (bookmarks) at that page, "Chapter › Section", as of the
    last bookmark that points at or before the page; None without an outline;
  * `p.pictured` is True when the page has no text but draws a picture (an image or a form
    object, which may hold one, among PDFium's page objects): a page OCR can read. A blank
    page is not pictured.
When `pictured` is given and some pages are pictured, it is called once, after every page was
read and while the document is still open, as `pictured(document, numbers)`: the open
pypdfium2 document and the 1-based numbers of the pictured pages, so they can be rendered
without parsing the file again. What it returns is the caller's; what it raises propagates.
The page count is checked against `limits.max_pdf_pages` before any page is read, and the text
against `limits.max_chars` as it grows. An encrypted PDF (a password is needed to open it) and
a damaged one raise LoadError with a sentence a user can act on; a PDF whose pages hold no text
is the caller's to judge (loaders.py).
"""

from __future__ import annotations

import ctypes
import math
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ragspec.retrieval.errors import LoadError
from ragspec.retrieval.readers.limits import ENV_FOR, IngestLimits, TextBuffer

_NAN4 = (math.nan, math.nan, math.nan, math.nan)
# PDFium marks a hyphen it found at a line end (a word broken across lines) with U+0002.
_PDFIUM_HYPHEN = 0x02


@dataclass(frozen=True)
class PdfPage:
    """One page: text, a (len(text), 4) float32 array of character boxes, size, rotation."""

    number: int
    text: str
    boxes: np.ndarray
    size: tuple[float, float]
    rotation: int = 0
    section: str | None = None
    pictured: bool = False

    def __post_init__(self) -> None:
        if self.number < 1:
            raise ValueError(f"page numbers count from 1, got {self.number}")
        if self.boxes.shape != (len(self.text), 4):
            raise ValueError(f"page {self.number}: {self.boxes.shape[0]} boxes for "
                             f"{len(self.text)} characters; there must be one per character")
        if self.rotation not in (0, 90, 180, 270):
            raise ValueError(f"page {self.number}: rotation {self.rotation} is not a quarter turn")


def read_pdf(data: bytes, limits: IngestLimits,
             pictured: Callable[[object, list[int]], object] | None = None) -> list[PdfPage]:
    """Every page's text and boxes (see the module docstring); raises LoadError."""
    import pypdfium2 as pdfium

    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        if "password" in str(exc).lower():
            raise LoadError(
                "the PDF is encrypted (password protected); save an unprotected copy "
                "(e.g. `qpdf --decrypt in.pdf out.pdf`) and ingest that"
            ) from exc
        raise LoadError(f"not a readable PDF (damaged or truncated?): {exc}") from exc
    try:
        count = len(pdf)
        if count > limits.max_pdf_pages:
            raise LoadError(
                f"the PDF has {count:,} pages, over the limit of {limits.max_pdf_pages:,}; "
                f"split it, or raise the limit with {ENV_FOR['max_pdf_pages']}"
            )
        buffer = TextBuffer(limits.max_chars)
        sections = _sections(pdf, count)
        pages = []
        for index in range(count):
            page = _read_page(pdf, index, sections[index])
            buffer.add(page.text)  # counts the characters; the pages themselves are kept
            pages.append(page)
        numbers = [page.number for page in pages if page.pictured]
        if pictured is not None and numbers:
            pictured(pdf, numbers)
        return pages
    except pdfium.PdfiumError as exc:
        raise LoadError(f"not a readable PDF (damaged?): {exc}") from exc
    finally:
        pdf.close()


def _sections(pdf, count: int) -> list[str | None]:
    """The outline's chain of titles in effect on each page (None before the first bookmark)."""
    marks: list[tuple[int, str]] = []
    chain: list[str] = []
    try:
        for item in pdf.get_toc(max_depth=4):
            title = " ".join((item.get_title() or "").split())
            dest = item.get_dest()
            index = dest.get_index() if dest is not None else None
            del chain[item.level:]
            chain.append(title)
            if index is not None and 0 <= index < count and title:
                marks.append((index, " \u203a ".join(t for t in chain if t)))
    except Exception:  # noqa: BLE001  # a damaged outline only costs the section names
        return [None] * count
    out: list[str | None] = [None] * count
    for index, name in sorted(marks, key=lambda m: m[0]):  # stable: reading order within a page
        for page in range(index, count):
            out[page] = name
    return out


def _read_page(pdf, index: int, section: str | None = None) -> PdfPage:
    import pypdfium2.raw as raw

    page = pdf[index]
    try:
        width, height = page.get_size()
        rotation = page.get_rotation()
        if rotation in (90, 270):  # get_size() is the rotated size; boxes are unrotated
            width, height = height, width
        textpage = page.get_textpage()
        try:
            text, boxes = _characters(raw, textpage.raw)
        finally:
            textpage.close()
        pictured = not text.strip() and _draws_picture(raw, page.raw)
    finally:
        page.close()
    array = np.array(boxes, dtype=np.float32).reshape(len(text), 4)
    return PdfPage(index + 1, text, array, (float(width), float(height)), rotation, section,
                   pictured)


def _draws_picture(raw, page) -> bool:
    """Whether a page's top-level objects include an image or a form (which may hold one)."""
    kinds = (raw.FPDF_PAGEOBJ_IMAGE, raw.FPDF_PAGEOBJ_FORM)
    return any(raw.FPDFPageObj_GetType(raw.FPDFPage_GetObject(page, i)) in kinds
               for i in range(raw.FPDFPage_CountObjects(page)))


def _characters(raw, textpage) -> tuple[str, list[tuple[float, float, float, float]]]:
    """One pass over PDFium's characters: the text and one box (or NaNs) per character."""
    out: list[str] = []
    boxes: list[tuple[float, float, float, float]] = []
    left, right = ctypes.c_double(), ctypes.c_double()
    bottom, top = ctypes.c_double(), ctypes.c_double()
    count = raw.FPDFText_CountChars(textpage)
    for i in range(count):
        code = raw.FPDFText_GetUnicode(textpage, i)
        if code == 0x0D:
            # PDFium ends lines with "\r\n" (both generated): keep one "\n".
            if i + 1 < count and raw.FPDFText_GetUnicode(textpage, i + 1) == 0x0A:
                continue
            code = 0x0A
        if code == _PDFIUM_HYPHEN:
            code = ord("-")
        if code in (0x09, 0x0A):
            chars = chr(code)
        elif code < 0x20 or code == 0x7F or 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
            continue  # a glyph PDFium could not map to text: nothing a reader would copy
        elif 0xFB00 <= code <= 0xFB06:
            chars = unicodedata.normalize("NFKC", chr(code))
        else:
            chars = chr(code)
        box = _NAN4
        if (not chars.isspace() and not raw.FPDFText_IsGenerated(textpage, i)
                and raw.FPDFText_GetCharBox(textpage, i, left, right, bottom, top)
                and right.value > left.value and top.value > bottom.value):
            box = (left.value, bottom.value, right.value, top.value)
        out.append(chars)
        boxes.extend([box] * len(chars))
    return "".join(out), boxes
