"""What a new user meets on the page (streamlit's AppTest, HashEmbedder, a tiny model):
removing a document takes a confirmation and can be cancelled; the page's icons are Streamlit's
Material icons, and no emoji is in any text it sends (a browser without an emoji font shows
emoji as empty boxes)."""

from __future__ import annotations

import ast
import html
import unicodedata
from pathlib import Path

import ui_support as ui

WEB = Path(__file__).resolve().parents[2] / "ragspec" / "web"


def emoji(text: str) -> list[str]:
    """The pictographs in text (Unicode "other symbol": ✅ ➕ ⏹ ⚡ 🔎 ✕ ...), and emoji
    presentation selectors."""
    return [c for c in text if unicodedata.category(c) == "So" or c == "\ufe0f"]


def listed(at) -> bool:
    return any("metrics.md" in html.unescape(t) for t in ui.texts(at.sidebar.markdown))


def button(at, prefix: str):
    found = [b for b in at.sidebar.button if (b.key or "").startswith(prefix)]
    assert len(found) <= 1, [b.key for b in found]
    return found[0] if found else None


def test_removing_a_document_asks_first_and_can_be_cancelled(tmp_path, monkeypatch):
    ui.fast_page(monkeypatch, tmp_path / "home")
    at = ui.new_session()
    at.file_uploader[0].set_value(("metrics.md", ui.METRICS_DOC, "text/markdown"))
    at.run()
    assert listed(at)

    button(at, "remove-").click().run()  # one click: asked, nothing removed
    assert not at.exception, at.exception
    assert listed(at) and button(at, "confirm-remove-") is not None
    assert any("Remove metrics.md from the index?" in html.unescape(t)
               for t in ui.texts(at.sidebar.warning))

    button(at, "cancel-remove-").click().run()
    assert listed(at) and button(at, "confirm-remove-") is None
    assert not at.sidebar.warning

    button(at, "remove-").click().run()
    button(at, "confirm-remove-").click().run()
    assert not at.exception, at.exception
    assert not listed(at) and button(at, "remove-") is None
    assert any("No documents yet" in t for t in ui.texts(at.sidebar.caption))


def test_the_page_shows_material_icons_and_no_emoji(tmp_path, monkeypatch):
    at = ui.tiny_page(tmp_path, monkeypatch)
    at.toggle(key="side_by_side").set_value(True)
    at.number_input(key="max_new_tokens").set_value(8)
    at.chat_input[0].set_value("Which port does the metrics endpoint use?").run()
    ui.settle(at)
    assert len(ui.saved_chat(at)["messages"][-1]["runs"]) == 2
    button(at, "remove-").click().run()  # the confirmation too

    found = [(field, text[:80]) for field, text in ui.element_strings(at) if emoji(text)]
    assert not found, found
    icons = {b.key.split("-")[0] if b.key.startswith(("remove-", "delete-chat-")) else b.key:
             b.proto.icon for b in at.sidebar.button if b.key}
    assert icons["new-chat"] == ":material/add:"
    assert icons["remove"] == icons["delete"] == ":material/close:"
    verdicts = [e.icon for e in [*at.main.success, *at.main.error, *at.main.info]
                if "identical" in e.value or "differ" in e.value]
    assert verdicts and all(i.startswith(":material/") for i in verdicts), verdicts


def test_no_string_the_page_can_show_holds_an_emoji():
    """Every string literal of the page's modules (docstrings aside) and the verdicts the page
    shows: a state the test above did not reach (waiting, stopped, refused) is covered too."""
    from ragspec import describe

    for path in [*sorted(WEB.glob("*.py")), WEB.parent / "describe.py"]:
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef)
                      and node.body and isinstance(node.body[0], ast.Expr)}
        found = [(node.lineno, node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and id(node) not in docstrings and emoji(node.value)]
        assert not found, (path.name, found)
    for ok in ((1, 2), (1, 3)):
        for greedy in (True, False):
            assert not emoji(describe.identical_verdict([1, 2], list(ok), greedy)[1])


def test_a_first_model_load_shows_that_it_moves(tmp_path, monkeypatch):
    """A first start builds kernels and converts the model: minutes on a busy machine. While the
    load runs, the answer's line says for how long it has run ("... so far"), refreshed by the
    live fragment, instead of a fixed estimate that a busy machine outlives."""
    import threading

    from ragspec import loading
    from ragspec.web.answering import ACTIVE

    folder = ui.tiny_model_folder(tmp_path / "tiny")
    ui.fast_page(monkeypatch, tmp_path / "home", models=[["tiny", str(folder)]],
                 model_cache=tmp_path / "cache")
    release, real_load = threading.Event(), loading.load_generator

    def slow_load(*args, **kwargs):
        assert release.wait(120), "the test never released the load"
        return real_load(*args, **kwargs)

    monkeypatch.setattr(loading, "load_generator", slow_load)
    at = ui.new_session()
    at.file_uploader[0].set_value(("metrics.md", ui.METRICS_DOC, "text/markdown"))
    at.run()
    at.number_input(key="max_new_tokens").set_value(4)
    try:
        at.chat_input[0].set_value("Which port does the metrics endpoint use?").run()
        ui.wait_for(lambda: any(job.models.loading_seconds("tiny") is not None
                                for job in list(ACTIVE._jobs.values())),
                    what="the model's load to begin")
        at.run()
        shown = [html.unescape(t) for t in ui.texts(at.main.info) if "Loading the model" in t]
        assert shown and "so far" in shown[0], ui.texts(at.main.info)
    finally:
        release.set()
    ui.settle(at, timeout=900)  # the real load now: a fresh model cache builds its kernels
    assert ui.saved_chat(at)["messages"][-1]["runs"]


def test_deleting_a_chat_asks_first_and_can_be_cancelled(tmp_path, monkeypatch):
    """Found in the walk-through: a chat's close button (the same icon as a document's, which
    asks) deleted the chat at once, with no way back; now it asks too."""
    from ragspec.web.chats import ChatStore

    ui.fast_page(monkeypatch, tmp_path / "home")
    store = ChatStore(tmp_path / "home" / "chats")
    chat = store.create("Which port does the metrics endpoint use?")
    at = ui.new_session()
    at.query_params["chat"] = chat["id"]
    at.run()

    button(at, "delete-chat-").click().run()  # one click: asked, nothing deleted
    assert not at.exception, at.exception
    assert store.load(chat["id"]) and button(at, "confirm-delete-chat-") is not None
    assert any("Delete the chat" in html.unescape(t) and "cannot be brought back" in t
               for t in ui.texts(at.sidebar.warning))

    button(at, "cancel-delete-chat-").click().run()
    assert store.load(chat["id"]) and button(at, "confirm-delete-chat-") is None
    assert not at.sidebar.warning and at.query_params["chat"] == chat["id"]

    button(at, "delete-chat-").click().run()
    button(at, "confirm-delete-chat-").click().run()
    assert not at.exception, at.exception
    assert button(at, "delete-chat-") is None and "chat" not in at.query_params
    assert any("No saved chats yet" in t for t in ui.texts(at.sidebar.caption))
