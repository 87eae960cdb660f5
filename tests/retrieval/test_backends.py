"""One suite, every index backend: the FAISS folder store and Milvus (Milvus Lite, the 2.5 line
with Milvus' own C++ core, from PyPI). Incremental ingest without duplicates, deletes, a crash
during a commit leaving the previous commit searchable, hybrid search, exact provenance, and the
same hits from both backends. HashEmbedder, no torch."""

from __future__ import annotations

import pytest
from fakes import HashEmbedder

from ragspec.retrieval import backends
from ragspec.retrieval.faiss import persist
from ragspec.retrieval.ingest import ingest_paths
from ragspec.retrieval.milvus import store as milvus_module
from ragspec.retrieval.readers.limits import IngestLimits
from ragspec.retrieval.readers.loaders import load_bytes

BACKENDS = ["faiss", "milvus"]

ALPHA = ("Alpha notes about queues and workers.\n\n"
         "Error E204 means the namespace quota is exhausted; raise the quota or wait.\n\n"
         "Workers poll the queue every 5 seconds and back off when it is empty.\n")
BETA = ("Beta guide to logging.\n\nSet max_log_size to 7432 bytes to rotate the log early.\n\n"
        "Old logs are compressed with gzip and kept for 14 days.\n")
GAMMA = ("Gamma: the scheduler runs jobs in priority order.\n\n"
         "A job that fails three times is parked in the dead-letter queue.\n")


def location(kind: str, tmp_path, name: str = "index") -> str:
    return str(tmp_path / name) if kind == "faiss" else f"milvus:{tmp_path / name}.db"


@pytest.fixture(params=BACKENDS)
def kind(request):
    return request.param


@pytest.fixture
def docs(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "alpha.txt").write_text(ALPHA)
    (folder / "beta.md").write_text(BETA)
    (folder / "gamma.txt").write_text(GAMMA)
    return folder


def _reopen(opened, store):
    store.close()
    return opened(store.index_dir if isinstance(store.index_dir, str) else str(store.index_dir))


def test_reingest_adds_nothing_and_a_changed_file_replaces_its_passages(kind, tmp_path, docs,
                                                                        opened):
    store = opened(location(kind, tmp_path))
    first = ingest_paths([docs], store)
    assert sorted(first.added) and first.passages_added == store.passage_count() > 0
    count = store.passage_count()
    again = ingest_paths([docs], store)
    assert again.added == [] and len(again.unchanged) == 3 and store.passage_count() == count
    (docs / "beta.md").write_text(BETA.replace("7432", "9100"))
    changed = ingest_paths([docs], store)
    assert [p.rsplit("/", 1)[-1] for p in changed.updated] == ["beta.md"]
    store = _reopen(opened, store)
    ids = [p.id for p in store.passages()]
    assert len(ids) == len(set(ids)) == store.passage_count() == count
    texts = " ".join(p.text for p in store.passages())
    assert "9100" in texts and "7432" not in texts
    assert len(store.documents()) == 3


def test_remove_deletes_every_passage_of_the_document(kind, tmp_path, docs, opened):
    store = opened(location(kind, tmp_path))
    ingest_paths([docs], store)
    gone = store.remove(str(docs / "alpha.txt"))
    store = _reopen(opened, store)
    assert all(p.doc_id != gone.doc_id for p in store.passages())
    assert sorted(d.source.rsplit("/", 1)[-1] for d in store.documents()) == ["beta.md",
                                                                              "gamma.txt"]
    assert store.passage_count() == len(store.passages())
    assert all("E204" not in h.passage.text for h in store.search("E204 quota", k=5,
                                                                    mode="hybrid"))


def _crash_at_commit(kind, monkeypatch):
    """Make the next commit fail at its commit point, after everything else was written."""
    def crash(*args, **kwargs):
        raise OSError("simulated crash at the commit point")

    if kind == "faiss":
        monkeypatch.setattr(persist.os, "replace", crash)
    else:
        monkeypatch.setattr(milvus_module, "_commit_point", crash)


def test_a_crash_during_a_commit_leaves_the_previous_commit_searchable(kind, tmp_path, docs,
                                                                     opened, monkeypatch):
    store = opened(location(kind, tmp_path))
    ingest_paths([docs / "alpha.txt", docs / "beta.md"], store)
    before = {h.passage.id for h in store.search("queue workers", k=10)}
    (docs / "beta.md").write_text(BETA.replace("7432", "9100"))
    _crash_at_commit(kind, monkeypatch)
    with pytest.raises(Exception, match="simulated crash"):
        ingest_paths([docs], store)  # gamma added, beta changed: neither may show
    monkeypatch.undo()
    for view in (store, _reopen(opened, store)):
        assert sorted(d.source.rsplit("/", 1)[-1] for d in view.documents()) == ["alpha.txt",
                                                                               "beta.md"]
        assert {h.passage.id for h in view.search("queue workers", k=10)} == before
        texts = " ".join(p.text for p in view.passages())
        assert "7432" in texts and "9100" not in texts and "dead-letter" not in texts
        store = view
    # The next writer cleans up: a commit of another file does not bring the crashed one's
    # passages to light, and ingesting everything again lands each passage once.
    (tmp_path / "delta.txt").write_text("Delta: a note about nothing else.\n")
    ingest_paths([tmp_path / "delta.txt"], store)
    store = _reopen(opened, store)
    texts = " ".join(p.text for p in store.passages())
    assert "Delta" in texts and "dead-letter" not in texts and "9100" not in texts
    ingest_paths([docs], store)
    store = _reopen(opened, store)
    ids = [p.id for p in store.passages()]
    assert len(ids) == len(set(ids)) == store.passage_count()
    assert "9100" in " ".join(p.text for p in store.passages())


def test_an_error_inside_the_writing_block_commits_nothing(kind, tmp_path, docs, opened):
    store = opened(location(kind, tmp_path))
    ingest_paths([docs / "alpha.txt"], store)
    with pytest.raises(RuntimeError, match="stop"), store.writing():
        store.remove(str(docs / "alpha.txt"))
        raise RuntimeError("stop")
    assert [d.source.rsplit("/", 1)[-1] for d in _reopen(opened, store).documents()] == \
        ["alpha.txt"]


def test_hybrid_search_finds_exact_codes_and_keeps_cosines(kind, tmp_path, docs, opened):
    store = opened(location(kind, tmp_path))
    ingest_paths([docs], store)
    hybrid = store.retrieve("E204", k=3, mode="hybrid")
    assert "E204" in hybrid.hits[0].passage.text and hybrid.hits[0].fused is not None
    embedder = HashEmbedder()
    for hit in hybrid.hits:
        cosine = float(embedder.embed_array([hit.passage.text])[0]
                       @ embedder.embed_array(["E204"])[0])
        assert hit.score == pytest.approx(cosine, abs=1e-5)
    assert "max_log_size" in store.search("max_log_size", k=1, mode="hybrid")[0].passage.text


def test_every_passage_points_at_its_exact_place_in_the_document(kind, tmp_path, docs, opened):
    store = opened(location(kind, tmp_path))
    ingest_paths([docs], store)
    for p in store.passages():
        path = next(docs.glob(p.source.rsplit("/", 1)[-1]))
        assert p.source == str(path.resolve())
        loaded = load_bytes(path.read_bytes(), path, IngestLimits())[0].page_content
        assert loaded[p.start : p.start + len(p.text)] == p.text
        assert p.doc_id == store.document_for_source(p.source).doc_id


def test_both_backends_return_the_same_hits(tmp_path, docs, opened):
    faiss_store = opened(location("faiss", tmp_path))
    milvus_store = opened(location("milvus", tmp_path))
    for store in (faiss_store, milvus_store):
        ingest_paths([docs], store)
    total = faiss_store.passage_count()
    assert milvus_store.passage_count() == total

    def ranked(result):
        # Equal cosines (to float32 rounding) may come in either order: compare by (score, id).
        return sorted((round(-h.score, 5), h.passage.id, h.passage) for h in result.hits)

    for query in ("queue workers", "E204", "max_log_size 7432", "dead-letter jobs", "gzip logs"):
        for mode in ("dense", "hybrid"):
            a = faiss_store.retrieve(query, k=total, mode=mode)
            b = milvus_store.retrieve(query, k=total, mode=mode)
            assert ranked(a) == ranked(b), (query, mode)
            assert a.best_score == pytest.approx(b.best_score, abs=1e-5)
    for query, word in (("E204", "E204"), ("max_log_size", "max_log_size"), ("gzip", "gzip")):
        tops = [s.search(query, k=1, mode="hybrid")[0].passage for s in (faiss_store, milvus_store)]
        assert tops[0] == tops[1] and word in tops[0].text


def test_milvus_locations_parse_and_bad_ones_say_the_accepted_forms(tmp_path):
    lite = backends.parse(f"milvus:{tmp_path}/x.db")
    assert lite.lite and lite.uri == str(tmp_path / "x.db") and lite.collection == "ragspec"
    server = backends.parse("milvus://db.internal:19530/team_docs")
    assert not server.lite and server.uri == "http://db.internal:19530"
    assert server.collection == "team_docs"
    assert backends.parse("milvus://db/c").uri == "http://db:19530"
    assert backends.parse("milvus+https://db:443/c").uri == "https://db:443"
    for bad in ("milvus:", "milvus://host/bad-name", "milvus://host"):
        with pytest.raises(ValueError, match="milvus:PATH.db|collection name|no file"):
            backends.parse(bad)
    assert not backends.is_milvus(str(tmp_path / "index"))


def test_opening_a_missing_milvus_lite_file_creates_nothing(tmp_path, opened):
    store = opened(f"milvus:{tmp_path}/new.db")
    assert store.passage_count() == 0 and store.documents() == []
    assert store.search("anything", k=2) == []
    assert not (tmp_path / "new.db").exists()


def test_current_commit_follows_each_commit_on_every_backend(kind, tmp_path, docs, opened):
    where = location(kind, tmp_path)
    assert backends.current_commit(where) is None
    store = opened(where)
    ingest_paths([docs / "alpha.txt"], store)
    first = backends.current_commit(where)
    assert first is not None and first == store._disk_commit()
    store.remove(str(docs / "alpha.txt"))
    assert backends.current_commit(where) not in (None, first)


def test_an_ivf_milvus_index_is_searched_and_remembered(tmp_path, docs, opened, monkeypatch):
    where = f"milvus:{tmp_path}/ivf.db"
    monkeypatch.setenv("RAGSPEC_MILVUS_INDEX", "ivf_flat")
    ingest_paths([docs], opened(where))
    monkeypatch.delenv("RAGSPEC_MILVUS_INDEX")
    store = opened(where)  # the collection keeps the index it was made with
    assert store._vector_index == "IVF_FLAT"
    assert "E204" in store.search("E204 quota", k=1, mode="hybrid")[0].passage.text
    monkeypatch.setenv("RAGSPEC_MILVUS_INDEX", "HNSW")
    with pytest.raises(ValueError, match="FLAT, IVF_FLAT"):
        opened(f"milvus:{tmp_path}/other.db")


def test_an_auto_milvus_index_turns_approximate_past_the_threshold(tmp_path, docs, opened,
                                                                   monkeypatch):
    from ragspec.retrieval.milvus import schema as milvus_schema

    where = f"milvus:{tmp_path}/auto.db"
    monkeypatch.setenv("RAGSPEC_MILVUS_INDEX", "auto")
    store = opened(where)
    ingest_paths([docs / "alpha.txt"], store)
    assert store._vector_index == "FLAT"
    monkeypatch.setattr(milvus_schema, "APPROX_THRESHOLD", store.passage_count() + 1)
    ingest_paths([docs], store)
    assert store._vector_index == "IVF_FLAT"
    described = store._connected().describe_index(store._names()[0], "vector")
    assert described["index_type"] == "IVF_FLAT"
    store = _reopen(opened, store)
    assert store._vector_index == "IVF_FLAT" and store._vector_policy == "AUTO"
    assert "E204" in store.search("E204 quota", k=1, mode="hybrid")[0].passage.text
