"""Private JSON files in $RAGSPEC_HOME: owner-only permissions, atomic replacement, one lock each.

Contract: `write_private(path, data)` creates the file readable and writable by its owner only
(0600, set when the temporary file is created, so the secret is never readable by others, not
even for a moment), writes it in full, flushes it to disk and renames it over `path`; on a
failure (a full disk) `path` is unchanged and ragspec.fileio.WriteFailed says so in one line.
`read_json(path, default)` returns `default` for a missing file and raises AccountError for one
that cannot be read. `locked(path)` is the file lock every read-modify-write of `path` holds;
a lock that cannot be had in time is an AccountError, never a bare filelock.Timeout.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from filelock import FileLock, Timeout

from ragspec.fileio import write_atomically

LOCK_SECONDS = 30


class AccountError(ValueError):
    """A request about accounts that cannot be done; the message says why, and never holds a
    password, a hash or a key."""


def write_private(path: Path, data: dict) -> None:
    # fileio: the temporary file is created 0600 (O_EXCL, a fresh name, so no stale file can
    # widen it), and a failed write (a full disk) leaves `path` as it was and raises WriteFailed.
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(data, ensure_ascii=False, indent=1), mode=0o600)


def read_json(path: Path, default: dict) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as exc:
        raise AccountError(f"{path.name} in the data directory cannot be read ({exc})") from exc
    if not isinstance(data, dict):
        raise AccountError(f"{path.name} in the data directory is not a ragspec file")
    return data


@contextlib.contextmanager
def locked(path: Path, timeout: float = LOCK_SECONDS):
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path.with_name(f".{path.name}.lock")), timeout=timeout)
    try:
        lock.acquire()
    except Timeout:
        raise AccountError(f"{path.name} is busy (another ragspec is changing it); try again")\
            from None
    try:
        yield
    finally:
        lock.release()
