"""Ingest files and folders into a PassageStore: load, split, embed, store; one file at a time.

Contract of `ingest_paths(paths, store, ...)`:
  * Folders are walked (recursively by default), skipping hidden entries; inside folders, files
    of unsupported types are skipped silently (listed in `IngestReport.skipped`). A file named
    explicitly with an unsupported type is a failure.
  * Each file ends in exactly one list of the report: added (new), updated (content changed:
    old passages replaced), unchanged (same sha256 as stored: nothing done, nothing parsed),
    or failed with a reason a user can act on. A bad file never stops the others.
  * Before reading a file its size is checked against `max_file_bytes` (default 50 MiB,
    RAGSPEC_MAX_FILE_MB overrides): bigger files are failed without being read.
  * All changes are committed once, atomically, at the end, under the store's write lock; an
    interrupted ingest (crash, Ctrl-C) leaves the previous index as it was.
  * Store-level problems (index not writable, locked, damaged, wrong embedder) raise instead of
    being reported per file: no file could succeed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from retrieval.errors import LoadError
from retrieval.loaders import SUPPORTED_SUFFIXES, load_file, supported, unsupported_message
from retrieval.passages import SplitConfig, split_documents
from retrieval.store import PassageStore

__all__ = ["SUPPORTED_SUFFIXES", "IngestEvent", "IngestReport", "ingest_paths",
           "default_max_file_bytes"]

MAX_FILE_ENV = "RAGSPEC_MAX_FILE_MB"
DEFAULT_MAX_FILE_MB = 50
# Passages per embedding call: small enough for frequent progress, big enough to batch well.
EMBED_CHUNK = 64


def default_max_file_bytes() -> int:
    """The per-file size limit: RAGSPEC_MAX_FILE_MB (may be fractional) or 50 MiB."""
    raw = os.environ.get(MAX_FILE_ENV)
    if not raw:
        return DEFAULT_MAX_FILE_MB * 2**20
    try:
        megabytes = float(raw)
    except ValueError:
        raise ValueError(f"{MAX_FILE_ENV}={raw!r} is not a number of megabytes") from None
    if megabytes <= 0:
        raise ValueError(f"{MAX_FILE_ENV} must be > 0, got {raw!r}")
    return int(megabytes * 2**20)


@dataclass
class IngestReport:
    """What happened to each input file. Paths are as given or as found in a folder."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    passages_added: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict:
        """The `ragspec ingest --json` object."""
        return {
            "added": self.added,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "failed": [{"path": path, "error": error} for path, error in self.failed],
        }


@dataclass(frozen=True)
class IngestEvent:
    """Progress, for bars and logs.

    kind: "start" (files_total known), "file" (starting `path`), "passages" (some passages of
        `path` embedded), "done" (`path` finished with `outcome`: added/updated/unchanged/failed).
    passages_done / passages_total: within the current file (total 0 until it is split).
    """

    kind: Literal["start", "file", "passages", "done"]
    files_done: int
    files_total: int
    path: str | None = None
    passages_done: int = 0
    passages_total: int = 0
    outcome: str | None = None


ProgressFn = Callable[[IngestEvent], None]


def ingest_paths(
    paths: Iterable[str | os.PathLike],
    store: PassageStore,
    recursive: bool = True,
    progress: ProgressFn | None = None,
    *,
    max_file_bytes: int | None = None,
    split: SplitConfig | None = None,
) -> IngestReport:
    """Bring files and folders into `store` (see the module docstring)."""
    if store.embedder is None:
        raise ValueError("ingest needs a PassageStore opened with an embedder")
    limit = default_max_file_bytes() if max_file_bytes is None else max_file_bytes
    if limit <= 0:
        raise ValueError(f"max_file_bytes must be > 0, got {limit}")
    emit = progress or (lambda event: None)
    report = IngestReport()
    files = _collect(paths, recursive, report)
    total = len(files)
    emit(IngestEvent("start", 0, total))
    with store.writing():
        for done, (shown, path) in enumerate(files):
            emit(IngestEvent("file", done, total, path=shown))
            try:
                outcome, count = _ingest_one(path, shown, store, limit, split, emit, done, total)
            except LoadError as exc:
                report.failed.append((shown, str(exc)))
                outcome = "failed"
            else:
                getattr(report, outcome).append(shown)
                report.passages_added += count
            emit(IngestEvent("done", done + 1, total, path=shown, outcome=outcome))
    return report


def _collect(
    paths: Iterable[str | os.PathLike], recursive: bool, report: IngestReport
) -> list[tuple[str, Path]]:
    """The files to ingest, in a stable order, each once; records missing/unsupported ones."""
    found: list[tuple[str, Path]] = []
    seen: set[Path] = set()

    def add(shown: str, path: Path) -> None:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            found.append((shown, path))

    for raw in paths:
        path = Path(raw).expanduser()
        shown = os.fspath(raw)
        if not path.exists():
            report.failed.append((shown, "no such file or directory"))
        elif path.is_dir():
            for child in _walk(path, recursive):
                if supported(child):
                    add(str(child), child)
                else:
                    report.skipped.append(str(child))
        elif not supported(path):
            report.failed.append((shown, unsupported_message(path)))
        else:
            add(shown, path)
    return found


def _walk(folder: Path, recursive: bool) -> Iterable[Path]:
    # Hidden files and folders (.git, .venv, editor swap files) are never documents.
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if recursive else []
        for name in sorted(names):
            if not name.startswith("."):
                yield Path(root) / name


def _ingest_one(
    path: Path, shown: str, store: PassageStore, limit: int, split: SplitConfig | None,
    emit: ProgressFn, done: int, total: int,
) -> tuple[str, int]:
    try:
        stat = path.stat()
        if not path.is_file():
            raise LoadError("not a regular file")
        if stat.st_size == 0:
            raise LoadError("the file is empty (0 bytes)")
        if stat.st_size > limit:
            raise LoadError(
                f"the file is {_mib(stat.st_size)}, over the size limit of {_mib(limit)}; "
                f"split it, or raise the limit with {MAX_FILE_ENV}"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise LoadError(f"cannot read the file ({exc.strerror or exc})") from exc
    sha256 = hashlib.sha256(data).hexdigest()
    source = str(path.resolve())
    existing = store.document_for_source(source)
    if existing is not None and existing.sha256 == sha256:
        return "unchanged", 0
    drafts = split_documents(load_file(path), store.embedder, split)
    if not drafts:
        raise LoadError("no extractable text")
    vectors = []
    for first in range(0, len(drafts), EMBED_CHUNK):
        batch = drafts[first : first + EMBED_CHUNK]
        vectors.append(store.embedder.embed_array([d.text for d in batch]))
        emit(IngestEvent("passages", done, total, path=shown,
                         passages_done=first + len(batch), passages_total=len(drafts)))
    store.add_document(source, sha256, len(data), drafts, np.concatenate(vectors))
    return ("updated" if existing is not None else "added"), len(drafts)


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size} bytes"
