"""ragspec.fileio: a file is replaced whole or not at all, and no temporary file is left."""

from __future__ import annotations

import errno
import os
import stat
import threading

import pytest

from ragspec import fileio


def test_write_atomically_replaces_the_file_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "chat.json"
    target.write_text("old")
    fileio.write_atomically(target, "néw")
    fileio.write_atomically(tmp_path / "blob.bin", b"\x00\xff")
    assert target.read_bytes() == "néw".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob.bin", "chat.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary_one(tmp_path, monkeypatch):
    target = tmp_path / "costs.json"
    target.write_text("old")

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(fileio.WriteFailed) as failed:
        fileio.write_atomically(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["costs.json"]
    # One line: the file, the cause, what to do; still an OSError with the errno.
    assert str(failed.value) == (f"could not write {target}: the disk is full (no space left "
                                 "on device); free some space there, or use another location, "
                                 "and try again")
    assert isinstance(failed.value, OSError) and failed.value.errno == errno.ENOSPC


@pytest.mark.parametrize(("code", "says"), [
    (errno.ENOSPC, "the disk is full"), (errno.EDQUOT, "the disk quota is used up"),
    (errno.EROFS, "the filesystem is read-only"), (errno.EIO, "the disk reported an input/output error"),
    (errno.EACCES, "permission denied"),
])
def test_every_refusal_of_the_filesystem_is_one_line_that_says_what_to_do(tmp_path, code, says):
    failed = fileio.WriteFailed(tmp_path / "x", OSError(code, os.strerror(code)))
    assert str(failed).startswith(f"could not write {tmp_path / 'x'}: {says}")
    assert "\n" not in str(failed) and ("use another location" in str(failed))
    assert fileio.describe(failed) == str(failed)
    # A bare OSError of a library that wrote its own file: the same words.
    bare = OSError(code, os.strerror(code), str(tmp_path / "y"))
    assert fileio.describe(bare) == f"could not write {tmp_path / 'y'}: {fileio.explain(bare)}"
    assert fileio.is_disk_error(failed)
    assert fileio.is_disk_error(bare) == (code != errno.EACCES)  # a permission may be a bug


def test_write_durably_removes_its_partial_file(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O")))
    with pytest.raises(fileio.WriteFailed, match="input/output error"):
        fileio.write_durably(tmp_path / "index.faiss.new", b"x" * 1000)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_survives_pickling(tmp_path):
    """A WriteFailed raised in a worker process reaches the parent with its message."""
    import pickle

    failed = fileio.WriteFailed(tmp_path / "x", OSError(errno.ENOSPC, "No space left on device"))
    assert str(pickle.loads(pickle.dumps(failed))) == str(failed)


def test_the_mode_is_applied(tmp_path):
    fileio.write_atomically(tmp_path / "private", "x", mode=0o600)
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600


def test_a_reader_never_sees_half_a_file(tmp_path):
    target = tmp_path / "big"
    versions = [bytes([i]) * 2_000_000 for i in range(1, 4)]
    fileio.write_atomically(target, versions[0])
    done, seen = threading.Event(), set()

    def read():
        while not done.is_set():
            data = target.read_bytes()
            seen.add((len(data), data[:1], data[-1:]))

    reader = threading.Thread(target=read)
    reader.start()
    for version in versions[1:] * 5:
        fileio.write_atomically(target, version)
    done.set()
    reader.join()
    assert seen <= {(2_000_000, v[:1], v[-1:]) for v in versions}
