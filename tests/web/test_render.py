"""Span and passage rendering: document text is inert (no HTML, Markdown or Streamlit directives
survive), drafted spans are marked with their provenance, copied ranges are merged and marked."""

from __future__ import annotations

import html
import re

import pytest

from ragspec import describe
from ragspec.decoding.types import Span, SpanOrigin
from ragspec.retrieval.faiss.store import Passage
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


def test_repeats_of_the_answer_or_question_are_underlined_not_highlighted_as_sources():
    p = passage()
    spans = [
        Span("Port 7432.", [1, 2], True, SpanOrigin(40, True, 0, 32, 41)),  # from passage [1]
        Span(" It listens.", [3], False),
        Span(" Port 7432.", [4, 5], True, SpanOrigin(60, False)),  # the answer's own text
        Span(" Which port?", [6], True, SpanOrigin(12, True)),  # the question: prompt text
    ]
    out = rd.spans_html(spans, [p])
    sources = re.findall(r'<mark class="rs-draft"[^>]*>(.*?)</mark>', out)
    echoes = re.findall(r'<mark class="rs-echo"[^>]*title="([^"]*)">(.*?)</mark>', out)
    assert [visible_text(m) for m in sources] == ["Port 7432."]
    assert [visible_text(m[1]) for m in echoes] == [" Port 7432.", " Which port?"]
    assert "own earlier text" in html.unescape(echoes[0][0])
    assert "question" in html.unescape(echoes[1][0])
    assert visible_text(out) == "Port 7432. It listens. Port 7432. Which port?"
    listed = rd.sources_html(spans, [p])
    assert len(re.findall(r"<li>", listed)) == 1 and "[1] ops.md" in html.unescape(listed)
    assert "2 accepted drafts" in listed and "not sources" in listed
    legend = visible_text(rd.legend_html())
    assert "copied from a passage" in legend and "not a source" in legend
    assert describe.copied_ranges(spans) == {0: [(32, 41)]}  # only the passage copy


def test_terminal_marks_passage_copies_and_repeats_differently():
    from rich.console import Console

    from ragspec.terminal import DRAFT_STYLES, render_spans

    spans = [Span("from [1]", [1], True, SpanOrigin(4, True, 0, 0, 8)),
             Span(" again", [2], True, SpanOrigin(90, False)), Span(" own", [3], False)]
    console = Console(record=True, force_terminal=True, color_system="standard", width=80)
    render_spans(spans, console)
    styled = [(seg.text, str(seg.style or "")) for seg in console._record_buffer if seg.text]
    assert styled == [("from [1]", DRAFT_STYLES["passage"]), (" again", DRAFT_STYLES["answer"]),
                      (" own", "")]
    assert DRAFT_STYLES["passage"] != DRAFT_STYLES["answer"]


def test_stop_notes_say_why_an_answer_ended():
    assert "repeating itself" in describe.stop_note("repetition")
    assert "length limit" in describe.stop_note("max_new_tokens")
    assert describe.stop_note("eos") is None


def test_a_draft_over_a_blank_line_leaves_the_line_breaks_unmarked():
    """Found in the newcomer's walk-through: a merged draft "REFERENCE\\n\\nThe daemon" drew a
    highlighted sliver on the empty line between, which reads as a whitespace source."""
    text = "Larkspur REFERENCE\n\nThe daemon reads\n"
    p = passage("LARKSPUR " + text)
    spans = [Span(text, [1, 2, 3], True, SpanOrigin(40, True, 0, 9, 9 + len(text))),
             Span("Which port?\n", [4], True, SpanOrigin(12, True))]
    from bs4 import BeautifulSoup

    out = rd.spans_html(spans, [p])
    marks = BeautifulSoup(out, "html.parser").find_all("mark")
    assert [m.get_text() for m in marks] == ["Larkspur REFERENCE", "The daemon reads",
                                             "Which port?"]
    assert visible_text(out) == text + "Which port?\n"
    # both lines are the one copy, with its one provenance
    assert len({m["title"] for m in marks if "rs-draft" in m["class"]}) == 1


def test_the_side_by_side_speedup_leaves_out_a_prompt_the_second_run_took_from_the_cache():
    """Speculation changes only the time after the first token: where the second run's prompt
    came from the prompt cache (the toggle reads the same prompt twice), the whole answers'
    seconds would credit the cache to speculation."""
    from ragspec.decoding.types import GenerationStats
    from ragspec.web.parts import speed_line

    off = GenerationStats(prompt_tokens=600, new_tokens=40, prefill_seconds=0.6,
                          decode_seconds=0.8)
    read = GenerationStats(prompt_tokens=600, new_tokens=40, prefill_seconds=0.6,
                           decode_seconds=0.4)
    cached = GenerationStats(prompt_tokens=600, new_tokens=40, prefill_seconds=0.004,
                             decode_seconds=0.4, cached_prompt_tokens=600)
    assert describe.toggle_speedup(off, read) == (pytest.approx(1.4 / 1.0), "")
    speedup, note = describe.toggle_speedup(off, cached)
    assert speedup == pytest.approx(2.0) and note == describe.CACHED_NOTE  # not 1.4 / 0.404
    line = speed_line({"stats": cached}, {"stats": off})
    assert "2.00× speculation off" in line and describe.CACHED_NOTE in line
    assert describe.CACHED_NOTE not in speed_line({"stats": read}, {"stats": off})
