"""The copies a Milvus store keeps on this machine beside Milvus: the keyword index
(milvus_keywords.py), and on Milvus Lite the vectors (milvus_vectors.py) and the passages'
records (milvus_records.py). Each is a side file (milvus_sidefile.py); this module loads,
commits, saves and cleans them together and reads what they need from Milvus.

Contract: `LocalCopies` holds the copies of the commit the store loaded or made. The manifest
names each copy's file under its key (`KEYS`); `commit` and `save` return those entries for
the store to put in its manifest, `clean` deletes the files a manifest does not name. Rows are
read from Milvus through `read(expr, fields)`, an iterator of row batches (dicts) of the
visible rows that also match `expr` ("" for all of them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np

from ragspec.retrieval.milvus.keywords import MilvusKeywords
from ragspec.retrieval.milvus.location import MilvusLocation
from ragspec.retrieval.milvus.records import MilvusRecords, Record
from ragspec.retrieval.milvus.sidefile import SideFile
from ragspec.retrieval.milvus.vectors import MilvusVectors, Rows, sorted_blocks
from ragspec.retrieval.records import Passage

KEYS = ("keywords", "vectors", "records")

Read = Callable[[str, list[str]], Iterator[list[dict]]]
# doc id -> (its passages, their vectors), of one commit
Pending = dict[str, tuple[list[Passage], np.ndarray]]


class LocalCopies:
    """See the module docstring."""

    def __init__(self, location: MilvusLocation) -> None:
        vectors, records = location.vectors_folder(), location.records_folder()
        self.keywords = MilvusKeywords(location.keywords_folder())
        self.vectors = None if vectors is None else MilvusVectors(vectors)
        self.records = None if records is None else MilvusRecords(records)

    def files(self) -> dict[str, SideFile]:
        """The copies this location keeps, by manifest key."""
        found = {"keywords": self.keywords, "vectors": self.vectors, "records": self.records}
        return {key: copy for key, copy in found.items() if copy is not None}

    @property
    def stale(self) -> bool:
        """Whether a file the manifest names lags behind the commit held."""
        return any(copy.stale for copy in self.files().values())

    def load(self, manifest: dict, count: int, doc_gen: dict[str, int], read: Read,
             dim: int) -> None:
        """The copies of the commit `manifest` names (its documents: doc_gen, `count`
        passages)."""
        readers = {"keywords": lambda expr: sorted(
                       (r["pid"], r["text"]) for batch in read(expr, ["pid", "text"])
                       for r in batch),
                   "vectors": lambda expr: sorted_blocks(_vector_rows(
                       read(expr, ["pid", "gen", "vector"]), dim)),
                   "records": lambda expr: (
                       Record(r["pid"], int(r["page"]), int(r["start"]), r["text"])
                       for batch in read(expr, ["pid", "page", "start", "text"])
                       for r in batch)}
        for key, copy in self.files().items():
            reader = readers[key]
            copy.load(manifest.get(key), count, doc_gen,
                      newer=lambda g, reader=reader: reader(f" and gen > {g}"),
                      every=lambda reader=reader: reader(""))

    def commit(self, pending: Pending, retired: Iterable[str], gen: int) -> dict:
        """Apply a commit's changes (documents added, documents retired); the manifest
        entries it must name."""
        retired = list(retired)
        added = {"keywords": [(p.id, p.text) for rows, _ in pending.values() for p in rows],
                 "vectors": [([p.id for p in rows], v) for rows, v in pending.values()],
                 "records": [Record(p.id, p.page or 0, p.start, p.text)
                             for rows, _ in pending.values() for p in rows]}
        return {key: copy.commit(added[key], retired, gen)
                for key, copy in self.files().items()}

    def save(self, gen: int) -> dict:
        """Write every lagging file for commit `gen`; the manifest entries."""
        return {key: copy.save(gen) for key, copy in self.files().items()}

    def clean(self, manifest: dict) -> None:
        for key, copy in self.files().items():
            copy.clean(manifest.get(key))

    def folders(self) -> list:
        return [copy.folder for copy in self.files().values()]


def _vector_rows(batches: Iterator[list[dict]], dim: int) -> Rows:
    """Rows as (passage ids, gens, vectors), converted a batch at a time (a million rows as
    Python floats would take ~10 GB)."""
    pids, gens, blocks = [], [], []
    for batch in batches:
        pids += [r["pid"] for r in batch]
        gens += [int(r["gen"]) for r in batch]
        blocks.append(np.asarray([r["vector"] for r in batch], dtype=np.float32))
    vectors = np.concatenate(blocks) if blocks else np.zeros((0, dim), np.float32)
    return pids, np.asarray(gens, dtype=np.int64), vectors
