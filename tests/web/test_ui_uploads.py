"""Uploads stored by content: two different files with one name are two documents, the same
bytes twice are one; hostile names (300 bytes, NUL, newlines, path separators) stay inside the
uploads folder; a symbolic link in the way is refused, not followed; the file is written under
the index's write lock, atomically; a failed or interrupted ingest leaves the disk as it was."""

from __future__ import annotations

import html
import os
import threading
from pathlib import Path

import pytest
from fakes import HashEmbedder
from filelock import FileLock, Timeout
from ui_support import fast_page, new_session, texts

from ragspec.retrieval.faiss import persist
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.web import uploads

NOTES_A = b"# Notes\n\nThe metrics endpoint listens on port 7432.\n"
NOTES_B = b"# Notes\n\nJob logs are kept for 14 days by default.\n"


@pytest.fixture
def store(tmp_path):
    return PassageStore.open(tmp_path / "index", HashEmbedder(), lock_timeout=0.2)


def tree(root: Path) -> dict[str, bytes | str]:
    """Everything under root: file bytes, or 'link -> target' for symbolic links."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")) if root.exists() else ():
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = f"link -> {os.readlink(path)}"
        elif path.is_file():
            out[rel] = path.read_bytes()
        else:
            out[rel] = "dir"
    return out


def test_two_files_with_one_name_are_two_documents_and_the_same_bytes_one(tmp_path, store):
    root = tmp_path / "uploads"
    first = uploads.ingest_upload(root, "notes.md", NOTES_A, store)
    second = uploads.ingest_upload(root, "notes.md", NOTES_B, store)
    assert (first.status, second.status) == ("added", "added")
    assert sorted(Path(d.source).name for d in store.documents()) == ["notes.md", "notes.md"]
    again = uploads.ingest_upload(root, "copy of notes.md", NOTES_A, store)
    assert again.status == "unchanged" and again.message.endswith("as notes.md, unchanged")
    assert len(store.documents()) == 2
    assert sorted(p.name for p in root.rglob("*.md")) == ["notes.md", "notes.md"]


@pytest.mark.parametrize("name", [
    "é" * 150 + ".md",               # 300 bytes of UTF-8 before the suffix
    "nul\x00byte.md",
    "two\nlines\r.md",
    "../../outside.md",
    "..\\..\\windows.md",
    "/etc/passwd.md",
    "..",
])
def test_hostile_names_stay_inside_the_uploads_folder(tmp_path, store, name):
    root = tmp_path / "uploads"
    outcome = uploads.ingest_upload(root, name, NOTES_A, store)
    stored = [p for p in root.rglob("*") if p.is_file()]
    if name == "..":
        assert outcome.failed and "unsupported type" in outcome.message and not stored
        return
    assert outcome.status == "added", outcome
    assert len(stored) == 1 and stored[0].parent.parent == root
    safe = stored[0].name
    assert len(safe.encode()) <= uploads.NAME_BYTES and safe.endswith(".md")
    assert not set(safe) & {"\x00", "\n", "\r", "/", "\\"} and not safe.startswith(".")
    assert {p.name for p in tmp_path.iterdir()} == {"index", "uploads"}


def test_a_symbolic_link_in_the_way_is_refused_not_followed(tmp_path, store):
    root = tmp_path / "uploads"
    victim = tmp_path / "victim.md"
    victim.write_bytes(b"precious")
    folder = uploads.upload_folder(root, NOTES_A)
    folder.mkdir(parents=True)
    (folder / "notes.md").symlink_to(victim)
    before = tree(root)
    outcome = uploads.ingest_upload(root, "notes.md", NOTES_A, store)
    assert outcome.failed and "symbolic link" in outcome.message
    assert str(tmp_path) not in outcome.message
    assert victim.read_bytes() == b"precious" and tree(root) == before
    assert store.documents() == []

    other = uploads.upload_folder(root, NOTES_B)
    other.symlink_to(tmp_path, target_is_directory=True)  # a linked folder: same answer
    outcome = uploads.ingest_upload(root, "notes.md", NOTES_B, store)
    assert outcome.failed and "symbolic link" in outcome.message
    assert not (tmp_path / "notes.md").exists()


def test_the_file_is_written_under_the_index_write_lock(tmp_path, store, monkeypatch):
    seen = []
    write = uploads.write_atomically

    def checking_write(target, data, **kwargs):
        try:
            FileLock(str(store.index_dir / persist.LOCK_NAME), timeout=0).acquire()
        except Timeout:
            seen.append("locked")
        else:
            seen.append("NOT locked")
        write(target, data, **kwargs)

    monkeypatch.setattr(uploads, "write_atomically", checking_write)
    assert uploads.ingest_upload(tmp_path / "uploads", "notes.md", NOTES_A, store).status == "added"
    assert seen == ["locked"]


def test_an_upload_being_embedded_does_not_hold_the_index_lock(tmp_path, monkeypatch):
    """An answer searches under the page's index lock; while another session's upload is parsed
    and embedded it gets the lock at once, and the upload takes it only for its commit."""
    embedding, release = threading.Event(), threading.Event()

    class SlowEmbedder(HashEmbedder):
        def embed_array(self, texts):
            if any("backlog" in t for t in texts):  # the upload's passages, not a query
                embedding.set()
                assert release.wait(30)
            return super().embed_array(texts)

    store = PassageStore.open(tmp_path / "index", SlowEmbedder(), lock_timeout=5)
    root, lock = tmp_path / "uploads", threading.Lock()
    assert uploads.ingest_upload(root, "notes.md", NOTES_A, store, lock=lock).status == "added"
    held_at_commit = []
    def recording(write):  # a commit writes the folder whole or appends to it
        def commit(*args, **kwargs):
            held_at_commit.append(lock.locked())
            return write(*args, **kwargs)
        return commit

    monkeypatch.setattr(persist, "write_snapshot", recording(persist.write_snapshot))
    monkeypatch.setattr(persist, "append_snapshot", recording(persist.append_snapshot))
    outcome = []
    upload = threading.Thread(target=lambda: outcome.append(uploads.ingest_upload(
        root, "big.md", b"# Backlog\n\nThe backlog of jobs drains at night.\n", store, lock=lock)))
    upload.start()
    try:
        assert embedding.wait(10)
        got_it = lock.acquire(timeout=2)
        if got_it:
            hits = store.search("metrics endpoint port")
            lock.release()
    finally:
        release.set()
        upload.join(30)
    assert got_it, "a search waited for the upload to be embedded"
    assert Path(hits[0].passage.source).name == "notes.md"
    assert [o.status for o in outcome] == ["added"]
    assert held_at_commit == [True]  # the commit itself is serialised with searches


def test_a_failed_ingest_leaves_the_disk_as_it_was(tmp_path, store):
    root = tmp_path / "uploads"
    uploads.ingest_upload(root, "notes.md", NOTES_A, store)
    before, docs = tree(root), store.documents()
    for name, data in [("broken.pdf", b"%PDF-1.4 not really"), ("blank.txt", b"\n\n  \n")]:
        outcome = uploads.ingest_upload(root, name, data, store)
        assert outcome.failed, outcome
        assert str(root) not in outcome.message
        assert tree(root) == before and store.documents() == docs


def test_an_interrupted_ingest_leaves_no_file_behind(tmp_path, store):
    root = tmp_path / "uploads"

    def interrupt(event):
        if event.kind == "passages":
            raise KeyboardInterrupt  # what a page rerun or Ctrl-C does mid-ingest

    with pytest.raises(KeyboardInterrupt):
        uploads.ingest_upload(root, "notes.md", NOTES_A, store, progress=interrupt)
    assert tree(root) == {} and store.documents() == []
    assert PassageStore.open(store.index_dir, HashEmbedder()).documents() == []


def test_a_locked_index_is_a_clear_failure_and_nothing_is_left(tmp_path, store):
    root = tmp_path / "uploads"
    store.index_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(store.index_dir / persist.LOCK_NAME)):  # another ragspec process writes
        outcome = uploads.ingest_upload(root, "notes.md", NOTES_A, store)
    assert outcome.failed and "Another ragspec process" in outcome.message
    assert [p for p in root.rglob("*") if p.is_file()] == []


def test_removing_an_upload_deletes_our_copy_only(tmp_path, store):
    root = tmp_path / "uploads"
    uploads.ingest_upload(root, "notes.md", NOTES_A, store)
    mine = tmp_path / "mine.md"
    mine.write_bytes(NOTES_B)
    from ragspec.retrieval.ingest import ingest_paths

    ingest_paths([mine], store)
    for doc in store.documents():
        uploads.remove_document(store, doc.doc_id, doc.source, root)
    assert store.documents() == [] and tree(root) == {}
    assert mine.read_bytes() == NOTES_B  # the user's own file, ingested from its place, stays


def test_two_sessions_uploading_notes_md_keep_both(tmp_path, monkeypatch):
    fast_page(monkeypatch, tmp_path / "home")
    alice, bob = new_session(), new_session()
    alice.file_uploader[0].set_value(("notes.md", NOTES_A, "text/markdown"))
    alice.run()
    bob.file_uploader[0].set_value(("notes.md", NOTES_B, "text/markdown"))
    bob.run()
    assert any("notes.md: added" in html.unescape(t) for t in texts(bob.success)), texts(bob.success)
    bob.file_uploader[0].set_value(("again.md", NOTES_A, "text/markdown"))
    bob.run()
    assert any("again.md: already in the index as notes.md" in html.unescape(t)
               for t in texts(bob.info)), texts(bob.info)
    alice.run()
    remove = [b for b in alice.sidebar.button if (b.key or "").startswith("remove-")]
    assert len(remove) == 2
    assert [b.help for b in remove].count(remove[0].help) == 1  # told apart by their ids


def test_an_upload_in_another_encoding_says_which(tmp_path, store):
    from test_retrieval_encoding import installed_page

    data = installed_page("de", "cp1252").encode("cp1252")
    outcome = uploads.ingest_upload(tmp_path / "uploads", "handbuch.txt", data, store)
    assert outcome.status == "added" and outcome.message.endswith(", read as Windows-1252)")
