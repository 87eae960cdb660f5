"""Writing files so that a crash, or a reader at the same moment, never sees half of one.

Contract:
  * `write_atomically(path, data)` replaces `path` with `data` (bytes, or str written as UTF-8):
    the data goes to a new file beside it, is flushed to disk, and is renamed over `path`, so a
    reader sees the old file or the new one, whole. On any failure (including Ctrl-C) the
    temporary file is removed and `path` is untouched. Two writers at once never mix their
    bytes: the last rename wins. The new file gets `mode` (less the umask); its temporary name
    starts with "." and ends with ".tmp", so folder listings that skip hidden files skip it.
    `write_parts_atomically(path, parts)` is the same for bytes given piece by piece (a file
    larger than one should hold in memory at once).
  * `write_durably(path, data)` writes `path` in place and flushes it to disk: the first step of
    a commit that renames several files itself (retrieval/persist.py).
  * `fsync_dir(directory)` makes renames in `directory` durable (a no-op where directories
    cannot be opened, i.e. on Windows).
  * Every write here that fails with an OSError (a full disk, a quota, a read-only filesystem,
    an I/O error, a permission) raises `WriteFailed`, an OSError whose message is one line
    naming the file, the cause and what to do:
        could not write /data/index/index.faiss.new: the disk is full (no space left on
        device); free some space there, or use another location, and try again
    `explain(exc)` is that cause-and-remedy part for any OSError, for callers that write
    through other means (a library that writes its own files) and say it in their own words.
    `is_disk_error(exc)` tells the OSErrors that are the filesystem's condition (full,
    read-only, quota, I/O), never a bug, which the CLI and the server report as one line.

This is a leaf module: it imports nothing from ragspec, so that every layer (decoding, retrieval,
the app) may use it without depending on another. Keep it that way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterable
from pathlib import Path

# The cause in words, and what to do about it, per errno.
_CAUSES = {
    errno.ENOSPC: "the disk is full (no space left on device); free some space there, or use "
                  "another location, and try again",
    errno.EDQUOT: "the disk quota is used up; free some space there, or use another "
                  "location, and try again",
    errno.EROFS: "the filesystem is read-only; make it writable, or use another location",
    errno.EIO: "the disk reported an input/output error; check the disk (dmesg), or use "
               "another location",
    errno.EACCES: "permission denied; make it writable for this user, or use another location",
    errno.EPERM: "operation not permitted; make it writable for this user, or use another "
                 "location",
    errno.EFBIG: "the file is too large for this filesystem; use another location",
}
# Conditions of the filesystem, not of ragspec's code: reported as one line wherever they arise.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})


def explain(exc: OSError) -> str:
    """The cause of `exc` and what to do, without the path (see the module docstring)."""
    if isinstance(exc, WriteFailed):
        exc = exc.cause
    cause = _CAUSES.get(exc.errno)
    if cause is not None:
        return cause
    return (exc.strerror or str(exc) or type(exc).__name__).rstrip(".")


def is_disk_error(exc: BaseException) -> bool:
    """Whether `exc` is a file ragspec could not write, or the filesystem's condition."""
    return isinstance(exc, WriteFailed) or (isinstance(exc, OSError)
                                            and exc.errno in DISK_ERRNOS)


def describe(exc: OSError) -> str:
    """One line for any OSError: `WriteFailed`'s own message, or the file (when the error names
    one) and `explain`."""
    if isinstance(exc, WriteFailed):
        return str(exc)
    where = f"could not write {exc.filename}: " if exc.filename else "a file could not be written: "
    return where + explain(exc)


class WriteFailed(OSError):
    """A file ragspec writes could not be written; str() is one line (see the module docstring).
    errno, strerror and filename are the underlying error's; `cause` is that error."""

    def __init__(self, path: str | os.PathLike, cause: OSError):
        super().__init__(cause.errno, cause.strerror, str(path))
        self.path, self.cause = Path(path), cause

    def __str__(self) -> str:
        return f"could not write {self.path}: {explain(self.cause)}"

    def __reduce__(self):  # picklable across processes, like the OSError it carries
        return (WriteFailed, (str(self.path), self.cause))


def write_atomically(path: str | os.PathLike, data: bytes | str, *, mode: int = 0o666) -> None:
    """Replace `path` with `data` (see the module docstring)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    write_parts_atomically(path, (payload,), mode=mode)


def write_parts_atomically(path: str | os.PathLike, parts: Iterable[bytes], *,
                           mode: int = 0o666) -> None:
    """Replace `path` with the concatenation of `parts`, written as they come (see the module
    docstring)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    with _failing_removes(tmp, path):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                out.write(part)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)


def write_durably(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` and flush it to disk (the caller renames it into place). On a
    failure the partial file is removed and WriteFailed raised."""
    with _failing_removes(Path(path), path):
        with open(path, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())


@contextlib.contextmanager
def _failing_removes(partial: Path, path: str | os.PathLike):
    """If the block fails: remove `partial` (quietly: a failure of the cleanup, e.g. a folder
    that became unreadable, must not hide the error being reported), and an OSError becomes
    WriteFailed naming `path`."""
    try:
        yield
    except BaseException as exc:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, WriteFailed):
            raise WriteFailed(path, exc) from exc
        raise


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make the renames in `directory` durable."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
