"""A saved chat as a Markdown document: each question, its answer, and the passages it cited.

Contract: `chat_markdown(chat)` takes a chat dict as ragspec.web.chats stores it and returns Markdown.
Answers are quoted as written; each answer is followed by its passages, numbered as the answer
cites them ([1], [2], ...), with file name, page and the passage text as a block quote, after a
list of the spans the answer copied (as the chat marks them: ragspec.highlights), each with its
passage number, file name and page. A
side-by-side answer exports its last run (speculation on), which is the one the chat shows
with provenance. Stopped, failed and interrupted answers say so, and so do answers that ended
because they started repeating themselves or reached the length limit.
"""

from __future__ import annotations

from ragspec.describe import PASSAGE, draft_source, passage_label, source_label, stop_note
from ragspec.highlights import shown_spans
from ragspec.search import NOT_IN_DOCUMENTS
from ragspec.web.chats import answer_record

_STATUS_NOTE = {
    "stopped": "*(stopped: the answer was cut short)*",
    "failed": "*(no answer: {error})*",
    "waiting": "*(interrupted before it started)*",
    "generating": "*(interrupted: the answer was cut short)*",
}


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines() or [""])


def _answer(message: dict) -> list[str]:
    record = answer_record(message)
    out = []
    if record["refused"]:
        out.append(f"*{NOT_IN_DOCUMENTS}*")
    if record["runs"]:
        out.append(record["runs"][-1]["text"].strip() or "*(empty answer)*")
    note = _STATUS_NOTE.get(record["status"])
    if note:
        out.append(note.format(error=record["error"] or "unknown error"))
    elif record["runs"] and stop_note(record["runs"][-1]["stats"].stop_reason):
        out.append(f"*({stop_note(record['runs'][-1]['stats'].stop_reason)})*")
    copied = _copied(record)
    if copied:
        out.append("**Copied from the documents**")
        out.append("\n".join(copied))
    if record["passages"]:
        out.append("**Passages**")
        for i, passage in enumerate(record["passages"]):
            out.append(f"[{i + 1}] {source_label(passage)}\n\n{_quote(passage.text)}")
    return out


def _copied(record: dict) -> list[str]:
    """One line per span of the answer copied from a passage: the words, then where they are."""
    if not record["runs"]:
        return []
    passages = record["passages"]
    lines = []
    for span in shown_spans(record["runs"][-1]["spans"]):  # as the chat marks them
        o = span.origin
        if (draft_source(span) != PASSAGE or not isinstance(o.source, int)
                or not 0 <= o.source < len(passages) or not span.text.strip()):
            continue
        words = " ".join(span.text.split()).replace("`", "'")
        lines.append(f"- `{words}` ({passage_label(o.source, passages[o.source])})")
    return lines


def chat_markdown(chat: dict) -> str:
    """The whole chat as Markdown (see the module docstring)."""
    lines = [f"# {chat.get('title') or 'Chat'}", "",
             f"*ragspec chat {chat['id']}, started {chat.get('created_at', '')}*", ""]
    for message in chat["messages"]:
        if message["role"] == "user":
            lines += [f"## {' '.join(message.get('content', '').split())}", ""]
        else:
            for block in _answer(message):
                lines += [block, ""]
    return "\n".join(lines).rstrip() + "\n"

