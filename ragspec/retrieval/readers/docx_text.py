"""The text of a Word (.docx) file, from its bytes, in bounded memory and time.

Contract: `docx_text(data, limits)` returns the text a reader sees in the headers, the body and
the footers (in that order, as docx2txt orders them): paragraphs separated by a blank line, tabs
and line breaks kept. The XML parts are read through `ragspec.retrieval.readers.archive` (sizes and ratios
checked before inflating, reads capped) and parsed as a stream by expat, keeping no tree: memory
is the text itself, which stops at `limits.max_chars`. A part that is not well-formed XML, or that
declares a DOCTYPE (Word never writes one; it is how XML entity bombs start), is a LoadError.
"""

from __future__ import annotations

import re

from ragspec.retrieval.errors import LoadError
from ragspec.retrieval.readers.archive import open_archive
from ragspec.retrieval.readers.limits import IngestLimits, TextBuffer
from ragspec.retrieval.readers.xml_parts import parse_part

_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main "  # expat: "uri local"
_TEXT, _PARAGRAPH, _TAB = _W + "t", _W + "p", _W + "tab"
_BREAKS = (_W + "br", _W + "cr")
_BODY = "word/document.xml"
_HEADER = re.compile(r"word/header\d*\.xml")
_FOOTER = re.compile(r"word/footer\d*\.xml")


def docx_text(data: bytes, limits: IngestLimits) -> str:
    archive = open_archive(data, limits, what=".docx file (Word 2007 or later)")
    with archive:
        names = archive.namelist()
        if _BODY not in names:
            raise LoadError(
                "not a valid .docx file (Word 2007 or later): it has no word/document.xml; "
                "re-save it as .docx"
            )
        parts = (sorted(n for n in names if _HEADER.fullmatch(n)) + [_BODY]
                 + sorted(n for n in names if _FOOTER.fullmatch(n)))
        buffer = TextBuffer(limits.max_chars)
        for name in parts:
            _extract(archive, name, buffer, limits)
    # Empty paragraphs leave runs of blank lines: at most one between paragraphs.
    return re.sub(r"\n\s*\n\s*\n+", "\n\n", buffer.text()).strip()


def _extract(archive, name: str, buffer: TextBuffer, limits: IngestLimits) -> None:
    inside_text = False

    def start(tag: str, attrs: dict) -> None:
        nonlocal inside_text
        if tag == _TEXT:
            inside_text = True
        elif tag == _PARAGRAPH:
            buffer.add("\n\n")
        elif tag == _TAB:
            buffer.add("\t")
        elif tag in _BREAKS:
            buffer.add("\n")

    def end(tag: str) -> None:
        nonlocal inside_text
        if tag == _TEXT:
            inside_text = False

    def characters(text: str) -> None:
        if inside_text:
            buffer.add(text)

    handlers = {"start": start, "end": end, "characters": characters}
    parse_part(archive, name, limits, handlers, what="Word file")
