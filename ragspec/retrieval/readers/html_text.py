"""The text a browser shows for an HTML page, from its bytes, in one linear pass.

Contract: `html_text(data, limits)` decodes the page (byte-order mark, else the charset the page
declares, else UTF-8, else Windows-1252 as browsers do), drops what browsers never show (script,
style, noscript, template), collapses whitespace as a browser does (runs of it, also across
elements, become one space; except in <pre>), turns block elements into paragraphs and <br> into line breaks, strips each line and
keeps at most one blank line between blocks. Malformed markup is read the way browsers read it
(a `<![...` section that is not CDATA is a bogus comment), never rejected.

The stdlib's event parser is driven with two counters (inside how many invisible elements, how
many <pre>) instead of a tree: no element ever looks at its ancestors, so time is linear in the
size of the page however deep it nests, and memory is the text, which stops at
`limits.max_chars`.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from ragspec.retrieval.readers.limits import IngestLimits, TextBuffer

# Elements whose text is never content a reader sees.
_INVISIBLE = frozenset({"script", "style", "noscript", "template"})
# Elements a browser renders as separate blocks: they become paragraphs of the text.
_BLOCK = frozenset({
    "p", "div", "section", "article", "header", "footer", "nav", "aside", "main", "h1", "h2",
    "h3", "h4", "h5", "h6", "li", "ul", "ol", "dl", "dt", "dd", "pre", "blockquote", "table",
    "tr", "figure", "figcaption", "title", "hr", "form", "fieldset", "address", "details",
    "summary",
})
_WHITESPACE = re.compile(r"\s+")


def html_text(data: bytes, limits: IngestLimits) -> str:
    parser = _VisibleText(TextBuffer(limits.max_chars))
    parser.feed(_decode(data))
    parser.close()
    return _tidy_lines(parser.buffer.text())


def _decode(data: bytes) -> str:
    from bs4.dammit import EncodingDetector

    data, bom_encoding = EncodingDetector.strip_byte_order_mark(data)
    declared = bom_encoding or EncodingDetector.find_declared_encoding(data, is_html=True)
    for encoding in (declared, "utf-8"):
        if encoding:
            try:
                return data.decode(encoding)
            except (LookupError, UnicodeDecodeError):
                continue  # an unknown or wrong declaration: try the next guess
    return data.decode("windows-1252", errors="replace")


class _VisibleText(HTMLParser):
    def __init__(self, buffer: TextBuffer) -> None:
        super().__init__(convert_charrefs=True)
        self.buffer = buffer
        self._hidden = 0  # open invisible elements
        self._pre = 0  # open <pre> elements
        self._after_space = True  # the text so far ends in whitespace (or a block edge)

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in _INVISIBLE:
            self._hidden += 1
        elif tag == "br":
            self._add("\n")
        elif tag in _BLOCK:
            self._pre += tag == "pre"
            self._add("\n\n")

    def handle_endtag(self, tag: str) -> None:
        # Stray end tags are common in real pages: counters never go below zero.
        if tag in _INVISIBLE:
            self._hidden = max(0, self._hidden - 1)
        elif tag in _BLOCK:
            self._pre = max(0, self._pre - (tag == "pre"))
            self._add("\n\n")

    def handle_data(self, data: str) -> None:
        if not self._pre:
            # One space between words, even across elements ("a <b> b</b>" reads "a b").
            data = _WHITESPACE.sub(" ", data)
            if self._after_space and data.startswith(" "):
                data = data[1:]
        self._add(data)

    def _add(self, text: str) -> None:
        if text and not self._hidden:
            self.buffer.add(text)
            self._after_space = text[-1].isspace()

    def parse_marked_section(self, i: int, report: int = 1) -> int:
        # The base class only knows SGML keywords and raises on any other (`<![foo[`); in HTML
        # every such section is a bogus comment that ends at the next ">".
        end = self.rawdata.find(">", i + 3)
        return -1 if end < 0 else end + 1


def _tidy_lines(text: str) -> str:
    """Strip each line and keep at most one blank line between blocks."""
    out: list[str] = []
    for line in (line.strip() for line in text.splitlines()):
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()
