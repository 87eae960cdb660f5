"""The instructions ragspec gives the model, by name: the default and the alternatives
`ragspec eval --prompt NAME` compares.

Contract: plain strings. A Prompt is the system message and an optional line put after the
question in the user turn (a 135M model heeds what comes last more than the system message).
The default was chosen with `ragspec eval` on data/realdocs/dev and reported on
data/realdocs/heldout (docs/answer-quality.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    system: str
    after_question: str = ""

    def __post_init__(self) -> None:
        if not self.system.strip():
            raise ValueError("a prompt's system message must not be empty")


QUOTE = ("You answer questions using only the numbered passages the user gives you. "
         "Copy the relevant sentences from the passages word for word, and cite them like [1]. "
         "If the passages do not contain the answer, say that you do not know.")

# One worked example shows a small model what "quote the passage" looks like; the example's
# passage is made up and never shown to the user.
EXAMPLE = ("You answer questions by quoting the numbered passages the user gives you. Reply with "
           "the sentence of a passage that answers the question, copied word for word, and cite "
           "the passage like [1]. If no passage answers it, say that you do not know.\n\n"
           "Example:\n"
           "Passages:\n\n[1] (from notes.txt)\nThe cache is cleared every night. Entries older "
           "than 7 days are removed first when the cache is full.\n\n"
           "Question: Which cache entries are removed when the cache is full?\n"
           "Answer: Entries older than 7 days are removed first when the cache is full [1].")

SENTENCE = ("Answer the user's question with the sentence from the numbered passages that "
            "answers it, copied exactly, followed by its number like [1]. Do not add anything "
            "else. If no passage answers it, say that you do not know.")

PROMPTS: dict[str, Prompt] = {
    # ragspec's instruction before the quality evaluation existed
    "quote": Prompt(QUOTE),
    "example": Prompt(EXAMPLE),
    "sentence": Prompt(SENTENCE),
}
DEFAULT_PROMPT = "quote"
