"""A Milvus Lite search reads the passages it returns from the records kept beside the Milvus
file (milvus_records.py), never from Milvus: the same passages (text, page, offset, source) as
Milvus holds, through adds, replacements and removals; the records file catches up across
commits that did not rewrite it, is read again from Milvus when missing or damaged, and a
crashed commit's file is removed by the next writer. A writer that finishes (close, or its
process's exit) leaves every side file at its last commit, so the next open asks Milvus for no
passage rows. The records file itself is checked against a dict of the same records."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import HashEmbedder
from test_milvus_vectors import (  # noqa: F401 (small_threshold: a fixture)
    _commit,
    _Corpus,
    _killed,
    _reopen,
    small_threshold,
)

from ragspec.retrieval import backends
from ragspec.retrieval.milvus import sidefile as milvus_sidefile
from ragspec.retrieval.milvus import store as milvus_module
from ragspec.retrieval.milvus.records import MilvusRecords, Record
from ragspec.retrieval.passages import PassageDraft

REPO = Path(__file__).resolve().parents[3]


def _document(corpus: _Corpus, name: str, n: int = 100, version: int = 0):
    """A document whose passages have pages (or none), offsets and texts of every length,
    some of them not ASCII."""
    drafts = [PassageDraft(text=f"{name} v{version} passage {i} topic {i % 7} " + "é∑ " * (i % 5)
                           + "word " * (i % 13), page=None if i % 3 == 0 else 1 + i // 10,
                           start=i * 37) for i in range(n)]
    return (f"/docs/{name}", f"{version:02d}{abs(hash(name)):062d}"[:64], 1, drafts,
            corpus.vectors(n))


def _from_milvus(store, ids):
    """The passages `ids` as Milvus holds them (read by row key)."""
    return {pid: store._passage(row) for pid, row in store._by_key(ids, ["pid", "doc_id", "page",
                                                                         "start", "text"]).items()}


def _no_milvus_rows(store, monkeypatch) -> list:
    """Make every read of the passage collection fail; the list records the attempts."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the passage collection was read")

    monkeypatch.setattr(store, "_search", refuse)
    monkeypatch.setattr(store, "_by_key", refuse)
    return calls


def _answers(store) -> list:
    return [[(h.passage, h.score, h.fused) for h in store.retrieve(q, k=10, mode=mode).hits]
            for mode in ("dense", "hybrid") for q in store.embedder.table]


def test_searches_read_the_passages_milvus_holds_from_the_records_file(
        tmp_path, opened, small_threshold, monkeypatch):  # noqa: F811
    corpus = _Corpus(4)
    folder = opened(str(tmp_path / "folder"), corpus.queries)
    milvus = opened(f"milvus:{tmp_path}/m.db", corpus.queries)
    stores = (folder, milvus)
    _commit(stores, *(_document(corpus, f"doc{d}") for d in range(9)))  # below the threshold
    _commit(stores, *(_document(corpus, f"doc{d}") for d in range(9, 12)),
            "/docs/doc3", _document(corpus, "doc4", version=1))
    ids = sorted(p.id for p in milvus.passages())
    assert len(ids) == 1_100 and milvus._approximate()
    records = milvus._records.get(ids)
    assert {pid: milvus._passage_of(r) for pid, r in records.items()} == \
        _from_milvus(milvus, ids) == {p.id: p for p in folder.passages()}
    expected = _answers(folder)
    calls = _no_milvus_rows(milvus, monkeypatch)
    assert _answers(milvus) == expected and calls == []
    assert milvus._records.get([ids[0] + "x", ids[0][:-1]]) == {}  # not held: left out
    vector = corpus.queries.embed_array(["passage 3 topic 3"])[0]
    held = milvus._fetch(ids, vector)
    copies = milvus._copies
    monkeypatch.setattr(milvus, "_by_key", type(milvus)._by_key.__get__(milvus))
    monkeypatch.setattr(copies, "records", None)  # as on a server: rows from Milvus
    monkeypatch.setattr(copies, "vectors", None)
    assert milvus._fetch(ids, vector) == held


def test_the_records_file_catches_up_and_is_read_from_milvus_when_missing_or_damaged(
        tmp_path, opened, small_threshold, monkeypatch):  # noqa: F811
    monkeypatch.setattr(milvus_sidefile, "REWRITE_SHARE", 10.0)  # only the first commit writes
    corpus = _Corpus(5)
    where = f"milvus:{tmp_path}/c.db"
    milvus = opened(where, corpus.queries)
    _commit([milvus], *(_document(corpus, f"doc{d}") for d in range(10)))
    first = milvus._records.file
    _commit([milvus], *(_document(corpus, f"doc{d}") for d in range(10, 13)))
    _commit([milvus], "/docs/doc1", _document(corpus, "doc4", version=1))
    assert milvus._records.file == first
    ids = sorted(p.id for p in milvus.passages())
    expected = _from_milvus(milvus, ids)
    assert len(expected) == 1_200

    def held(store):
        return {pid: store._passage_of(r) for pid, r in store._records.get(ids).items()}

    assert held(milvus) == expected
    milvus = _reopen(opened, _killed(milvus), where, corpus)
    assert milvus._records.file == first  # the old file, the newer rows from Milvus
    assert held(milvus) == expected and len(milvus._records) == 1_200
    # A damaged text (the sizes intact): only the checksum can tell. Then a missing file.
    path = milvus._records.folder / first["file"]
    data = bytearray(path.read_bytes())
    data[-3:] = b"zzz"
    path.write_bytes(bytes(data))
    milvus = _reopen(opened, milvus, where, corpus)
    assert milvus._records.file is None and held(milvus) == expected
    path.unlink()
    milvus = _reopen(opened, milvus, where, corpus)
    assert held(milvus) == expected


def test_a_crashed_commit_leaves_the_named_records_file_and_the_next_writer_cleans_up(
        tmp_path, opened, small_threshold, monkeypatch):  # noqa: F811
    corpus = _Corpus(6)
    where = f"milvus:{tmp_path}/x.db"
    milvus = opened(where, corpus.queries)
    _commit([milvus], *(_document(corpus, f"doc{d}") for d in range(4)))
    named = milvus._records.file
    ids = sorted(p.id for p in milvus.passages())

    def crash(*args, **kwargs):
        raise OSError("simulated crash at the commit point")

    monkeypatch.setattr(milvus_module, "_commit_point", crash)
    with pytest.raises(OSError, match="simulated crash"):  # its records file is written
        _commit([milvus], *(_document(corpus, f"new{d}") for d in range(8)))
    monkeypatch.undo()
    assert sorted(p.name for p in milvus._records.folder.iterdir()) == \
        ["records-1.bin", "records-2.bin"]
    assert milvus._records.file == named and sorted(milvus._records.get(
        ids + [p.id for p in milvus.passages()])) == ids
    _commit([milvus], _document(corpus, "late", n=5))
    assert [p.name for p in milvus._records.folder.iterdir()] == ["records-1.bin"]


def test_a_finished_writer_leaves_side_files_that_open_without_reading_passage_rows(
        tmp_path, opened, small_threshold, monkeypatch):  # noqa: F811
    monkeypatch.setattr(milvus_sidefile, "REWRITE_SHARE", 10.0)  # commits leave files behind
    corpus = _Corpus(7)
    folder = opened(str(tmp_path / "folder"), corpus.queries)
    where = f"milvus:{tmp_path}/f.db"
    milvus = opened(where, corpus.queries)
    _commit((folder, milvus), *(_document(corpus, f"doc{d}") for d in range(8)))
    _commit((folder, milvus), *(_document(corpus, f"doc{d}") for d in range(8, 12)),
            "/docs/doc2")
    assert {c.file["gen"] for c in milvus._copies.files().values()} == {1}
    milvus.close()  # the writer finishes: every file of gen 2, named by the manifest
    assert {c.file["gen"] for c in milvus._copies.files().values()} == {2}
    assert [p.name for p in milvus._records.folder.iterdir()] == ["records-2.bin"]
    read = []
    real = milvus_module.MilvusStore._batches
    monkeypatch.setattr(milvus_module.MilvusStore, "_batches", lambda self, name, *a:
                        read.append(name) or real(self, name, *a))
    milvus = opened(where, corpus.queries)
    assert "ragspec" not in read and read  # the documents and the manifest only
    assert {c.file["gen"] for c in milvus._copies.files().values()} == {2}
    assert not milvus._copies.stale and _answers(milvus) == _answers(folder)
    # A crash while finishing leaves the gen-2 files named; the next writer removes its files.
    _commit((folder, milvus), _document(corpus, "late", n=10))

    def crash(*args, **kwargs):
        raise OSError("simulated crash at the commit point")

    assert milvus._wrote  # the commit registered the finish (close, or the process's exit)
    monkeypatch.setattr(milvus_module, "_commit_point", crash)
    milvus.close()  # logged, not raised
    assert sorted(p.name for p in milvus._records.folder.iterdir()) == \
        ["records-2.bin", "records-3.bin"]
    monkeypatch.undo()
    milvus = opened(where, corpus.queries)
    assert milvus._records.file["gen"] == 2 and _answers(milvus) == _answers(folder)
    _commit([milvus], "/docs/late")
    assert [p.name for p in milvus._records.folder.iterdir()] == ["records-2.bin"]


def test_the_records_file_holds_exactly_what_a_dict_of_the_records_holds(tmp_path):
    """Random documents added, replaced and removed, the file rewritten at random, read again:
    `get` always answers as a dict of the live records does."""
    rng = random.Random(3)
    oracle: dict[str, Record] = {}
    made: list[str] = ["000000000000-00000000-00000", "zz"]  # every id, live or not
    records = MilvusRecords(tmp_path)
    gen = 0

    def make(doc: str, version: int) -> list[Record]:
        n = rng.randint(1, 30)
        return [Record(f"{doc}-{version:08x}-{i:0{rng.choice([5, 5, 6])}d}",
                       rng.choice([0, 1, 7, 2**31 - 1]), rng.randint(0, 2**40),
                       "".join(rng.choice("ab é∑\n\"") for _ in range(rng.randint(1, 40))))
                for i in range(n)]

    for _ in range(60):
        gen += 1
        doc = f"{rng.randint(0, 15):012x}"
        removed = [doc] if rng.random() < 0.6 else []
        added = make(doc, gen) if rng.random() < 0.7 else []
        for pid in [p for p in oracle if p.startswith(doc + "-")] if removed else []:
            del oracle[pid]
        oracle.update((r.pid, r) for r in added)
        made += [r.pid for r in added]
        records.commit(added, removed, gen)
        if rng.random() < 0.3:
            entry = records.save(gen)
            records = MilvusRecords(tmp_path)
            live = {pid.rsplit("-", 2)[0]: entry["gen"] for pid in oracle}
            records.load(entry, len(oracle), live, newer=None, every=None)
            assert records.file == entry
        assert len(records) == len(oracle)
        assert records.get(rng.sample(made, len(made))) == oracle


def test_a_writer_process_that_exits_without_closing_finishes_at_exit(tmp_path):
    """`ragspec ingest` never closes its store: the process's exit brings the side files up to
    its last commit (commits here never rewrite them themselves)."""
    script = f"""
import sys
sys.path.insert(0, {str(REPO / "tests" / "support")!r})
from fakes import HashEmbedder
from ragspec.retrieval import backends
from ragspec.retrieval.milvus import sidefile as milvus_sidefile
from ragspec.retrieval.ingest import ingest_paths
milvus_sidefile.REWRITE_SHARE = 10.0
store = backends.open_index("milvus:{tmp_path}/i.db", HashEmbedder())
ingest_paths([{str(REPO / "data" / "corpus")!r}], store, commit_every=2)
print(store._gen, sorted(c.file["gen"] for c in store._copies.files().values()))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, check=True)
    gen, gens = done.stdout.split(maxsplit=1)
    assert int(gen) > 1 and gens.strip() == "[1, 1, 1]"  # the files lag when it exits
    store = backends.open_index(f"milvus:{tmp_path}/i.db", HashEmbedder())
    try:
        assert store._gen == int(gen) and not store._copies.stale
        assert {c.file["gen"] for c in store._copies.files().values()} == {int(gen)}
    finally:
        store.close()
