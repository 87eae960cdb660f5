"""What a browser is told when something fails on the server: a short sentence, never a path.

Contract: `public_message(exc, doing)` returns one line for the page (and for the chat file,
which the page shows again later) and logs the whole exception, traceback included, in the
server's log. Messages that ragspec writes for users on purpose and that hold no server path
(NoDocumentsError, a refused setting, a denied action or quota) pass through as they are;
everything else, including store errors that name the index folder, becomes a sentence about
`doing` that points to the log; a file the server could not write (a full disk, a read-only
filesystem) says so, with the cause and what to do, but not the path.
"""

from __future__ import annotations

import logging

from ragspec.fileio import explain, is_disk_error

logger = logging.getLogger("ragspec.web")

_RETRIEVAL_HINTS = {
    "IndexCorruptError": "the document index is damaged",
    "IndexLockedError": "the document index is busy (another process is writing it); "
                        "try again in a moment",
    "IndexNotWritableError": "the document index cannot be written",
    "EmbedderUnavailableError": "the search model cannot be loaded",
    "EmbedderMismatchError": "the index was built with another search model",
}


def public_message(exc: BaseException, doing: str) -> str:
    """See the module docstring. doing: what failed, e.g. "Generation", "Removing report.pdf"."""
    from ragspec.accounts.policy import Denied
    from ragspec.search import NoDocumentsError
    from ragspec.web.chats import ChatError

    if isinstance(exc, (NoDocumentsError, Denied)):
        return str(exc)
    if isinstance(exc, ChatError) and not isinstance(exc.__cause__, OSError):
        return str(exc)  # chat errors name the chat, never the folder
    logger.error("%s failed", doing, exc_info=exc)
    disk = next((e for e in (exc, exc.__cause__) if is_disk_error(e)), None)
    if disk is not None:  # the cause without the path: "the disk is full ...; free some space"
        return f"{doing} failed: the server could not write a file: {explain(disk)}."
    hint = _RETRIEVAL_HINTS.get(type(exc).__name__)
    reason = f": {hint}" if hint else ""
    return f"{doing} failed{reason}; the server's log has the details."
