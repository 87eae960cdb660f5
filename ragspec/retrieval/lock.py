"""The index's write lock: one writer at a time across processes, held only while committing.

Contract: `write_lock(directory, timeout, on_wait)` holds the lock file `.write.lock` in
`directory` for the body of the `with`. When another process holds it, `on_wait()` is called once
(the CLI prints WAIT_MESSAGE) and the call waits up to `timeout` seconds, then raises
IndexLockedError saying how long it waited. Writers hold it only to commit (a few seconds at
most), so the default wait is generous: reaching it means a writer is stuck, not busy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from ragspec.retrieval.errors import IndexLockedError
from ragspec.retrieval.faiss.persist import LOCK_NAME

DEFAULT_LOCK_TIMEOUT = 600.0
WAIT_MESSAGE = "waiting for another ragspec process to finish writing the index..."


@contextmanager
def write_lock(
    directory: Path, timeout: float, on_wait: Callable[[], None] | None = None,
    name: str = LOCK_NAME,
) -> Iterator[None]:
    """name: the lock file's name in `directory` (an index folder's own: LOCK_NAME)."""
    lock = FileLock(str(directory / name))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if on_wait is not None:
            on_wait()
        try:
            lock.acquire(timeout=timeout)
        except Timeout:
            raise IndexLockedError(
                f"Another ragspec process is writing the index in {directory} (lock "
                f"{lock.lock_file}); waited {timeout:g} s for it. Try again when it has "
                "finished."
            ) from None
    try:
        yield
    finally:
        lock.release()
