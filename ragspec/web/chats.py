"""Chats that persist: one JSON file per chat under `$RAGSPEC_HOME/chats/`.

Contract:
  * A chat is a plain dict, saved as `<root>/<id>.json`:
        {"format": "ragspec-chat", "version": 1, "id", "title", "created_at", "updated_at",
         "messages": [...]}
    A user message is {"role": "user", "content", "standalone"}; an assistant message is
    {"role": "assistant", "content", "status", "model", "error", "greedy", "runs", "passages",
     "note", "refused", "absent_words"}
    where status is "waiting", "generating", "done", "stopped" or "failed"; refused is true
    when no passage was relevant enough (no runs then: the passages are the closest found,
    the content says the documents do not appear to hold the answer; absent_words, the
    question's specific words the documents never use when they were the reason, else []); each run is
    {"label", "text", "token_ids", "spans", "stats"} (spans as `Span.to_dict()`: text, token
    ids, drafted, origin; stats as `GenerationStats.to_dict()`), and each passage is
    {"id", "doc_id", "source", "page", "start", "text", "score"}. `answer_record` turns an
    assistant message back into Span, Passage and GenerationStats objects, so a reloaded chat
    shows the same highlights and provenance as the live answer.
  * Writes are atomic (a temporary file in the same folder, flushed, then renamed), and every
    read-modify-write (`update`) holds that chat's own file lock (`.locks/<id>.lock`), so two
    sessions or two server processes never lose each other's changes, and saving one chat
    never waits for another. A lock not had within `lock_timeout` seconds is `ChatBusy`.
    Nothing is pickled; a damaged file is skipped by `list` and reported by `load`
    (ChatError), never executed. A write that fails (a full disk) leaves the chat as it was
    and raises ragspec.fileio.WriteFailed (`create`, `update` and `save_partial` alike).
  * An answer being written is saved cheaply: `save_partial` writes only that message to
    `.partial/<id>.json` (no fsync; its cost grows with the answer, not with the chat), and
    `load` shows it in place of the waiting or generating message it stands for. The next
    `update` folds it into the chat file.
  * Chats may belong to a user: `ChatStore(root, user=NAME, can_see=PREDICATE)` stamps new
    chats with "user": NAME and treats every chat `can_see(chat_user)` refuses as missing
    (list, load, update and delete alike), so a chat id from another user's address finds
    nothing. Without `can_see` every chat is visible (the CLI, the single-user chat).
  * Error messages name the chat, never the folder: they may reach a browser.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock, Timeout

from ragspec.decoding.types import GenerationStats, Span
from ragspec.fileio import WriteFailed, write_atomically
from ragspec.retrieval.records import Passage

FORMAT = "ragspec-chat"
VERSION = 1
TITLE_CHARS = 80
_ID = re.compile(r"^[0-9a-f]{12}$")
LOCKS, PARTIAL = ".locks", ".partial"


class ChatError(ValueError):
    """A chat that does not exist or cannot be read; the message says which and why."""


class ChatBusy(ChatError):
    """The chat's lock was not had in time (another process is saving it)."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def title_for(question: str) -> str:
    """The chat's title: its first question on one line, cut to TITLE_CHARS characters."""
    line = " ".join(question.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "\u2026"


@dataclass(frozen=True)
class ChatSummary:
    id: str
    title: str
    created_at: str
    updated_at: str
    messages: int
    user: str | None = None

    def to_dict(self) -> dict:
        return {"id": self.id, "title": self.title, "created_at": self.created_at,
                "updated_at": self.updated_at, "messages": self.messages, "user": self.user}


_SUMMARIES: dict[str, tuple[tuple[int, int], ChatSummary]] = {}  # path -> (mtime, size), summary


class ChatStore:
    """The chats in one folder (see the module docstring)."""

    def __init__(self, root: str | os.PathLike, *, user: str | None = None,
                 can_see: Callable[[str | None], bool] | None = None,
                 lock_timeout: float = 30.0) -> None:
        self.root = Path(root)
        self.user, self.can_see, self.lock_timeout = user, can_see, lock_timeout

    def path(self, chat_id: str) -> Path:
        if not isinstance(chat_id, str) or not _ID.match(chat_id):
            raise ChatError(f"{chat_id!r} is not a chat id (12 hex digits; `ragspec chats list` "
                            f"shows them)")
        return self.root / f"{chat_id}.json"

    def _partial_path(self, chat_id: str) -> Path:
        return self.root / PARTIAL / f"{chat_id}.json"

    @contextlib.contextmanager
    def _locked(self, chat_id: str):
        folder = self.root / LOCKS
        folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(folder / f"{chat_id}.lock"), timeout=self.lock_timeout)
        try:
            lock.acquire()
        except Timeout:
            raise ChatBusy(f"chat {chat_id} is busy (it is being saved elsewhere); try again")\
                from None
        try:
            yield
        finally:
            lock.release()

    def create(self, title: str = "") -> dict:
        chat_id = secrets.token_hex(6)
        stamp = now()
        chat = {"format": FORMAT, "version": VERSION, "id": chat_id, "title": title,
                "created_at": stamp, "updated_at": stamp, "messages": []}
        if self.user is not None:
            chat["user"] = self.user
        with self._locked(chat_id):
            self._write(chat)
        return chat

    def load(self, chat_id: str) -> dict:
        chat = self._read(chat_id)
        try:
            partial = json.loads(self._partial_path(chat_id).read_text(encoding="utf-8"))
            index, message = partial["index"], partial["message"]
        except (OSError, ValueError, KeyError, TypeError):
            return chat  # none, or one cut short by a crash: the chat file stands
        messages = chat["messages"]
        if (isinstance(index, int) and 0 <= index < len(messages)
                and messages[index].get("status") in ("waiting", "generating")):
            messages[index] = message
        return chat

    def _read(self, chat_id: str) -> dict:
        path = self.path(chat_id)
        try:
            chat = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ChatError(f"no chat {chat_id}") from None
        except (OSError, ValueError) as exc:
            raise ChatError(f"chat {chat_id} cannot be read ({exc.__class__.__name__})") from exc
        if not isinstance(chat, dict) or chat.get("format") != FORMAT or chat.get("id") != chat_id:
            raise ChatError(f"{path.name} is not a ragspec chat")
        if chat.get("version") != VERSION or not isinstance(chat.get("messages"), list):
            raise ChatError(f"chat {chat_id} has an unknown layout (version "
                            f"{chat.get('version')!r}); this ragspec reads version {VERSION}")
        if self.can_see is not None and not self.can_see(chat.get("user")):
            raise ChatError(f"no chat {chat_id}")  # another user's: as if it did not exist
        return chat

    def exists(self, chat_id: str) -> bool:
        try:
            self._read(chat_id)
        except ChatError:
            return False
        return True

    def update(self, chat_id: str, change: Callable[[dict], object]) -> dict:
        """Load, apply `change(chat)` (which edits the dict in place), save; under the chat's
        lock. A partial answer is folded into the chat file."""
        with self._locked(chat_id):
            chat = self.load(chat_id)
            change(chat)
            chat["updated_at"] = now()
            self._write(chat)
            self._partial_path(chat_id).unlink(missing_ok=True)
        return chat

    def save_partial(self, chat_id: str, index: int, message: dict) -> None:
        """The answer at `index` as it stands, without rewriting the chat (see above)."""
        with self._locked(chat_id):
            if not self.path(chat_id).is_file():
                raise ChatError(f"no chat {chat_id}")
            folder = self.root / PARTIAL
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{chat_id}-", suffix=".tmp", dir=folder)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    json.dump({"index": index, "message": message}, out, ensure_ascii=False)
                os.replace(tmp, self._partial_path(chat_id))
            except BaseException as exc:
                Path(tmp).unlink(missing_ok=True)
                if isinstance(exc, OSError) and not isinstance(exc, WriteFailed):
                    raise WriteFailed(self._partial_path(chat_id), exc) from exc  # one line
                raise

    def delete(self, chat_id: str) -> None:
        path = self.path(chat_id)
        with self._locked(chat_id):
            self._read(chat_id)  # missing, or not this user's: ChatError
            _SUMMARIES.pop(str(path.resolve()), None)
            path.unlink()
            self._partial_path(chat_id).unlink(missing_ok=True)

    def list(self) -> list[ChatSummary]:
        """Readable chats this store may see, most recently updated first (damaged files are
        skipped)."""
        out = []
        for path in self.root.glob("*.json") if self.root.is_dir() else ():
            summary = self._summary(path)
            if summary is not None and (self.can_see is None or self.can_see(summary.user)):
                out.append(summary)
        return sorted(out, key=lambda c: (c.updated_at, c.id), reverse=True)

    def _summary(self, path: Path) -> ChatSummary | None:
        # The sidebar lists the chats on every page run: parse a file again only when it changed.
        try:
            stat = path.stat()
        except OSError:
            return None
        key, stamp = str(path.resolve()), (stat.st_mtime_ns, stat.st_size)
        cached = _SUMMARIES.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            chat = ChatStore(self.root)._read(path.stem)
        except ChatError:
            return None
        summary = ChatSummary(chat["id"], chat.get("title") or "(untitled)",
                              chat.get("created_at", ""), chat.get("updated_at", ""),
                              len(chat["messages"]), chat.get("user"))
        _SUMMARIES[key] = (stamp, summary)
        return summary

    def find(self, ref: str) -> str:
        """The id of the chat named by `ref`: its id or a unique prefix of 4+ characters."""
        if _ID.match(ref or "") and self.exists(ref):
            return ref
        matches = [c.id for c in self.list() if len(ref) >= 4 and c.id.startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        reason = "matches several chats" if matches else "matches no chat"
        raise ChatError(f"{ref!r} {reason}; `ragspec chats list` shows the ids")

    def _write(self, chat: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path(chat["id"]), json.dumps(chat, ensure_ascii=False, indent=1),
                         mode=0o600)


# -- messages <-> engine objects ------------------------------------------------------------


def user_message(question: str, standalone: str | None = None) -> dict:
    return {"role": "user", "content": question, "standalone": standalone}


def passage_dict(passage: Passage, score: float | None = None) -> dict:
    return {"id": passage.id, "doc_id": passage.doc_id, "source": passage.source,
            "page": passage.page, "start": passage.start, "text": passage.text, "score": score}


def stats_dict(stats: GenerationStats | None) -> dict | None:
    """stats.to_dict(), plus the per-step acceptances the page charts (to_dict leaves them out)."""
    if stats is None:
        return None
    return {**stats.to_dict(), "accepted_per_step": list(stats.accepted_per_step)}


def run_dict(label: str, spans: list[Span], stats: GenerationStats | None) -> dict:
    return {
        "label": label,
        "text": "".join(s.text for s in spans),
        "token_ids": [t for s in spans for t in s.token_ids],
        "spans": [s.to_dict() for s in spans],
        "stats": stats_dict(stats),
    }


def span_from_dict(d: dict) -> Span:
    from ragspec.quoting import span_from_dict as read  # quoted spans come back quoted

    return read(d)


_STATS_FIELDS = {f.name for f in fields(GenerationStats)}


def stats_from_dict(d: dict | None) -> GenerationStats:
    """GenerationStats from its to_dict() form (derived values are recomputed, not read)."""
    values = {k: v for k, v in (d or {}).items() if k in _STATS_FIELDS}
    values["accepted_lengths"] = {int(k): v for k, v in values.get("accepted_lengths", {}).items()}
    return GenerationStats(**values)


def passage_from_dict(d: dict) -> Passage:
    return Passage(id=d["id"], doc_id=d["doc_id"], text=d["text"], source=d["source"],
                   page=d.get("page"), start=d.get("start", 0))


def answer_record(message: dict) -> dict:
    """An assistant message as the objects the page renders: runs with Span lists and
    GenerationStats, Passage list, scores, greedy flag."""
    passages = [passage_from_dict(p) for p in message.get("passages") or []]
    runs = []
    for run in message.get("runs") or []:
        runs.append({
            "label": run.get("label", ""),
            "text": run.get("text", ""),
            "token_ids": list(run.get("token_ids") or []),
            "spans": [span_from_dict(s) for s in run.get("spans") or []],
            "stats": stats_from_dict(run.get("stats")),
        })
    return {"runs": runs, "passages": passages,
            "scores": [p.get("score") for p in message.get("passages") or []],
            "greedy": bool(message.get("greedy", True)), "status": message.get("status", "done"),
            "model": message.get("model"), "error": message.get("error"),
            "note": message.get("note"), "refused": bool(message.get("refused")),
            "absent_words": list(message.get("absent_words") or [])}


def history(chat: dict) -> list[dict]:
    """The chat as the pipeline's follow-up history: role, content, standalone."""
    return [{"role": m["role"], "content": m.get("content", ""), "standalone": m.get("standalone")}
            for m in chat["messages"]]
