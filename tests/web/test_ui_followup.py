"""A follow-up in the chat shows what was searched for: the question made standalone (AppTest,
fast: HashEmbedder, tiny model folder; both questions are refused, so no model runs)."""

from __future__ import annotations

from ui_support import element_strings, saved_chat, settle, tiny_page

FIRST = "What is the capital of Australia?"
FOLLOWUP = "And its population?"


def _ask(at, question: str) -> list[dict]:
    at.chat_input[0].set_value(question).run()
    settle(at)
    return saved_chat(at)["messages"]


def test_a_followup_shows_the_standalone_question_it_was_searched_with(tmp_path, monkeypatch):
    at = tiny_page(tmp_path, monkeypatch)
    at.slider(key="min_score").set_value(0.4).run()
    _ask(at, FIRST)
    messages = _ask(at, FOLLOWUP)
    assert messages[-2]["standalone"] == f"{FIRST} {FOLLOWUP}"
    captions = [text for _, text in element_strings(at) if text.startswith("Searched for:")]
    # the follow-up's line only: a question searched as typed shows none
    assert captions == [f"Searched for: {FIRST} {FOLLOWUP}"]
