"""A filesystem that fills up, for the tests of what ragspec does when a write does not fit.

`FullDisk(folder)`: `root` is a folder on a tiny tmpfs (2 MiB) mounted for the test where the
test may mount (root on Linux; RAGSPEC_TEST_FULL_DISK=inject skips the mount), else a plain folder under `folder` whose writes are refused
with ENOSPC once it is "full" (os.fsync, which every write of ragspec.fileio and of the index's
appending commit ends with, fails for files under it; `injected` says which). `fill()` makes
it full: on the tmpfs a ballast file takes every free block, so a real write() fails; `free()`
makes room again; `close()` unmounts. `snapshot(folder)` is every file under a folder with its
bytes, to compare the state before and after a failed write.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

BALLAST = ".ballast"


class FullDisk:
    def __init__(self, folder: Path, monkeypatch: pytest.MonkeyPatch, size: str = "2m"):
        self.root = folder / "disk"
        self.root.mkdir()
        self._monkeypatch = monkeypatch
        self._full = False
        self.injected = (os.environ.get("RAGSPEC_TEST_FULL_DISK") == "inject"
                         or not _mount(self.root, size))
        if self.injected:
            real = os.fsync

            def fsync(fd):
                if self._full and _under(fd, self.root):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return real(fd)

            monkeypatch.setattr(os, "fsync", fsync)

    def fill(self) -> None:
        self._full = True
        if self.injected:
            return
        fd = os.open(self.root / BALLAST, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while True:
                os.write(fd, b"\0" * 65536)
        except OSError:
            pass
        try:  # the last few blocks, one page at a time
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)

    def free(self) -> None:
        self._full = False
        (self.root / BALLAST).unlink(missing_ok=True)

    def close(self) -> None:
        if not self.injected:
            subprocess.run(["umount", "-l", str(self.root)], check=False, capture_output=True)


def _mount(folder: Path, size: str) -> bool:
    if os.name != "posix" or os.geteuid() != 0:
        return False
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _under(fd: int, root: Path) -> bool:
    try:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return True  # no /proc: refuse every fsync while full
    return path == root or root in path.parents


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes, but the ballast and empty lock files (a file
    lock leaves its empty file behind by design: it holds nothing)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != BALLAST
            and not (p.name.endswith(".lock") and p.stat().st_size == 0)}


# the one-line cause a write on a full disk gives (ragspec.fileio.WriteFailed)
FULL = "the disk is full (no space left on device)"


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """A small full-able filesystem under tmp_path (FullDisk), taken down when the test ends."""
    made = FullDisk(tmp_path, monkeypatch)
    try:
        yield made
    finally:
        made.close()
