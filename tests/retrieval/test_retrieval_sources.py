"""Which files an ingest reads and how: symbolic links that leave the folder are not followed
unless asked, pipes never block, and each file is read once (the bytes hashed are the bytes
parsed)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from fakes import HashEmbedder

import ragspec.retrieval.ingest as ingest_module
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.ingest import ingest_paths
from ragspec.retrieval.sources import collect


@pytest.fixture
def store(tmp_path):
    return PassageStore.open(tmp_path / "index", HashEmbedder())


@pytest.fixture
def tree(tmp_path):
    """docs/ holds a file, a link to a file outside, a link to a folder outside, a link inside,
    and a link loop; secret/ is outside."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwords.txt").write_text("The vault code is 1234.")
    (secret / "more.md").write_text("More secrets.")
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "notes.txt").write_text("The ferry leaves at noon.")
    (docs / "sub" / "deep.md").write_text("Deep notes.")
    (docs / "leak.txt").symlink_to(secret / "passwords.txt")
    (docs / "leakdir").symlink_to(secret, target_is_directory=True)
    (docs / "alias.txt").symlink_to(docs / "notes.txt")
    (docs / "sub" / "up").symlink_to(docs, target_is_directory=True)
    (docs / "loop-a.txt").symlink_to(docs / "loop-b.txt")
    (docs / "loop-b.txt").symlink_to(docs / "loop-a.txt")
    return docs


def _names(paths) -> list[str]:
    return sorted(Path(p).name for p in paths)


def test_links_leaving_the_folder_are_skipped_and_reported(tree, store):
    report = ingest_paths([tree], store)
    # alias.txt comes first by name and stands for notes.txt: stored once, as its target.
    assert _names(report.added) == ["alias.txt", "deep.md"]
    assert _names(d.source for d in store.documents()) == ["deep.md", "notes.txt"]
    links = dict(report.links)
    assert set(map(lambda p: Path(p).name, links)) == {"leak.txt", "leakdir", "loop-a.txt",
                                                       "loop-b.txt"}
    assert "outside the folder being ingested" in links[str(tree / "leak.txt")]
    assert "--follow-symlinks" in links[str(tree / "leakdir")]
    assert not any("vault" in p.text for p in store.passages())


def test_follow_symlinks_ingests_what_they_point_to_once(tree, store):
    report = ingest_paths([tree], store, follow_symlinks=True)
    assert _names(d.source for d in store.documents()) == [
        "deep.md", "more.md", "notes.txt", "passwords.txt"
    ]
    assert len(report.added) == 4
    assert any("vault" in p.text for p in store.passages())
    assert _names(path for path, _ in report.links) == ["loop-a.txt", "loop-b.txt"]


def test_a_link_named_on_the_command_line_is_followed(tree, store):
    report = ingest_paths([tree / "leak.txt"], store)
    assert report.added == [str(tree / "leak.txt")] and not report.links


def test_a_named_pipe_fails_without_blocking(tmp_path, store):
    os.mkfifo(tmp_path / "pipe.txt")
    (tmp_path / "fine.txt").write_text("Fine.")
    report = ingest_paths([tmp_path], store)  # would wait forever if the pipe were opened
    assert report.failed == [(str(tmp_path / "pipe.txt"),
                              "not a regular file (a pipe, socket or device); nothing was read")]
    assert report.added == [str(tmp_path / "fine.txt")]


def test_walk_order_is_each_folders_files_then_its_subfolders(tmp_path):
    for name in ("b/2.txt", "b/a/3.txt", "a/1.txt", "0.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    found = collect([tmp_path])
    assert [Path(p).relative_to(tmp_path).as_posix() for p, _ in found.files] == [
        "0.txt", "a/1.txt", "b/2.txt", "b/a/3.txt"
    ]


def test_the_bytes_parsed_are_the_bytes_hashed(tmp_path, store, monkeypatch):
    # Another program rewrites the file right after ingest read it: what is stored must be
    # the version that was read, under that version's hash.
    path = tmp_path / "changing.txt"
    path.write_text("First version: the gate closes at six.")
    real_read = ingest_module.read_once
    parsed = []

    def read_then_change(p, limit):
        data = real_read(p, limit)
        path.write_text("Second version: the gate never closes.")
        return data

    real_load = ingest_module.load_bytes

    def spy(data, name, limits=None):
        parsed.append(data)
        return real_load(data, name, limits)

    monkeypatch.setattr(ingest_module, "read_once", read_then_change)
    monkeypatch.setattr(ingest_module, "load_bytes", spy)
    ingest_paths([path], store)
    [info] = store.documents()
    assert parsed == [b"First version: the gate closes at six."]
    assert info.sha256 == hashlib.sha256(parsed[0]).hexdigest()
    assert [p.text for p in store.passages()] == ["First version: the gate closes at six."]
