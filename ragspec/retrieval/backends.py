"""Which index backend an `--index` value names, and opening it.

Contract: `parse(value)` reads what every command's `--index` takes:
  * a folder (the default form): the FAISS folder store (store.PassageStore);
  * `milvus:PATH` — a Milvus Lite file (embedded Milvus; PATH usually ends in .db), collection
    "ragspec", or `milvus:PATH#NAME` for another collection in that file;
  * `milvus://HOST:PORT/COLLECTION` — a Milvus server (standalone or a cluster's proxy), over
    http; `milvus+https://...` over TLS. A token, when the server needs one, comes from
    RAGSPEC_MILVUS_TOKEN (never from the command line, where other users could read it).
A malformed Milvus value is a ValueError that says the accepted forms. `open_index` returns the
store; `current_commit` says which commit an index holds now without loading it (the chat
reopens its store when that changes).

Dependencies: this module opens the stores, so it imports them (lazily); the stores import
only `milvus_location` (MilvusLocation), never this module.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ragspec.retrieval.lock import DEFAULT_LOCK_TIMEOUT
from ragspec.retrieval.milvus.location import MilvusLocation

DEFAULT_COLLECTION = "ragspec"
FORMS = ("a folder, milvus:PATH.db (Milvus Lite), or milvus://HOST:PORT/COLLECTION (a Milvus "
         "server)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,200}")
_SERVER = re.compile(r"milvus(\+https)?://([^/\s]+)/([^/\s]+)/?")


def is_milvus(value: str | os.PathLike | None) -> bool:
    return isinstance(value, str) and value.startswith("milvus") and ":" in value[:14]


def parse(value: str):
    """A MilvusLocation for a Milvus value (see the module docstring); ValueError otherwise."""
    server = _SERVER.fullmatch(value)
    if server:
        scheme = "https" if server.group(1) else "http"
        host, collection = server.group(2), server.group(3)
        if ":" not in host:
            host += ":19530"
        _check_name(collection, value)
        return MilvusLocation(f"{scheme}://{host}", collection, value)
    if value.startswith("milvus:") and not value.startswith("milvus://"):
        path, _, collection = value[len("milvus:"):].partition("#")
        if not path:
            raise ValueError(f"--index {value!r} names no file; use {FORMS}")
        collection = collection or DEFAULT_COLLECTION
        _check_name(collection, value)
        resolved = Path(path).expanduser().resolve()
        return MilvusLocation(str(resolved), collection, f"milvus:{resolved}" + (
            f"#{collection}" if collection != DEFAULT_COLLECTION else ""))
    raise ValueError(f"--index {value!r} is not a Milvus location; use {FORMS}")


def _check_name(name: str, value: str) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError(f"--index {value!r}: the collection name must be letters, digits and "
                         f"underscores, starting with a letter or underscore")


def open_index(value: str | os.PathLike, embedder=None, *,
               lock_timeout: float = DEFAULT_LOCK_TIMEOUT):
    """The store `value` names (a folder path or a Milvus location)."""
    if is_milvus(value):
        from ragspec.retrieval.milvus.store import MilvusStore

        return MilvusStore.open(parse(str(value)), embedder, lock_timeout=lock_timeout)
    from ragspec.retrieval.faiss.store import PassageStore

    return PassageStore.open(value, embedder, lock_timeout=lock_timeout)


_peekers: dict[str, object] = {}  # Milvus location -> a store that reads only its manifest


def current_commit(value: str | os.PathLike) -> str | None:
    """The commit the index holds now (None: no index yet); one small read."""
    if is_milvus(value):
        from ragspec.retrieval.milvus.store import MilvusStore

        key = str(value)
        if key not in _peekers:
            _peekers[key] = MilvusStore.peek(parse(key))
        return _peekers[key]._disk_commit()
    from ragspec.retrieval.faiss import persist

    return persist.current_commit(Path(value).expanduser())
