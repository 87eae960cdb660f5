"""Keyword ranking is the same whichever backend holds the passages: a Milvus index keeps
ragspec's BM25 in a file beside it (milvus_keywords.py). The pipeline's top k for the 24
questions of data/ are the same passages in the same order from the FAISS folder and Milvus
Lite; the file catches up across commits that did not rewrite it, is rebuilt from the texts when
it is missing or damaged, and a crashed commit leaves no file behind after the next writer."""

from __future__ import annotations

import atexit
import json
from pathlib import Path

import pytest
from fakes import HashEmbedder

from ragspec.retrieval.bm25.index import BM25Index
from ragspec.retrieval.ingest import ingest_paths
from ragspec.retrieval.milvus import sidefile as milvus_sidefile
from ragspec.retrieval.milvus import store as milvus_module
from ragspec.search import retrieve

REPO = Path(__file__).resolve().parents[3]
QUESTIONS = [json.loads(line)["question"]
             for line in (REPO / "data" / "questions.jsonl").read_text().splitlines() if line]


def _fresh_top(store, query: str, k: int = 50) -> list[str]:
    """The BM25 ranking of an index built at once from what the store holds now."""
    index = BM25Index.build((p.id, p.text) for p in store.passages())
    return [pid for pid, _ in index.top(query, k)]


def test_the_pipelines_hybrid_passages_are_the_same_on_both_backends(tmp_path, opened):
    folder = opened(str(tmp_path / "index"))
    milvus = opened(f"milvus:{tmp_path}/index.db")
    for store in (folder, milvus):
        ingest_paths([REPO / "data" / "corpus"], store)
    assert len(QUESTIONS) == 24
    for question in QUESTIONS:
        assert milvus._keyword_ids(question, 50) == folder._keyword_ids(question, 50)
        a = retrieve(folder, question, k=4, search="hybrid")
        b = retrieve(milvus, question, k=4, search="hybrid")
        assert [h.passage for h in a.hits] == [h.passage for h in b.hits], question
        assert [h.fused for h in a.hits] == [h.fused for h in b.hits]


def _corpus(tmp_path: Path, n: int) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    for i in range(n):
        (docs / f"note{i:02d}.txt").write_text(
            f"Note {i} about queue {i % 3} and worker {i % 5}.\n\nError E{200 + i} means quota "
            f"{i} is gone; " + "retry later. " * (i % 4) + "\n")
    return docs


def test_the_keyword_file_catches_up_across_commits_that_did_not_rewrite_it(
        tmp_path, opened, monkeypatch):
    monkeypatch.setattr(milvus_sidefile, "REWRITE_SHARE", 10.0)  # only the first commit writes
    docs = _corpus(tmp_path, 12)
    where = f"milvus:{tmp_path}/k.db"
    store = opened(where)
    ingest_paths(sorted(docs.iterdir())[:6], store)
    first = store._keywords.file
    ingest_paths(sorted(docs.iterdir()), store)  # six more, no rewrite
    (docs / "note01.txt").write_text("Note one, rewritten: the quota error is E999 now.\n")
    ingest_paths([docs / "note01.txt"], store)  # a replaced document
    store.remove(str(docs / "note02.txt"))  # a removed one
    assert store._keywords.file == first
    queries = ["quota error E999", "queue 1 worker 2", "E203 retry", "note about E205"]
    expected = {q: _fresh_top(store, q) for q in queries}
    store = _reopen(opened, _killed(store), where)
    assert store._keywords.file == first  # read from the old file plus the newer rows
    assert {q: store._keyword_ids(q, 50) for q in queries} == expected
    # A damaged file, then a missing one: rebuilt from the texts, same ranking.
    path = store.location.keywords_folder() / first["file"]
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    store = _reopen(opened, store, where)
    assert store._keywords.file is None
    assert {q: store._keyword_ids(q, 50) for q in queries} == expected
    path.unlink()
    store = _reopen(opened, store, where)
    assert {q: store._keyword_ids(q, 50) for q in queries} == expected


def _killed(store):
    """The store as a writer killed after its commits leaves it: it never finishes."""
    atexit.unregister(store.finish)
    store._wrote = False
    return store


def _reopen(opened, store, where):
    store.close()
    return opened(where)


def test_a_crashed_commit_leaves_the_named_keyword_file_and_the_next_writer_cleans_up(
        tmp_path, opened, monkeypatch):
    docs = _corpus(tmp_path, 6)
    where = f"milvus:{tmp_path}/c.db"
    store = opened(where)
    ingest_paths(sorted(docs.iterdir())[:2], store)
    named = store._keywords.file
    folder = store.location.keywords_folder()

    def crash(*args, **kwargs):
        raise OSError("simulated crash at the commit point")

    monkeypatch.setattr(milvus_module, "_commit_point", crash)
    with pytest.raises(OSError, match="simulated crash"):
        ingest_paths(sorted(docs.iterdir()), store)  # its keyword file is written, not named
    monkeypatch.undo()
    assert len(list(folder.glob("gen-*.npz"))) == 2
    assert store._keywords.file == named and len(store._keywords.index) == store.passage_count()
    assert store._keyword_ids("E204", 5) == []  # a passage of the crashed commit
    (tmp_path / "late.txt").write_text("A late note.\n")
    ingest_paths([tmp_path / "late.txt"], store)
    assert [p.name for p in folder.glob("gen-*.npz")] == [store._keywords.file["file"]]
    assert store._keyword_ids("E204", 5) == []
    assert _reopen(opened, store, where)._keyword_ids("late note", 5) == \
        _fresh_top(store, "late note", 5)


def test_passages_found_by_keywords_alone_come_back_with_their_cosines(tmp_path, opened):
    """A hybrid hit outside the dense top 50 is fetched by id (by row key on Milvus: passage id
    and the generation of its document's visible version): every current passage comes back
    with the FAISS folder's passage and cosine, a replaced version's old ids do not."""
    docs = _corpus(tmp_path, 8)
    folder = opened(str(tmp_path / "index"))
    milvus = opened(f"milvus:{tmp_path}/f.db")
    for store in (folder, milvus):
        ingest_paths(sorted(docs.iterdir()), store)
    old = {p.id for p in milvus.passages() if "Note 3 " in p.text}
    (docs / "note03.txt").write_text("Note three, replaced: the quota error is E777 now.\n")
    for store in (folder, milvus):
        ingest_paths([docs / "note03.txt"], store)  # a second generation of one document
    ids = sorted(p.id for p in folder.passages())
    assert ids == sorted(p.id for p in milvus.passages()) and old and not old & set(ids)
    vector = HashEmbedder().embed_array(["which quota error"])[0]
    theirs, ours = folder._fetch(ids, vector), milvus._fetch(ids, vector)
    assert sorted(ours) == ids
    for pid in ids:
        assert ours[pid][0] == theirs[pid][0]
        assert ours[pid][1] == pytest.approx(theirs[pid][1], abs=1e-6)
    assert milvus._fetch(sorted(old), vector) == {}
