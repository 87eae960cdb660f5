"""From a question to the passages that may answer it, and whether they are relevant enough.

Contract:
  * `retrieve(store, question, history, ...)` makes a follow-up standalone (see
    `standalone_question`), searches with the chosen mode ("dense" or "hybrid", see
    ragspec.retrieval.faiss.store) and compares the best cosine of any passage with the relevance floor
    `min_score`: below it the Retrieval is `refused`, and the caller shows NOT_IN_DOCUMENTS with
    the closest passages (the most similar ones, whatever the mode) instead of asking the
    model. No model is needed here, so a refusal
    costs one embedding and one search. min_score = 0 turns the floor off.
  * Follow-ups: with chat history, a question that leans on an earlier one ("and what about its
    GPU version?") is made standalone by prefixing the previous standalone question. A rule,
    not the model: a 135M model rewrites questions unreliably and the rewrite would cost a
    whole generation before retrieval starts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ragspec.retrieval.records import Hit, Passage

NOT_IN_DOCUMENTS = ("Your documents do not appear to contain the answer to this question, so no "
                    "answer was generated. These are the closest passages found:")

# Chosen on the tuning question sets (docs/documents-and-search.md, "Finding passages"; ragspec/eval/retrieval.py):
# hybrid had the better recall; the floor is the highest that refused no answerable question.
DEFAULT_SEARCH = "hybrid"
DEFAULT_MIN_SCORE = 0.4


class NoDocumentsError(RuntimeError):
    """The index holds no passages: there is nothing to answer from."""


@dataclass
class Retrieval:
    """What one question retrieved. best_score: the best cosine of any passage (None for an
    empty index). refused: best_score is below the floor, so no answer should be generated."""

    question: str
    standalone_question: str
    hits: list[Hit]
    best_score: float | None
    min_score: float
    refused: bool

    def to_dict(self) -> dict:
        """The `ask --json` fields of a refusal."""
        return {"refused": self.refused, "message": NOT_IN_DOCUMENTS if self.refused else None,
                "best_score": self.best_score, "min_score": self.min_score}


def retrieve(store, question: str, history: Sequence[dict] = (), *, k: int = 4,
             search: str = DEFAULT_SEARCH, min_score: float = DEFAULT_MIN_SCORE,
             rewrite_followups: bool = True) -> Retrieval:
    """Rewrite a follow-up and search `store`; say whether the floor refuses (see the module
    docstring). Needs no model, so a refusal costs one embedding and one search."""
    question = check_question(question)
    standalone = standalone_question(question, history) if rewrite_followups else question
    if store.passage_count() == 0:
        raise NoDocumentsError(
            "No documents are indexed yet. Add some with `ragspec ingest PATH...` or the "
            "upload box in the sidebar of `ragspec ui`."
        )
    result = store.retrieve(standalone, k=k, mode=search)
    refused = min_score > 0 and result.best_score is not None and result.best_score < min_score
    if refused and search != "dense":
        # The closest passages shown with a refusal are the most similar ones, the best (whose
        # score the floor judged) first; a fused ranking need not hold that one at all.
        result = store.retrieve(standalone, k=k, mode="dense")
    return Retrieval(question, standalone, list(result.hits), result.best_score, min_score,
                     refused)


def passage_json(n: int, p: Passage, score: float | None, copied: Sequence = ()) -> dict:
    """One passage as `ask --json` shows it: number, provenance, score, text, copied ranges."""
    return {"n": n, "id": p.id, "doc_id": p.doc_id, "source": p.source, "page": p.page,
            "start": p.start, "score": score, "text": p.text, "copied": [list(r) for r in copied]}


def hits_to_dicts(hits: Sequence[Hit]) -> list[dict]:
    """Search hits in passage_json's shape (nothing was copied from them)."""
    return [passage_json(i + 1, h.passage, h.score) for i, h in enumerate(hits)]


# -- follow-up questions ------------------------------------------------------------------------

_REFERRING = {
    "it", "its", "it's", "they", "them", "their", "theirs", "this", "that", "these", "those",
    "there", "he", "she", "his", "her", "one", "ones", "same", "former", "latter", "above",
    "also", "too", "else", "instead",
}
_FOLLOWUP_OPENERS = ("and ", "but ", "also ", "so ", "what about", "how about", "then ", "or ")


def is_followup(question: str) -> bool:
    """A question that needs the conversation to make sense: it opens like a continuation,
    refers back with a pronoun, or is too short to stand alone (three words or fewer)."""
    q = question.strip().lower()
    words = re.findall(r"[a-z']+", q)
    return (
        q.startswith(_FOLLOWUP_OPENERS)
        or any(w in _REFERRING for w in words)
        or len(words) <= 3
    )


def standalone_question(question: str, history: Sequence[dict] = ()) -> str:
    """The question made standalone with a simple rule.

    history: chat turns, oldest first, as {"role": "user"|"assistant", "content": str}; a user
    turn may carry "standalone" (what this function returned for it), so chains of follow-ups
    keep the original subject. A follow-up (see is_followup) becomes
    "<previous standalone question> <question>"; anything else is returned unchanged.
    """
    question = question.strip()
    previous = next(
        (t.get("standalone") or t.get("content", "") for t in reversed(list(history))
         if t.get("role") == "user" and (t.get("standalone") or t.get("content", "")).strip()),
        "",
    ).strip()
    if not previous or not is_followup(question):
        return question
    return f"{previous} {question}"


def check_question(question: str) -> str:
    if not isinstance(question, str) or not question.strip():
        raise ValueError("the question is empty: type a question about your documents")
    return question.strip()
