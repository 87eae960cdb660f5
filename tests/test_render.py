"""Span and passage rendering: document text is inert (no HTML, Markdown or Streamlit directives
survive), drafted spans are marked with their provenance, copied ranges are merged and marked."""

from __future__ import annotations

import html
import re

from ragspec import describe
from ragspec.decoding.types import Span, SpanOrigin
from ragspec.retrieval.store import Passage
from ragspec.web import page_html as rd

NASTY = "<script>alert(1)</script> **bold** _i_ # h :red[x] $x^2$ [l](http://e) `c` &amp;\n- item"


def visible_text(fragment: str) -> str:
    """What a browser shows: tags dropped, <br> as newline, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment.replace("<br>", "\n")))


def test_escape_text_leaves_no_markup_and_round_trips():
    escaped = rd.escape_text(NASTY)
    assert not re.search(r"[<>*_#\[\]$`:&](?![#0-9]+;)", escaped.replace("<br>", "")
                         .replace("&#", "\0")), escaped
    assert "\n" not in escaped
    assert visible_text(escaped) == NASTY


def passage(text="The metrics endpoint listens on port 7432."):
    return Passage(id="p", doc_id="d", text=text, source="/docs/ops.md", page=None, start=0)


def test_spans_html_marks_drafted_spans_with_provenance_and_keeps_text():
    p = passage()
    spans = [
        Span("It listens on ", [1], False),
        Span("port 7432", [2, 3], True, SpanOrigin(40, True, 0, 32, 41)),
        Span(" <b>.", [4], False),
    ]
    out = rd.spans_html(spans, [p])
    assert out.startswith("<div") and "\n" not in out
    marks = re.findall(r'<mark class="rs-draft"[^>]*title="([^"]*)">(.*?)</mark>', out)
    assert [visible_text(m[1]) for m in marks] == ["port 7432"]
    title = html.unescape(marks[0][0])
    assert "[1] ops.md" in title and "32-41" in title and "port 7432" in title
    assert visible_text(out) == "It listens on port 7432 <b>."


def test_copied_ranges_merge_overlaps_per_passage():
    spans = [
        Span("a", [1], True, SpanOrigin(1, True, 0, 0, 5)),
        Span("b", [1], True, SpanOrigin(1, True, 0, 3, 9)),
        Span("c", [1], True, SpanOrigin(1, True, 1, 2, 4)),
        Span("d", [1], True, SpanOrigin(1, False)),
        Span("e", [1], False),
    ]
    assert describe.copied_ranges(spans) == {0: [(0, 9)], 1: [(2, 4)]}


def test_passage_html_marks_copied_ranges_and_escapes():
    text = "a <i>b</i> c d"
    out = rd.passage_html(text, [(2, 10), (13, 14)])
    assert visible_text(out) == text
    marked = [visible_text(m) for m in re.findall(r"<mark[^>]*>(.*?)</mark>", out)]
    assert marked == ["<i>b</i>", "d"]


def test_identical_verdict():
    assert describe.identical_verdict([1, 2], [1, 2], True)[0] is True
    ok, message = describe.identical_verdict([1, 2, 3], [1, 5, 3], True)
    assert ok is False and "token 1" in message
    assert describe.identical_verdict([1], [2], False)[0] is None
