"""Which accepted drafts an answer *shows* as copied: the one rule the chat page and the
terminal both apply before they mark anything.

An accepted draft proves only that the model agreed with a few tokens the drafter proposed. A
draft of "43" inside "7431", of ".", or of a line break is as likely a coincidence as a copy, and
marking it tells the reader nothing. So, for display only:

  1. Adjacent accepted drafts merge into one run: drafts copied from the same passage whose
     character ranges follow each other (the next starts where the last ended, or one
     character later: a space the tokenizer's offsets leave out), and adjacent repeats of the
     answer's own text or of the question (neither is a source; their runs are underlined).
  2. A run is shown only if it holds a whole word of at least MIN_WORD_CHARS letters or digits
     (Unicode word characters): a word that starts and ends inside the run, with no letter or
     digit of the answer right before or after it; or MIN_PIECE_CHARS or more letters or digits
     in a row (a long piece of an identifier, a list of flags or a hash, which no coincidence
     writes). Anything shorter is shown as plain text.

Why MIN_WORD_CHARS = 4, from real answers: the bundled corpus (`ragspec ingest data/corpus`),
nine `ragspec ask` questions, smollm2-135m-instruct, greedy. Of the 21 accepted drafts copied
from a passage, 14 held no whole word: pieces of numbers ("7" and "32" of "7432", "02" of
"2024", "20", "5", "3"), pieces of words ("emon" of "daemon", "ark" of "lark", "d", "4 Mi" of
"64 MiB") and a comma. Five more held only words of 2-3 letters (" by", " the", " of", ". The",
" in Go"): words any answer writes, copied or not. Four letters or digits is the shortest that
keeps a whole port number or year ("7431", "2024") and a name; it leaves " September " and
" that" shown (2 of 21). Of the 94 repeats of the answer's own text or of the question, 17 are
underlined (" a list of jobs", " log size", "d daemon is"...); the rest were pieces like ". \n##"
of a numbered list repeating itself. MIN_PIECE_CHARS = 8 changes none of those: the longest piece
of a word there had 4 letters ("emon"); it keeps a copied run of a long flag list such as
bzip2's "-cdfkqstvzVL123456789" shown when the copy is split inside it.

Contract:
  * `shown_spans(spans)` -> the spans to display: the same text in the same order (the texts
    concatenate to the answer), merged runs as one Span (token ids and character range joined,
    origin of the first draft, char_end of the last), runs below the rule as plain Spans
    (drafted False, no origin). Plain and quoted spans pass through unchanged.
  * `ShownStream` does the same for spans that arrive one by one (the terminal's live answer):
    `feed(span)` returns the spans it can decide now (a drafted run is held until the next
    text shows where it ends), `finish()` the rest; fed or at once, the result is the same.
  * Display only: the API, `--json` and saved chats keep every span as the engine produced it,
    with its provenance.

Example: "The default port is 7" (plain), "43" (draft, passage 0, chars 120-122), "1" (plain),
"." (draft) -> one plain text: neither draft holds a whole word.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ragspec.decoding.types import Span, SpanOrigin
from ragspec.describe import PASSAGE, draft_source

MIN_WORD_CHARS = 4
MIN_PIECE_CHARS = 8
RULE = (f"a draft is marked only when it holds a whole word of {MIN_WORD_CHARS} or more letters "
        f"or digits (or {MIN_PIECE_CHARS} or more in a row); shorter ones (a piece of a word or "
        f"number, punctuation, spaces) are left plain, as a coincidence cannot be told from a "
        f"copy")
_WORD = re.compile(r"\w+")


def _joins(last: Span, span: Span) -> bool:
    """True when `span` continues the drafted run ending with `last` (rule 1)."""
    kind = draft_source(span)
    if kind is None or kind != draft_source(last):
        return False
    if kind != PASSAGE:
        return True
    a, b = last.origin, span.origin
    return (a.source == b.source and a.char_end is not None and b.char_start is not None
            and 0 <= b.char_start - a.char_end <= 1)


def _merge(run: Sequence[Span]) -> Span:
    if len(run) == 1:
        return run[0]
    first, last = run[0].origin, run[-1].origin
    origin = first if first is None else SpanOrigin(
        first.position, first.in_prompt, first.source, first.char_start,
        last.char_end if last is not None else first.char_end)
    return Span("".join(s.text for s in run), [t for s in run for t in s.token_ids], True,
                origin)


def _is_word_char(char: str) -> bool:
    return bool(char) and bool(_WORD.match(char))


def holds_whole_word(text: str, before: str = "", after: str = "") -> bool:
    """True when `text` holds a word of MIN_WORD_CHARS+ word characters that is whole in the
    answer (`before` and `after` are the characters next to `text` there, "" at an edge), or
    MIN_PIECE_CHARS+ word characters in a row, whole or not."""
    for m in _WORD.finditer(text):
        if len(m.group()) >= MIN_PIECE_CHARS:  # a long piece: shown even if not whole
            return True
        if len(m.group()) < MIN_WORD_CHARS:
            continue
        if m.start() == 0 and _is_word_char(before):
            continue
        if m.end() == len(text) and _is_word_char(after):
            continue
        return True
    return False


def _judged(run: Sequence[Span], before: str, after: str) -> Span:
    merged = _merge(run)
    if holds_whole_word(merged.text, before, after):
        return merged
    return Span(merged.text, list(merged.token_ids), False)


class ShownStream:
    """See the module docstring: `shown_spans` for spans that arrive one by one."""

    def __init__(self) -> None:
        self._run: list[Span] = []  # drafted spans whose run may still grow
        self._before = ""  # the last character of the text already decided

    def feed(self, span: Span) -> list[Span]:
        if span.drafted and (not self._run or _joins(self._run[-1], span)):
            self._run.append(span)
            return []
        if span.drafted:  # a draft of another kind or place starts its own run
            out = self._close(span.text[:1])
            self._run.append(span)
            return out
        if not span.text:  # no character yet to tell where a run ends
            return self._pass([span]) if not self._run else (self._run.append(span) or [])
        return self._close(span.text[:1]) + self._pass([span])

    def finish(self) -> list[Span]:
        return self._close("")

    def _close(self, after: str) -> list[Span]:
        if not self._run:
            return []
        drafts = [s for s in self._run if s.drafted]
        held = [s for s in self._run if not s.drafted]  # empty plain spans held behind it
        self._run = []
        return self._pass([_judged(drafts, self._before, after), *held])

    def _pass(self, spans: list[Span]) -> list[Span]:
        for s in spans:
            if s.text:
                self._before = s.text[-1]
        return spans


def shown_spans(spans: Iterable[Span]) -> list[Span]:
    """The spans to display (module docstring, rules 1 and 2)."""
    stream = ShownStream()
    out: list[Span] = []
    for span in spans:
        out += stream.feed(span)
    return out + stream.finish()
