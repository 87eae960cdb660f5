"""Appending commits (persist.append_snapshot): an exception or a kill -9 at each step of one
keeps the old index or the new, never a mix; the keyword statistics after appending commits,
deletes and re-ingests equal a full rebuild; the C tokenise+count path (bm25_native.c) gives
the Python tokenizer's tokens and counts on real text. HashEmbedder, no torch."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fakes import HashEmbedder

from ragspec.retrieval.bm25.index import BM25Index, tokenize
from ragspec.retrieval.bm25.native import scorer
from ragspec.retrieval.faiss import persist
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.passages import PassageDraft

REPO = Path(__file__).resolve().parents[2]


def real_texts(limit: int = 600, words: int = 60) -> list[str]:
    """Passages of documentation nobody here wrote: copyright files and manual pages."""
    out: list[str] = []
    paths = sorted(Path("/usr/share/doc").glob("*/copyright"))[:120] + \
        sorted(Path("/usr/share/man/man1").glob("*.gz"))[:120]
    for path in paths:
        try:
            raw = path.read_bytes()
            raw = gzip.decompress(raw) if path.suffix == ".gz" else raw
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        split = raw.decode("utf-8", errors="replace").split(" ")
        out += [" ".join(split[i : i + words]) for i in range(0, len(split), words)]
    out = [t for t in out if t.strip()]
    if len(out) < 50:
        pytest.skip("too little installed documentation to test on")
    return out[:limit]


def _add(store: PassageStore, name: str, texts: list[str], version: str = "1") -> None:
    drafts = [PassageDraft(text=t, page=None, start=0) for t in texts]
    sha = hashlib.sha256(f"{name}:{version}".encode()).hexdigest()
    store.add_document(f"/docs/{name}", sha, 1, drafts, store.embedder.embed_array(texts))


def _state(store: PassageStore) -> tuple:
    """Everything a commit holds but the ingestion times: documents, passages in row order,
    the vectors, the keyword index's bytes."""
    passages = store.passages()
    order = [p.id for p in passages]
    index = store._lc.index if store._lc is not None else None
    vectors = index.reconstruct_n(0, index.ntotal).tobytes() if index is not None else b""
    return ([(d.doc_id, d.sha256, d.passages) for d in store.documents()],
            [(p.id, p.text) for p in passages], vectors, store._keywords.to_bytes(order))


def _rebuilt_keywords(store: PassageStore) -> bytes:
    passages = store.passages()
    return BM25Index.build([(p.id, p.text) for p in passages]).to_bytes([p.id for p in passages])


# -- statistics after appending commits --------------------------------------------------------


def test_appended_keywords_and_vectors_equal_a_full_rebuild_through_deletes_and_reingests(
        tmp_path):
    texts = real_texts() + ["Straße café ΣΑΣ naïve", "İstanbul ǅ Ⅻ ① x_1"]
    chunks = [texts[i : i + 20] for i in range(0, len(texts), 20)]
    appending = PassageStore.open(tmp_path / "appending", HashEmbedder())
    PassageStore.appending = True
    reference = PassageStore.open(tmp_path / "reference", HashEmbedder())

    def commit(step):
        for store, append in ((appending, True), (reference, False)):
            PassageStore.appending = append
            try:
                with store.writing():
                    step(store)
            finally:
                PassageStore.appending = True

    for first in range(0, 12, 3):  # four commits of three documents: one full, three appended
        commit(lambda s, first=first: [_add(s, f"d{j}", chunks[j]) for j in (first, first + 1,
                                                                            first + 2)])
    log = persist._read_log(tmp_path / "appending" / persist.APPEND_NAME)
    assert log is not None and len(log["extents"]) == 3
    assert not (tmp_path / "reference" / persist.APPEND_NAME).exists()

    def check():
        reopened = PassageStore.open(tmp_path / "appending", HashEmbedder())
        assert _state(reopened) == _state(appending) == _state(reference)
        assert _state(reopened)[3] == _rebuilt_keywords(reopened)
        for query in ("copyright license", "GNU General Public", "the file", "straße"):
            got = reopened.search(query, k=5, mode="hybrid")
            assert got == reference.search(query, k=5, mode="hybrid")
            assert reopened._keywords.top(query, 20) == \
                reopened._keywords.top_exhaustive(query, 20)
        return reopened

    check()
    # A removal and a re-ingest (a changed file) cannot be appended: a full commit folds the
    # appends into the base; later additions append again.
    commit(lambda s: s.remove("/docs/d4"))
    assert not (tmp_path / "appending" / persist.APPEND_NAME).exists()
    check()
    commit(lambda s: _add(s, "d7", chunks[7][:10], version="2"))
    assert not (tmp_path / "appending" / persist.APPEND_NAME).exists()
    check()
    for j in range(12, min(len(chunks), 16)):
        commit(lambda s, j=j: _add(s, f"d{j}", chunks[j]))
    assert len(persist._read_log(tmp_path / "appending" / persist.APPEND_NAME)["extents"]) >= 2
    reopened = check()
    with reopened.writing():  # a reopened store appends on top of what it read
        _add(reopened, "late", ["late addition about copyright"])
    PassageStore.appending = False
    try:
        with reference.writing():
            _add(reference, "late", ["late addition about copyright"])
    finally:
        PassageStore.appending = True
    appending = reopened
    check()


SIZES = [0, 2, 4, 6, 8, 0, 2, 4]


def test_appends_past_the_base_and_compact_min_become_a_full_commit(tmp_path, monkeypatch):
    import ragspec.retrieval.faiss.store as store_module

    monkeypatch.setattr(store_module, "COMPACT_MIN", 3)
    store = PassageStore.open(tmp_path / "index", HashEmbedder())
    sizes = []
    for i in range(8):
        with store.writing():
            _add(store, f"d{i}", [f"passage {i} number {j}" for j in range(2)])
        log = persist._read_log(tmp_path / "index" / persist.APPEND_NAME)
        sizes.append(0 if log is None else sum(e["passages"] for e in log["extents"]))
    # base 2, then appends while within max(4 * base, 3) passages, then a full commit (base 12)
    assert sizes == SIZES
    assert _state(PassageStore.open(tmp_path / "index", HashEmbedder())) == _state(store)


# -- a crash at each step of an appending commit -----------------------------------------------

# The steps of one appending commit, in order: fsync of append.f32, append.jsonl,
# append.keywords, append.json.new; the rename of append.json; the directory's fsync.
STEPS = ["fsync vectors", "fsync lines", "fsync keywords", "fsync record", "rename record",
         "fsync folder"]
COMMITTED_FROM = STEPS.index("fsync folder")  # a crash at that step (or after) keeps the new


def _build_old(path: Path) -> None:
    texts = real_texts(200)
    store = PassageStore.open(path, HashEmbedder())
    with store.writing():
        _add(store, "a", texts[:40])
    with store.writing():  # one appending commit already there: the crash is on top of it
        _add(store, "b", texts[40:80])


def _make_new(store: PassageStore) -> None:
    texts = real_texts(200)
    _add(store, "c", texts[80:120])
    _add(store, "d", texts[120:130])


@pytest.fixture(scope="module")
def old_and_new(tmp_path_factory):
    base = tmp_path_factory.mktemp("append-states")
    _build_old(base / "old")
    old = _state(PassageStore.open(base / "old", HashEmbedder()))
    shutil.copytree(base / "old", base / "new")
    store = PassageStore.open(base / "new", HashEmbedder())
    with store.writing():
        _make_new(store)
    assert persist._read_log(base / "new" / persist.APPEND_NAME)["extents"].__len__() == 2
    return base / "old", old, _state(PassageStore.open(base / "new", HashEmbedder()))


def _hooked(monkeypatch, at: int, action) -> None:
    """Run `action()` instead of the `at`-th step (STEPS) of the next commit."""
    calls = []
    real_fsync, real_replace, real_fsync_dir = os.fsync, os.replace, persist.fsync_dir

    def step(real):
        def run(*args):
            calls.append(1)
            if len(calls) - 1 == at:
                action()
            return real(*args)
        return run

    monkeypatch.setattr(persist.os, "fsync", step(real_fsync))
    monkeypatch.setattr(persist.os, "replace", step(real_replace))
    monkeypatch.setattr(persist, "fsync_dir", step(real_fsync_dir))


def _finish_and_compare(index: Path, expected: tuple) -> None:
    """The next writer clears what the crash left and its commit is like any other."""
    store = PassageStore.open(index, HashEmbedder())
    with store.writing():
        _add(store, "after", ["after the crash, copyright"])
    reopened = PassageStore.open(index, HashEmbedder())
    assert _state(reopened) == _state(store)
    assert _state(reopened)[3] == _rebuilt_keywords(reopened)
    assert len(reopened.documents()) == len(expected[0]) + 1


@pytest.mark.parametrize("at", range(len(STEPS)), ids=STEPS)
def test_an_exception_at_each_step_of_an_appending_commit_keeps_old_or_new(
        tmp_path, monkeypatch, old_and_new, at):
    source, old, new = old_and_new
    index = tmp_path / "index"
    shutil.copytree(source, index)

    def power_cut():
        raise KeyboardInterrupt("power cut")

    _hooked(monkeypatch, at, power_cut)
    store = PassageStore.open(index, HashEmbedder())
    with pytest.raises(KeyboardInterrupt):
        with store.writing():
            _make_new(store)
    monkeypatch.undo()
    seen = _state(PassageStore.open(index, HashEmbedder()))
    assert seen == (new if at >= COMMITTED_FROM else old)
    assert _state(store) == seen  # the writer reloaded what is on disk
    _finish_and_compare(index, new if at >= COMMITTED_FROM else old)


KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[3])
    from fakes import HashEmbedder
    import test_retrieval_append as t
    from ragspec.retrieval.faiss.store import PassageStore

    class Patch:  # monkeypatch without pytest
        def setattr(self, owner, name, value):
            setattr(owner, name, value)

    t._hooked(Patch(), int(sys.argv[2]), lambda: os.kill(os.getpid(), signal.SIGKILL))
    store = PassageStore.open(sys.argv[1], HashEmbedder())
    with store.writing():
        t._make_new(store)
    print("survived")
""")


def _kill_and_compare(index: Path, states: tuple, at: int, committed_from: int) -> None:
    """A writer killed (-9) at the `at`-th step of its commit of _make_new into a copy of the
    old state (states: old folder, old state, new state) leaves the old state or the new, and
    the next writer commits as usual."""
    source, old, new = states
    shutil.copytree(source, index)
    tests = REPO / "tests" / "support"  # the fakes
    done = subprocess.run([sys.executable, "-c", KILLER, str(index), str(at), str(tests)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(REPO), str(tests), str(Path(__file__).resolve().parent)])})
    assert done.returncode == -signal.SIGKILL, done.stderr
    seen = _state(PassageStore.open(index, HashEmbedder()))
    assert seen == (new if at >= committed_from else old)
    _finish_and_compare(index, new if at >= committed_from else old)


@pytest.mark.parametrize("at", range(len(STEPS)), ids=STEPS)
def test_kill_9_at_each_step_of_an_appending_commit_keeps_old_or_new(tmp_path, old_and_new, at):
    _kill_and_compare(tmp_path / "index", old_and_new, at, COMMITTED_FROM)


def test_a_damaged_append_file_is_reported_not_read(tmp_path):
    index = tmp_path / "index"
    _build_old(index)
    path = index / persist.APPEND_LINES
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(persist.IndexCorruptError, match="append.jsonl"):
        PassageStore.open(index, HashEmbedder())


# -- the first appending commit on a base, and a lost record ------------------------------------

# The first appending commit on a base writes an empty record first, so that append data never
# lies in the folder without a record (which would be a record lost, below). The folder's
# fsync after that rename counts twice here: the hooked fsync_dir, then the os.fsync inside it.
FIRST_STEPS = ["fsync empty record", "rename empty record", "fsync folder (empty record)",
               "its os.fsync"] + STEPS
FIRST_COMMITTED_FROM = FIRST_STEPS.index("fsync folder")


@pytest.fixture(scope="module")
def base_and_first(tmp_path_factory):
    """A base of one full commit and no appends; the state after one appending commit on it."""
    base = tmp_path_factory.mktemp("first-append")
    texts = real_texts(200)
    store = PassageStore.open(base / "old", HashEmbedder())
    with store.writing():
        _add(store, "a", texts[:40])
        _add(store, "b", texts[40:80])
    assert not (base / "old" / persist.APPEND_NAME).exists()
    old = _state(PassageStore.open(base / "old", HashEmbedder()))
    shutil.copytree(base / "old", base / "new")
    store = PassageStore.open(base / "new", HashEmbedder())
    with store.writing():
        _make_new(store)
    assert len(persist._read_log(base / "new" / persist.APPEND_NAME)["extents"]) == 1
    return base / "old", old, _state(PassageStore.open(base / "new", HashEmbedder()))


@pytest.mark.parametrize("at", range(len(FIRST_STEPS)), ids=FIRST_STEPS)
def test_kill_9_at_each_step_of_the_first_appending_commit_keeps_old_or_new(
        tmp_path, base_and_first, at):
    # before the empty record, a kill between the data's fsync and the record's rename left
    # append data with no record: a state no reader could tell from a lost record
    _kill_and_compare(tmp_path / "index", base_and_first, at, FIRST_COMMITTED_FROM)


def test_a_deleted_append_record_is_refused_as_damaged_by_readers_and_writers(tmp_path):
    index = tmp_path / "index"
    _build_old(index)  # a base and one appending commit
    store = PassageStore.open(index, HashEmbedder())  # a writer opened before the loss
    (index / persist.APPEND_NAME).unlink()
    before = {p.name: p.read_bytes() for p in index.iterdir() if p.is_file()}
    # before: read as the base alone, the appended passages gone without a word (and the next
    # writer deleted their files)
    with pytest.raises(persist.IndexCorruptError, match="append.json is missing") as caught:
        PassageStore.open(index, HashEmbedder())
    assert "\n" not in str(caught.value) and str(index) in str(caught.value)
    with pytest.raises(persist.IndexCorruptError, match="append.json is missing"):
        with store.writing():
            _add(store, "later", ["a later document"])
    assert {p.name: p.read_bytes() for p in index.iterdir() if p.is_file()} == before


# -- the C tokenizer against the Python one ---------------------------------------------------

EDGES = ["", "   ", "___", "a\x00B", "Hello-World_42 x", "x" * 3000 + " Y", "E204: max_log_size=7432",
         "".join(chr(c) for c in range(128)), "\t\n\r\x0b\x0cTAB", "9" * 40 + "_" + "Z" * 40]


def test_the_c_tokenizer_gives_the_python_tokens_and_counts_on_real_text():
    native = scorer()
    if native is None:
        pytest.skip("no C compiler: the Python tokenizer is the only one")
    texts = [t for t in real_texts(2000) + EDGES if t.isascii()]
    vocabulary = native.vocabulary()
    tokens: list[str] = []
    for i in range(0, len(texts), 37):
        batch = texts[i : i + 37]
        counted = vocabulary.count(batch, np.arange(len(batch)))
        tokens += counted.new_tokens
        assert len(vocabulary) == len(tokens)
        for row, text in enumerate(batch):
            mine = Counter({tokens[t]: int(c) for t, r, c in zip(
                counted.terms, counted.rows, counted.counts, strict=True) if r == row})
            expected = Counter(tokenize(text))
            assert mine == expected, text[:80]
            assert counted.lengths[row] == sum(expected.values())
            assert counted.distinct[row] == len(expected)


def test_keyword_index_bytes_are_the_same_with_and_without_the_c_tokenizer(monkeypatch):
    if scorer() is None:
        pytest.skip("no C compiler: the Python tokenizer is the only one")
    texts = real_texts(2000) + EDGES[1:] + [
        "Straße café ΣΑΣ", "ǅungla İ Ⅻ ①", "naïve ascii mix", "ΟΔΟΣ ΟΔΟΣ. ΟΔΟΣ,ΟΔΟΣ",
        "the\u00a0THE the… l'été the_été x\u2028y", "ΣΑΣ.the ΣΑΣ the", "Σ", "aΣ bΣc ΣΣ"]
    pairs = [(f"p{i}", t) for i, t in enumerate(texts)]
    built = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("RAGSPEC_NATIVE_TOKENIZE", flag)
        index = BM25Index()
        for i in range(0, len(pairs), 64):
            index.add_many(pairs[i : i + 64])
        assert (index._native_vocab is not None) == (flag == "1")
        built[flag] = index.to_bytes([pid for pid, _ in pairs])
    assert built["0"] == built["1"]


def test_passage_lines_are_the_characters_json_dumps_writes():
    # The fast passage line (persist._passage_line) against `_line`, json.dumps itself, on
    # real text and on what JSON must escape; other types and keys take json.dumps.
    texts = real_texts(300) + EDGES + ['quo"te \\ back\\', "\u2028\u2029 \ud7ff \U0001f600",
                                       "ünï 中文 ΣΑΣ", "\x7f\x80\x9f"]
    cases = [{"id": f"d-{i}\"", "doc_id": text[:5], "page": page, "start": start, "text": text}
             for i, text in enumerate(texts)
             for page, start in ((None, 0), (1, 17), (2**70, 2**40))]
    cases += [{"id": "x", "doc_id": "y", "page": True, "start": 0, "text": "t"},
              {"id": "x", "doc_id": "y", "page": None, "start": 1.5, "text": "t"},
              {"id": "x", "doc_id": "y", "start": 0, "text": "t"},
              {"doc_id": "y", "id": "x", "page": None, "start": 0, "text": "t"}]
    for case in cases:
        assert persist._passage_line(case) == persist._line({"type": "passage", **case})
