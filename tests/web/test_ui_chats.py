"""Chats that persist: the JSON store (atomic, locked, no pickle, ids checked), answers saved with
their spans and passages so a reloaded chat shows the same highlights, the sidebar's chat list
(open, new, delete) across sessions, and `ragspec chats list/show/export/delete`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from ui_support import (
    APP,
    answers_html,
    fast_page,
    new_session,
    saved_chat,
    settle,
    texts,
    tiny_page,
)

from ragspec.cli import main
from ragspec.decoding.types import GenerationStats, Span, SpanOrigin
from ragspec.highlights import shown_spans
from ragspec.quoting import span_from_dict
from ragspec.retrieval.records import Passage
from ragspec.web import chats as ch
from ragspec.web.chat_export import chat_markdown

PASSAGE = Passage(id="d-1", doc_id="d", source="/srv/docs/ops guide.md", page=2, start=10,
                  text="The metrics endpoint listens on port 7432.\nIt serves /metrics only.")
SPANS = [Span("It listens on ", [5, 6], False),
         Span("port 7432", [7, 8], True, SpanOrigin(40, True, 0, 32, 41)),
         Span(".\x1b[2J", [9], False)]
STATS = GenerationStats(prompt_tokens=50, new_tokens=5, forward_passes=4, drafted_tokens=3,
                        accepted_tokens=2, accepted_lengths={2: 1, 0: 1},
                        accepted_per_step=[0, 2, 0, 0], prefill_seconds=0.2,
                        decode_seconds=0.3, ttft_seconds=0.2, stop_reason="eos")


def saved_answer(store: ch.ChatStore, question: str = "Which port?") -> dict:
    chat = store.create()

    def add(c: dict) -> None:
        c["title"] = ch.title_for(question)
        c["messages"] += [ch.user_message(question, question), {
            "role": "assistant", "content": "".join(s.text for s in SPANS), "status": "done",
            "model": "tiny", "error": None, "greedy": True,
            "runs": [ch.run_dict("Speculation on", SPANS, STATS)],
            "passages": [ch.passage_dict(PASSAGE, 0.83)]}]

    return store.update(chat["id"], add)


def test_an_answer_survives_the_round_trip_through_json(tmp_path):
    store = ch.ChatStore(tmp_path)
    chat = saved_answer(store)
    record = ch.answer_record(store.load(chat["id"])["messages"][1])
    run = record["runs"][0]
    assert run["spans"] == SPANS
    assert run["stats"] == STATS and run["stats"].accept_rate == STATS.accept_rate
    assert run["token_ids"] == [5, 6, 7, 8, 9]
    assert record["passages"] == [PASSAGE] and record["scores"] == [0.83]


def test_writes_are_atomic_and_damaged_or_foreign_files_are_refused(tmp_path):
    store = ch.ChatStore(tmp_path)
    chat = saved_answer(store)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".locks", f"{chat['id']}.json"]
    (tmp_path / "0123456789ab.json").write_text('{"format": "ragspec-chat", "id": "0123')
    (tmp_path / "abcdefabcdef.json").write_text(json.dumps({"id": "abcdefabcdef"}))
    assert [c.id for c in store.list()] == [chat["id"]]
    with pytest.raises(ch.ChatError, match="cannot be read"):
        store.load("0123456789ab")
    with pytest.raises(ch.ChatError, match="not a ragspec chat"):
        store.load("abcdefabcdef")
    for bad in ("../../etc/passwd", "", "ABCDEF123456", chat["id"] + "0"):
        with pytest.raises(ch.ChatError, match="not a chat id"):
            store.path(bad)


def test_the_list_follows_every_change(tmp_path):
    store = ch.ChatStore(tmp_path)
    chat = saved_answer(store)
    assert [(c.title, c.messages) for c in store.list()] == [("Which port?", 2)]
    store.update(chat["id"], lambda c: (c.update(title="Renamed"),
                                        c["messages"].append(ch.user_message("More?"))))
    assert [(c.title, c.messages) for c in store.list()] == [("Renamed", 3)]
    store.delete(chat["id"])
    assert store.list() == []


def test_find_takes_an_id_or_a_unique_prefix(tmp_path):
    store = ch.ChatStore(tmp_path)
    one, two = store.create(), store.create()
    assert store.find(one["id"]) == one["id"]
    assert store.find(two["id"][:6]) == two["id"]
    with pytest.raises(ch.ChatError, match="no chat"):
        store.find("fff")


def test_markdown_export_cites_the_passages(tmp_path):
    store = ch.ChatStore(tmp_path)
    text = chat_markdown(saved_answer(store))
    assert "## Which port?" in text
    assert "It listens on port 7432." in text
    assert "[1] ops guide.md, page 2" in text
    assert "- `port 7432` ([1] ops guide.md, page 2)" in text  # each copied span, with its page
    assert "> The metrics endpoint listens on port 7432.\n> It serves /metrics only." in text
    assert "/srv/docs" not in text
    assert "repeating" not in text  # ended at an end-of-text token: no note


def test_markdown_export_says_when_an_answer_stopped_repeating_itself(tmp_path):
    from dataclasses import replace

    store = ch.ChatStore(tmp_path)
    chat = saved_answer(store)

    def repeated(c: dict) -> None:
        c["messages"][1]["runs"] = [ch.run_dict("Speculation on", SPANS,
                                                replace(STATS, stop_reason="repetition"))]

    text = chat_markdown(store.update(chat["id"], repeated))
    assert "*(The answer ends here because it started repeating itself" in text


def test_markdown_export_lists_the_copies_the_chat_marks_not_pieces_of_words(tmp_path):
    store = ch.ChatStore(tmp_path)
    chat = saved_answer(store)
    noise = [Span("It listens on port 7", [5], False),  # "43" of "7432", then a full stop
             Span("43", [6], True, SpanOrigin(40, True, 0, 33, 35)), Span("2", [7], False),
             Span(".", [8], True, SpanOrigin(42, True, 0, 41, 42))]

    def pieces(c: dict) -> None:
        c["messages"][1]["runs"] = [ch.run_dict("Speculation on", noise, STATS)]

    text = chat_markdown(store.update(chat["id"], pieces))
    assert "It listens on port 7432." in text and "**Copied from the documents**" not in text


# -- the page ---------------------------------------------------------------------------------

@pytest.fixture
def page(tmp_path, monkeypatch):
    at = tiny_page(tmp_path, monkeypatch)
    at.number_input(key="max_new_tokens").set_value(48)
    at.toggle(key="adaptive").set_value(False)  # draft whenever the context offers a match
    return at


def passages_html(at) -> list[str]:
    return [m.value for m in at.markdown if m.value.startswith('<div class="rs-passage">')]


def test_a_reloaded_chat_shows_the_same_answer_highlights_and_passages(page):
    at = page
    at.chat_input[0].set_value("On which port does the metrics endpoint listen?").run()
    settle(at)
    chat_id = at.query_params["chat"]
    answer, passages = answers_html(at), passages_html(at)
    assert len(answer) == 1 and passages
    saved = saved_chat(at)["messages"][-1]
    assert saved["status"] == "done" and saved["runs"][0]["spans"]
    assert any(s["drafted"] for s in saved["runs"][0]["spans"])  # every draft is saved...
    # ... and marked when it shows copying (the tiny model's drafts are often bits of words)
    shown = shown_spans([span_from_dict(s) for s in saved["runs"][0]["spans"]])
    assert ('<mark class="rs-' in answer[0]) == any(r.drafted and r.text for r in shown)

    # a new browser session (a reload) with the chat in the address
    from streamlit.testing.v1 import AppTest

    again = AppTest.from_file(APP, default_timeout=60)
    again.query_params["chat"] = chat_id
    again.run()
    assert not again.exception, again.exception
    assert answers_html(again) == answer
    assert passages_html(again) == passages
    question = "<div>On which port does the metrics endpoint listen?</div>"
    assert [m.value for m in again.markdown].count(question) == 1


def test_the_sidebar_lists_opens_starts_and_deletes_chats(page):
    at = page
    at.chat_input[0].set_value("How long are job logs kept?").run()
    settle(at)
    first = at.query_params["chat"]
    at.button(key="new-chat").click().run()
    assert "chat" not in at.query_params and not answers_html(at)
    at.chat_input[0].set_value("On which port does the metrics endpoint listen?").run()
    settle(at)
    second = at.query_params["chat"]
    assert second != first

    other = new_session()  # another user, or a reload without the address: the list is there
    labels = [b.label for b in other.sidebar.button if (b.key or "").startswith("chat-")]
    assert len(labels) == 2 and any("How long are job logs kept" in x for x in labels)
    other.button(key=f"chat-{first}").click().run()
    assert other.query_params["chat"] == first and len(answers_html(other)) == 1

    other.button(key=f"delete-chat-{first}").click().run()
    other.button(key=f"confirm-delete-chat-{first}").click().run()  # it asks first
    assert "chat" not in other.query_params
    assert [b.key for b in other.sidebar.button if (b.key or "").startswith("chat-")] == \
        [f"chat-{second}"]
    at.run()  # the first session still shows its open (second) chat
    assert at.query_params["chat"] == second and len(answers_html(at)) == 1


def test_an_answer_cut_off_by_a_server_stop_is_shown_as_interrupted(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    fast_page(monkeypatch, tmp_path / "home")
    store = ch.ChatStore(tmp_path / "home" / "chats")
    chat = saved_answer(store)
    store.update(chat["id"], lambda c: c["messages"][1].update(status="generating"))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["chat"] = chat["id"]
    at.run()
    assert not at.exception, at.exception
    assert any("interrupted" in t for t in texts(at.warning))
    assert len(answers_html(at)) == 1 and "port 7432" in answers_html(at)[0]
    assert not at.chat_input[0].proto.disabled  # no job holds this chat


def test_an_unknown_chat_in_the_address_opens_a_new_chat(page, tmp_path):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["chat"] = "../../etc/passwd"
    at.run()
    assert not at.exception, at.exception
    assert any("no longer exists" in t for t in texts(at.warning))


# -- the command line -------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path))
    return ch.ChatStore(tmp_path / "chats")


def test_chats_list_show_export_delete(home, tmp_path):
    chat = saved_answer(home, "Which port?\x1b[31m")
    runner = CliRunner()
    listed = runner.invoke(main, ["chats", "list"])
    assert listed.exit_code == 0 and chat["id"] in listed.output
    assert "\x1b" not in listed.output and "Which port?\\x1b[31m" in listed.output
    as_json = json.loads(runner.invoke(main, ["chats", "list", "--json"]).output)
    assert as_json[0]["id"] == chat["id"] and as_json[0]["messages"] == 2

    shown = runner.invoke(main, ["chats", "show", chat["id"][:6]])
    assert shown.exit_code == 0 and "A: It listens on port 7432." in shown.output
    assert "\x1b" not in shown.output
    whole = json.loads(runner.invoke(main, ["chats", "show", chat["id"], "--json"]).output)
    assert whole["messages"][1]["runs"][0]["spans"][1]["origin"]["char_start"] == 32

    out = tmp_path / "chat.md"
    exported = runner.invoke(main, ["chats", "export", chat["id"], "-o", str(out), "--json"])
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.output)["out"] == str(out)
    assert "[1] ops guide.md, page 2" in out.read_text()

    deleted = runner.invoke(main, ["chats", "delete", chat["id"]])
    assert deleted.exit_code == 0 and home.list() == []
    missing = runner.invoke(main, ["chats", "show", chat["id"]])
    assert missing.exit_code == 1 and "matches no chat" in missing.output
    assert "Traceback" not in missing.output
