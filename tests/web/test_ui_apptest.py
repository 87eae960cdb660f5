"""The Streamlit page under streamlit.testing.v1.AppTest, with the bundled model and embedder.

One app session walks through: empty index notice, bad uploads (each an error, the app goes on),
a good upload, a question whose answer shows highlighted spans identical to the engine's drafted
spans, the side-by-side view with the token-identical mark, and removing the document. Answers
run in the page's queue; the test waits for them (`settle`) and reads the saved chat.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from ui_support import answers_html, saved_chat, settle

from ragspec.describe import PASSAGE, draft_source
from ragspec.highlights import shown_spans
from ragspec.quoting import span_from_dict
from tests.conftest import MODEL_CACHE

pytestmark = pytest.mark.slow

APP = str(Path(__file__).resolve().parents[2] / "ragspec" / "web" / "page.py")

DOC = b"""# Metrics

The metrics endpoint of the daemon listens on port 7432 and serves /metrics only. It always uses
the port right after api_port, so it moves when api_port moves.

Job logs are kept for 14 days by default.
"""

QUESTION = "On which port does the metrics endpoint listen, and what does it serve?"


@pytest.fixture
def app(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAGSPEC_MODEL_CACHE", str(MODEL_CACHE))
    monkeypatch.setenv("RAGSPEC_AUTH", "single-user")
    for name in ("RAGSPEC_UI_INDEX", "RAGSPEC_UI_MODELS", "RAGSPEC_UI_MAX_LOADED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAGSPEC_MAX_FILE_MB", "0.002")  # ~2 KiB: big.txt is over, DOC is not
    at = AppTest.from_file(APP, default_timeout=600)
    at.run()
    assert not at.exception, at.exception
    return at


def texts(elements) -> list[str]:
    return [html.unescape(e.value) for e in elements]


def marks(fragment: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", m.replace("<br>", "\n")))
            for m in re.findall(r'<mark class="rs-draft"[^>]*>(.*?)</mark>', fragment)]


def set_settings(at, *, side_by_side: bool) -> None:
    at.toggle(key="side_by_side").set_value(side_by_side)
    at.slider(key="k").set_value(1)
    at.number_input(key="max_new_tokens").set_value(24)


def test_upload_ask_highlight_side_by_side_and_bad_input(app):
    at = app
    assert any("No documents yet" in t for t in texts(at.info))

    # -- bad uploads: each a visible error, the app keeps running
    uploader = at.file_uploader[0]
    uploader.set_value([("virus.exe", b"MZ\x90\x00", "application/octet-stream"),
                        ("broken.pdf", b"%PDF-1.4 this is not a pdf", "application/pdf"),
                        ("empty.txt", b"", "text/plain"),
                        ("big.txt", b"word " * 1000, "text/plain")])
    at.run()
    assert not at.exception, at.exception
    errors = " | ".join(texts(at.error))
    assert "virus.exe" in errors and "unsupported" in errors
    assert "broken.pdf" in errors and "empty.txt" in errors
    assert "big.txt" in errors and "limit" in errors
    assert "chat" not in at.query_params  # no question yet: no chat saved

    # -- empty question: a warning, nothing generated
    at.chat_input[0].set_value("   ").run()
    assert any("empty" in t for t in texts(at.warning))

    # -- a question before any document: says how to add some
    at.chat_input[0].set_value(QUESTION).run()
    settle(at, timeout=600)
    assert any("No documents are indexed yet" in t for t in texts(at.error))
    assert saved_chat(at)["messages"][-1]["status"] == "failed"

    # -- a good upload
    at.file_uploader[0].set_value(("metrics notes.md", DOC, "text/markdown"))
    at.run()
    assert not at.exception, at.exception
    assert any("metrics notes.md" in t and "added" in t for t in texts(at.success))
    assert any("metrics notes.md" in html.unescape(t) for t in texts(at.sidebar.markdown))

    # -- ask: the answer appears, highlighted spans are exactly the engine's drafted spans
    set_settings(at, side_by_side=False)
    at.chat_input[0].set_value(QUESTION).run()
    settle(at, timeout=600)
    run = saved_chat(at)["messages"][-1]["runs"][0]
    assert run["text"].strip()
    shown = answers_html(at)
    assert len(shown) == 1
    assert any(s["drafted"] for s in run["spans"]), f"expected drafts in {run['text']!r}"
    # copies from a passage are highlighted; repeats of the answer or question are underlined;
    # both as ragspec.highlights shows them (merged, the too-short ones plain)
    runs = [r for r in shown_spans([span_from_dict(s) for s in run["spans"]])
            if r.drafted and r.text]
    sources = [r.text for r in runs if draft_source(r) == PASSAGE]
    assert marks(shown[0]) == sources
    assert len(re.findall(r'<mark class="rs-echo"', shown[0])) == len(runs) - len(sources)
    assert "copied from [1] metrics notes.md" in html.unescape(shown[0])

    # -- side by side: two answers, with the token-identical mark (greedy)
    set_settings(at, side_by_side=True)
    at.chat_input[0].set_value(QUESTION).run()
    settle(at, timeout=600)
    runs = saved_chat(at)["messages"][-1]["runs"]
    assert [r["label"] for r in runs] == ["Speculation off", "Speculation on"]
    assert runs[0]["token_ids"] == runs[1]["token_ids"]
    assert len(answers_html(at)) == 3  # the first answer (replayed) and the two new ones
    assert any("Token-identical" in t for t in texts(at.success))
    assert not any(s["drafted"] for s in runs[0]["spans"])

    # -- remove the document from the sidebar
    remove = [b for b in at.sidebar.button if b.key and b.key.startswith("remove-")]
    assert len(remove) == 1
    remove[0].click().run()
    confirm = [b for b in at.sidebar.button if (b.key or "").startswith("confirm-remove-")]
    confirm[0].click().run()
    assert not at.exception, at.exception
    assert any("No documents yet" in t for t in texts(at.info))
