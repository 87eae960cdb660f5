"""The question sets the benchmark and the quality evaluation read, and a question's prepared
prompt.

Contract: `load_questions` reads JSON lines and raises BenchInputError, naming the line, for
anything it cannot use; a Prepared holds the prompt token ids the real pipeline built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

KINDS = ("copy", "open")


class BenchInputError(ValueError):
    """A questions file or prompt the benchmark cannot use; the message says where and why."""


@dataclass(frozen=True)
class Question:
    """answers: the verbatim snippets that hold the answer (empty when the file gives none).
    unanswerable: the documents do not hold the answer. source: the document that holds it
    (None when the file does not say; `ragspec bench --sessions` groups questions by it)."""

    id: str
    question: str
    kind: str = "copy"
    answers: tuple[str, ...] = ()
    unanswerable: bool = False
    source: str | None = None


def load_questions(path: str | Path, limit: int | None = None, *,
                   unanswerable: bool = False) -> list[Question]:
    """Questions from a JSONL file: one {"id", "question", "kind", "answer"} object per line.

    kind is "copy" (the answer should quote the documents) or "open"; missing means "copy".
    answer: a snippet or a list of snippets that hold the answer (optional). Questions marked
    "unanswerable" are skipped unless `unanswerable` is True (the quality evaluation asks them
    to see them refused). A missing id becomes the line number. Blank lines are skipped.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchInputError(f"cannot read questions file {path}: {exc}") from exc
    questions: list[Question] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise BenchInputError(f"{where}: not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise BenchInputError(f"{where}: expected an object like "
                                  '{"id": "q1", "question": "...", "kind": "copy"}')
        text = obj.get("question")
        if not isinstance(text, str) or not text.strip():
            raise BenchInputError(f"{where}: \"question\" must be a non-empty string")
        if obj.get("unanswerable") and not unanswerable:
            continue  # the documents do not hold the answer: nothing to time
        kind = obj.get("kind") or "copy"
        if kind not in KINDS:
            raise BenchInputError(f"{where}: \"kind\" must be \"copy\" or \"open\", got {kind!r}")
        qid = str(obj["id"]) if obj.get("id") not in (None, "") else str(number)
        if qid in seen:
            raise BenchInputError(f"{where}: duplicate id {qid!r}")
        seen.add(qid)
        answers = obj.get("answer") or []
        answers = [answers] if isinstance(answers, str) else answers
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise BenchInputError(f"{where}: \"answer\" must be a string or a list of strings")
        source = obj.get("source")
        questions.append(Question(qid, text.strip(), kind, tuple(a for a in answers if a.strip()),
                                  bool(obj.get("unanswerable")),
                                  str(source) if source not in (None, "") else None))
    if not questions:
        raise BenchInputError(f"{path} holds no questions: write one JSON object per line")
    return questions[:limit] if limit else questions


@dataclass(frozen=True)
class Prepared:
    """A question with its prompt as the pipeline built it."""

    question: Question
    prompt_ids: list[int]
    sources: tuple = ()
