"""Cut a retrieved passage down to the sentences nearest the question, keeping exact provenance.

Contract: `trim_passage(passage, question, budget, count)` returns a Passage whose text is one
contiguous run of whole sentences of `passage.text`, i.e. `passage.text[a:b]`, with `start`
moved by `a`; id, doc_id, source and page are unchanged. So what held for the passage holds
for the result: `loaded_text[start : start + len(text)] == text`, and a character range of the
trimmed text is a range of the document (citations, highlights and the source view need
nothing else). `count(text)` is the length in the prompt's tokens (the generator's tokenizer);
`budget` is the most tokens the kept text may have. A passage of at most `budget` tokens comes
back unchanged (the same object). No model, no embedding: word look-ups only.

  * Sentences: the passage is cut after ".", "!" or "?" followed by whitespace, and at blank
    lines; each sentence is stripped of the whitespace around it (so a manual page's option
    line and its description, one hard-wrapped paragraph, stay one sentence).
  * Nearness: the question's words (BM25's tokens, function words left out) are matched with
    their plain inflections (ragspec.retrieval.absent_words.inflections); a sentence scores the
    sum, over the distinct question words it has, of that word's rarity among the passage's
    sentences (log(1 + n / df)), so a word every sentence repeats counts little.
  * The window: the best sentence (the highest score, the earliest on ties; the first sentence
    when none has a question word) is kept whole even when it alone is over the budget; then
    the window grows one sentence at a time toward the neighbour that scores higher (the
    following one on ties: a definition's next sentence usually continues it) while the text
    from the window's first to its last character stays within the budget.

Worked example (budget 12, counting words): "The cache is cleared every night. Entries older than 7
days are removed first when the cache is full. Logs rotate weekly." with the question "Which
entries are removed when the cache is full?" -> sentence 2 has entries, removed, cache, full
(sentence 1 only cache): it is kept; with it alone already over 12 tokens nothing is added,
and the result is passage.text[34:101] with start + 34.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import replace

from ragspec.retrieval.absent_words import FUNCTION_WORDS, inflections
from ragspec.retrieval.bm25.index import tokenize
from ragspec.retrieval.records import Passage

# The prompt tokens a passage may take by default (PipelineConfig.trim, `ragspec eval --trim`):
# chosen on data/realdocs/dev with `ragspec eval` among 48, 64, 96 and 128 as the one whose
# snippet recall was not lower than whole passages' (docs/answer-quality.md).
DEFAULT_TRIM = 128
# A sentence ends at . ! ? followed by whitespace; a blank line ends one too.
_BREAK = re.compile(r"(?<=[.!?])\s+|\n[ \t]*\n\s*")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of `text` (see the module docstring), in order, without
    the whitespace around it; empty pieces are skipped."""
    spans, pos = [], 0
    for m in [*_BREAK.finditer(text), None]:
        end = m.start() if m else len(text)
        piece = text[pos:end]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            spans.append((pos + lead, pos + len(piece.rstrip())))
        if m:
            pos = m.end()
    return spans


def question_words(question: str) -> list[set[str]]:
    """Each distinct content word of the question, as the set of its inflections."""
    words = dict.fromkeys(w for w in tokenize(question)
                          if w not in FUNCTION_WORDS and not w.isdigit())
    return [inflections(w) for w in words]


def sentence_scores(sentences: list[str], wanted: list[set[str]]) -> list[float]:
    """Each sentence's nearness to the question words `wanted` (module docstring)."""
    have = [set(tokenize(s)) for s in sentences]
    hits = [[bool(forms & words) for forms in wanted] for words in have]
    df = [sum(row[j] for row in hits) for j in range(len(wanted))]
    weight = [math.log(1 + len(sentences) / d) if d else 0.0 for d in df]
    return [sum(w for w, hit in zip(weight, row, strict=True) if hit) for row in hits]


def trim_passage(passage: Passage, question: str, budget: int,
                 count: Callable[[str], int]) -> Passage:
    """The passage cut to the sentences nearest `question` within `budget` tokens (see the
    module docstring)."""
    if budget < 1:
        raise ValueError(f"the trim budget must be >= 1 token, got {budget}")
    text = passage.text
    if count(text) <= budget:
        return passage
    spans = sentence_spans(text)
    if len(spans) < 2:
        return passage
    scores = sentence_scores([text[a:b] for a, b in spans], question_words(question))
    best = max(range(len(spans)), key=lambda i: (scores[i], -i))
    lo = hi = best
    while True:
        after = hi + 1 if hi + 1 < len(spans) else None
        before = lo - 1 if lo > 0 else None
        sides = [i for i in (after, before) if i is not None]
        if not sides:
            break
        # The higher-scoring neighbour first; the following one on ties.
        sides.sort(key=lambda i: -scores[i])
        for i in sides:
            a, b = spans[min(lo, i)][0], spans[max(hi, i)][1]
            if count(text[a:b]) <= budget:
                lo, hi = min(lo, i), max(hi, i)
                break
        else:
            break
    a, b = spans[lo][0], spans[hi][1]
    if (a, b) == (0, len(text)):
        return passage
    return replace(passage, text=text[a:b], start=passage.start + a)
