"""Keyword search and hybrid retrieval: BM25 against a hand-computed oracle, incremental updates
against a rebuild, the keyword file committed with the index (and rebuilt for an index written
without it), reciprocal-rank fusion order, and the store's hybrid mode. HashEmbedder, no torch."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from fakes import HashEmbedder

from ragspec.retrieval.bm25.index import K1, B, BM25Index, tokenize
from ragspec.retrieval.faiss import persist
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.fusion import fuse
from ragspec.retrieval.ingest import ingest_paths

# A toy corpus small enough to score by hand.
TOY = [
    ("a", "The disk is full."),  # tokens: the disk is full (4)
    ("b", "Error E204: the disk quota is full, full."),  # error e204 the disk quota is full full (8)
    ("c", "Set max_log_size to 7432 bytes."),  # set max_log_size to 7432 bytes (5)
]


def _oracle(query_tokens: list[str], doc_tokens: dict[str, list[str]]) -> dict[str, float]:
    """Okapi BM25 written out from its definition, term by term."""
    n = len(doc_tokens)
    average = sum(len(t) for t in doc_tokens.values()) / n
    out: dict[str, float] = {}
    for pid, tokens in doc_tokens.items():
        total = 0.0
        for term in set(query_tokens):
            df = sum(term in t for t in doc_tokens.values())
            tf = tokens.count(term)
            if tf == 0:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            total += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * len(tokens) / average))
        if total:
            out[pid] = total
    return out


def test_tokens_are_lowercased_words_numbers_and_identifiers():
    assert tokenize("Error E204: set max_log_size=7432, retry 3.5x!") == [
        "error", "e204", "set", "max_log_size", "7432", "retry", "3", "5x"]


def test_bm25_scores_match_the_hand_computed_values():
    index = BM25Index.build(TOY)
    # "full": df 2 of 3, idf = ln(1 + 1.5/2.5) = ln 1.6; average length 17/3.
    idf = math.log(1.6)
    a = idf * 1 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 4 / (17 / 3)))
    b = idf * 2 * 2.2 / (2 + 1.2 * (0.25 + 0.75 * 8 / (17 / 3)))
    assert index.score("full") == pytest.approx({"a": a, "b": b}, rel=1e-12)
    # "e204" only in b: idf = ln(1 + 2.5/1.5).
    e204 = math.log(1 + 2.5 / 1.5) * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 8 / (17 / 3)))
    assert index.score("what is E204?")["b"] == pytest.approx(
        e204 + _oracle(["is"], {p: tokenize(t) for p, t in TOY})["b"], rel=1e-12)


@pytest.mark.parametrize("query", ["full disk", "E204", "max_log_size 7432", "the is",
                                   "nothing matches", "FULL full Full"])
def test_bm25_scores_equal_the_definition_for_any_query(query):
    index = BM25Index.build(TOY)
    assert index.score(query) == pytest.approx(
        _oracle(tokenize(query), {p: tokenize(t) for p, t in TOY}), rel=1e-12)


def test_top_orders_by_score_and_leaves_out_passages_without_a_query_token():
    index = BM25Index.build(TOY)
    assert [pid for pid, _ in index.top("full disk quota", 5)] == ["b", "a"]
    assert index.top("7432", 5)[0][0] == "c" and len(index.top("7432", 5)) == 1
    assert index.top("zebra", 5) == [] and BM25Index().top("full", 3) == []


def test_incremental_adds_and_removes_equal_building_from_scratch():
    grown = BM25Index.build(TOY)
    grown.add("d", "The quota of namespace blue is 40 jobs.")
    grown.remove("a")
    grown.add("a2", "A disk that is full stops the queue.")
    grown.remove("d")
    final = [TOY[1], TOY[2], ("a2", "A disk that is full stops the queue.")]
    scratch = BM25Index.build(final)
    for query in ("full disk", "quota namespace blue", "e204", "the queue"):
        assert grown.score(query) == pytest.approx(scratch.score(query), rel=1e-12)
    order = [pid for pid, _ in final]
    assert grown.to_bytes(order) == scratch.to_bytes(order)


def test_saved_keywords_read_back_to_the_same_scores_and_refuse_other_rows():
    index = BM25Index.build(TOY)
    data = index.to_bytes(["c", "a", "b"])
    again = BM25Index.from_bytes(data, ["c", "a", "b"])
    assert again.score("full disk e204 7432") == index.score("full disk e204 7432")
    with pytest.raises(ValueError, match="3 rows for 2 passages"):
        BM25Index.from_bytes(data, ["c", "a"])
    with pytest.raises(ValueError, match="not a keyword index"):
        BM25Index.from_bytes(b"not an npz file", ["a"])
    # restore(): a file that does not fit is rebuilt from the texts instead.
    assert BM25Index.restore(data, TOY[:2]).score("full") == BM25Index.build(TOY[:2]).score("full")


def test_adding_a_passage_twice_is_refused():
    index = BM25Index.build(TOY)
    with pytest.raises(ValueError, match="already in the keyword index"):
        index.add("a", "again")


# -- reciprocal-rank fusion ---------------------------------------------------------------------


def test_fusion_sums_reciprocal_ranks_and_breaks_ties_by_the_first_ranking():
    fused = fuse([["a", "z", "c"], ["c", "b"]], k=10)
    # z and b tie (1/62 each): z is in the first ranking, so it comes first.
    assert [pid for pid, _ in fused] == ["c", "a", "z", "b"]
    assert dict(fused) == pytest.approx(
        {"c": 1 / 63 + 1 / 61, "a": 1 / 61, "z": 1 / 62, "b": 1 / 62})
    assert fuse([["a", "z", "c"], ["c", "b"]], k=2) == fused[:2]
    # With rrf_k = 0 the top of one list outweighs a passage both lists hold in second place.
    assert fuse([["a", "x"], ["b", "x"]], k=1, rrf_k=0)[0][0] == "a"
    assert fuse([["a", "x"], ["b", "x"]], k=1)[0][0] == "x"


def test_fusion_of_one_ranking_keeps_its_order():
    assert [pid for pid, _ in fuse([["z", "y", "x"], []], k=3)] == ["z", "y", "x"]


# -- the store ------------------------------------------------------------------------------------


@pytest.fixture
def docs(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "alpha.txt").write_text("Alpha notes about queues and workers.\n\n"
                                      "Error E204 means the namespace quota is exhausted.\n")
    (folder / "beta.md").write_text("# Beta\n\nThe metrics endpoint listens on port 7432.\n")
    (folder / "gamma.txt").write_text("Gamma: logs larger than max_log_size are rotated.\n")
    return folder


def _index(path: Path, files: list[Path], remove: list[Path] = ()) -> PassageStore:
    store = PassageStore.open(path, HashEmbedder())
    assert ingest_paths(files, store).ok
    for f in remove:
        store.remove(str(f.resolve()))
    return store


def test_store_keywords_after_add_and_remove_equal_an_index_built_without_the_removed(
        tmp_path, docs):
    files = sorted(docs.iterdir())
    _index(tmp_path / "grown", files, remove=[docs / "beta.md"])
    _index(tmp_path / "direct", [f for f in files if f.name != "beta.md"])
    grown = (tmp_path / "grown" / persist.KEYWORDS_NAME).read_bytes()
    assert grown == (tmp_path / "direct" / persist.KEYWORDS_NAME).read_bytes()
    reopened = PassageStore.open(tmp_path / "grown", HashEmbedder())
    assert all("7432" not in h.passage.text for h in reopened.search("7432", k=5, mode="hybrid"))


def _strip_keywords(index: Path) -> None:
    """Rewrite `index` as ragspec wrote it before keyword search: no keywords.npz, and no
    keywords_sha256 in the header."""
    snapshot = persist.read_snapshot(index)
    (index / persist.KEYWORDS_NAME).unlink()
    persist.write_snapshot(index, snapshot.embedder, snapshot.dim, snapshot.documents,
                           snapshot.passages, snapshot.index)
    header = json.loads((index / persist.PASSAGES_NAME).read_text().splitlines()[0])
    assert "keywords_sha256" not in header and not (index / persist.KEYWORDS_NAME).exists()


def test_an_index_written_without_keywords_opens_searches_and_gains_them_on_next_write(
        tmp_path, docs, caplog):
    store = _index(tmp_path / "index", [docs])
    expected = store.search("what does error E204 mean", k=3, mode="hybrid")
    _strip_keywords(tmp_path / "index")
    with caplog.at_level("WARNING"):
        old = PassageStore.open(tmp_path / "index", HashEmbedder())
        assert old.search("what does error E204 mean", k=3, mode="hybrid") == expected
    assert not caplog.records  # nothing alarming
    (docs / "delta.txt").write_text("Delta: nothing else.")
    assert ingest_paths([docs / "delta.txt"], old).ok
    assert (tmp_path / "index" / persist.KEYWORDS_NAME).exists()


def test_hybrid_hits_keep_their_cosine_and_dense_mode_is_unchanged(tmp_path, docs):
    store = _index(tmp_path / "index", [docs])
    dense = store.search("metrics endpoint 7432", k=3)
    assert all(h.fused is None for h in dense)
    result = store.retrieve("metrics endpoint 7432", k=3, mode="hybrid")
    assert result.best_score == pytest.approx(dense[0].score)
    embedder = HashEmbedder()
    query = embedder.embed_array(["metrics endpoint 7432"])[0]
    for hit in result.hits:
        cosine = float(embedder.embed_array([hit.passage.text])[0] @ query)
        assert hit.score == pytest.approx(cosine, abs=1e-5)
    fused = [h.fused for h in result.hits]
    assert fused == sorted(fused, reverse=True) and "7432" in result.hits[0].passage.text
    with pytest.raises(ValueError, match="search mode must be one of dense, hybrid"):
        store.search("x", mode="keywords")
