"""From a question to the passages that may answer it, and whether they are relevant enough.

Contract:
  * `retrieve(store, question, history, ...)` makes a follow-up standalone (see
    `standalone_question`), searches with the chosen mode ("dense" or "hybrid", see
    ragspec.retrieval.faiss.store) and compares the best cosine of any passage with the relevance floor
    `min_score`: below it the Retrieval is `refused`, and the caller shows NOT_IN_DOCUMENTS with
    the closest passages (the most similar ones, whatever the mode) instead of asking the
    model. Above the floor but below WORDS_CHECK_BELOW, a question is refused too when the
    documents never use one of its specific words (`absent_words`: "rotate" in "How do I
    rotate the API keys?"; ragspec.retrieval.absent_words). No model is needed here, so a
    refusal costs one embedding, one search and a few keyword look-ups. min_score = 0 turns
    both checks off.
  * Follow-ups: with chat history, a question that leans on an earlier one ("and what about its
    GPU version?") is made standalone by prefixing the previous standalone question. A rule,
    not the model: a 135M model rewrites questions unreliably and the rewrite would cost a
    whole generation before retrieval starts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ragspec.retrieval.absent_words import absent_words
from ragspec.retrieval.records import Hit, Passage

NOT_IN_DOCUMENTS = ("Your documents do not appear to contain the answer to this question, so no "
                    "answer was generated. These are the closest passages found:")

# Chosen on the tuning question sets (docs/documents-and-search.md, "Finding passages"; ragspec/eval/retrieval.py):
# hybrid had the better recall; the floor is the highest that refused no answerable question.
DEFAULT_SEARCH = "hybrid"
DEFAULT_MIN_SCORE = 0.4
# Chosen on the tuning sets too (`python -m ragspec.eval.refusal`, docs/answer-quality.md): the
# highest best cosine below which missing specific words refuse no answerable tuning question.
WORDS_CHECK_BELOW = 0.57


class NoDocumentsError(RuntimeError):
    """The index holds no passages: there is nothing to answer from."""


@dataclass
class Retrieval:
    """What one question retrieved. best_score: the best cosine of any passage (None for an
    empty index). refused: no answer should be generated, because best_score is below the
    floor or the documents lack `absent_words` (the question's specific words they never
    use; empty when the floor alone refused or nothing was checked)."""

    question: str
    standalone_question: str
    hits: list[Hit]
    best_score: float | None
    min_score: float
    refused: bool
    absent_words: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The `ask --json` fields of a refusal."""
        return {"refused": self.refused, "message": NOT_IN_DOCUMENTS if self.refused else None,
                "best_score": self.best_score, "min_score": self.min_score,
                "absent_words": self.absent_words}


def retrieve(store, question: str, history: Sequence[dict] = (), *, k: int = 4,
             search: str = DEFAULT_SEARCH, min_score: float = DEFAULT_MIN_SCORE,
             rewrite_followups: bool = True) -> Retrieval:
    """Rewrite a follow-up and search `store`; say whether it is refused (see the module
    docstring). Needs no model."""
    question = check_question(question)
    standalone = standalone_question(question, history) if rewrite_followups else question
    if store.passage_count() == 0:
        raise NoDocumentsError(
            "No documents are indexed yet. Add some with `ragspec ingest PATH...` or the "
            "upload box in the sidebar of `ragspec ui`."
        )
    result = store.retrieve(standalone, k=k, mode=search)
    best = result.best_score
    refused = min_score > 0 and best is not None and best < min_score
    absent: list[str] = []
    if min_score > 0 and not refused and best is not None and best < WORDS_CHECK_BELOW:
        # A store without keyword look-ups (a test double, a remote index) is not checked.
        found = getattr(store, "indexed_words", None)
        if found is not None:
            absent = absent_words(standalone, found, [h.passage.text for h in result.hits])
        refused = bool(absent)
    if refused and search != "dense":
        # The closest passages shown with a refusal are the most similar ones, the best (whose
        # score the floor judged) first; a fused ranking need not hold that one at all.
        result = store.retrieve(standalone, k=k, mode="dense")
    return Retrieval(question, standalone, list(result.hits), best, min_score, refused, absent)


def refusal_reason(retrieval: Retrieval) -> str:
    """Why a refused question was refused, in one line for people."""
    best = f"best similarity {retrieval.best_score:.2f}"
    if retrieval.absent_words:
        return (f"{best}, and your documents never use "
                f"{', '.join(repr(w) for w in retrieval.absent_words)} (a specific word of the "
                f"question)")
    return f"{best}, below the floor {retrieval.min_score:.2f}"


def passage_json(n: int, p: Passage, score: float | None, copied: Sequence = ()) -> dict:
    """One passage as `ask --json` shows it: number, provenance, score, text, copied ranges."""
    return {"n": n, "id": p.id, "doc_id": p.doc_id, "source": p.source, "page": p.page,
            "start": p.start, "score": score, "text": p.text, "copied": [list(r) for r in copied]}


def hits_to_dicts(hits: Sequence[Hit]) -> list[dict]:
    """Search hits in passage_json's shape (nothing was copied from them)."""
    return [passage_json(i + 1, h.passage, h.score) for i, h in enumerate(hits)]


# -- follow-up questions ------------------------------------------------------------------------

REFERRING = {
    "it", "its", "it's", "they", "them", "their", "theirs", "this", "that", "these", "those",
    "there", "he", "she", "his", "her", "one", "ones", "same", "former", "latter", "above",
    "also", "too", "else", "instead",
}
FOLLOWUP_OPENERS = ("and ", "but ", "also ", "so ", "what about", "how about", "then ", "or ")


# A question ending on one of these points back in time ("What happens to the queued jobs
# then?"): the moment it means was named by an earlier question.
FOLLOWUP_ENDINGS = frozenset({"then"})


def is_followup(question: str, endings: frozenset[str] = FOLLOWUP_ENDINGS) -> bool:
    """A question that needs the conversation to make sense: it opens like a continuation,
    refers back with a pronoun, ends on "then", or is too short to stand alone (three words or
    fewer)."""
    q = question.strip().lower()
    words = re.findall(r"[a-z']+", q)
    return (
        q.startswith(FOLLOWUP_OPENERS)
        or any(w in REFERRING for w in words)
        or (bool(words) and words[-1] in endings)
        or len(words) <= 3
    )


def standalone_question(question: str, history: Sequence[dict] = (), *,
                        endings: frozenset[str] = FOLLOWUP_ENDINGS) -> str:
    """The question made standalone with a simple rule.

    history: chat turns, oldest first, as {"role": "user"|"assistant", "content": str}; a user
    turn may carry "standalone" (what this function returned for it), so chains of follow-ups
    keep the original subject. A follow-up (see is_followup) becomes
    "<previous standalone question> <question>"; anything else is returned unchanged.
    endings: the last words that make a follow-up (empty: the rule before "then" counted).
    """
    question = question.strip()
    previous = next(
        (t.get("standalone") or t.get("content", "") for t in reversed(list(history))
         if t.get("role") == "user" and (t.get("standalone") or t.get("content", "")).strip()),
        "",
    ).strip()
    if not previous or not is_followup(question, endings):
        return question
    return f"{previous} {question}"


def check_question(question: str) -> str:
    if not isinstance(question, str) or not question.strip():
        raise ValueError("the question is empty: type a question about your documents")
    return question.strip()
