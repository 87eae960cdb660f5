"""The pruned top-k keyword search (MaxScore) against the exhaustive one it replaces: the same
(id, score) list, to the last bit, on random text (skewed vocabularies, duplicate passages that
tie, passages removed and re-added, many segments) and on real documents installed on this
machine; and it really skips postings: a common word's list is probed, not read."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from ragspec.retrieval.bm25 import index as bm25
from ragspec.retrieval.bm25 import maxscore as bm25_maxscore
from ragspec.retrieval.bm25 import native as bm25_native
from ragspec.retrieval.bm25.index import BM25Index

REPO = Path(__file__).resolve().parents[2]
LICENSES = Path("/usr/share/common-licenses")


def _zipf_corpus(rng: random.Random, n: int, vocabulary: int) -> list[tuple[str, str]]:
    words = [f"w{i}" for i in range(vocabulary)]
    weights = [1 / (i + 1) for i in range(vocabulary)]
    texts = [" ".join(rng.choices(words, weights, k=rng.randint(1, 60))) for _ in range(n)]
    texts += rng.sample(texts, n // 10)  # exact duplicates: equal scores, ordered by id
    return [(f"p{i:05d}", text) for i, text in enumerate(texts)]


def _queries(rng: random.Random, passages, count: int) -> list[str]:
    words = [w for _, text in passages[:200] for w in text.split()]
    return [" ".join(rng.choices(words, k=rng.randint(1, 10))) for _ in range(count)]


def _assert_same(index: BM25Index, queries, ks=(1, 4, 5, 50, 10_000)) -> None:
    for query in queries:
        for k in ks:
            assert index.top(query, k) == index.top_exhaustive(query, k) == \
                index.top_maxscore(query, k), (query, k)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pruned_top_k_equals_the_exhaustive_one_on_random_text(seed):
    rng = random.Random(seed)
    passages = _zipf_corpus(rng, 1500, rng.choice([30, 400, 5000]))
    _assert_same(BM25Index.build(passages), _queries(rng, passages, 120))


def test_pruned_top_k_stays_exact_across_segments_removals_and_readds(monkeypatch):
    monkeypatch.setattr(bm25, "_SEAL_POSTINGS", 300)  # many small segments
    rng = random.Random(7)
    passages = _zipf_corpus(rng, 1200, 300)
    index = BM25Index.build(passages[:600])
    queries = _queries(rng, passages, 60)
    _assert_same(index, queries, ks=(1, 5, 50))  # bounds computed here, at this average length
    for pid, text in passages[600:]:  # the average length moves: the old bounds must still hold
        index.add(pid, text)
    removed = rng.sample(passages, 400)
    for pid, _ in removed:
        index.remove(pid)
    _assert_same(index, queries, ks=(1, 5, 50))
    for pid, text in removed[:200]:  # back with other texts (shorter): new rows
        index.add(pid, " ".join(text.split()[:3]))
    _assert_same(index, queries, ks=(1, 5, 50))
    again = BM25Index.from_bytes(index.to_bytes(sorted(p for p, _ in passages if p in index)),
                                 sorted(p for p, _ in passages if p in index))
    _assert_same(again, queries, ks=(1, 5, 50))


def test_bounds_taken_at_a_short_average_still_hold_when_passages_grow_longer():
    rng = random.Random(11)
    short = _zipf_corpus(rng, 800, 200)
    index = BM25Index.build(short)
    queries = _queries(rng, short, 80)
    _assert_same(index, queries, ks=(1, 5))  # the segment's bounds are computed now
    # Long passages of one repeated word: the average length grows ~8x while the new postings
    # stay few, so the old segment (and its bounds) is kept rather than merged anew.
    for i in range(800):
        index.add(f"q{i:05d}", "filler " * 400)
    index.top("filler", 1)  # seals the new passages into a segment of their own
    assert len(index._segments) == 2
    _assert_same(index, queries, ks=(1, 5))
    norms = index._norms(len(index))
    for query in queries:  # each term's bound is above what it gives any passage, now
        for term in index._query_terms(query):
            rows = np.concatenate([r for r, _ in term.lists])
            assert term.probe(rows, norms).max() <= term.bound


def _license_passages() -> list[tuple[str, str]]:
    passages = []
    for path in sorted(LICENSES.iterdir()):
        if path.is_file():
            words = path.read_text(encoding="utf-8", errors="replace").split()
            passages += [(f"{path.name}-{i:05d}", " ".join(words[i : i + 60]))
                         for i in range(0, len(words), 45)]
    return passages


@pytest.mark.skipif(not LICENSES.is_dir(), reason="no /usr/share/common-licenses here")
def test_pruned_top_k_equals_the_exhaustive_one_on_installed_documents():
    passages = _license_passages()
    assert len(passages) > 500
    index = BM25Index.build(passages)
    questions = [json.loads(line)["question"] for name in ("dev", "heldout") for line in
                 (REPO / "data" / "realdocs" / name / "questions.jsonl").read_text().splitlines()
                 if line.strip()]
    rng = random.Random(3)
    sentences = [s for _, text in rng.sample(passages, 80) for s in re.split(r"[.;:]", text)
                 if s.strip()]
    _assert_same(index, questions + sentences[:150] + ["the", "of the", "GNU General Public"])


def test_a_common_words_postings_are_probed_not_read(monkeypatch):
    passages = [(f"p{i:05d}", "common " + ("rare" if i == 17 else f"x{i}")) for i in range(20_000)]
    index = BM25Index.build(passages)
    scored = []
    real = bm25_maxscore.contribution
    monkeypatch.setattr(bm25_maxscore, "contribution",
                        lambda idf, tfs, norms: scored.append(len(tfs)) or real(idf, tfs, norms))
    assert index.top_maxscore("rare common", 1) == index.top_exhaustive("rare common", 1)
    assert index.top_maxscore("rare common", 1)[0][0] == "p00017"
    assert sum(scored) < 100  # against 20,001 postings for an exhaustive pass


def test_query_terms_reject_a_negative_bound():
    with pytest.raises(ValueError, match="bound"):
        bm25_maxscore.QueryTerm(idf=1.0, bound=-1.0, lists=[(np.zeros(0), np.zeros(0))])


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
def test_the_compiled_scorer_is_used_and_equals_numpy_to_the_last_bit(monkeypatch):
    """`top` runs the compiled MaxScore where a compiler is (the same floats as the numpy
    scorer), and MaxScore in numpy where it is switched off: the same answers."""
    assert bm25_native.scorer() is not None
    rng = random.Random(5)
    passages = _zipf_corpus(rng, 2000, 600)
    index = BM25Index.build(passages)
    for pid, _ in rng.sample(passages, 200):
        index.remove(pid)
    queries = _queries(rng, passages, 80)
    calls = []
    real = bm25_native.Native.top
    monkeypatch.setattr(bm25_native.Native, "top",
                        lambda self, *args: calls.append(1) or real(self, *args))
    _assert_same(index, queries, ks=(1, 5, 50))
    assert calls
    monkeypatch.setattr(bm25_native.scorer(), "term_at_a_time", False)  # the merging traversal
    _assert_same(index, queries[:40], ks=(1, 5, 50))
    monkeypatch.setattr(bm25, "scorer", lambda: None)  # no compiler: MaxScore in numpy
    calls.clear()
    _assert_same(index, queries[:20], ks=(1, 5, 50))
    assert not calls


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
@pytest.mark.parametrize("term_at_a_time", [True, False])
def test_the_compiled_scorer_skips_a_common_words_postings(monkeypatch, term_at_a_time):
    """Document-at-a-time MaxScore in C: once the rare word's row fills the top 1, the common
    word's list is galloped over for that row, not read; with removals and several segments."""
    passages = [(f"p{i:05d}", "common " + ("rare" if i % 5000 == 17 else f"x{i}"))
                for i in range(20_000)]
    index = BM25Index()
    for start in range(0, 20_000, 7000):  # several segments of the common word's list
        index.add_many(passages[start:start + 7000])
        index.top("warm", 1)
    index.remove("p05017")
    native = bm25_native.scorer()
    monkeypatch.setattr(native, "term_at_a_time", term_at_a_time)
    for k in (1, 3):
        assert index.top("rare common", k) == index.top_exhaustive("rare common", k)
        assert native.visited < 1000, native.visited  # against 20,000 postings of "common"
    assert [pid for pid, _ in index.top("rare common", 3)] == ["p00017", "p10017", "p15017"]
    assert index.top("common", 2) == index.top_exhaustive("common", 2)


def test_adding_a_batch_gives_the_index_adding_one_by_one_gives():
    rng = random.Random(9)
    passages = _zipf_corpus(rng, 900, 700) + [("empty", ""), ("caps", "Disk FULL disk_quota")]
    one = BM25Index()
    for pid, text in passages:
        one.add(pid, text)
    batched = BM25Index()
    batched.add_many(passages[:10])
    batched.add_many(passages[10:500])
    batched.add_many([])
    batched.add_many(passages[500:])
    order = [pid for pid, _ in passages]
    assert batched.to_bytes(order) == one.to_bytes(order)
    for query in _queries(rng, passages, 30) + ["disk_quota full"]:
        assert batched.top(query, 5) == one.top(query, 5)
    with pytest.raises(ValueError, match="already"):
        batched.add_many([("new", "a"), ("new", "b")])
    with pytest.raises(ValueError, match="already"):
        batched.add_many([("caps", "x")])
    assert "new" not in batched
