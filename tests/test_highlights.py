"""Which accepted drafts are shown as copied (ragspec.highlights), on the chat page and in the
terminal: adjacent drafts merge; a draft too short to show copying (a piece of a number or
word, punctuation, a line break) is plain text; the legends say the rule."""

from __future__ import annotations

import html
import io
import random
import re

from ragspec.decoding.types import Span, SpanOrigin
from ragspec.highlights import (
    MIN_PIECE_CHARS,
    MIN_WORD_CHARS,
    ShownStream,
    holds_whole_word,
    shown_spans,
)
from ragspec.retrieval.faiss.store import Passage
from ragspec.web import page_html as rd

TEXT = "The default port of the API is 7431.\nSee the metrics guide."


def passage(text=TEXT):
    return Passage(id="p", doc_id="d", text=text, source="/docs/ops.md", page=None, start=0)


def draft(text, start, end, source=0):
    return Span(text, [1] * max(1, len(text) // 3), True, SpanOrigin(50 + start, True, source,
                                                                     start, end))


def marks(fragment: str) -> list[tuple[str, str]]:
    """(title, visible text) of every highlighted mark."""
    return [(html.unescape(t), html.unescape(re.sub(r"<[^>]+>", "", m.replace("<br>", "\n"))))
            for t, m in re.findall(r'<mark class="rs-draft"[^>]*title="([^"]*)">(.*?)</mark>',
                                   fragment)]


# The answer of the issue: "43" and "." drafted inside "7431.", then a drafted line break.
NOISE = [Span("The default port of the API is 7", [1], False),
         draft("43", 31, 33), Span("1", [2], False), draft(".", 34, 35), draft("\n", 35, 36),
         Span("See the guide.", [3], False)]


def test_pieces_of_a_number_punctuation_and_line_breaks_are_not_shown_as_sources():
    out = rd.spans_html(NOISE, [passage()])
    assert marks(out) == []
    assert "characters 35-36" not in html.unescape(out)  # the line break's tooltip is gone
    assert "rs-echo" not in out
    assert html.unescape(re.sub(r"<[^>]+>", "", out.replace("<br>", "\n"))) == \
        "".join(s.text for s in NOISE)
    listed = rd.sources_html(NOISE, [passage()])
    assert "No span was copied from a passage" in listed


def test_adjacent_drafts_from_one_passage_merge_into_one_mark():
    spans = [Span("It is on ", [1], False), draft("port", 12, 16), draft(" of the API", 16, 27),
             draft(" is", 28, 30), Span(" open.", [2], False)]  # " is": one space skipped
    out = rd.spans_html(spans, [passage()])
    [(title, text)] = marks(out)
    assert text == "port of the API is"
    assert "characters 12-30" in title and "\u201cport of the API is\u201d" in title


def test_drafts_from_other_passages_or_places_do_not_merge():
    other = passage("The metrics guide says port 7431.")
    spans = [draft("default port", 4, 16), draft(" metrics guide", 3, 17, source=1)]
    assert [t for _, t in marks(rd.spans_html(spans, [passage(), other]))] == \
        ["default port", " metrics guide"]
    jump = [draft("default port", 4, 16), draft(" metrics guide", 44, 58)]  # same passage, later
    assert len(marks(rd.spans_html(jump, [passage()]))) == 2


def test_a_whole_word_or_number_is_shown_a_piece_of_one_is_not():
    whole = [Span("Port ", [1], False), draft("7431", 31, 35), Span(".", [2], False)]
    assert [t for _, t in marks(rd.spans_html(whole, [passage()]))] == ["7431"]
    cut = [Span("Port 7", [1], False), draft("431", 32, 35), Span(".", [2], False)]
    assert marks(rd.spans_html(cut, [passage()])) == []
    short = [Span("It is", [1], False), draft(" of the", 16, 23), Span(" API.", [2], False)]
    assert marks(rd.spans_html(short, [passage()])) == []  # words any answer writes
    word = "x" * (MIN_WORD_CHARS - 1)
    assert not holds_whole_word(f" {word} {word}.") and holds_whole_word(f" {word}x ")
    assert not holds_whole_word("metrics", before="a") and not holds_whole_word("metrics",
                                                                                after="_")


def test_a_long_piece_of_an_identifier_is_shown_a_short_piece_is_not():
    """A copy split inside one long word (bzip2's flags "-cdfkqstvzVL123456789") is no
    coincidence once MIN_PIECE_CHARS letters or digits are copied in a row; "emon" of "daemon"
    is."""
    long = [Span("bzip2 -c", [1], False), draft("dfkqstvzVL12", 40, 52),
            Span("3456789", [2], False)]
    assert [t for _, t in marks(rd.spans_html(long, [passage()]))] == ["dfkqstvzVL12"]
    assert holds_whole_word("x" * MIN_PIECE_CHARS, before="a", after="b")
    assert not holds_whole_word("x" * (MIN_PIECE_CHARS - 1), before="a", after="b")
    short = [Span("the da", [1], False), draft("emon", 12, 16), Span("s", [2], False)]
    assert marks(rd.spans_html(short, [passage()])) == []


def test_repeats_too_short_to_show_copying_are_not_underlined_either():
    spans = [Span("Steps:\n1", [1], False),
             Span(".\n", [2], True, SpanOrigin(3, False)),  # the answer's own ".\n"
             Span("2", [3], False),
             Span(".\n", [4], True, SpanOrigin(5, False))]
    assert "rs-echo" not in rd.spans_html(spans, [passage()])
    long = [Span("Open", [1], False), Span(" the metrics guide", [2], True, SpanOrigin(3, True))]
    assert "rs-echo" in rd.spans_html(long, [passage()])


def test_streamed_one_by_one_the_shown_spans_are_the_same_as_at_once():
    rng = random.Random(0)
    pieces = ["7", "43", "1", ".", "\n", " port", " of", " the API", "metrics", "", " is",
              "431", " guide"]
    for _ in range(300):
        spans, at = [], 0
        for _ in range(rng.randint(1, 10)):
            text = rng.choice(pieces)
            if rng.random() < 0.6:
                start = at if rng.random() < 0.7 else at + 5
                spans.append(draft(text, start, start + len(text), source=rng.randint(0, 1)))
                at = start + len(text)
            else:
                spans.append(Span(text, [1], False))
        stream = ShownStream()
        fed = [s for span in spans for s in stream.feed(span)] + stream.finish()
        assert [(s.text, s.drafted, s.origin) for s in fed] == \
            [(s.text, s.drafted, s.origin) for s in shown_spans(spans)]
        assert "".join(s.text for s in fed) == "".join(s.text for s in spans)


def test_the_terminal_applies_the_same_rule_and_its_legend_says_it():
    from rich.console import Console

    from ragspec.terminal import legend, render_spans

    console = Console(file=io.StringIO(), force_terminal=True, color_system="truecolor",
                      soft_wrap=True)
    render_spans(NOISE, console)
    printed = console.file.getvalue()
    assert "\x1b[" not in printed.replace("\x1b[0m", "")  # no style at all: nothing marked
    console = Console(file=io.StringIO(), force_terminal=True, color_system="truecolor",
                      soft_wrap=True)
    stream = ShownStream()
    for span in [Span("It is ", [1], False), draft("port", 12, 16), draft(" of", 16, 19),
                 Span(" 7", [2], False), draft("43", 31, 33), Span("1.", [3], False)]:
        render_spans(stream.feed(span), console)
    render_spans(stream.finish(), console)
    styled = re.findall(r"\x1b\[[0-9;]+m([^\x1b]+)\x1b\[0m", console.file.getvalue())
    assert styled == ["port of"]
    assert f"whole word of {MIN_WORD_CHARS} or more" in legend(NOISE)


def test_the_page_legend_says_the_rule():
    shown = html.unescape(re.sub(r"<[^>]+>", "", rd.legend_html()))
    assert "Adjacent drafts are marked as one" in shown
    assert f"whole word of {MIN_WORD_CHARS} or more letters or digits" in shown
    assert f"or {MIN_PIECE_CHARS} or more in a row" in shown
