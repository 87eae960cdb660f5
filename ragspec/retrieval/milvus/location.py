"""Where a Milvus index lives: the parsed form of a Milvus `--index` value (backends.parse).

Contract: a MilvusLocation names a Milvus Lite file or a server URI and a collection; it knows
where this machine keeps the index's write lock, keyword files and (Milvus Lite only) vector
and record files. It imports nothing from the stores, so both backends.py (which opens stores) and
milvus_store.py (which is opened) can depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MilvusLocation:
    """Where a Milvus index lives: a Milvus Lite file or a server URI, and the collection."""

    uri: str  # a local file path (Milvus Lite) or http(s)://host:port
    collection: str
    spec: str  # as the user wrote it (shown in messages)

    @property
    def lite(self) -> bool:
        return not self.uri.startswith(("http://", "https://"))

    def lock_place(self) -> tuple[Path, str]:
        """(folder, file name) of this index's write lock on this machine."""
        if self.lite:
            path = Path(self.uri)
            return path.parent, f".{path.name}.{self.collection}.write.lock"
        from ragspec import paths

        return paths.home() / "locks", f"milvus-{self._safe()}.lock"

    def keywords_folder(self) -> Path:
        """Where this machine keeps the index's keyword files (milvus_keywords.py): beside a
        Milvus Lite file; under the data directory for a server."""
        if self.lite:
            path = Path(self.uri)
            return path.parent / f".{path.name}.{self.collection}.keywords"
        from ragspec import paths

        return paths.home() / "milvus-keywords" / self._safe()

    def vectors_folder(self) -> Path | None:
        """Where the index's vector files live (milvus_vectors.py): beside a Milvus Lite file.
        None for a server, which searches its own vectors."""
        if not self.lite:
            return None
        path = Path(self.uri)
        return path.parent / f".{path.name}.{self.collection}.vectors"

    def records_folder(self) -> Path | None:
        """Where the index's passage records live (milvus_records.py): beside a Milvus Lite
        file. None for a server, which is read by its clients wherever they run."""
        if not self.lite:
            return None
        path = Path(self.uri)
        return path.parent / f".{path.name}.{self.collection}.records"

    def _safe(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in f"{self.uri}-{self.collection}")
