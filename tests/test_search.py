"""ragspec.search: the refusal (the relevance floor, and the question's specific words the
documents never use) and follow-ups made standalone. Fast: the hash embedder over real indexes
of both backends, so the keyword look-ups are the stores' own."""

from __future__ import annotations

import pytest

from ragspec import search
from ragspec.retrieval import absent_words as aw
from ragspec.retrieval.ingest import ingest_paths
from ragspec.search import is_followup, retrieve, standalone_question

DOC = ("api_token: a shared secret that clients of the Larkspur HTTP API must send. Tokens "
       "shorter than 32 characters are rejected at start-up.\n\n"
       "api_port: the port of the Larkspur HTTP API. Default 7431. Changing it needs a restart.\n")
ROTATE = "How do I rotate the API keys in Larkspur?"


def _index(opened, tmp_path, backend):
    doc = tmp_path / "config.txt"
    doc.write_text(DOC)
    where = str(tmp_path / "index") if backend == "faiss" else f"milvus:{tmp_path}/index.db"
    store = opened(where)
    assert ingest_paths([doc], store).ok
    return store


@pytest.mark.parametrize("backend", ["faiss", "milvus"])
def test_a_question_whose_specific_word_the_documents_never_use_is_refused_above_the_floor(
        opened, tmp_path, monkeypatch, backend):
    store = _index(opened, tmp_path, backend)
    best = store.retrieve(ROTATE, k=4, mode="hybrid").best_score
    assert best > 0
    # The floor lets it through; the words check looks at every question (bound above best).
    monkeypatch.setattr(search, "WORDS_CHECK_BELOW", 1.0)
    refused = retrieve(store, ROTATE, min_score=best / 2)
    assert refused.refused and refused.absent_words == ["rotate"]
    assert refused.hits, "a refusal still shows the closest passages"
    assert refused.to_dict()["absent_words"] == ["rotate"]
    assert "never use 'rotate'" in search.refusal_reason(refused)
    assert "below the floor" in search.refusal_reason(retrieve(store, ROTATE, min_score=best + 0.01))
    # Every specific word present (api, larkspur, tokens): answered.
    kept = retrieve(store, "How long must the API token of Larkspur be?", min_score=0.01)
    assert not kept.refused and kept.absent_words == []
    # The floor's switch turns both checks off.
    assert not retrieve(store, ROTATE, min_score=0).refused


def test_the_words_check_only_looks_below_its_cosine_bound(opened, tmp_path, monkeypatch):
    store = _index(opened, tmp_path, "faiss")
    best = store.retrieve(ROTATE, k=4, mode="hybrid").best_score
    monkeypatch.setattr(search, "WORDS_CHECK_BELOW", best - 1e-6)
    assert not retrieve(store, ROTATE, min_score=best / 2).refused
    monkeypatch.setattr(search, "WORDS_CHECK_BELOW", best + 1e-6)
    assert retrieve(store, ROTATE, min_score=best / 2).refused


def test_indexed_words_finds_only_tokens_some_passage_has(opened, tmp_path):
    store = _index(opened, tmp_path, "faiss")
    assert store.indexed_words(["api_token", "restart", "rotate", "7431", "restarts"]) == {
        "api_token", "restart", "7431"}


def _found(vocabulary):
    return lambda words: set(words) & set(vocabulary)


@pytest.mark.parametrize("question, vocabulary, hits, absent", [
    # an inflection the documents use is the word's presence
    ("How do I stop gzip deleting files?", {"gzip", "delete", "files"}, [], []),
    # a long word whose first 6 letters start a word of a retrieved passage is present
    ("Why is the indentation wrong?", set(), ["dedent removes common indent"], []),
    # identifiers and codes are specific; a prefix never stands in for them
    ("What is snapshot_interval?", {"snapshot_keep"}, ["snapshot_keep: 7"], ["snapshot_interval"]),
    ("What does error E301 mean?", {"error", "e204"}, [], ["e301"]),
    # common English words are never reported, present or not
    ("Why does it stop at the wrong place?", set(), [], []),
    ("How do I rotate the API keys in Larkspur?", {"api", "larkspur"}, [], ["rotate"]),
])
def test_absent_words_are_the_specific_words_without_any_form_in_the_index(
        question, vocabulary, hits, absent):
    assert aw.absent_words(question, _found(vocabulary), hits) == absent


def test_without_the_frequency_list_no_word_is_absent(monkeypatch):
    monkeypatch.setattr(aw, "word_ranks", dict)
    assert aw.absent_words(ROTATE, _found(set()), []) == []


def test_function_words_and_numbers_are_never_content_words():
    assert aw.content_words("What is the port 7431 of it, and the API?") == ["port", "api"]


@pytest.mark.parametrize("question", ["What happens to the queued jobs then?",
                                      "And then?", "what happens then"])
def test_a_question_ending_on_then_is_a_followup(question):
    assert is_followup(question)
    history = [{"role": "user", "content": "What does lark drain do?"}]
    assert standalone_question(question, history) == f"What does lark drain do? {question}"


def test_then_inside_a_standalone_question_leaves_it_alone():
    history = [{"role": "user", "content": "What does lark drain do?"}]
    question = "If the queue is full then what does lark submit return?"
    assert standalone_question(question, history) == question
    # the rule before the ending counted, kept for the measurement
    assert not is_followup("What happens to the queued jobs then?", frozenset())
