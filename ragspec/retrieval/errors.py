"""Errors the retrieval layer raises on purpose.

Every message says what went wrong *and what to do about it*; the CLI prints them verbatim
(as click.ClickException), the UI shows them in a banner. Nothing here is a crash to debug.
"""

from __future__ import annotations


class RetrievalError(Exception):
    """Base class: a problem the user can act on."""


class LoadError(RetrievalError):
    """One input file could not be turned into text (reported per file; ingest goes on)."""


class IndexCorruptError(RetrievalError):
    """The files on disk do not form a valid index (truncated, hand-edited, mismatched)."""


class IndexLockedError(RetrievalError):
    """Another process holds the index write lock and did not release it in time."""


class IndexNotWritableError(RetrievalError):
    """The index directory cannot be written (permissions, read-only filesystem)."""


class EmbedderUnavailableError(RetrievalError):
    """The embedding model is not installed, incomplete, or cannot be loaded from local files."""


class EmbedderMismatchError(RetrievalError):
    """The index was built with a different embedding model than the one opening it."""


class UnknownDocumentError(RetrievalError, KeyError):
    """`remove` (or a lookup) named a document the index does not hold."""

    def __str__(self) -> str:
        # KeyError's __str__ quotes its argument; we want the plain sentence.
        return str(self.args[0]) if self.args else ""


def type_name(exc: BaseException) -> str:
    """The exception's type as a user could search for it: `KeyError`, `zlib.error`,
    `xml.etree.ElementTree.ParseError` (reported when a file fails in a way we did not foresee)."""
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def not_saved(where, exc: OSError) -> IndexNotWritableError:
    """The error for a commit that could not be written (a full disk, a read-only filesystem):
    which index, the cause and what to do (ragspec.fileio.explain), and that nothing changed."""
    from ragspec.fileio import explain

    return IndexNotWritableError(
        f"Could not save the index in {where}: {explain(exc)}. The previous index is unchanged."
    )
