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

This is a leaf module: it imports nothing from ragspec, so that every layer (decoding, retrieval,
the app) may use it without depending on another. Keep it that way.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from pathlib import Path


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
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                out.write(part)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_durably(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` and flush it to disk (the caller renames it into place)."""
    with open(path, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make the renames in `directory` durable."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
