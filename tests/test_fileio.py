"""ragspec.fileio: a file is replaced whole or not at all, and no temporary file is left."""

from __future__ import annotations

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
    with pytest.raises(OSError, match="No space"):
        fileio.write_atomically(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["costs.json"]


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
