"""No file name, error text or passage reaches the page as live markup: files named like Markdown
links and images, HTML, `javascript:` URLs and bare URLs are uploaded (good ones and bad ones),
and every string of every element the page sends (bodies, labels, tooltips) is rendered as
Streamlit's Markdown would render it and checked for links, images and scripts. Tooltips carry
no server paths."""

from __future__ import annotations

import pytest
from ui_support import element_strings, fast_page, live_markup, new_session, texts

from ragspec.web import page_html as rd

BODY = b"# Notes\n\nThe metrics endpoint listens on port 7432 and serves /metrics only.\n"

NASTY_GOOD = [  # supported types with real text: they are ingested and listed
    "[click me](javascript:alert(1)).md",
    "![pixel](http://evil.example/p.png).md",
    "<img src=x onerror=alert(1)>.txt",
    "see http://evil.example/x and www.evil.example or a@evil.example.md",
    "**bold** :red[red] $x$ <b>b</b>.md",
]
NASTY_BAD = [  # each one a failure message naming the file
    ("<script>alert(2)</script>.exe", b"MZ\x90\x00"),
    ("[broken](http://evil.example/).pdf", b"%PDF-1.4 [x](http://evil.example/) not a pdf"),
    ("![empty](javascript:alert(3)).txt", b""),
]


def test_the_oracle_sees_what_streamlit_would_link():
    # The checks below are only as good as this: raw names are live markup, escaped ones not.
    for name in [*NASTY_GOOD, *(n for n, _ in NASTY_BAD)]:
        assert live_markup(name) or ":red" in name, name
        assert not live_markup(rd.escape_text(name, inline=True)), name
        assert not live_markup(f"<div>{rd.escape_text(name)}</div>"), name


def test_nasty_file_names_show_as_plain_text_everywhere(tmp_path, monkeypatch):
    fast_page(monkeypatch, tmp_path / "home")
    at = new_session()
    at.file_uploader[0].set_value(
        [(name, BODY + f"File {i}.".encode(), "text/plain") for i, name in enumerate(NASTY_GOOD)]
        + [(name, data, "application/octet-stream") for name, data in NASTY_BAD])
    at.run()
    assert not at.exception, at.exception
    successes, errors = " ".join(texts(at.success)), " ".join(texts(at.error))
    assert successes.count("added") == len(NASTY_GOOD), successes
    assert len(at.error) == len(NASTY_BAD), errors
    remove = [b for b in at.sidebar.button if (b.key or "").startswith("remove-")]
    assert len(remove) == len(NASTY_GOOD)

    strings = element_strings(at)
    live = [(field, text[:100], found) for field, text in strings
            if (found := live_markup(text))]
    assert not live, live
    home = str(tmp_path)
    tooltips = [text for field, text in strings if field.endswith(".help")]
    assert tooltips and not [t for t in tooltips if home in t], tooltips
    # the names are still readable: what a user sees decodes to the (made safe) name
    import html

    shown = " ".join(html.unescape(t).replace("\u2060", "") for _, t in strings)
    assert "[click me](javascript:alert(1)).md" in shown
    assert "see http:__evil.example_x" in shown  # "/" cannot be in a file name


@pytest.mark.parametrize("name", ["a\nb.md", "nul\x00.md"])
def test_control_characters_in_names_are_shown_escaped_not_obeyed(tmp_path, monkeypatch, name):
    fast_page(monkeypatch, tmp_path / "home")
    at = new_session()
    at.file_uploader[0].set_value((name, BODY, "text/plain"))
    at.run()
    assert not at.exception, at.exception
    assert any("added" in t for t in texts(at.success))
    assert all("\x00" not in text and "<br>" not in text or text.startswith("<div")
               for _, text in element_strings(at))
