"""The audit log: who did what to which document or account, and when.

Contract: `record(action, principal_label, **details)` appends one JSON object per line to
`$RAGSPEC_HOME/audit.jsonl` (created 0600):
    {"time": ISO-8601 UTC, "user": NAME, "action": ACTION, ...details}
Actions: "upload" (collection, name, doc status, bytes), "remove" (collection, doc_id, name),
"sign-in", "sign-in-failed", "sign-out", "user-add", "user-remove", "user-set", "password",
"key-create", "key-revoke", "chat-delete". Each line is written with one write() on a file
opened for appending, so lines from several processes do not interleave. Callers pass names,
ids and sizes, never passwords, hashes or keys. `read()` returns the entries (for tests and
tools). A log that cannot be written (a full disk) is reported in the server's log, in
ragspec.fileio's one line; the action stands, and no half line is left in the log.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path

from ragspec import paths
from ragspec.fileio import describe

FILE_NAME = "audit.jsonl"
logger = logging.getLogger(__name__)


def log_path() -> Path:
    return paths.home() / FILE_NAME


def record(action: str, user: str, **details) -> None:
    entry = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "user": user,
             "action": action, **details}
    line = (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")
    path = log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            _append_whole(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        logger.error("cannot write the audit log (%s): %s", action, describe(exc))


def _append_whole(fd: int, line: bytes) -> None:
    """Append `line` whole or not at all: a full disk may take part of it (a short write);
    that part is cut off again, so the log never holds half a line that the next entry would
    run into. (Only when nothing was appended after it meanwhile: another writer's line is
    never cut.)"""
    start = os.fstat(fd).st_size
    written = 0
    try:
        while written < len(line):
            n = os.write(fd, line[written:])
            if n == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written += n
    except OSError:
        if written and os.fstat(fd).st_size == start + written:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
        raise


def read(path: Path | None = None) -> list[dict]:
    try:
        text = (path or log_path()).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]
