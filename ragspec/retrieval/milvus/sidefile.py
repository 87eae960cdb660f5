"""The protocol every file kept beside a Milvus index follows: the keyword index
(milvus_keywords.py), the vectors (milvus_vectors.py) and the passages' records
(milvus_records.py). Milvus holds the authoritative copy of all of it; a side file only saves
reading it back (and, on Milvus Lite, making Milvus load the whole passage collection: ~2 min
at 1M passages, whatever is read).

Contract (a payload subclasses SideFile and implements its hooks: what it holds, how it reads,
changes and writes it):
  * A SideFile holds exactly the rows of the commit the store loaded or made.
  * Files: `<PREFIX><g><SUFFIX>` in the payload's folder holds the rows of commit g. The
    manifest names the file it relies on ({"file", "gen", "sha256"}); a file is written (to a
    temporary name, fsynced, renamed) before the manifest that names it, so a crash leaves
    either the old manifest and its file, or the new ones; files the manifest does not name,
    and temporary files, are left-overs, deleted by the next writer (`clean`).
  * Not every commit rewrites the file (that would make a long ingest quadratic): `commit`
    rewrites it when the passages added or removed since the file's commit reach
    REWRITE_SHARE of the index, so the bytes written stay within a constant factor of the
    index's size. `save(gen)` writes a lagging file at once: the store calls it when a writer
    finishes (milvus_store.MilvusStore.finish, which a writer's close calls), so that the
    next open reads whole files.
  * A reader catches up from the file: it drops the documents removed or replaced after the
    file's commit and adds the visible rows of documents committed after it, read from Milvus
    (and asks Milvus nothing when there are none). When the file is missing, damaged (its
    sha256 differs) or does not hold the commit's passage count, the rows are read from Milvus
    again: rebuilding is always safe, only slower.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ragspec.fileio import fsync_dir

logger = logging.getLogger(__name__)

REWRITE_SHARE = 0.25


class SideFile:
    """See the module docstring. Subclasses set PREFIX, SUFFIX and WHAT (for messages) and
    implement the hooks; the rows a hook takes are the payload's own (`Added`)."""

    PREFIX = ""
    SUFFIX = ""
    WHAT = ""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.file: dict | None = None  # the manifest entry of the file these rows came from
        self._changed = 0  # passages added or removed since that file's commit
        self._reset()

    # -- hooks --------------------------------------------------------------------------------

    def __len__(self) -> int: ...  # passages held

    def _reset(self) -> None: ...  # hold nothing

    def _read(self, path: Path, sha256: str) -> None:
        """Hold the rows of the file at `path`; ValueError when it is damaged or its sha256 is
        not `sha256`."""

    def _doc_ids(self) -> Iterable[str]: ...  # the documents it holds passages of

    def _apply(self, removed_docs: Iterable[str], added: Any) -> int:
        """Drop every row of `removed_docs`, then add the rows `added`; the passages changed."""
        ...

    def _write(self, path: Path) -> str:
        """Write the rows to `path` atomically (fileio); their sha256."""
        ...

    # -- the protocol -------------------------------------------------------------------------

    @property
    def stale(self) -> bool:
        """Whether the file the manifest names lags behind the rows held."""
        return self.file is None or self._changed > 0

    def load(self, entry: dict | None, count: int, doc_gen: dict[str, int],
             newer: Callable[[int], Any], every: Callable[[], Any]) -> None:
        """The rows of the commit whose documents (doc id -> gen) hold `count` passages, from
        the file `entry` names. newer(g): the visible rows with gen > g; every(): all of
        them (both in the payload's `Added` form)."""
        self._reset()
        self.file, self._changed = None, 0
        try:
            if entry is None:
                raise ValueError(f"the index names no {self.WHAT} file")
            self._read(self.folder / entry["file"], entry["sha256"])
            gen = int(entry["gen"])
            gone = [d for d in self._doc_ids() if doc_gen.get(d, gen + 1) > gen]
            # Asking Milvus Lite for no rows at all would still make it load the collection.
            later = any(g > gen for g in doc_gen.values())
            self.apply(gone, newer(gen) if later else ())
            if len(self) != count:
                raise ValueError(f"it holds {len(self)} passages, the index {count}")
            self.file = entry
            return
        except (OSError, ValueError, KeyError) as exc:
            logger.info("reading the %s from Milvus: %s", self.WHAT, exc)
        self._reset()
        self.file, self._changed = None, 0
        self.apply([], every())

    def apply(self, removed_docs: Iterable[str], added: Any) -> None:
        """Drop every row of `removed_docs`, then add `added`."""
        self._changed += self._apply(removed_docs, added)

    def commit(self, added: Any, retired: Iterable[str], gen: int) -> dict:
        """Apply a commit's changes; write the file for `gen` when it is due. Returns the
        manifest entry the commit must name (the new file's, or the one still relied on)."""
        self.apply(retired, added)
        if self.file is not None and self._changed < REWRITE_SHARE * max(1, len(self)):
            return self.file
        return self.save(gen)

    def save(self, gen: int) -> dict:
        """Write the rows held (those of commit `gen`) to their file; its manifest entry."""
        if not self.stale:
            return self.file
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{self.PREFIX}{gen}{self.SUFFIX}"
        self.file = {"file": name, "gen": gen, "sha256": self._write(self.folder / name)}
        fsync_dir(self.folder)
        self._changed = 0
        return self.file

    def clean(self, keep: dict | None) -> None:
        """Delete the files the manifest (entry `keep`) does not name, and the temporary files
        a crash left."""
        if not self.folder.is_dir():
            return
        for path in [*self.folder.glob(f"{self.PREFIX}*{self.SUFFIX}"),
                     *self.folder.glob(f".{self.PREFIX}*.tmp")]:
            if keep is None or path.name != keep["file"]:
                path.unlink(missing_ok=True)
