"""Ingest files and folders into a PassageStore: each file read once, parsed, split and embedded
outside the index lock; the results committed in batches.

Contract of `ingest_paths(paths, store, ...)`:
  * Which files: see `ragspec.retrieval.sources.collect` (folders walked, hidden entries skipped, other
    types inside folders listed in `skipped`, symbolic links leaving a folder listed in
    `links` and not followed unless `follow_symlinks`).
  * Each file ends in exactly one list of the report: added (new), updated (content changed: old
    passages replaced), unchanged (same sha256 as stored: nothing parsed), or failed with a reason
    a user can act on. A file's bytes are read once; those bytes are hashed and parsed. An added
    or updated text file that was not UTF-8 is also in `encodings`, with the encoding it was
    read in (see encoding.py). An added or updated file with pages read by OCR (a scan, a
    PDF's pages without a text layer, a picture) is also in `ocr_pages`, with those page
    numbers in ascending order.
  * Anything that goes wrong while loading or splitting one file, whatever its type, is that
    file's failure (an unexpected exception is reported with its type), never the run's; the
    limits of `IngestLimits` bound what one file may cost (size, pages, characters, inflation).
  * Commits: finished files are committed every `commit_every` files or `commit_seconds`
    seconds, whichever comes first, and at the end. Only a commit takes the store's write lock,
    so other writers (and, in one process, searches) wait for commits, never for parsing or
    embedding. A crash, kill -9 or Ctrl-C keeps every file committed before it; running the same
    ingest again finds those unchanged and finishes the rest.
  * Store-level problems (index not writable or full disk, lock not released in time, damaged
    index, missing or mismatched embedder) raise instead: no file could succeed. Files committed
    before stay committed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from ragspec.retrieval.errors import LoadError, RetrievalError, type_name
from ragspec.retrieval.faiss.store import PassageEmbedder, PassageStore
from ragspec.retrieval.layouts import layout_dir, missing_layout, save_layouts
from ragspec.retrieval.passages import PassageDraft, SplitConfig, split_documents
from ragspec.retrieval.readers.limits import ENV_FOR, IngestLimits
from ragspec.retrieval.readers.loaders import SUPPORTED_SUFFIXES, load_bytes
from ragspec.retrieval.sources import collect, read_once

__all__ = ["SUPPORTED_SUFFIXES", "IngestEvent", "IngestReport", "ingest_paths", "page_ranges",
           "default_max_file_bytes", "DEFAULT_COMMIT_FILES", "DEFAULT_COMMIT_SECONDS"]

MAX_FILE_ENV = ENV_FOR["max_file_bytes"]
DEFAULT_COMMIT_FILES = 100
DEFAULT_COMMIT_SECONDS = 30.0
# Passages per embedding call: small enough for frequent progress, big enough to batch well.
EMBED_CHUNK = 64


def default_max_file_bytes() -> int:
    """The per-file size limit: RAGSPEC_MAX_FILE_MB (may be fractional) or 50 MiB."""
    return IngestLimits.from_env().max_file_bytes


@dataclass
class IngestReport:
    """What happened to each input file. Paths are as given or as found in a folder."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)  # not followed, with the reason
    passages_added: int = 0
    commits: int = 0
    # added or updated files read in another encoding than UTF-8: path -> the encoding's name
    encodings: dict[str, str] = field(default_factory=dict)
    # added or updated files with pages recognised by OCR: path -> the pages, ascending
    ocr_pages: dict[str, list[int]] = field(default_factory=dict)

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
            "links_not_followed": [{"path": path, "reason": why} for path, why in self.links],
            "encodings": [{"path": path, "encoding": name}
                          for path, name in self.encodings.items()],
            "ocr_pages": [{"path": path, "pages": pages}
                          for path, pages in self.ocr_pages.items()],
        }


def page_ranges(pages: list[int]) -> str:
    """Ascending page numbers as a short list: [1, 2, 3, 7] -> "pages 1-3, 7"; [4] -> "page 4"."""
    runs: list[list[int]] = []
    for page in pages:
        if runs and page == runs[-1][1] + 1:
            runs[-1][1] = page
        else:
            runs.append([page, page])
    words = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    return ("page " if len(pages) == 1 else "pages ") + ", ".join(words)


@dataclass(frozen=True)
class IngestEvent:
    """Progress, for bars and logs.

    kind: "start" (files_total known), "file" (starting `path`), "passages" (some passages of
        `path` embedded), "done" (`path` finished with `outcome`: added/updated/unchanged/failed;
        added and updated files are committed at the next "commit"), "waiting" (another process
        is writing the index: this one waits for it), "commit" (`committed` files are now safe
        on disk, this run's total so far).
    passages_done / passages_total: within the current file (total 0 until it is split).
    """

    kind: Literal["start", "file", "passages", "done", "waiting", "commit"]
    files_done: int
    files_total: int
    path: str | None = None
    passages_done: int = 0
    passages_total: int = 0
    outcome: str | None = None
    committed: int = 0


ProgressFn = Callable[[IngestEvent], None]


def ingest_paths(
    paths: Iterable[str | os.PathLike],
    store: PassageStore,
    recursive: bool = True,
    progress: ProgressFn | None = None,
    *,
    max_file_bytes: int | None = None,
    split: SplitConfig | None = None,
    limits: IngestLimits | None = None,
    commit_every: int = DEFAULT_COMMIT_FILES,
    commit_seconds: float = DEFAULT_COMMIT_SECONDS,
    follow_symlinks: bool = False,
) -> IngestReport:
    """Bring files and folders into `store` (see the module docstring).

    limits: None = IngestLimits.from_env(); max_file_bytes overrides its file size limit.
    """
    if store.embedder is None:
        raise ValueError("ingest needs a PassageStore opened with an embedder")
    if limits is None:
        limits = IngestLimits.from_env(max_file_bytes=max_file_bytes)
    elif max_file_bytes is not None:
        limits = replace(limits, max_file_bytes=max_file_bytes)
    found = collect(paths, recursive, follow_symlinks)
    report = IngestReport(failed=found.failed, skipped=found.skipped, links=found.links)
    emit = progress or (lambda event: None)
    batch = _Batch(store, report, emit, commit_every, commit_seconds)
    total = len(found.files)
    emit(IngestEvent("start", 0, total))
    for done, (shown, path) in enumerate(found.files):
        emit(IngestEvent("file", done, total, path=shown))
        outcome = _ingest_one(shown, path, store, limits, split, emit, batch, done, total)
        emit(IngestEvent("done", done + 1, total, path=shown, outcome=outcome))
        if batch.due():
            batch.commit(done + 1, total)
    batch.commit(total, total)
    return report


@dataclass
class _Prepared:
    """A file parsed, split and embedded, waiting for its commit."""

    shown: str
    source: str
    sha256: str
    size: int
    drafts: list[PassageDraft]
    vectors: np.ndarray
    outcome: Literal["added", "updated"]
    encoding: str | None = None  # None: UTF-8 (or not a plain-text file)
    ocr_pages: tuple[int, ...] = ()  # the pages read by OCR


def _ingest_one(shown: str, path: Path, store: PassageStore, limits: IngestLimits,
                split: SplitConfig | None, emit: ProgressFn, batch: _Batch, done: int,
                total: int) -> str:
    def on_passages(passages_done: int, passages_total: int) -> None:
        emit(IngestEvent("passages", done, total, path=shown, passages_done=passages_done,
                         passages_total=passages_total))

    try:
        prepared = _prepare(shown, path, store, limits, split, on_passages)
    except LoadError as exc:
        batch.report.failed.append((shown, str(exc)))
        return "failed"
    if prepared is None:
        batch.report.unchanged.append(shown)
        return "unchanged"
    batch.add(prepared)
    return prepared.outcome


def _prepare(shown: str, path: Path, store: PassageStore, limits: IngestLimits,
             split: SplitConfig | None, on_passages: Callable[[int, int], None]
             ) -> _Prepared | None:
    """The file's passages and vectors, or None when it is stored unchanged."""
    data = read_once(path, limits.max_file_bytes)
    sha256 = hashlib.sha256(data).hexdigest()
    source = str(path.resolve())
    existing = store.document_for_source(source)
    if existing is not None and existing.sha256 == sha256:
        if missing_layout(layout_dir(store), sha256, path):  # ingested before layouts existed
            with contextlib.suppress(LoadError):  # still unchanged: it just shows no boxes
                save_layouts(layout_dir(store), sha256, load_bytes(data, path, limits))
        return None
    docs, drafts, encoding = _passages(data, path, store.embedder, limits, split)
    save_layouts(layout_dir(store), sha256, docs)  # PDF character boxes, for the source view
    vectors = _embed(store.embedder, drafts, on_passages)
    ocr_pages = tuple(sorted({d.metadata["page"] for d in docs if d.metadata.get("ocr")}))
    return _Prepared(shown, source, sha256, len(data), drafts, vectors,
                     "updated" if existing is not None else "added", encoding, ocr_pages)


def _passages(data: bytes, path: Path, embedder: PassageEmbedder, limits: IngestLimits,
              split: SplitConfig | None) -> tuple[list, list[PassageDraft], str | None]:
    """The file's loaded pages, its passages, and the encoding its text was read in (None:
    UTF-8)."""
    try:
        docs = load_bytes(data, path, limits)
        drafts = split_documents(docs, embedder, split)
    except RetrievalError:
        raise  # LoadError: this file's, said in our words; others (no embedder): the run's
    except Exception as exc:  # noqa: BLE001
        # Parsers of untrusted files fail in ways no one lists (XML ParseError, zlib.error,
        # AssertionError, RecursionError, MemoryError, ...). Whatever it is, it is this file's
        # failure, reported with its type; it must not stop the other files.
        raise LoadError(f"cannot parse the file ({type_name(exc)}: {exc})") from exc
    if not drafts:
        raise LoadError("no extractable text")
    return docs, drafts, docs[0].metadata.get("encoding")


def _embed(embedder: PassageEmbedder, drafts: list[PassageDraft],
           on_passages: Callable[[int, int], None]) -> np.ndarray:
    return embed_in_order(embedder, [d.text for d in drafts], on_passages)


def embed_in_order(embedder: PassageEmbedder, texts: list[str],
                   on_passages: Callable[[int, int], None]) -> np.ndarray:
    """The vectors of `texts`, row i for texts[i], embedded in calls of EMBED_CHUNK texts taken
    in order of length: a batch of texts of about one length pads little, and the model's time
    grows with the padded length. A text's vector does not depend on its batch (padding is
    masked) beyond float rounding."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    vectors: np.ndarray | None = None
    for first in range(0, len(order), EMBED_CHUNK):
        rows = order[first : first + EMBED_CHUNK]
        batch = embedder.embed_array([texts[i] for i in rows])
        if vectors is None:
            vectors = np.empty((len(texts), batch.shape[1]), dtype=np.float32)
        vectors[rows] = batch
        on_passages(first + len(rows), len(texts))
    assert vectors is not None, "a file's passages are never empty here"
    return vectors


class _Batch:
    """Prepared files waiting for their commit, and when it is due."""

    def __init__(self, store: PassageStore, report: IngestReport, emit: ProgressFn,
                 every: int, seconds: float) -> None:
        if every < 1:
            raise ValueError(f"commit_every must be >= 1 file, got {every}")
        if not seconds > 0:
            raise ValueError(f"commit_seconds must be > 0, got {seconds}")
        self.store, self.report, self.emit = store, report, emit
        self.every, self.seconds = every, seconds
        self.pending: list[_Prepared] = []
        self.since = time.monotonic()
        self.committed = 0

    def add(self, prepared: _Prepared) -> None:
        self.pending.append(prepared)

    def due(self) -> bool:
        return bool(self.pending) and (
            len(self.pending) >= self.every or time.monotonic() - self.since >= self.seconds
        )

    def commit(self, files_done: int, total: int) -> None:
        if not self.pending:
            return

        def waiting() -> None:
            self.emit(IngestEvent("waiting", files_done, total))

        with self.store.writing(on_wait=waiting):
            for p in self.pending:
                self.store.add_document(p.source, p.sha256, p.size, p.drafts, p.vectors)
        for p in self.pending:
            getattr(self.report, p.outcome).append(p.shown)
            self.report.passages_added += len(p.drafts)
            if p.encoding is not None:
                self.report.encodings[p.shown] = p.encoding
            if p.ocr_pages:
                self.report.ocr_pages[p.shown] = list(p.ocr_pages)
        self.committed += len(self.pending)
        self.report.commits += 1
        self.pending.clear()
        self.since = time.monotonic()
        self.emit(IngestEvent("commit", files_done, total, committed=self.committed))
