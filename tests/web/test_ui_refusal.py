"""The chat's "not in your documents" reply (AppTest, fast: HashEmbedder, tiny model folder).

A question unrelated to the uploaded document, below the relevance floor, is answered with the
message and the closest passages, and the model is neither loaded nor called; a related question
above the floor is answered by the model as usual. The reply survives a reload of the chat."""

from __future__ import annotations

import pytest
from ui_support import element_strings, new_session, saved_chat, settle, tiny_page

from ragspec.search import NOT_IN_DOCUMENTS
from ragspec.web import model_choice as ui_models

# HashEmbedder cosines with the uploaded METRICS_DOC passage: the unrelated question 0.19, the
# related one 0.67 (HashEmbedder's scale, not the bundled embedder's: the floor is set here).
UNRELATED = "What is the capital of Australia?"
RELATED = "On which port does the metrics endpoint listen?"
FLOOR = 0.4


@pytest.fixture
def model_calls(monkeypatch):
    """Every request for a generator the page makes, by model name; the request itself works."""
    calls: list[str] = []
    real = ui_models.ModelRegistry.get

    def get(self, name):
        calls.append(name)
        return real(self, name)

    monkeypatch.setattr(ui_models.ModelRegistry, "get", get)
    return calls


def _ask(at, question: str) -> dict:
    at.chat_input[0].set_value(question).run()
    settle(at)
    return saved_chat(at)["messages"][-1]


def _page_text(at) -> str:
    return "\n".join(text for _, text in element_strings(at))


def test_an_unrelated_question_gets_not_in_your_documents_and_no_model_call(
        tmp_path, monkeypatch, model_calls):
    at = tiny_page(tmp_path, monkeypatch)
    at.slider(key="min_score").set_value(FLOOR).run()
    at.number_input(key="max_new_tokens").set_value(8).run()

    refused = _ask(at, UNRELATED)
    assert refused["refused"] is True and refused["status"] == "done"
    assert refused["content"] == NOT_IN_DOCUMENTS and refused["runs"] == []
    assert refused["passages"] and "port 7432" in refused["passages"][0]["text"]
    assert refused["passages"][0]["score"] < FLOOR
    assert model_calls == []  # the model was not even loaded
    shown = _page_text(at)
    assert "do not appear to contain the answer" in shown and "port 7432" in shown

    answered = _ask(at, RELATED)
    assert answered["refused"] is False and answered["status"] == "done"
    assert answered["runs"] and answered["runs"][0]["stats"]["new_tokens"] == 8
    assert model_calls == ["tiny"]

    # A reload (a new session opening this chat) shows the same reply, read from disk.
    again = new_session(min_score=FLOOR)
    again.query_params["chat"] = at.query_params["chat"]
    again.run()
    assert "do not appear to contain the answer" in _page_text(again)


def test_a_refusal_for_a_word_the_documents_never_use_names_the_word_and_keeps_it(
        tmp_path, monkeypatch, model_calls):
    from ragspec import search

    at = tiny_page(tmp_path, monkeypatch)
    at.slider(key="min_score").set_value(0.05).run()  # HashEmbedder's cosines: the floor passes
    monkeypatch.setattr(search, "WORDS_CHECK_BELOW", 1.0)  # and the words check looks at all
    refused = _ask(at, "How do I rotate the metrics endpoint's port?")
    assert refused["refused"] is True and refused["absent_words"] == ["rotate"]
    assert model_calls == []
    assert "never use “rotate”" in _page_text(at)
    again = new_session(min_score=0.05)  # read back from disk: the reason stays with the reply
    again.query_params["chat"] = at.query_params["chat"]
    again.run()
    assert "never use “rotate”" in _page_text(again)


def test_floor_zero_answers_even_an_unrelated_question(tmp_path, monkeypatch, model_calls):
    at = tiny_page(tmp_path, monkeypatch)  # fast sessions start with the floor off
    at.number_input(key="max_new_tokens").set_value(8).run()
    answered = _ask(at, UNRELATED)
    assert answered["refused"] is False and answered["runs"] and model_calls == ["tiny"]


def test_the_markdown_export_says_not_in_your_documents_and_cites_the_closest_passages():
    from ragspec.web.chat_export import chat_markdown

    passage = {"id": "p", "doc_id": "d", "source": "/srv/docs/metrics.md", "page": None,
               "start": 0, "text": "The port is 7432.", "score": 0.12}
    chat = {"id": "0123456789ab", "title": "t", "created_at": "now", "messages": [
        {"role": "user", "content": UNRELATED},
        {"role": "assistant", "content": NOT_IN_DOCUMENTS, "status": "done", "runs": [],
         "passages": [passage], "refused": True}]}
    text = chat_markdown(chat)
    assert f"*{NOT_IN_DOCUMENTS}*" in text
    assert "[1] metrics.md" in text and "> The port is 7432." in text
