"""Files uploaded in the chat: stored by content, ingested, removed again.

Contract:
  * An upload is stored at `<root>/<first 16 hex digits of its sha256>/<safe name>`, so the
    passage labels still show the file name, two different files with the same name are two
    documents, and the same bytes uploaded twice are one (the second upload finds the first
    copy, under whatever name it came, and the index reports it unchanged).
  * The name is made safe for any file system (`safe_name`): path separators and control
    characters (NUL, newlines) become "_", leading dots are dropped, and it is cut to
    NAME_BYTES bytes of UTF-8 keeping the suffix. The suffix decides the loader.
  * The file is written under the index's write lock (`store.writing()`), in a step of its own
    (the ingest takes that lock itself): into a temporary file in the same folder, flushed to
    disk, then renamed into place, so nobody ever sees half a file. A symbolic link where the
    folder or the file should be is refused, never followed.
  * When the ingest fails (or is interrupted) the disk is put back exactly as it was: a file
    or folder this upload created is removed; a copy that was already there is left alone.
  * `lock` (a threading lock shared by every browser session of the process, which searches and
    removals of the shared store take too) is held only while this upload changes the store: its
    commit, and the short step that stores the file. Reading, parsing and embedding the upload
    happen outside it, so answers waiting to search never wait for an upload to be embedded.
  * Messages never carry server paths: they name the upload by its (safe) file name.
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from ragspec.fileio import explain, write_atomically
from ragspec.retrieval.errors import RetrievalError
from ragspec.retrieval.readers.limits import size_text

NAME_BYTES = 200  # under the 255 bytes file systems allow, with room for a temporary name
DIGEST_CHARS = 16  # 64 bits of the sha256: distinct contents never meet in practice
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f/\\]")


class UploadError(ValueError):
    """An upload that cannot be stored; the message says why, naming the file, not a path."""


@dataclass(frozen=True)
class UploadOutcome:
    """What happened to one upload.

    status: "added", "updated", "unchanged" or "failed". name: the safe file name shown to users.
    message: a one-line explanation (the reason, for a failure). passages: passages added.
    """

    name: str
    status: str
    message: str = ""
    passages: int = 0

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def safe_name(name: str) -> str:
    """`name` as a single safe file name (see the module docstring); never empty."""
    name = _UNSAFE.sub("_", unicodedata.normalize("NFC", name)).strip()
    dot = name.rfind(".")
    suffix = name[dot:] if dot >= 0 else ""
    if not 1 < len(suffix.encode("utf-8")) <= 16 or " " in suffix:
        suffix, dot = "", len(name)  # no real suffix: keep it all as the stem
    stem = name[:dot].strip().lstrip(".") or "upload"
    room = NAME_BYTES - len(suffix.encode("utf-8"))
    stem = stem.encode("utf-8")[:room].decode("utf-8", errors="ignore")
    return stem + suffix


def upload_folder(root: Path, data: bytes) -> Path:
    return root / hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]


def _existing_copy(folder: Path, suffix: str) -> Path | None:
    """An earlier upload of the same bytes and type, stored under its first name."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except FileNotFoundError:
        return None
    for entry in entries:
        if (not entry.name.startswith(".") and entry.is_file(follow_symlinks=False)
                and entry.name.lower().endswith(suffix)):
            return Path(entry.path)
    return None


def _refuse_links(folder: Path, target: Path, name: str) -> None:
    for path in (folder, target):
        if path.is_symlink():
            raise UploadError(
                f"{name}: a symbolic link is in the way in the uploads folder; the server's "
                f"owner must remove it ({path.parent.name}/{path.name})"
            )


@dataclass
class StoredUpload:
    """Where an upload lies, and what this upload created (to undo on failure)."""

    path: Path
    created_file: bool
    created_folder: bool

    def undo(self) -> None:
        """Remove what this upload created; leave what was there before."""
        if self.created_file:
            self.path.unlink(missing_ok=True)
        if self.created_folder:
            try:
                self.path.parent.rmdir()
            except OSError:
                pass  # someone else's upload of the same bytes arrived meanwhile: keep it


def store_upload(root: Path, name: str, data: bytes, store) -> StoredUpload:
    """Put `data` at its content address under root (see the module docstring)."""
    safe = safe_name(name)
    folder = upload_folder(root, data)
    target = folder / safe
    _refuse_links(folder, target, safe)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with store.writing():
            created_folder = not folder.exists()
            folder.mkdir(exist_ok=True)
            _refuse_links(folder, target, safe)  # again, now that we hold the lock
            existing = _existing_copy(folder, Path(safe).suffix.lower())
            if existing is not None:
                return StoredUpload(existing, False, False)
            write_atomically(target, data, mode=0o600)
            return StoredUpload(target, True, created_folder)
    except OSError as exc:
        # The cause and what to do, never the server's folder: the message reaches the browser.
        raise UploadError(f"{safe}: could not store the upload: {explain(exc)}") from exc


ProgressFn = Callable[[object], None]


def ingest_upload(root: Path, name: str, data: bytes, store, *,
                  lock: AbstractContextManager | None = None,
                  progress: ProgressFn | None = None,
                  max_file_bytes: int | None = None) -> UploadOutcome:
    """Check, store and ingest one upload; on any failure the disk is as it was before."""
    from ragspec.retrieval.ingest import SUPPORTED_SUFFIXES, default_max_file_bytes, ingest_paths

    safe = safe_name(name)
    suffix = Path(safe).suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        return UploadOutcome(safe, "failed", f"unsupported type {suffix or '(none)'}; supported "
                                             f"are {', '.join(sorted(SUPPORTED_SUFFIXES))}")
    limit = default_max_file_bytes() if max_file_bytes is None else max_file_bytes
    if len(data) > limit:
        return UploadOutcome(safe, "failed", f"{size_text(len(data))} is over the upload limit of "
                                             f"{size_text(limit)} (RAGSPEC_MAX_FILE_MB raises it)")
    committing = store if lock is None else _CommitsUnder(store, lock)
    try:
        stored = store_upload(root, name, data, committing)
    except (UploadError, RetrievalError) as exc:
        return UploadOutcome(safe, "failed", _public(str(exc), root))
    try:
        report = ingest_paths([stored.path], committing, progress=progress)
    except (RetrievalError, OSError, ValueError) as exc:
        stored.undo()
        return UploadOutcome(safe, "failed", _public(str(exc), root))
    except BaseException:  # Ctrl-C, or the page rerunning mid-ingest: leave no trace
        stored.undo()
        raise
    if report.failed:
        stored.undo()
        return UploadOutcome(safe, "failed", _public(report.failed[0][1], root))
    if report.unchanged:
        known = "" if stored.path.name == safe else f" as {stored.path.name}"
        return UploadOutcome(safe, "unchanged", f"already in the index{known}, unchanged")
    status = "updated" if report.updated else "added"
    read_as = "".join(f", read as {name}" for name in report.encodings.values())
    return UploadOutcome(safe, status, f"{status} ({report.passages_added} passages{read_as})",
                         report.passages_added)


class _CommitsUnder:
    """`store`, with `lock` taken around each `writing()` block (where changes and commits
    happen) and nowhere else; every other attribute is the store's own."""

    def __init__(self, store, lock: AbstractContextManager) -> None:
        self._store, self._lock = store, lock

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    @contextmanager
    def writing(self, *args, **kwargs):
        with self._lock, self._store.writing(*args, **kwargs) as store:
            yield store


def is_upload(source: str | os.PathLike, root: Path) -> bool:
    """True when `source` (a document's path in the index) is a copy this module stored."""
    path = Path(source)
    return path.parent.parent == root.resolve() and not path.is_symlink()


def remove_document(store, doc_id: str, source: str, root: Path, *,
                    lock: AbstractContextManager | None = None) -> None:
    """Remove a document from the index, and our stored copy when it was an upload."""
    with lock or nullcontext():
        store.remove(doc_id)
        if is_upload(source, root):
            path = Path(source)
            path.unlink(missing_ok=True)
            try:
                path.parent.rmdir()
            except OSError:
                pass  # the folder still holds another name's copy or a stray file: keep it


def _public(message: str, root: Path) -> str:
    """An error message with server paths under the uploads folder cut to their file name."""
    for base in {str(root.resolve()), str(root)}:
        message = re.sub(re.escape(base) + r"[/\\][0-9a-f]+[/\\]", "", message)
    return message
