"""Splitting: exact provenance and every passage within the embedder's 256 word pieces."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import HashEmbedder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document

from ragspec.retrieval.passages import SplitConfig, split_documents
from ragspec.retrieval.readers.loaders import load_file

CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus"


@pytest.fixture(scope="module")
def counter():
    # Real all-MiniLM-L6-v2 word pieces (from the bundled tokenizer.json), no torch.
    return HashEmbedder()


def _check(docs, drafts, counter):
    """Provenance holds exactly and every passage fits the model, [CLS]/[SEP] included."""
    texts = {doc.metadata.get("page"): doc.page_content for doc in docs}
    for d in drafts:
        assert d.text.strip() == d.text and d.text
        assert texts[d.page][d.start : d.start + len(d.text)] == d.text
        assert counter.count_tokens(d.text) + counter.special_tokens <= counter.max_tokens


def _doc(text, page=None):
    return Document(page_content=text, metadata={"source": "x", "page": page})


def test_sample_corpus_passages_point_exactly_into_their_page(counter):
    total = 0
    for path in sorted(CORPUS.iterdir()):
        docs = load_file(path)
        drafts = split_documents(docs, counter)
        _check(docs, drafts, counter)
        total += len(drafts)
    assert 30 <= total <= 80  # the size the sample corpus was written for


def test_consecutive_passages_overlap_so_boundary_sentences_are_whole_somewhere(counter):
    text = " ".join(f"Sentence number {i} talks about queue_capacity and retries." for i in range(300))
    drafts = split_documents([_doc(text)], counter, SplitConfig(chunk_tokens=120, overlap_tokens=24))
    assert len(drafts) > 5
    for a, b in zip(drafts, drafts[1:], strict=False):
        assert b.start < a.start + len(a.text), "no overlap between consecutive passages"
        assert b.start > a.start


def test_limit_holds_for_the_largest_chunk_size_the_model_allows(counter):
    text = " ".join(f"word{i % 7}" for i in range(3000))
    drafts = split_documents([_doc(text)], counter, SplitConfig(chunk_tokens=10_000))
    _check([_doc(text)], drafts, counter)
    assert max(counter.count_tokens(d.text) for d in drafts) > 200  # the cap, not the default


@pytest.mark.parametrize(
    "text",
    [
        "x" * 6000,  # one unbroken "word": split at characters
        "abcdefghij" * 700,  # word pieces that merge differently when cut mid-word
        ("Same paragraph repeated. " * 20 + "\n\n") * 12,  # identical passages
        "調度器は毎晩二時半に報告書を作ります。" * 150,  # CJK: one word piece per character
        "\n".join(f"- item {i}" for i in range(900)),  # many short lines
        "£€¥ ümlaut naïve café " * 400,
    ],
    ids=["unbroken", "mid-word", "repeated", "cjk", "lines", "accents"],
)
def test_adversarial_texts_keep_provenance_and_limit(counter, text):
    docs = [_doc(text, page=3)]
    drafts = split_documents(docs, counter)
    assert drafts and all(d.page == 3 for d in drafts)
    _check(docs, drafts, counter)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1,
                max_size=400),
        min_size=1, max_size=12,
    ).map(lambda parts: "\n\n".join(parts)),
)
def test_any_text_keeps_provenance_and_limit(text):
    counter = HashEmbedder()
    docs = [_doc(text)]
    _check(docs, split_documents(docs, counter, SplitConfig(chunk_tokens=48, overlap_tokens=8)), counter)


def test_split_config_rejects_unusable_values_with_a_reason():
    with pytest.raises(ValueError, match="too small"):
        SplitConfig(chunk_tokens=4)
    with pytest.raises(ValueError, match="overlap_tokens"):
        SplitConfig(chunk_tokens=100, overlap_tokens=60)


# -- repetitive and unbroken text: offsets found by construction, never by searching ----------

_WORDS = st.sampled_from(["lorem", "ipsum", "| a | b |", "Zeile", "行", "данные", "x" * 40, "é"])
_BLOCKS = st.one_of(
    # a line repeated (table rows, log lines, page headers)
    st.tuples(st.text(alphabet="ab |-:é行", min_size=1, max_size=30), st.integers(2, 60)).map(
        lambda t: "\n".join([t[0]] * t[1])
    ),
    # a word repeated ("lorem ipsum" filler)
    st.tuples(_WORDS, st.integers(2, 300)).map(lambda t: " ".join([t[0]] * t[1])),
    # a long run without whitespace (base64, URLs, minified code)
    st.tuples(st.sampled_from(["ab", "x", "Я", "語", "0/"]), st.integers(50, 3000)).map(
        lambda t: t[0] * t[1]
    ),
    # mixed scripts
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=200),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_BLOCKS, min_size=1, max_size=8),
    st.sampled_from(["\n\n", "\n", " ", ""]),
    st.sampled_from([(16, 0), (48, 8), (200, 32)]),
)
def test_repetitive_text_splits_with_monotonic_exact_offsets(blocks, joiner, sizes):
    counter = HashEmbedder()
    text = joiner.join(blocks)
    docs = [_doc(text)]
    drafts = split_documents(docs, counter, SplitConfig(*sizes))
    _check(docs, drafts, counter)
    starts = [d.start for d in drafts]
    assert starts == sorted(set(starts)), "offsets must strictly advance"
    if text.strip():
        assert drafts, "text with words must give at least one passage"


def test_lorem_ipsum_repeated_is_split_not_refused(counter):
    text = "lorem ipsum dolor sit amet " * 2000
    docs = [_doc(text)]
    drafts = split_documents(docs, counter)
    _check(docs, drafts, counter)
    assert len(drafts) > 10
    assert drafts[-1].start + len(drafts[-1].text) == len(text.rstrip())
