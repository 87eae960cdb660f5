"""OpenDocument text (.odt) and presentations (.odp), streamed from content.xml.

Contract: `odf_pages(data, limits, slides)` returns `(page, text)` pairs: for a text document
(`slides=False`) one pair with page None, for a presentation one per slide (draw:page), 1-based,
slides without text left out but keeping their numbers. The text is every paragraph and heading
(text:p, text:h, also inside tables, frames, lists and speaker notes) separated by a blank line,
with the spaces, tabs and line breaks the document encodes (text:s, text:tab, text:line-break).

Why not odfpy: it builds a tree of the whole content.xml, tens of times its size in memory.
Here content.xml is parsed as a stream (xml_parts.py: declared sizes and ratio checked before
inflating, reads capped, a DOCTYPE refused), keeping no tree: memory is the text, which stops
at `limits.max_chars`.
"""

from __future__ import annotations

import re

from ragspec.retrieval.errors import LoadError
from ragspec.retrieval.readers.archive import open_archive
from ragspec.retrieval.readers.limits import IngestLimits, TextBuffer
from ragspec.retrieval.readers.xml_parts import parse_part

_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0 "  # expat: "uri local"
_DRAW = "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0 "
_PARAGRAPHS = (_TEXT + "p", _TEXT + "h")
_SPACE, _TAB, _BREAK = _TEXT + "s", _TEXT + "tab", _TEXT + "line-break"
_SLIDE = _DRAW + "page"
_CONTENT = "content.xml"
_BLANK_RUNS = re.compile(r"\n\s*\n\s*\n+")


def odf_pages(data: bytes, limits: IngestLimits, slides: bool) -> list[tuple[int | None, str]]:
    what = "OpenDocument presentation (.odp)" if slides else "OpenDocument text (.odt)"
    archive = open_archive(data, limits, what=what)
    with archive:
        if _CONTENT not in archive.namelist():
            raise LoadError(f"not a valid {what}: it has no content.xml; re-save it")
        pages = _parse(archive, limits, slides, what)
    return [(page, _BLANK_RUNS.sub("\n\n", text).strip()) for page, text in pages]


def _parse(archive, limits: IngestLimits, slides: bool, what: str) -> list[tuple[int | None, str]]:
    buffer = TextBuffer(limits.max_chars)
    pages: list[tuple[int | None, str]] = []
    depth = 0  # inside how many paragraphs (a note's paragraphs sit inside a paragraph)
    current: list[str] = []

    def add(text: str) -> None:
        buffer.add(text)
        current.append(text)

    def start(tag: str, attrs: dict) -> None:
        nonlocal depth
        if tag in _PARAGRAPHS:
            depth += 1
            add("\n\n")
        elif tag == _SLIDE and slides:
            current.clear()
        elif depth and tag == _SPACE:
            count = attrs.get(_TEXT + "c", "1")
            add(" " * min(int(count) if count.isdigit() else 1, 1000))
        elif depth and tag == _TAB:
            add("\t")
        elif depth and tag == _BREAK:
            add("\n")

    def end(tag: str) -> None:
        nonlocal depth
        if tag in _PARAGRAPHS:
            depth -= 1
        elif tag == _SLIDE and slides:
            pages.append((len(pages) + 1, "".join(current)))
            current.clear()

    def characters(text: str) -> None:
        if depth:
            add(text)

    handlers = {"start": start, "end": end, "characters": characters}
    parse_part(archive, _CONTENT, limits, handlers, what)
    if not slides:
        pages.append((None, "".join(current)))
    return pages
