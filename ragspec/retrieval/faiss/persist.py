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
  append.json     (optional) the commit record of the appending commits made on top of that
                  base: the base's commit id, this commit's id, and per appending commit its
                  extents (offset, length, sha256) in the three append files below, with its
                  document and passage counts.
  append.f32      the appended passages' vectors, float32 rows, in row order after the base's;
  append.jsonl    their document and passage lines (each document's line before its passages);
  append.keywords their keyword index, one .npz (bm25.py `rows_bytes`) per appending commit.
                  Bytes past the extents append.json names are garbage (a commit in progress or
                  a crashed one) and are cut off by the next appending commit.
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

Appending commit (`append_snapshot`, one writer, under the lock; the base stays untouched):
  0. the first one on a base writes an empty record first (no extents, its commit id the
     base's), durably, so that append data never exists without a record naming its base;
  1. cut each append file back to the end of the extents the live append.json names (nothing
     past it is committed), write the new extents after it, fsync;
  2. write append.json.new completely, fsync, rename it to append.json, fsync the directory.
A crash before the rename of step 2 leaves the old append.json naming the old extents: the
bytes after them are ignored. Its rename is the commit. A full commit (the protocol above)
removes the append files after its renames (the data first, the record last); an append.json
whose base is not the live passages.jsonl's commit is stale (a full commit happened after it)
and is ignored and removed. So append data with no append.json beside it means the record was
lost (deleted by hand, a restore that missed it): the index is refused as damaged, not read
as its base alone (the appended passages would vanish silently). The record cannot be rebuilt:
the bytes of an unfinished commit at the end of the append files look like committed ones.
Readers read append.json before the base: if a full commit lands in between, the record they
hold names the old base and is ignored, so they read the new base, never an older state.
Version 2 headers (this one) may have appends; a ragspec that reads only version 1 refuses them
rather than reading the base without its appends.

Anything else that does not check out (truncated file, edited line, hash mismatch) raises
IndexCorruptError telling the user how to rebuild; nothing here crashes inside FAISS.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np

from ragspec.fileio import WriteFailed, fsync_dir, write_durably
from ragspec.retrieval.errors import IndexCorruptError, IndexNotWritableError

FORMAT = "ragspec-passages"
VERSION = 2
READ_VERSIONS = (1, 2)  # version 1: the same base, written before appends existed
APPEND_FORMAT = "ragspec-append"
APPEND_NAME = "append.json"
APPEND_VECTORS = "append.f32"
APPEND_LINES = "append.jsonl"
APPEND_KEYWORDS = "append.keywords"
APPEND_FILES = (APPEND_VECTORS, APPEND_LINES, APPEND_KEYWORDS)
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
    log: the appending commits on top of the base (`AppendLog`); documents, passages and index
        include them. keyword_parts: per appending commit its keyword .npz and passage count.
    """

    embedder: str
    dim: int
    documents: list[dict]
    passages: list[dict]
    index: faiss.Index
    commit: str
    keywords: bytes | None = None
    log: AppendLog | None = None
    keyword_parts: list[tuple[bytes, int]] = field(default_factory=list)


@dataclass
class AppendLog:
    """What append.json names: the base commit it extends, its own commit id, and per
    appending commit a dict of extents ("vectors", "lines", "keywords": [offset, length,
    sha256]) and counts ("documents", "passages")."""

    base: str
    commit: str
    extents: list[dict]

    @property
    def passages(self) -> int:
        return sum(e["passages"] for e in self.extents)

    def end(self, part: str) -> int:
        """The committed length of append file `part`'s data ("vectors", "lines", ...)."""
        return max((e[part][0] + e[part][1] for e in self.extents), default=0)


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
    body = _body(documents, passages)
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
    faiss_new = directory / (FAISS_NAME + PENDING_SUFFIX)
    passages_new = directory / (PASSAGES_NAME + PENDING_SUFFIX)
    try:
        if keywords is not None:
            header["keywords_sha256"] = _sha256(keywords)
            write_durably(keywords_new, keywords)
        write_durably(faiss_new, faiss_bytes)
        write_durably(passages_new, _line(header).encode("utf-8") + body)
    except BaseException:
        # Step 1 failed (a full disk): nothing is renamed yet, so the pending files are
        # garbage; remove them now rather than leave them to the next writer.
        for pending in (keywords_new, faiss_new, passages_new):
            with contextlib.suppress(OSError):
                pending.unlink(missing_ok=True)
        raise
    if keywords is not None:
        os.replace(keywords_new, directory / KEYWORDS_NAME)
    os.replace(faiss_new, directory / FAISS_NAME)
    os.replace(passages_new, directory / PASSAGES_NAME)
    fsync_dir(directory)
    _drop_appends(directory)  # stale now: they name the old base
    return commit


def _drop_appends(directory: Path) -> None:
    # the data first, the record last: append data without a record means a lost record
    for name in (*APPEND_FILES, APPEND_NAME + PENDING_SUFFIX, APPEND_NAME):
        (directory / name).unlink(missing_ok=True)


def _orphaned_appends(directory: Path) -> list[str]:
    """The append files holding data (with no append.json beside them, that data's record
    was lost)."""
    out = []
    for name in APPEND_FILES:
        try:
            if (directory / name).stat().st_size > 0:
                out.append(name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _corrupt(directory, f"cannot read {name} ({exc})") from exc
    return out


def _lost_record(directory: Path, names: list[str]) -> str:
    return (f"{APPEND_NAME} is missing, but {', '.join(names)} hold appended passages "
            f"that only it names")


_PARTS = {"vectors": APPEND_VECTORS, "lines": APPEND_LINES, "keywords": APPEND_KEYWORDS}


def append_snapshot(
    directory: Path, log: AppendLog | None, base: str, documents: list[dict],
    passages: list[dict], vectors: np.ndarray, keywords: bytes,
) -> AppendLog:
    """Commit `documents` and `passages` (new, none replacing a stored one) with their vectors
    (row i for passages[i]) and keyword index on top of the committed index whose base commit
    is `base` and whose appends are `log` (None: none yet); caller holds the write lock.
    Returns the new log (its `commit` is the commit id)."""
    if len(vectors) != len(passages) or not passages:
        raise AssertionError(f"{len(vectors)} vectors for {len(passages)} passages")
    if log is not None and log.base != base:
        raise AssertionError("the append log extends another base")
    extents = list(log.extents) if log is not None else []
    pending = directory / (APPEND_NAME + PENDING_SUFFIX)
    if not extents:  # step 0: the record exists before any append data does
        try:
            _write_record(directory, pending, AppendLog(base, base, []))
        except BaseException:
            pending.unlink(missing_ok=True)
            raise
        fsync_dir(directory)
    current = AppendLog(base, "", extents)
    data = {
        "vectors": np.ascontiguousarray(vectors, dtype=np.float32).tobytes(),
        "lines": _body(documents, passages),
        "keywords": keywords,
    }
    extent: dict = {"documents": len(documents), "passages": len(passages)}
    try:
        for part, payload in data.items():
            path = directory / _PARTS[part]
            start = current.end(part)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o666)
            try:
                with os.fdopen(fd, "r+b") as f:
                    f.truncate(start)  # past the committed extents: an unfinished commit's bytes
                    f.seek(start)
                    f.write(payload)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                raise WriteFailed(path, exc) from exc
            extent[part] = [start, len(payload), _sha256(payload)]
        new = AppendLog(base, uuid.uuid4().hex, extents + [extent])
        _write_record(directory, pending, new)
    except BaseException:
        _cut_back(directory, current)  # tidy up; a kill leaves this to the next writer
        raise
    fsync_dir(directory)  # the rename is the commit: from here on, no cutting back
    return new


def _write_record(directory: Path, pending: Path, log: AppendLog) -> None:
    """append.json naming `log`: written whole and fsynced beside it, renamed over it (the
    caller fsyncs the folder)."""
    record = {"format": APPEND_FORMAT, "version": VERSION, "base": log.base,
              "commit": log.commit, "extents": log.extents}
    write_durably(pending, _line(record).encode("utf-8"))
    os.replace(pending, directory / APPEND_NAME)


def _cut_back(directory: Path, log: AppendLog) -> None:
    """Best effort: the append files back to what `log` (the live record) names."""
    (directory / (APPEND_NAME + PENDING_SUFFIX)).unlink(missing_ok=True)
    for part, name in _PARTS.items():
        path, end = directory / name, log.end(part)
        try:
            if end == 0 and not log.extents:
                path.unlink(missing_ok=True)
            elif path.exists():
                os.truncate(path, end)
        except OSError:
            pass


def _line(obj: dict) -> str:
    # ensure_ascii=False keeps non-English text readable (and half the size) in the file.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def _body(documents: list[dict], passages: list[dict]) -> bytes:
    """The document lines, then the passage lines, as UTF-8: each line is `_line` of the
    object with its "type" first."""
    return "".join([_line({"type": "document", **doc}) for doc in documents]
                   + [_passage_line(p) for p in passages]).encode("utf-8")


# What json.dumps(ensure_ascii=False) quotes every string with (its C encoder, where built).
_quote = json.encoder.encode_basestring
_PASSAGE_KEYS = ("id", "doc_id", "page", "start", "text")


def _passage_line(p: dict) -> str:
    """`_line({"type": "passage", **p})`, the same characters, ~8x faster (a passage line
    was most of an appending commit's time): the strings through json's own quoting, the
    integers as json writes them. Anything else (other keys, other types) takes `_line`."""
    page, start = p.get("page"), p.get("start")
    if (tuple(p) != _PASSAGE_KEYS or type(start) is not int
            or (page is not None and type(page) is not int)
            or type(p["id"]) is not str or type(p["doc_id"]) is not str
            or type(p["text"]) is not str):
        return _line({"type": "passage", **p})
    return (f'{{"type":"passage","id":{_quote(p["id"])},"doc_id":{_quote(p["doc_id"])},'
            f'"page":{"null" if page is None else page},"start":{start},'
            f'"text":{_quote(p["text"])}}}\n')


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
    for name in (FAISS_NAME, PASSAGES_NAME, KEYWORDS_NAME, APPEND_NAME):
        (directory / (name + PENDING_SUFFIX)).unlink(missing_ok=True)
    live = _read_header(directory / PASSAGES_NAME)
    log = _read_log(directory / APPEND_NAME)
    if log is None and live is not None:
        if (directory / APPEND_NAME).exists():  # replaced only whole (a rename): damaged
            raise _corrupt(directory, f"{APPEND_NAME} is not an append record")
        orphans = _orphaned_appends(directory)
        if orphans:  # not an unfinished commit (step 0): the record was lost
            raise _corrupt(directory, _lost_record(directory, orphans))
    if log is None or live is None or log.get("base") != live.get("commit"):
        _drop_appends(directory)  # no record, or a stale one: the files hold nothing committed


def _read_header(path: Path) -> dict | None:
    try:
        with open(path, "rb") as f:
            header = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None


def _read_log(path: Path) -> dict | None:
    header = _read_header(path)
    return header if header is not None and header.get("format") == APPEND_FORMAT else None


def current_commit(directory: Path) -> str | None:
    """The commit id of what is on disk now (cheap: reads two lines), None if no index."""
    log = _read_log(directory / APPEND_NAME)
    header = _read_header(directory / PASSAGES_NAME)
    if not header:
        return None
    if log is not None and log.get("base") == header.get("commit"):
        return log.get("commit")
    return header.get("commit")


# -- reading ---------------------------------------------------------------------------------


def read_snapshot(directory: Path) -> Snapshot | None:
    """The committed index in `directory`, or None when there is none; IndexCorruptError if bad."""
    if directory.exists() and not directory.is_dir():
        raise _corrupt(directory, "it is a file, not an index folder")
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
    # The append record first: see the module docstring (a full commit landing meanwhile).
    try:
        log_raw = (directory / APPEND_NAME).read_bytes()
    except FileNotFoundError:
        log_raw = None
    except OSError as exc:
        raise _corrupt(directory, f"cannot read {APPEND_NAME} ({exc})") from exc
    snapshot = _read_base(directory)
    if snapshot is None:
        return snapshot
    if log_raw is None:
        orphans = _orphaned_appends(directory)
        if orphans:  # or a first appending commit began after our look (read again)
            raise _Mismatch(_lost_record(directory, orphans))
        return snapshot
    try:
        record = json.loads(log_raw)
    except ValueError:
        raise _Mismatch(f"{APPEND_NAME} is not JSON") from None
    if not isinstance(record, dict) or record.get("base") != snapshot.commit:
        return snapshot  # stale: a full commit replaced the base it extends
    return _apply_log(directory, snapshot, record)


def _apply_log(directory: Path, snapshot: Snapshot, record: dict) -> Snapshot:
    """The base snapshot with the appending commits `record` names applied."""
    try:
        log = AppendLog(record["base"], record["commit"], list(record["extents"]))
        # no extents (an empty record, step 0): the append files may not exist yet
        parts = {part: (directory / name).read_bytes() if log.extents else b""
                 for part, name in _PARTS.items()}
    except (KeyError, TypeError) as exc:
        raise _corrupt(directory, f"{APPEND_NAME} is not an append record ({exc})") from exc
    except OSError as exc:
        raise _Mismatch(f"cannot read the append files ({exc})") from exc
    documents, passages = list(snapshot.documents), list(snapshot.passages)
    vectors, keyword_parts = [], []
    for number, extent in enumerate(log.extents, start=1):
        pieces = {}
        for part in _PARTS:
            try:
                start, length, digest = extent[part]
                piece = parts[part][start : start + length]
            except (KeyError, TypeError, ValueError) as exc:
                raise _corrupt(directory, f"{APPEND_NAME} extent {number} is malformed") from exc
            if len(piece) != length or _sha256(piece) != digest:
                raise _Mismatch(f"{_PARTS[part]} does not hold what {APPEND_NAME} names "
                                f"(appending commit {number}: truncated or edited)")
            pieces[part] = piece
        docs, rows = _parse_lines(directory, APPEND_LINES, pieces["lines"])
        if len(docs) != extent.get("documents") or len(rows) != extent.get("passages"):
            raise _corrupt(directory, f"{APPEND_LINES} does not hold the counts "
                                      f"{APPEND_NAME} announces")
        if len(pieces["vectors"]) != 4 * snapshot.dim * len(rows):
            raise _corrupt(directory, f"{APPEND_VECTORS} holds the wrong number of vectors")
        documents += docs
        passages += rows
        vectors.append(np.frombuffer(pieces["vectors"], dtype=np.float32))
        keyword_parts.append((pieces["keywords"], len(rows)))
    _check_ids(directory, APPEND_LINES, documents, passages)
    if vectors:
        snapshot.index.add(np.concatenate(vectors).reshape(-1, snapshot.dim))
    snapshot.documents, snapshot.passages = documents, passages
    snapshot.commit, snapshot.log, snapshot.keyword_parts = log.commit, log, keyword_parts
    return snapshot


def _read_base(directory: Path) -> Snapshot | None:
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
        log=AppendLog(header["commit"], header["commit"], []),
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
    if header.get("version") not in READ_VERSIONS:
        raise _corrupt(
            directory, f"{name} has format version {header.get('version')!r}; this ragspec "
            f"reads version {VERSION}"
        )
    _check_fields(directory, name, "header", header, _HEADER_TYPES)
    if _sha256(body) != header["body_sha256"]:
        raise _corrupt(
            directory, f"{name} was truncated or edited by hand (its checksum does not match)"
        )
    documents, passages = _parse_lines(directory, name, body)
    if len(documents) != header["documents"] or len(passages) != header["passages"]:
        raise _corrupt(directory, f"{name} does not hold the counts its header announces")
    _check_ids(directory, name, documents, passages)
    return header, documents, passages


def _parse_lines(directory: Path, name: str, body: bytes) -> tuple[list[dict], list[dict]]:
    """The document and passage lines of `body`, each checked."""
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
    return documents, passages


def _check_ids(directory: Path, name: str, documents: list[dict], passages: list[dict]) -> None:
    doc_ids = {doc["doc_id"] for doc in documents}
    if len(doc_ids) != len(documents) or len({p["id"] for p in passages}) != len(passages):
        raise _corrupt(directory, f"{name} repeats a document or passage id")
    if any(p["doc_id"] not in doc_ids for p in passages):
        raise _corrupt(directory, f"{name} has passages of a document it does not list")


def _check_fields(directory: Path, name: str, where: str, obj: dict, types: dict) -> None:
    for key, kind in types.items():
        if not isinstance(obj.get(key), kind):
            raise _corrupt(directory, f"{name} {where}: field {key!r} is missing or not {kind.__name__}")
