"""In a real browser (headless Chromium, as test_ui_browser_source.py): a passage the answer
copied nothing from, opened with *open in the document* under *Passages used*, opens where the
passage is, not at the top of the document:

  * a PDF (Debian's bzip2 manual) zoomed to 300%: the pane is scrolled so that the passage's
    first box starts inside it (before, a zoom with no copied box opened at the page's top
    left corner);
  * a plain-text document (zlib's FAQ, from Debian's zlib1g-dev): the text around the passage
    is scrolled so that the passage starts inside its pane (before, it opened at the top of
    the 1,500 characters shown above the passage).

The model (tests/support/copying_model.py) answers with a phrase that no document holds, so
no span of the answer is a copy from a passage: no copied box or mark to open at. Nothing here
counts or times anything; each check waits until the pane shows the passage, or fails."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
from copying_model import copying_model_folder
from test_ui_browser import chromium, serving  # noqa: F401 (fixture)
from test_ui_browser_source import MANUAL, answer, opened_page_number

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ZLIB_FAQ = Path("/usr/share/doc/zlib1g-dev/FAQ.gz")
NOWHERE = "Qz~"  # in neither document's text: nothing the model says is a passage's

QUESTIONS = {
    "bzip2 manual.pdf": "How does bzip2 recover data from damaged files?",
    "zlib FAQ.txt": "Can zlib decode Flate data in an Adobe PDF file?",
}

# The passage's first box (a PDF) or first line (text) against the visible part of its pane:
# its top left corner inside, with room for a line of text after it.
_STARTS_INSIDE = """([pane, first]) => {
  const p = document.querySelector(pane), f = document.querySelector(first);
  const r = f && f.getClientRects()[0];
  if (!p || !r) return null;
  const a = p.getBoundingClientRect();
  const left = a.left + p.clientLeft, top = a.top + p.clientTop;
  const inside = left <= r.left + 1 && r.left + 16 <= left + p.clientWidth
    && top <= r.top + 1 && r.top + 16 <= top + p.clientHeight;
  return inside ? true : JSON.stringify({pane: [left, top, p.clientWidth, p.clientHeight],
                                        passage: [r.left, r.top, r.width, r.height]});
}"""


def open_deepest_passage(page, name: str) -> None:
    """Click *open in the document* on the passage of `name` that starts furthest into it (the
    one a view opened at the top would show least of)."""
    page.get_by_text("Passages used").first.click()
    links = page.locator("a.rs-open-passage").first
    links.wait_for()
    found = page.evaluate("""name => [...document.querySelectorAll('a.rs-open-passage')]
      .map(a => [a.parentElement.innerText, a.getAttribute('href')])
      .filter(([label]) => label.includes(name))""", name)
    assert found, f"no passage of {name} was used"
    _, href = max(found, key=lambda f: int(re.search(r"char (\d+)", f[0]).group(1)))
    page.locator(f'a.rs-open-passage[href="{href}"]').first.click()


def wait_passage_shown(page, pane: str, first: str) -> None:
    """Wait until the passage starts inside its pane (it is scrolled there once drawn)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(f"a => ({_STARTS_INSIDE})(a) === true", arg=[pane, first],
                               timeout=60_000)
    except PlaywrightTimeout:
        where = page.evaluate(_STARTS_INSIDE, [pane, first])
        raise AssertionError(f"the passage is outside its pane: {where}") from None


def test_browser_a_passage_nothing_was_copied_from_opens_where_it_is(
        chromium, tmp_path):  # noqa: F811
    pytest.importorskip("pypdfium2")
    for needed in (MANUAL, ZLIB_FAQ):
        if not needed.exists():
            pytest.skip(f"{needed} is not installed (`make testdocs`)")
    docs = [tmp_path / name for name in QUESTIONS]
    docs[0].write_bytes(gzip.decompress(MANUAL.read_bytes()))
    docs[1].write_bytes(gzip.decompress(ZLIB_FAQ.read_bytes()))
    model = copying_model_folder(tmp_path / "model", NOWHERE)
    with serving(tmp_path, (f"copy-nothing={model}",),
                 RAGSPEC_MODEL_CACHE=str(tmp_path / "cache")) as url:
        page = chromium.new_context(viewport={"width": 1400, "height": 1100}).new_page()
        try:
            check_passages_open_where_they_are(page, url, docs)
        except BaseException:
            page.screenshot(path=str(tmp_path / "failed.png"), full_page=True)
            raise
        finally:
            page.screenshot(path=str(tmp_path / "last.png"))


def check_passages_open_where_they_are(page, url: str, docs: list[Path]) -> None:
    page.set_default_timeout(120_000)
    page.goto(url)
    page.get_by_placeholder("Ask a question about your documents").wait_for()
    page.locator('section[data-testid="stSidebar"] input[type="file"]').set_input_files(docs)
    for doc in docs:
        page.get_by_text(f"{doc.name}: added").wait_for(timeout=900_000)

    pdf, text = docs
    answer(page, "copy-nothing", QUESTIONS[pdf.name])
    open_deepest_passage(page, pdf.name)
    opened_page_number(page)
    assert page.evaluate("() => !document.querySelector('div.rs-page .rs-copied')")
    page.get_by_text("300%", exact=True).first.click()
    page.locator('div.rs-page[data-zoom="300"] img').wait_for()
    wait_passage_shown(page, "div.rs-scroll", 'div.rs-page[data-zoom="300"] .rs-shade')
    page.screenshot(path=str(pdf.with_suffix(".png")))

    answer(page, "copy-nothing", QUESTIONS[text.name])
    open_deepest_passage(page, text.name)
    page.locator("div.rs-source-text").wait_for()
    assert page.evaluate("() => !document.querySelector('div.rs-source-text mark')")
    wait_passage_shown(page, "div.rs-source-text", "div.rs-source-text .rs-shade")
    page.screenshot(path=str(text.with_suffix(".png")))
