"""A damaged Milvus Lite file is refused with one line, never searched: emptied, truncated,
overwritten in its middle, or a folder in its place (integrity.py: the seal a writer leaves
beside the file). Harmless changes are not refused: a copy of the same bytes, a file written
since by another commit, a deleted side file. Milvus Lite in this process, HashEmbedder."""

from __future__ import annotations

import os
import shutil

import pytest

from ragspec.retrieval.errors import IndexCorruptError
from ragspec.retrieval.ingest import ingest_paths
from ragspec.retrieval.milvus import integrity

QUERY = "namespace quota exhausted"


@pytest.fixture
def sealed(tmp_path, opened):
    """A Milvus Lite file with two documents, its writer closed (so sealed), and its hits."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "alpha.txt").write_text("Error E204 means the namespace quota is exhausted.\n\n"
                                    "Workers poll the queue every 5 seconds.\n")
    (docs / "beta.md").write_text("Set max_log_size to 7432 bytes to rotate the log early.\n")
    db = tmp_path / "team.db"
    store = opened(f"milvus:{db}")
    ingest_paths([docs], store)
    store.close()
    assert integrity.seal_path(db).is_file()
    reader = opened(f"milvus:{db}")
    hits = reader.search(QUERY, k=3)
    reader.close()
    return db, hits


def _overwrite_middle(db):
    size = db.stat().st_size
    with open(db, "r+b") as f:
        f.seek(size // 2)
        f.write(os.urandom(4096))


def _overwrite_keeping_size_and_mtime(db):
    """Bytes changed in place, the size and mtime as they were (silent corruption on disk, or
    a copy tool that restores mtimes): before, the seal checked only the size and mtime."""
    before = db.stat()
    _overwrite_middle(db)
    os.utime(db, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (db.stat().st_size, db.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def _folder(db):
    db.unlink()
    db.mkdir()


@pytest.mark.parametrize("damage", [
    lambda db: db.write_bytes(b""),
    lambda db: os.truncate(db, db.stat().st_size // 2),
    _overwrite_middle,
    _overwrite_keeping_size_and_mtime,
    _folder,
], ids=["emptied", "truncated", "overwritten", "overwritten-same-stat", "folder"])
def test_a_damaged_file_is_refused_with_one_line_naming_the_index(sealed, opened, damage,
                                                                  tmp_path):
    db, _ = sealed
    damage(db)
    with pytest.raises(IndexCorruptError) as refused:
        opened(f"milvus:{db}")
    message = str(refused.value)
    assert message.startswith(f"The index milvus:{db} is damaged: ")
    assert "\n" not in message and "ragspec ingest --index" in message
    fresh = opened(f"milvus:{tmp_path / 'fresh.db'}")  # a new path works meanwhile
    ingest_paths([tmp_path / "docs"], fresh)
    assert fresh.search(QUERY, k=1)


def test_the_same_bytes_with_a_new_mtime_are_accepted(sealed, opened, tmp_path):
    db, hits = sealed
    copy = tmp_path / "copy.db"
    shutil.copyfile(db, copy)  # a restore: same bytes, new mtime
    copy.replace(db)
    assert opened(f"milvus:{db}").search(QUERY, k=3) == hits


def test_a_file_holding_another_commit_is_not_called_damaged(sealed, opened, tmp_path):
    """An older backup restored, or a commit by a ragspec that writes no seal: the file holds
    a readable commit other than the sealed one."""
    db, _ = sealed
    old_seal = integrity.seal_path(db).read_bytes()
    (tmp_path / "docs" / "gamma.txt").write_text("Gamma: the scheduler runs jobs by priority.\n")
    writer = opened(f"milvus:{db}")
    ingest_paths([tmp_path / "docs"], writer)
    writer.close()
    integrity.seal_path(db).write_bytes(old_seal)  # the seal of the commit before
    assert len(opened(f"milvus:{db}").documents()) == 3
    assert not integrity.seal_path(db).exists()  # the stale seal is gone


def test_a_deleted_side_file_is_rebuilt_not_refused(sealed, opened):
    db, hits = sealed
    shutil.rmtree(db.parent / f".{db.name}.ragspec.records")
    assert opened(f"milvus:{db}").search(QUERY, k=3) == hits


def test_a_file_over_the_full_check_size_with_the_sealed_stat_is_not_hashed(sealed, opened,
                                                                             monkeypatch):
    db, hits = sealed
    monkeypatch.setattr(integrity, "FULL_CHECK_BYTES", db.stat().st_size - 1)

    def no_hash(path):
        raise AssertionError("hashed")

    monkeypatch.setattr(integrity, "_sha256", no_hash)
    assert opened(f"milvus:{db}").search(QUERY, k=3) == hits
