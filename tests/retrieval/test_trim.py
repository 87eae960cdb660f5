"""Passage trimming (ragspec.retrieval.trim): the kept text is the document's own characters at
the stored offsets, whole sentences within the budget, the question's best sentence among them;
a passage within the budget is left alone. Oracles: the document string itself, and a brute-force
look at every sentence window."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragspec.retrieval.records import Passage
from ragspec.retrieval.trim import sentence_spans, trim_passage


def words(text: str) -> int:
    return len(text.split())


# Sentences of a manual page's option list, each with words no other sentence has.
SENTENCES = [
    "The -k option keeps the input files after compressing them.",
    "Without it gzip deletes each input file once its archive is written!",
    "Compression levels run from 1 (fastest) to 9 (smallest output).",
    "The default level is 6,\n   unless the GZIP variable names another level.",
    "Use --rsyncable to make archives that rsync transfers efficiently.",
]
PAGE = "GZIP(1)\n\n" + "  ".join(SENTENCES) + "\n\nSee also: zcat."


def passage_of(document: str, start: int, end: int) -> Passage:
    return Passage(id="d-1", doc_id="d", source="/docs/gzip.txt", page=None, start=start,
                   text=document[start:end])


def assert_provenance(document: str, kept: Passage) -> None:
    assert document[kept.start: kept.start + len(kept.text)] == kept.text


def test_a_passage_within_the_budget_is_returned_unchanged():
    p = passage_of(PAGE, 9, len(PAGE))
    assert trim_passage(p, "Which level is the default?", words(p.text), words) is p
    assert trim_passage(p, "Which level is the default?", 10_000, words) is p


@pytest.mark.parametrize("index, question", [
    (0, "How do I keep the input files?"),
    (1, "Does gzip delete the input file?"),
    (2, "Which compression level gives the smallest output?"),
    (3, "What is the default level?"),
    (4, "How do I make archives rsync can transfer efficiently?"),
])
def test_the_questions_best_sentence_is_kept_at_its_place_in_the_document(index, question):
    p = passage_of(PAGE, 9, len(PAGE))
    for budget in (1, 15, 25):
        kept = trim_passage(p, question, budget, words)
        assert SENTENCES[index] in kept.text, (budget, kept.text)
        assert_provenance(PAGE, kept)
        assert kept.id == p.id and kept.source == p.source and kept.page == p.page
    assert trim_passage(p, question, 1, words).text == SENTENCES[index]  # alone over budget


def test_without_a_question_word_the_passage_start_is_kept():
    p = passage_of(PAGE, 9, len(PAGE))
    kept = trim_passage(p, "Anything about bzip2?", 12, words)
    assert kept.start == p.start and p.text.startswith(kept.text) and kept.text != p.text


def test_a_budget_below_one_token_is_a_clear_error():
    with pytest.raises(ValueError, match="trim budget must be >= 1"):
        trim_passage(passage_of(PAGE, 0, 40), "level?", 0, words)


_WORD = st.sampled_from(["gzip", "level", "keep", "files", "the", "a", "Archive", "x9",
                         "café", "rsync", "default", "—", "(1)"])
_GAP = st.sampled_from([" ", "  ", "\n", "\n\n", " \t", ". ", "! ", "? ", ".\n\n", ".  "])


@st.composite
def documents(draw):
    parts = draw(st.lists(st.tuples(_WORD, _GAP), min_size=1, max_size=60))
    text = "".join(w + g for w, g in parts)
    start = draw(st.integers(0, len(text) - 1))
    end = draw(st.integers(start + 1, len(text)))
    question = " ".join(draw(st.lists(_WORD, min_size=0, max_size=5)))
    return text, start, end, question, draw(st.integers(1, 30))


@settings(max_examples=300, deadline=None)
@given(documents())
def test_kept_text_is_whole_sentences_of_the_document_at_the_stored_offsets(case):
    document, start, end, question, budget = case
    if not document[start:end].strip():
        return  # a stored passage holds words
    p = passage_of(document, start, end)
    kept = trim_passage(p, question, budget, words)
    assert_provenance(document, kept)
    if kept is p:
        return
    spans = sentence_spans(p.text)
    a, b = kept.start - p.start, kept.start - p.start + len(kept.text)
    # a contiguous run of whole sentences ...
    first = [s for s, _ in spans].index(a)
    last = [e for _, e in spans].index(b)
    assert first <= last
    # ... within the budget unless it is one sentence, and no neighbour fits besides
    assert words(kept.text) <= budget or first == last
    if words(kept.text) <= budget:
        if first > 0:
            assert words(p.text[spans[first - 1][0]:b]) > budget
        if last + 1 < len(spans):
            assert words(p.text[a:spans[last + 1][1]]) > budget


def test_sentences_end_at_stops_and_blank_lines_not_at_every_line_break():
    text = "-k, --keep\n       Keep input files.  Do not delete them!\n\nNext para"
    assert [text[a:b] for a, b in sentence_spans(text)] == [
        "-k, --keep\n       Keep input files.", "Do not delete them!", "Next para"]
