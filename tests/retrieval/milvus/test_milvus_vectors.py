"""Past faiss_ann.THRESHOLD passages a Milvus Lite index searches its vectors with the FAISS
folder's approximate index, kept beside the Milvus file (milvus_vectors.py): the same passages
and the same cosines as the FAISS folder holding the same vectors, through adds, replacements
and removals; the vector file catches up across commits that did not rewrite it, is read again
from Milvus when it is missing or damaged, and a crashed commit's file is removed by the next
writer. Below the threshold, with RAGSPEC_DENSE=exact, or on a Milvus server, Milvus searches
by itself."""

from __future__ import annotations

import atexit

import numpy as np
import pytest
from fakes import HashEmbedder

from ragspec.retrieval.faiss import ann as faiss_ann
from ragspec.retrieval.milvus import sidefile as milvus_sidefile
from ragspec.retrieval.milvus import store as milvus_module
from ragspec.retrieval.milvus.copies import LocalCopies
from ragspec.retrieval.milvus.location import MilvusLocation
from ragspec.retrieval.passages import PassageDraft

DIM = 48
THRESHOLD = 1_000


class _Queries(HashEmbedder):
    """HashEmbedder whose questions ("passage 3 topic 3", ...: words the passages hold, so that
    keywords find some) get vectors near the passages'."""

    def __init__(self, vectors: np.ndarray) -> None:
        super().__init__(dim=DIM)
        self.table = {f"passage {i} topic {i % 7}": v for i, v in enumerate(vectors)}

    def embed_array(self, texts):
        return np.stack([self.table[t] if t in self.table else HashEmbedder.embed_array(
            self, [t])[0] for t in texts])


class _Corpus:
    """Documents of clustered unit vectors (embeddings cluster by topic), made the same for
    every store."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.centres = self.rng.normal(0, 1, (30, DIM))
        self.queries = _Queries(self.vectors(30))

    def vectors(self, n: int) -> np.ndarray:
        out = self.centres[self.rng.integers(0, len(self.centres), n)] + \
            self.rng.normal(0, 0.35, (n, DIM))
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)

    def document(self, name: str, n: int = 100, version: int = 0):
        vectors = self.vectors(n)
        drafts = [PassageDraft(text=f"{name} v{version} passage {i} topic {i % 7}", page=None,
                               start=i * 10) for i in range(n)]
        return (f"/docs/{name}", f"{version:02d}{abs(hash(name)):062d}"[:64], 1, drafts, vectors)


@pytest.fixture
def small_threshold(monkeypatch):
    monkeypatch.setattr(faiss_ann, "THRESHOLD", THRESHOLD)
    monkeypatch.setattr(faiss_ann, "MIN_CANDIDATES", 50)


def _commit(stores, *changes) -> None:
    """Apply the same changes to every store in one commit each: a tuple is a document to add,
    a string a document to remove."""
    for store in stores:
        with store.writing():
            for change in changes:
                if isinstance(change, str):
                    store.remove(change)
                else:
                    store.add_document(*change)


def _answers(store, modes=("dense", "hybrid")) -> list:
    """Every question's hits (passage, cosine, fused score) in each mode, k = 10."""
    return [[(h.passage, h.score, h.fused) for h in store.retrieve(q, k=10, mode=mode).hits]
            for mode in modes for q in store.embedder.table]


def _milvus_searches(store, monkeypatch) -> list:
    calls = []
    search = store._search
    monkeypatch.setattr(store, "_search", lambda *a, **kw: calls.append(a[0]) or search(*a, **kw))
    return calls


def test_past_the_threshold_milvus_lite_gives_the_folders_passages_and_cosines(
        tmp_path, opened, small_threshold, monkeypatch):
    corpus = _Corpus(0)
    folder = opened(str(tmp_path / "folder"), corpus.queries)
    milvus = opened(f"milvus:{tmp_path}/m.db", corpus.queries)
    stores = (folder, milvus)
    _commit(stores, *(corpus.document(f"doc{d}") for d in range(8)))
    _commit(stores, *(corpus.document(f"doc{d}") for d in range(8, 14)))
    assert milvus.passage_count() == 1_400 and milvus._approximate()
    calls = _milvus_searches(milvus, monkeypatch)
    assert _answers(milvus) == _answers(folder)
    assert calls == []  # Milvus only fetched rows by key
    assert milvus._vectors.approx._ivf is not None
    # Trained; now rows move: a document removed, one replaced, one added in one commit.
    _commit(stores, "/docs/doc2", corpus.document("doc5", version=1), corpus.document("late"))
    assert _answers(milvus) == _answers(folder)
    held = {p.id for p in milvus.passages()}
    assert set(milvus._vectors.pids) == held and len(held) == 1_400
    assert not any("doc2 " in p.text or "doc5 v0" in p.text for p in milvus.passages())


def test_below_the_threshold_with_exact_asked_or_on_a_server_milvus_searches_itself(
        tmp_path, opened, small_threshold, monkeypatch):
    corpus = _Corpus(1)
    folder = opened(str(tmp_path / "folder"), corpus.queries)
    milvus = opened(f"milvus:{tmp_path}/m.db", corpus.queries)
    _commit((folder, milvus), *(corpus.document(f"doc{d}") for d in range(9)))
    calls = _milvus_searches(milvus, monkeypatch)
    assert not milvus._approximate() and len(milvus._vectors) == 900
    assert _answers(milvus, ["dense"]) == _answers(folder, ["dense"])
    assert calls and set(calls) == {"vector"}
    _commit((folder, milvus), corpus.document("doc9"), corpus.document("doc10"))
    monkeypatch.setenv(faiss_ann.MODE_ENV, "exact")
    calls.clear()
    assert not milvus._approximate()
    assert _answers(milvus, ["dense"]) == _answers(folder, ["dense"])
    assert len(calls) == len(corpus.queries.table)
    server = MilvusLocation(uri="http://localhost:19530", collection="ragspec",
                            spec="milvus://localhost:19530/ragspec")
    assert server.vectors_folder() is None and LocalCopies(server).vectors is None
    assert server.records_folder() is None and LocalCopies(server).records is None


def test_the_vector_file_catches_up_and_is_read_from_milvus_when_missing_or_damaged(
        tmp_path, opened, small_threshold, monkeypatch):
    monkeypatch.setattr(milvus_sidefile, "REWRITE_SHARE", 10.0)  # only the first commit writes
    corpus = _Corpus(2)
    folder = opened(str(tmp_path / "folder"), corpus.queries)
    where = f"milvus:{tmp_path}/c.db"
    milvus = opened(where, corpus.queries)
    stores = (folder, milvus)
    _commit(stores, *(corpus.document(f"doc{d}") for d in range(10)))
    first = milvus._vectors.file
    _commit(stores, *(corpus.document(f"doc{d}") for d in range(10, 14)))
    _commit(stores, "/docs/doc1", corpus.document("doc4", version=1))
    assert milvus._vectors.file == first and milvus._approximate()
    expected = _answers(folder)
    milvus = _reopen(opened, _killed(milvus), where, corpus)
    assert milvus._vectors.file == first  # the old file, the newer rows from Milvus
    assert sorted(milvus._vectors.pids) == sorted(p.id for p in folder.passages())
    assert _answers(milvus) == expected
    # Damaged rows (the ids intact): only the checksum can tell. Then a missing file.
    path = milvus._vectors.folder / first["file"]
    data = bytearray(path.read_bytes())
    data[-DIM * 4 :] = np.ones(DIM, np.float32).tobytes()
    path.write_bytes(bytes(data))
    milvus = _reopen(opened, milvus, where, corpus)
    assert milvus._vectors.file is None and len(milvus._vectors) == 1_300
    assert _answers(milvus) == expected
    path.unlink()
    milvus = _reopen(opened, milvus, where, corpus)
    assert _answers(milvus) == expected
    _commit([milvus], corpus.document("after"))  # the next commit writes a file again
    assert milvus._vectors.file["gen"] == 4
    assert [p.name for p in milvus._vectors.folder.iterdir()] == ["vectors-4.bin"]


def test_a_crashed_commit_leaves_the_named_vector_file_and_the_next_writer_cleans_up(
        tmp_path, opened, small_threshold, monkeypatch):
    corpus = _Corpus(3)
    folder = opened(str(tmp_path / "folder"), corpus.queries)
    where = f"milvus:{tmp_path}/x.db"
    milvus = opened(where, corpus.queries)
    _commit((folder, milvus), *(corpus.document(f"doc{d}") for d in range(12)))
    named, expected = milvus._vectors.file, _answers(folder)
    assert milvus._approximate()

    def crash(*args, **kwargs):
        raise OSError("simulated crash at the commit point")

    monkeypatch.setattr(milvus_module, "_commit_point", crash)
    with pytest.raises(OSError, match="simulated crash"):  # its vector file is written
        _commit([milvus], *(corpus.document(f"new{d}") for d in range(8)))
    monkeypatch.setattr(milvus_module, "_commit_point", _commit_point)
    files = sorted(p.name for p in milvus._vectors.folder.iterdir())
    assert files == ["vectors-1.bin", "vectors-2.bin"]
    assert milvus._vectors.file == named and len(milvus._vectors) == 1_200
    assert _answers(milvus) == expected
    _commit((folder, milvus), corpus.document("late"))
    assert [p.name for p in milvus._vectors.folder.iterdir()] == \
        [milvus._vectors.file["file"]] == ["vectors-1.bin"]  # not due: the crashed one gone
    assert _answers(_reopen(opened, milvus, where, corpus)) == _answers(folder)


_commit_point = milvus_module._commit_point


def _killed(store):
    """The store as a writer killed after its commits leaves it: it never finishes (never
    brings its side files up to its last commit)."""
    atexit.unregister(store.finish)
    store._wrote = False
    return store


def _reopen(opened, store, where, corpus):
    store.close()
    return opened(where, corpus.queries)
