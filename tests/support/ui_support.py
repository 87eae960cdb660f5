"""What the chat page's tests share: the page under AppTest on a temporary RAGSPEC_HOME with the
HashEmbedder and a tiny model folder, waiting for queued answers, and a markup oracle that says
what Streamlit would turn into a link, an image or a script."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

from bs4 import BeautifulSoup
from conftest import make_char_tokenizer, make_tiny_model
from fakes import HashEmbedder
from markdown_it import MarkdownIt

APP = str(Path(__file__).resolve().parents[2] / "ragspec" / "web" / "page.py")


def tiny_model_folder(path: Path, seed: int = 0) -> Path:
    """A tiny random Llama with a character tokenizer and no end-of-sequence token, saved as a
    Hugging Face folder: every answer runs to its token limit, in well under a second."""
    tok = make_char_tokenizer()
    tok.eos_token = None
    model = make_tiny_model(len(tok), seed=seed, max_position_embeddings=4096, eos_token_id=None)
    model.generation_config.eos_token_id = None
    tok.save_pretrained(path)
    model.save_pretrained(path)
    return path


def fast_page(monkeypatch, home: Path, models: list[list[str]] | None = None,
              model_cache: Path | None = None, auth: str = "single-user"):
    """Environment for the page: temporary home, HashEmbedder, the given [name, folder] models,
    the sign-in mode `auth` (as `ragspec ui` would pass it)."""
    import streamlit as st

    from ragspec import loading as common

    monkeypatch.setenv("RAGSPEC_HOME", str(home))
    monkeypatch.setenv("RAGSPEC_AUTH", auth)
    monkeypatch.delenv("RAGSPEC_UI_INDEX", raising=False)
    monkeypatch.delenv("RAGSPEC_EMBEDDER", raising=False)
    monkeypatch.delenv("RAGSPEC_UI_MAX_LOADED", raising=False)
    if model_cache is not None:
        monkeypatch.setenv("RAGSPEC_MODEL_CACHE", str(model_cache))
    if models is not None:
        monkeypatch.setenv("RAGSPEC_UI_MODELS", json.dumps(models))
    else:
        monkeypatch.delenv("RAGSPEC_UI_MODELS", raising=False)
    monkeypatch.setattr("ragspec.retrieval.embeddings.embedder.Embedder", lambda name=None: HashEmbedder())
    # A cache of its own for this test, so no other test is handed the HashEmbedder later.
    monkeypatch.setattr(common, "cached_embedder",
                        functools.lru_cache(maxsize=2)(common.cached_embedder.__wrapped__))
    st.cache_resource.clear()


METRICS_DOC = b"""# Metrics

The metrics endpoint of the daemon listens on port 7432 and serves /metrics only.
Job logs are kept for 14 days by default.
"""


def tiny_page(tmp_path: Path, monkeypatch):
    """A session of the page offering one tiny model ("tiny"), with METRICS_DOC uploaded."""
    folder = tiny_model_folder(tmp_path / "tiny")
    fast_page(monkeypatch, tmp_path / "home", models=[["tiny", str(folder)]],
              model_cache=tmp_path / "cache")
    at = new_session()
    at.file_uploader[0].set_value(("metrics.md", METRICS_DOC, "text/markdown"))
    at.run()
    return at


def new_session(timeout: float = 120, min_score: float = 0.0):
    """A fresh browser session of the page. min_score: its relevance floor. The default floor
    is calibrated on the bundled embedder; HashEmbedder's cosines are on another scale, so
    these sessions turn it off unless a test is about the floor."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=timeout)
    at.run()
    assert not at.exception, at.exception
    at.slider(key="min_score").set_value(min_score)
    at.run()
    assert not at.exception, at.exception
    return at


def settle(*sessions, timeout: float = 120) -> None:
    """Wait until no answer is queued or running, then rerun each session."""
    from ragspec.web.answering import ACTIVE

    deadline = time.monotonic() + timeout
    while ACTIVE._jobs:
        assert time.monotonic() < deadline, "answers still running after the timeout"
        time.sleep(0.05)
    for at in sessions:
        at.run()
        assert not at.exception, at.exception


def wait_for(predicate, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def saved_chat(at) -> dict:
    """The chat the session has open, as saved on disk."""
    from ragspec import paths
    from ragspec.web.chats import ChatStore

    return ChatStore(paths.home() / "chats").load(at.query_params["chat"])


def answers_html(at) -> list[str]:
    return [m.value for m in at.markdown if m.value.startswith('<div class="rs-answer">')]


def texts(elements) -> list[str]:
    return [e.value for e in elements]


# -- what the page would render ------------------------------------------------------------------


def element_strings(at) -> list[tuple[str, str]]:
    """(field, text) for every string in every element of the page (main and sidebar), read
    from the protobuf messages Streamlit sends to the browser: bodies, labels, tooltips."""
    out: list[tuple[str, str]] = []

    def walk(message, prefix: str) -> None:
        for field, value in message.ListFields():
            values = value if getattr(field, "is_repeated", False) else [value]
            for v in values:
                if isinstance(v, str):
                    out.append((f"{prefix}{field.name}", v))
                elif hasattr(v, "ListFields"):
                    walk(v, f"{prefix}{field.name}.")

    def visit(node) -> None:
        proto = getattr(node, "proto", None)
        if proto is not None and hasattr(proto, "ListFields"):
            walk(proto, f"{getattr(node, 'type', '?')}.")
        for child in getattr(node, "children", {}).values():
            visit(child)

    visit(at._tree)
    return out


_MD = MarkdownIt("commonmark", {"html": True})
# Streamlit's renderer makes an <a> of any link syntax (it blanks unsafe URLs, but the link is
# there); markdown-it would drop `javascript:` links silently, so accept every URL here.
_MD.validateLink = lambda url: True
# What GitHub-flavoured Markdown (Streamlit's remark-gfm) turns into links in plain text, after
# character references are decoded.
_AUTOLINK = re.compile(r"(?i)(https?://|www\.)|[\w.+-]+@[\w-]+(\.[\w-]+)+")
_LIVE_TAGS = ("a", "img", "script", "iframe", "object", "embed", "svg", "video", "audio")


def live_markup(text: str) -> list[str]:
    """The links, images and scripts Streamlit's Markdown would make of `text` (empty: inert)."""
    found = []
    soup = BeautifulSoup(_MD.render(text), "html.parser")
    for tag in soup.find_all(True):
        if tag.name in _LIVE_TAGS:
            found.append(str(tag)[:120])
        found += [f"{tag.name}[{a}]" for a in tag.attrs if a.lower().startswith("on")]
        found += [f"{tag.name}[{a}={v}]" for a, v in tag.attrs.items()
                  if isinstance(v, str) and "javascript:" in v.lower()]
    for token in _MD.parse(text):
        for child in token.children or []:
            if child.type == "text" and _AUTOLINK.search(child.content):
                found.append(f"autolink in {child.content[:80]!r}")
    return found


# -- a real server ------------------------------------------------------------------------------

def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"streamlit did not become healthy at {url} in {timeout:.0f} s")
