"""Quoted spans (ragspec.quoting): an answer's stretches found word for word in the passages,
cut the same whether the answer arrives whole or in pieces, never called drafts."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from ragspec.quoting import (
    MIN_QUOTE_WORDS,
    QuotedSpan,
    QuoteFinder,
    locate,
    quote_spans,
    span_from_dict,
)

PASSAGES = ["Workers poll the queue every 5 seconds and back off when it is empty.",
            "Error E204 means the namespace quota is exhausted; raise the quota or wait."]
_TOKEN = re.compile(r"\w+|[^\w\s]")


def _words(text: str) -> list[str]:
    return _TOKEN.findall(text)


def test_the_module_example():
    spans = quote_spans("They poll the queue every 5 seconds, always.", PASSAGES[:1])
    assert [(s.text, isinstance(s, QuotedSpan)) for s in spans] == [
        ("They ", False), ("poll the queue every 5 seconds", True), (", always.", False)]
    quoted = spans[1]
    assert not quoted.drafted and quoted.origin.source == 0
    assert PASSAGES[0][quoted.origin.char_start : quoted.origin.char_end] == quoted.text


def test_runs_shorter_than_the_minimum_are_plain_and_whitespace_may_differ():
    assert not any(isinstance(s, QuotedSpan) for s in quote_spans("the queue every", PASSAGES))
    spans = quote_spans("E204 means the\nnamespace quota is exhausted.", PASSAGES)
    quoted = [s for s in spans if isinstance(s, QuotedSpan)]
    assert len(quoted) == 1 and quoted[0].origin.source == 1
    assert _words(quoted[0].text) == _words("E204 means the namespace quota is exhausted")


def test_quoted_spans_survive_a_round_trip_through_json():
    span = quote_spans("poll the queue every 5 seconds", PASSAGES)[0]
    again = span_from_dict(span.to_dict())
    assert isinstance(again, QuotedSpan) and again.to_dict() == span.to_dict()
    assert span.to_dict()["quoted"] is True and span.to_dict()["drafted"] is False


def test_locate_finds_a_copied_text_in_the_passages():
    at = PASSAGES[1].index("namespace quota")
    assert locate("namespace quota", PASSAGES) == (1, at, at + len("namespace quota"))
    assert locate("not there at all", PASSAGES) is None


_pieces = st.lists(st.sampled_from(
    _words(PASSAGES[0]) + _words(PASSAGES[1]) + ["answer", "The", ",", "so", "5", "quota"]),
    max_size=40)


@settings(max_examples=200, deadline=None)
@given(words=_pieces, copy=st.integers(0, 12), cut=st.integers(0, 60),
       cuts=st.lists(st.integers(1, 400), max_size=12))
def test_fed_in_pieces_the_spans_equal_those_of_the_whole_answer(words, copy, cut, cuts):
    source = _words(PASSAGES[cut % 2])
    answer = " ".join(words[: len(words) // 2] + source[cut % 5 : cut % 5 + copy]
                      + words[len(words) // 2 :])
    whole = quote_spans(answer, PASSAGES)
    assert "".join(s.text for s in whole) == answer
    finder, fed = QuoteFinder(PASSAGES), []
    for end in sorted(c for c in cuts if c < len(answer)):
        fed += finder.feed(answer[:end])
    fed += finder.finish(answer)
    assert "".join(s.text for s in fed) == answer
    assert [(s.text, s.origin) for s in fed if isinstance(s, QuotedSpan)] == \
        [(s.text, s.origin) for s in whole if isinstance(s, QuotedSpan)]
    for s in whole:
        if isinstance(s, QuotedSpan):
            passage = PASSAGES[s.origin.source]
            assert _words(passage[s.origin.char_start : s.origin.char_end]) == _words(s.text)
            assert sum(w[0].isalnum() or w[0] == "_" for w in _words(s.text)) >= MIN_QUOTE_WORDS
