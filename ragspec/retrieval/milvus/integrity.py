"""Is a Milvus Lite file the one ragspec last wrote? A damaged file is refused, not searched.

Milvus Lite keeps its data in one SQLite file. Emptied, it opens as a new empty index; with
bytes overwritten in its middle it logs "database disk image is malformed" and serves the rows
it could still read: searches then return wrong passages with exit status 0. So a writer, when
it is done with the file (its Milvus Lite server stopped, nothing more to write), seals it:

  .<file>.seal.json   beside it: {"commit": the manifest's commit id, "size", "mtime_ns",
                      "sha256": of the whole file}

Contract:
  * `unseal(path)`: a writer's first step under the lock, before Milvus writes anything: the
    seal is removed, so a writer that crashes leaves no seal (and an unchecked file), never a
    false alarm. `seal(path, commit)`: its last step, after the server stopped.
  * `check(path, spec, manifest_commit)` when a store opens the file, before Milvus reads it:
      - a folder, or a file of 0 bytes, in its place: IndexCorruptError at once;
      - no seal: nothing to compare with (an index from before seals, or a writer that did not
        finish): accepted;
      - the file is hashed, whatever its size and mtime say, when it is at most
        FULL_CHECK_BYTES (bytes changed in place with the size and mtime kept — a disk's
        silent corruption, a tool that restores mtimes — are caught; measured cost in
        docs/documents-and-search.md); a larger file with the sealed size and mtime is accepted at the
        cost of one stat;
      - the sealed sha256 is accepted; a
        different one is the sign of damage only when the file still claims the sealed
        commit (its bytes changed under the same commit) or holds no readable commit at all
        (emptied, truncated, garbage): IndexCorruptError. A file that holds another readable
        commit was written since by a ragspec without seals, or restored from an older backup:
        accepted, and its stale seal removed.
    `manifest_commit()` is asked only in that last case (it starts Milvus Lite); it returns the
    commit id the file holds (None: no index in it) and raises RetrievalError when Milvus cannot
    read the file.
Not caught: bytes of a file over FULL_CHECK_BYTES that change while its size and mtime stay
the same; hashing it on every open would cost ~2.5 s per GB of index.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from ragspec.fileio import write_atomically
from ragspec.retrieval.errors import IndexCorruptError, RetrievalError

# Files up to this size are hashed on every open (0.20-0.27 GB/s measured on a busy 2-core
# Xeon: at most ~5 s, beside the many seconds Milvus Lite itself takes to open a file that
# large); larger ones only when their size or mtime differs from the seal's.
FULL_CHECK_BYTES = 1 << 30


def seal_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.seal.json")


def unseal(path: Path) -> None:
    seal_path(path).unlink(missing_ok=True)


def seal(path: Path, commit: str | None) -> None:
    """Record what `path` is now (see the module docstring); nothing for a missing file or an
    index with no commit."""
    if commit is None or not path.is_file():
        return
    info = path.stat()
    record = {"commit": commit, "size": info.st_size, "mtime_ns": info.st_mtime_ns,
              "sha256": _sha256(path)}
    write_atomically(seal_path(path), json.dumps(record))


def check(path: Path, spec: str, manifest_commit: Callable[[], str | None]) -> None:
    """Refuse a damaged file with IndexCorruptError (see the module docstring)."""
    if path.is_dir():
        raise _damaged(spec, path, "a folder is where the Milvus Lite file should be")
    try:
        info = path.stat()
    except FileNotFoundError:
        return  # no index yet (or deleted to rebuild it)
    if info.st_size == 0:
        raise _damaged(spec, path, "the file is empty (0 bytes)")
    record = _read_seal(path)
    if record is None:
        return
    same_stat = (info.st_size, info.st_mtime_ns) == (record.get("size"), record.get("mtime_ns"))
    if same_stat and info.st_size > FULL_CHECK_BYTES:
        return
    if _sha256(path) == record.get("sha256"):
        if not same_stat:
            with contextlib.suppress(OSError):  # the same bytes (a copy, a restore)
                write_atomically(seal_path(path), json.dumps(
                    {**record, "size": info.st_size, "mtime_ns": info.st_mtime_ns}))
        return
    try:
        commit = manifest_commit()
    except RetrievalError as exc:
        raise _damaged(spec, path, "Milvus Lite cannot open it") from exc
    if commit is None:
        raise _damaged(spec, path, "it holds no index, but ragspec wrote one there")
    if commit == record.get("commit"):
        raise _damaged(spec, path, "its bytes changed since ragspec last wrote it "
                                   "(truncated or overwritten)")
    with contextlib.suppress(OSError):
        unseal(path)  # another commit: written without seals, or an older backup restored


def _read_seal(path: Path) -> dict | None:
    try:
        record = json.loads(seal_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # a seal that cannot be read checks nothing (it is rewritten on the next seal)
    return record if isinstance(record, dict) else None


def _sha256(path: Path) -> str:
    # read a MiB at a time (hashlib.file_digest would need Python 3.11; ragspec runs on 3.10)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _damaged(spec: str, path: Path, detail: str) -> IndexCorruptError:
    return IndexCorruptError(
        f"The index {spec} is damaged: {detail}. Restore {path.name} from a backup together "
        f"with the files beside it that start with .{path.name}., or delete them all and run "
        f"`ragspec ingest --index {spec} YOUR_FILES...` again."
    )
