"""E-books (.epub): one page per chapter, in reading order, headings kept.

Contract: `epub_pages(data, limits)` returns `(chapter number, text)` for every document of the
book's spine (its reading order), 1-based; the text is what a reader sees in that chapter's
XHTML, headings as paragraphs of their own (html_text.py, one linear pass). Chapters without
text (a cover picture) and the navigation page (a table of contents) are left out but keep
their numbers.

Bounds: ebooklib reads every part of the book into memory, so each part's declared size is
checked before it opens the file (archive.check_parts: ratio, per-part and total limits;
zipfile never inflates past a declared size), and the text of all chapters together stops at
`limits.max_chars`. The book's package files (container, OPF, NCX) are refused if they declare
XML entities, which a book never needs and an entity bomb does.
"""

from __future__ import annotations

import io
import warnings

from ragspec.retrieval.errors import LoadError, type_name
from ragspec.retrieval.readers.archive import check_parts, open_archive, read_part
from ragspec.retrieval.readers.html_text import html_text
from ragspec.retrieval.readers.limits import IngestLimits, TextBuffer

_WHAT = "EPUB e-book"
_PACKAGE_SUFFIXES = (".opf", ".ncx", "container.xml")
# How much of a package file may be read to look for entity declarations (they sit in the
# DOCTYPE, before the root element).
_PROLOGUE_BYTES = 64 * 1024


def epub_pages(data: bytes, limits: IngestLimits) -> list[tuple[int, str]]:
    from ebooklib import ITEM_DOCUMENT, epub

    with open_archive(data, limits, what=_WHAT) as archive:
        check_parts(archive, limits)
        for name in archive.namelist():
            if name.endswith(_PACKAGE_SUFFIXES):
                _refuse_entities(archive, name, limits)
    try:
        with warnings.catch_warnings():  # ebooklib warns of options it will change one day
            warnings.simplefilter("ignore")
            book = epub.read_epub(io.BytesIO(data), {"ignore_ncx": True})
    except LoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - ebooklib raises many types on broken books
        raise LoadError(f"not a readable {_WHAT}: {type_name(exc)}: {exc}") from exc
    buffer = TextBuffer(limits.max_chars)
    pages = []
    for number, (item_id, _linear) in enumerate(book.spine, start=1):
        item = book.get_item_with_id(item_id)
        if item is None or item.get_type() != ITEM_DOCUMENT or isinstance(item, epub.EpubNav):
            continue  # the navigation page repeats the chapters' headings
        text = html_text(item.get_content(), limits)
        buffer.add(text)
        pages.append((number, text))
    if not pages:
        raise LoadError(f"the {_WHAT} has no chapters in its reading order (spine)")
    return pages


def _refuse_entities(archive, name: str, limits: IngestLimits) -> None:
    head = b""
    for block in read_part(archive, name, limits):
        head += block
        if len(head) >= _PROLOGUE_BYTES:
            break
    if b"<!ENTITY" in head:
        raise LoadError(f"{name} declares XML entities, which an e-book never needs; refused")
