"""Past a size threshold the FAISS folder store searches approximately (faiss_ann.py): recall@10
against exact search stays >= 0.98 at the default parameters, the cosines it reports are the
exact ones, and adds and deletes never leave it pointing at a row that moved. Below the
threshold, or with RAGSPEC_DENSE=exact, search is exact."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import HashEmbedder

from ragspec.retrieval.faiss import ann as faiss_ann
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.passages import PassageDraft

DIM = 64


def _vectors(rng: np.random.Generator, n: int, centres: np.ndarray) -> np.ndarray:
    """Unit vectors near random centres (embeddings cluster by topic)."""
    out = centres[rng.integers(0, len(centres), n)] + rng.normal(0, 0.35, (n, DIM))
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def _add(store: PassageStore, name: str, vectors: np.ndarray) -> None:
    drafts = [PassageDraft(text=f"{name} passage {i}", page=None, start=i * 10)
              for i in range(len(vectors))]
    store.add_document(f"/docs/{name}", f"{abs(hash(name)):064d}"[:64], 1, drafts, vectors)


def _ids(store: PassageStore, query: np.ndarray, k: int) -> list[str]:
    return [p.id for p, _ in store._dense(query, k)]


def _recall(store, queries, monkeypatch, k: int = 10) -> float:
    approx = [_ids(store, q, k) for q in queries]
    with monkeypatch.context() as exact_mode:
        exact_mode.setenv(faiss_ann.MODE_ENV, "exact")
        exact = [_ids(store, q, k) for q in queries]
    return float(np.mean([len(set(a) & set(e)) / k for a, e in zip(approx, exact, strict=True)]))


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(faiss_ann, "THRESHOLD", 2_000)
    monkeypatch.setattr(faiss_ann, "MIN_CANDIDATES", 50)
    return PassageStore.open(tmp_path / "index", HashEmbedder(dim=DIM), use_gpu=False)


def _filled(store, seed: int, topics: int, docs: int, per_doc: int):
    """The store with `docs` documents of clustered vectors; (rng, centres, 60 queries)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1, (topics, DIM))
    with store.writing():
        for d in range(docs):
            _add(store, f"doc{d}", _vectors(rng, per_doc, centres))
    return rng, centres, _vectors(rng, 60, centres)


def test_past_the_threshold_recall_at_10_is_at_least_098_with_exact_cosines(store, monkeypatch):
    _, _, queries = _filled(store, 0, 60, 40, 150)
    assert faiss_ann.wanted(store.passage_count())
    assert _recall(store, queries, monkeypatch) >= 0.98
    stored = {p.id: v for p, v in zip(store.passages(), store._lc.index.reconstruct_n(
        0, store.passage_count()), strict=True)}
    for q in queries[:10]:
        for p, score in store._dense(q, 10):
            assert score == pytest.approx(float(stored[p.id] @ q), abs=1e-6)
    assert store._approx._ivf is not None and store._approx._ivf.ntotal == 6_000


def test_adds_and_deletes_keep_the_approximate_index_on_the_right_rows(store, monkeypatch):
    rng, centres, queries = _filled(store, 1, 40, 20, 120)
    _ids(store, queries[0], 10)  # trains it
    with store.writing():
        store.remove("/docs/doc3")  # rows after doc3's shift down
        _add(store, "late", _vectors(rng, 300, centres))
    assert _recall(store, queries, monkeypatch) >= 0.98
    texts = {p.id: p.text for p in store.passages()}
    assert not any(t.startswith("doc3 ") for t in texts.values())
    for q in queries[:10]:
        assert all(pid in texts for pid in _ids(store, q, 10))


def test_below_the_threshold_or_when_asked_search_is_exact(monkeypatch):
    assert not faiss_ann.wanted(faiss_ann.THRESHOLD - 1) and faiss_ann.wanted(faiss_ann.THRESHOLD)
    monkeypatch.setenv(faiss_ann.MODE_ENV, "exact")
    assert not faiss_ann.wanted(10 * faiss_ann.THRESHOLD)
    monkeypatch.setenv(faiss_ann.MODE_ENV, "fast")
    with pytest.raises(ValueError, match="auto"):
        faiss_ann.wanted(1)


def test_a_fixed_number_of_lists_is_probed_and_a_share_can_be_asked(monkeypatch):
    """The default probes PROBED_LISTS lists whatever the index size (all of them when there
    are fewer); a benchmark's share of the lists applies from the next search, None goes back."""
    import faiss

    monkeypatch.setattr(faiss_ann, "PROBED_LISTS", 20)
    monkeypatch.setattr(faiss_ann, "MIN_PROBE", 4)
    monkeypatch.setattr(faiss_ann, "_TRAIN_PER_LIST", 4)
    rng = np.random.default_rng(0)
    for n, lists in ((400, 20), (4900, 70)):  # lists_for: max(16, sqrt(n))
        flat = faiss.IndexFlatIP(8)
        vectors = rng.normal(size=(n, 8)).astype(np.float32)
        flat.add(vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
        approx = faiss_ann.ApproxIndex()
        approx.search(flat, vectors[0], 3)
        ivf = approx._synced(flat)
        assert (ivf.nlist, ivf.nprobe) == (lists, min(lists, 20))
        approx.set_probe_share(0.5)
        assert ivf.nprobe == max(4, lists // 2)
        approx.set_probe_share(None)
        assert ivf.nprobe == min(lists, 20)
    with pytest.raises(ValueError, match="probe_share"):
        faiss_ann.ApproxIndex(probe_share=0)
