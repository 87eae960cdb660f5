"""The index on disk: written atomically, read without unpickling anything.

Layout of an index directory:
  index.faiss     the FAISS index (CPU form), as written by faiss.serialize_index
  passages.jsonl  line 1: a header (format, version, embedder, dim, the sha256 of index.faiss,
                  the sha256 of the remaining lines, counts, a commit id, and the sha256 of
                  keywords.npz when there is one);
                  then one line per document, then one line per passage in FAISS row order.
  keywords.npz    the BM25 keyword index of the same passages, rows in the same order (see
                  bm25.py). Derived data: when it is absent (an index written before it
                  existed), or is not the one the header names, `Snapshot.keywords` is None and
                  the store rebuilds it from the passage texts.
  .write.lock     the writers' lock (see store.py); its presence means nothing by itself.

Commit protocol (one writer at a time, under the lock):
  1. write keywords.npz.new, index.faiss.new and passages.jsonl.new completely, fsync them;
  2. rename keywords.npz.new -> keywords.npz, index.faiss.new -> index.faiss, then
     passages.jsonl.new -> passages.jsonl;
  3. fsync the directory.
passages.jsonl is the commit record: it names the exact index.faiss it belongs to by hash. A crash
before step 2 leaves the old pair untouched (the .new files are garbage). A crash between the two
renames leaves a new index.faiss beside the old passages.jsonl; the pending passages.jsonl.new
matches it, so readers use that and the next writer completes the rename ("roll forward").
Either way a reader sees one complete index, old or new, never a mix. A crash after the first
rename leaves a keywords.npz the live header does not name: it is ignored (and rebuilt).

Anything else that does not check out (truncated file, edited line, hash mismatch) raises
IndexCorruptError telling the user how to rebuild; nothing here crashes inside FAISS.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from ragspec.fileio import fsync_dir, write_durably
from ragspec.retrieval.errors import IndexCorruptError, IndexNotWritableError

FORMAT = "ragspec-passages"
VERSION = 1
FAISS_NAME = "index.faiss"
PASSAGES_NAME = "passages.jsonl"
KEYWORDS_NAME = "keywords.npz"
PENDING_SUFFIX = ".new"
LOCK_NAME = ".write.lock"

# A reader racing a writer between its two renames sees a mismatched pair for a moment.
_READ_ATTEMPTS = 3
_READ_RETRY_SECONDS = 0.2


@dataclass
class Snapshot:
    """Everything one committed index holds, as plain data.

    documents: dicts with doc_id, source, sha256, size_bytes, ingested_at.
    passages: dicts with id, doc_id, page, start, text; row i of `index` embeds passages[i].
    keywords: the bytes of keywords.npz when the commit names it and it matches, else None.
    """

    embedder: str
    dim: int
    documents: list[dict]
    passages: list[dict]
    index: faiss.Index
    commit: str
    keywords: bytes | None = None


def rebuild_hint(directory: Path) -> str:
    return (
        f"Nothing was changed. To rebuild, move {directory} aside (or delete it) and run "
        f"`ragspec ingest --index {directory} YOUR_FILES...` again."
    )


def _corrupt(directory: Path, detail: str) -> IndexCorruptError:
    return IndexCorruptError(
        f"The index in {directory} is damaged: {detail}. {rebuild_hint(directory)}"
    )


def _sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


# -- writing ---------------------------------------------------------------------------------


def check_writable(directory: Path) -> None:
    """Create `directory` if needed and prove a file can be written there, or raise
    IndexNotWritableError saying what to do."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # Creating a file is the only reliable test (permissions, read-only mounts, ACLs).
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise IndexNotWritableError(
            f"Cannot write to the index directory {directory} ({exc.strerror or exc}). "
            "Make it writable, or choose another with --index DIR or RAGSPEC_HOME."
        ) from exc


def write_snapshot(
    directory: Path, embedder: str, dim: int, documents: list[dict], passages: list[dict],
    index: faiss.Index, keywords: bytes | None = None,
) -> str:
    """Commit a new index to `directory` (caller holds the write lock). Returns the commit id.

    keywords: the keyword index's bytes (bm25.py), committed with the rest."""
    if index.ntotal != len(passages):
        raise AssertionError(f"index has {index.ntotal} rows for {len(passages)} passages")
    faiss_bytes = faiss.serialize_index(index).tobytes()
    body = "".join(
        [_line({"type": "document", **doc}) for doc in documents]
        + [_line({"type": "passage", **p}) for p in passages]
    ).encode("utf-8")
    commit = uuid.uuid4().hex
    header = {
        "format": FORMAT,
        "version": VERSION,
        "embedder": embedder,
        "dim": dim,
        "metric": "inner_product",
        "faiss_file": FAISS_NAME,
        "faiss_sha256": _sha256(faiss_bytes),
        "body_sha256": _sha256(body),
        "documents": len(documents),
        "passages": len(passages),
        "commit": commit,
    }
    keywords_new = directory / (KEYWORDS_NAME + PENDING_SUFFIX)
    if keywords is not None:
        header["keywords_sha256"] = _sha256(keywords)
        write_durably(keywords_new, keywords)
    faiss_new = directory / (FAISS_NAME + PENDING_SUFFIX)
    passages_new = directory / (PASSAGES_NAME + PENDING_SUFFIX)
    write_durably(faiss_new, faiss_bytes)
    write_durably(passages_new, _line(header).encode("utf-8") + body)
    if keywords is not None:
        os.replace(keywords_new, directory / KEYWORDS_NAME)
    os.replace(faiss_new, directory / FAISS_NAME)
    os.replace(passages_new, directory / PASSAGES_NAME)
    fsync_dir(directory)
    return commit


def _line(obj: dict) -> str:
    # ensure_ascii=False keeps non-English text readable (and half the size) in the file.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def recover(directory: Path) -> None:
    """Finish or discard an interrupted commit (caller holds the write lock)."""
    faiss_path = directory / FAISS_NAME
    pending = directory / (PASSAGES_NAME + PENDING_SUFFIX)
    if pending.exists() and faiss_path.exists():
        header = _read_header(pending)
        if header is not None and header.get("faiss_sha256") == _sha256(faiss_path.read_bytes()):
            live = _read_header(directory / PASSAGES_NAME)
            if live is None or live.get("faiss_sha256") != header["faiss_sha256"]:
                os.replace(pending, directory / PASSAGES_NAME)
                fsync_dir(directory)
    for name in (FAISS_NAME, PASSAGES_NAME, KEYWORDS_NAME):
        (directory / (name + PENDING_SUFFIX)).unlink(missing_ok=True)


def _read_header(path: Path) -> dict | None:
    try:
        with open(path, "rb") as f:
            header = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None


def current_commit(directory: Path) -> str | None:
    """The commit id of what is on disk now (cheap: reads one line), None if no index."""
    header = _read_header(directory / PASSAGES_NAME)
    return header.get("commit") if header else None


# -- reading ---------------------------------------------------------------------------------


def read_snapshot(directory: Path) -> Snapshot | None:
    """The committed index in `directory`, or None when there is none; IndexCorruptError if bad."""
    for attempt in range(_READ_ATTEMPTS):
        try:
            return _read_once(directory)
        except _Mismatch as mismatch:
            if attempt == _READ_ATTEMPTS - 1:
                raise _corrupt(directory, str(mismatch)) from None
            time.sleep(_READ_RETRY_SECONDS)
    raise AssertionError("unreachable")


class _Mismatch(Exception):
    """index.faiss and passages.jsonl disagree (maybe a writer is between its renames)."""


def _read_once(directory: Path) -> Snapshot | None:
    faiss_path = directory / FAISS_NAME
    passages_path = directory / PASSAGES_NAME
    pending_path = directory / (PASSAGES_NAME + PENDING_SUFFIX)
    if not faiss_path.exists():
        if passages_path.exists():
            raise _corrupt(directory, f"{FAISS_NAME} is missing")
        return None
    try:
        faiss_bytes = faiss_path.read_bytes()
    except OSError as exc:
        raise _corrupt(directory, f"cannot read {FAISS_NAME} ({exc})") from exc
    faiss_sha = _sha256(faiss_bytes)
    record = _read_record(directory, passages_path) if passages_path.exists() else None
    if record is None or record[0]["faiss_sha256"] != faiss_sha:
        # Roll forward: the pending record may be the one this index.faiss belongs to.
        pending = _read_record(directory, pending_path, strict=False)
        if pending is not None and pending[0]["faiss_sha256"] == faiss_sha:
            record = pending
        elif record is None:
            raise _corrupt(directory, f"{PASSAGES_NAME} is missing")
        else:
            raise _Mismatch(
                f"{FAISS_NAME} does not match {PASSAGES_NAME} (sha256 differs: one of them was "
                "replaced, truncated or edited)"
            )
    header, documents, passages = record
    try:
        index = faiss.deserialize_index(np.frombuffer(faiss_bytes, dtype=np.uint8))
    except RuntimeError as exc:
        raise _corrupt(directory, f"FAISS cannot read {FAISS_NAME} ({exc})") from exc
    if index.ntotal != len(passages) or index.d != header["dim"]:
        raise _corrupt(
            directory,
            f"{FAISS_NAME} holds {index.ntotal} vectors of size {index.d}, but {PASSAGES_NAME} "
            f"lists {len(passages)} passages of size {header['dim']}",
        )
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise _corrupt(directory, f"{FAISS_NAME} does not use inner-product search")
    return Snapshot(
        embedder=header["embedder"], dim=header["dim"], documents=documents, passages=passages,
        index=index, commit=header["commit"], keywords=_read_keywords(directory, header),
    )


def _read_keywords(directory: Path, header: dict) -> bytes | None:
    """keywords.npz when the commit names it and it is that file; None otherwise (the caller
    rebuilds the keyword index from the passages, so a missing or stale file costs time only)."""
    expected = header.get("keywords_sha256")
    if not isinstance(expected, str):
        return None
    try:
        data = (directory / KEYWORDS_NAME).read_bytes()
    except OSError:
        return None
    return data if _sha256(data) == expected else None


_HEADER_TYPES = {
    "format": str, "version": int, "embedder": str, "dim": int, "faiss_sha256": str,
    "body_sha256": str, "documents": int, "passages": int, "commit": str,
}
_DOCUMENT_TYPES = {"doc_id": str, "source": str, "sha256": str, "size_bytes": int,
                   "ingested_at": str}
_PASSAGE_TYPES = {"id": str, "doc_id": str, "start": int, "text": str}


def _read_record(directory: Path, path: Path, strict: bool = True):
    """(header, documents, passages) from a passages.jsonl file, fully validated.

    strict=False returns None instead of raising (used for the optional pending record).
    """
    try:
        return _parse_record(directory, path)
    except (IndexCorruptError, OSError):
        if strict:
            raise
        return None


def _parse_record(directory: Path, path: Path):
    name = path.name
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise _corrupt(directory, f"cannot read {name} ({exc})") from exc
    first, _, body = raw.partition(b"\n")
    try:
        header = json.loads(first)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _corrupt(directory, f"{name} does not start with a ragspec header line")
    if header.get("version") != VERSION:
        raise _corrupt(
            directory, f"{name} has format version {header.get('version')!r}; this ragspec "
            f"reads version {VERSION}"
        )
    _check_fields(directory, name, "header", header, _HEADER_TYPES)
    if _sha256(body) != header["body_sha256"]:
        raise _corrupt(
            directory, f"{name} was truncated or edited by hand (its checksum does not match)"
        )
    documents: list[dict] = []
    passages: list[dict] = []
    try:
        lines = [json.loads(line) for line in body.decode("utf-8").splitlines()]
    except ValueError as exc:
        raise _corrupt(directory, f"{name} has a line that is not JSON ({exc})") from exc
    for number, obj in enumerate(lines, start=2):
        kind = obj.pop("type", None) if isinstance(obj, dict) else None
        if kind == "document":
            _check_fields(directory, name, f"line {number}", obj, _DOCUMENT_TYPES)
            documents.append(obj)
        elif kind == "passage":
            _check_fields(directory, name, f"line {number}", obj, _PASSAGE_TYPES)
            passages.append(obj)
        else:
            raise _corrupt(directory, f"{name} line {number} is neither a document nor a passage")
    if len(documents) != header["documents"] or len(passages) != header["passages"]:
        raise _corrupt(directory, f"{name} does not hold the counts its header announces")
    doc_ids = {doc["doc_id"] for doc in documents}
    if len(doc_ids) != len(documents) or len({p["id"] for p in passages}) != len(passages):
        raise _corrupt(directory, f"{name} repeats a document or passage id")
    if any(p["doc_id"] not in doc_ids for p in passages):
        raise _corrupt(directory, f"{name} has passages of a document it does not list")
    return header, documents, passages


def _check_fields(directory: Path, name: str, where: str, obj: dict, types: dict) -> None:
    for key, kind in types.items():
        if not isinstance(obj.get(key), kind):
            raise _corrupt(directory, f"{name} {where}: field {key!r} is missing or not {kind.__name__}")
