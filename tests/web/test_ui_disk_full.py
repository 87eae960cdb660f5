"""A full disk under RAGSPEC_HOME while chatting: the chat store refuses with one line and keeps
every chat as it was, and the page shows an error message (not Streamlit's exception box, not a
server path) when a question cannot be saved. A real 2 MiB tmpfs where the test may mount one,
else ENOSPC injected (full_disk.py)."""

from __future__ import annotations

import html

import pytest
from full_disk import FULL, snapshot
from ui_support import METRICS_DOC, fast_page, new_session, tiny_model_folder

from ragspec import fileio
from ragspec.web import chats as ch
from ragspec.web.public_errors import public_message


def test_every_chat_write_on_a_full_disk_raises_one_line_and_changes_nothing(disk):
    store = ch.ChatStore(disk.root / "chats")
    chat = store.create("kept")
    store.update(chat["id"], lambda c: c["messages"].append(ch.user_message("Q?", "Q?")))
    disk.fill()
    before = snapshot(disk.root)
    answer = {"role": "assistant", "content": "x" * 100_000, "status": "generating"}
    for write in (lambda: store.create("new"),
                  lambda: store.update(chat["id"], lambda c: c.update(title="renamed")),
                  lambda: store.save_partial(chat["id"], 1, answer)):
        with pytest.raises(fileio.WriteFailed) as failed:
            write()
        assert str(failed.value).startswith(f"could not write {disk.root / 'chats'}")
        assert FULL in str(failed.value)
        assert snapshot(disk.root) == before
        # What the browser is told: the cause and what to do, no server path.
        shown = public_message(failed.value, "Asking")
        assert shown.startswith(f"Asking failed: the server could not write a file: {FULL}")
        assert str(disk.root) not in shown
    assert store.load(chat["id"])["title"] == "kept"


def test_asking_in_a_new_chat_on_a_full_disk_shows_an_error_message(tmp_path, monkeypatch, disk):
    folder = tiny_model_folder(tmp_path / "tiny")
    fast_page(monkeypatch, disk.root / "home", models=[["tiny", str(folder)]],
              model_cache=tmp_path / "cache")
    at = new_session()
    at.file_uploader[0].set_value(("metrics.md", METRICS_DOC, "text/markdown"))
    at.run()
    disk.fill()
    before = snapshot(disk.root)
    at.chat_input[0].set_value("On which port does the metrics endpoint listen?").run()
    assert not at.exception, at.exception  # no exception box with a traceback
    errors = [html.unescape(e.value) for e in at.error]  # the page escapes Markdown as HTML
    assert any(e.startswith(f"Asking failed: the server could not write a file: {FULL}")
               for e in errors), errors
    assert not any(str(disk.root) in e for e in errors)
    assert snapshot(disk.root) == before


def test_an_upload_that_does_not_fit_says_so_and_stores_nothing(tmp_path, disk):
    from fakes import HashEmbedder

    from ragspec.retrieval.faiss.store import PassageStore
    from ragspec.web.uploads import UploadError, store_upload

    store = PassageStore.open(tmp_path / "index", HashEmbedder())
    root = disk.root / "uploads"
    store_upload(root, "kept.md", METRICS_DOC, store)
    disk.fill()
    before = snapshot(disk.root)
    with pytest.raises(UploadError) as refused:
        store_upload(root, "report.md", b"# Report\n" + b"x" * 300_000, store)
    assert str(refused.value) == (f"report.md: could not store the upload: {FULL}; free some "
                                  "space there, or use another location, and try again")
    assert snapshot(disk.root) == before
