"""In a real browser (headless Chromium, as test_ui_browser.py): upload documents nobody here
wrote (Debian's PDF manuals, one page of them laid out in two columns) and two of our own (HTML
and Word), ask about each, click the span the answer copied, and see the source view:

  * a PDF: its page rendered beside the answer; the boxes drawn over the copied characters
    hold exactly those characters on PDFium's own text layer (nothing of our extraction is used
    to check them), on a one-column page and in the right-hand column of a two-column page;
  * HTML and Word: the text around the passage with the copied characters marked, the
    headings there, and the document's markup-looking text shown as text.

The answers come from `copying_model_folder` (tests/support/copying_model.py): a one-layer model whose
greedy answer is a phrase of the passage, so the engine's n-gram drafter really copies it and
the model really accepts it; the spans then go through the real citation path. `make
screenshot` sets RAGSPEC_SCREENSHOT, and the PDF views are saved beside it for docs/chat.md."""

from __future__ import annotations

import gzip
import io
import os
from pathlib import Path

import pytest
from copying_model import BREAK, copying_model_folder
from fakes import docx_bytes
from test_pdf_boxes import _letters, _PdfiumLayer, _two_columns
from test_ui_browser import (  # noqa: F401 (fixture)
    SCREENSHOT_ENV,
    SIDEBAR,
    ask,
    chromium,
    open_advanced,
    serving,
    set_toggle,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MANUAL = Path("/usr/share/doc/bzip2/manual.pdf.gz")  # 38 pages
MIME_SPEC = Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf")

# Each phrase is copied from one document (every character once: see copying_model.py).
CASES = {
    "manual": ("bzip2 manual.pdf", "-cdfkqstvzVL123456789",
               "What is the synopsis of the bzip2 command line, with its flags and filenames?"),
    "columns": ("mime spec in two columns.pdf", "IA/SUBTYPE.xml (one",
                "Which files does update-mime-database create, with the details of each MIME "
                "type such as its comment and generic icon?"),
    "html": ("forge notes.html", "blacksmith jug",
             "What did the smithy keep the quenching water in at the Harwood forge?"),
    "docx": ("turbine service.docx", "quick dynamo",
             "Which part of the Elmstead turbine is checked first at each service?"),
}

FORGE_HTML = b"""<!DOCTYPE html><html><head><title>Forge notes</title>
<style>p { color: red }</style><script>document.title = "live"</script></head><body>
<h1>Harwood forge</h1>
<p>The Harwood forge stood by the mill race until 1931.</p>
<h2>Quenching &amp; the &lt;script&gt; tag</h2>
<p>At the Harwood forge the quenching water was kept in a blacksmith jug of fired clay, never
in an iron pail. Writing &lt;script&gt;alert(1)&lt;/script&gt; in a page is only <b>text</b>
here.</p>
<h2>Fuel</h2>
<p>Charcoal came from the coppice on the hill.</p>
</body></html>"""

TURBINE = ("Elmstead turbine", "Service order",
           "At each service of the Elmstead turbine the quick dynamo is checked first, then the "
           "brake pads.",
           "Notes like <img src=x onerror=alert(1)> are kept as written.",
           "Blades", "The blades are inspected every second year.")


def two_columns(data: bytes, left: int, right: int) -> bytes:
    """Two pages of a real PDF (0-based numbers) side by side on one page."""
    import pypdfium2 as pdfium

    pair = pdfium.PdfDocument.new()
    pair.import_pages(pdfium.PdfDocument(data), [left, right])
    out = io.BytesIO()
    pair.save(out)
    return _two_columns(out.getvalue())[0]


def documents(folder: Path) -> dict[str, Path]:
    for needed in (MANUAL, MIME_SPEC):
        if not needed.exists():
            pytest.skip(f"{needed} is not installed (`make testdocs`)")
    data = {"manual": gzip.decompress(MANUAL.read_bytes()),
            "columns": two_columns(MIME_SPEC.read_bytes(), 1, 2),
            "html": FORGE_HTML, "docx": docx_bytes(TURBINE)}
    paths = {}
    for key, (name, _, _) in CASES.items():
        paths[key] = folder / name
        paths[key].write_bytes(data[key])
    return paths


def shown_box(locator) -> dict:
    """The element's box once it is on screen: during one of Streamlit's reruns an element can be
    drawn again, and for that moment it has no box."""
    for _ in range(40):
        locator.wait_for(state="visible")
        box = locator.bounding_box()
        if box is not None:
            return box
        locator.page.wait_for_timeout(250)
    raise AssertionError(f"{locator} never stayed on screen long enough to be measured")


def save_screenshot(page, name: str, fallback: Path) -> None:
    """The answer and its source view (the page without the sidebar), as a small palette PNG
    beside RAGSPEC_SCREENSHOT when that is set (for docs/chat.md), else at `fallback`."""
    side = shown_box(page.locator(SIDEBAR))
    shown = shown_box(page.locator("div.rs-page"))
    left = side["x"] + side["width"]
    clip = {"x": left, "y": 0, "width": page.viewport_size["width"] - left,
            "height": shown["y"] + shown["height"] + 70}
    target = os.environ.get(SCREENSHOT_ENV)
    if not target:
        page.screenshot(path=str(fallback), clip=clip)
        return
    from PIL import Image

    image = Image.open(io.BytesIO(page.screenshot(clip=clip)))
    path = Path(target).with_name(f"{Path(target).stem}-{name}.png")
    image.convert("RGB").quantize(colors=64).save(path, optimize=True)


def answer(page, model: str, question: str) -> None:
    """A new chat, the named model, the question; returns once the answer is saved."""
    page.locator(SIDEBAR).get_by_text("New chat").click()
    page.wait_for_timeout(1000)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    choose = page.locator(SIDEBAR).locator('[data-testid="stSelectbox"]').filter(has_text="Model")
    option = page.get_by_role("option", name=model, exact=True)
    for _ in range(4):  # a rerun under way can take the click that opens the list
        choose.first.click()
        try:
            option.wait_for(timeout=20_000)
            break
        except PlaywrightTimeout:
            continue
    option.click()
    page.wait_for_timeout(1000)
    # Draft whatever the match offers: the adaptive policy weighs drafts against this machine's
    # forward costs, and on a loaded machine it may rightly decline to draft at all.
    adaptive = page.locator(SIDEBAR).get_by_label("Adaptive drafting", exact=True).first
    if not adaptive.is_visible():
        open_advanced(page, adaptive)
    set_toggle(page, "Adaptive drafting", False)
    ask(page, question)
    try:
        page.get_by_text("Passages used").first.wait_for(timeout=600_000)
    except Exception as exc:  # say what the page said instead
        alerts = page.locator('[data-testid="stAlert"]')
        raise AssertionError([alerts.nth(i).inner_text()
                              for i in range(alerts.count())]) from exc


_LINKS = """root => {
  const out = []; let pos = 0;
  const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const node = walk.currentNode, text = node.textContent.replace(/\\u2060/g, '');
    const link = node.parentElement.closest('a.rs-open');
    if (link) out.push([pos, text, link.getAttribute('href')]);
    pos += text.length;
  }
  return out;
}"""


def open_copied_span(page, phrase: str) -> list[str]:
    """Click the first span copied from a passage; return the runs of the phrase that the answer
    copied from that same passage (the answer is PHRASE|PHRASE|..., and where the drafter's guess
    was wrong the model wrote a character itself: that one was not copied)."""
    answer_div = page.locator("div.rs-answer").last
    text = answer_div.inner_text().replace("\u2060", "")
    assert text.startswith(phrase + BREAK), text[:80]  # the model wrote what it was built to
    pieces = answer_div.evaluate(_LINKS)
    assert pieces, "the answer copied nothing from a passage"
    href = pieces[0][2]
    copied = set()
    for pos, piece, link in pieces:
        if link == href:
            start = pos % (len(phrase) + 1)
            assert phrase[start : start + len(piece)] == piece
            copied.update(range(start, start + len(piece)))
    runs, run = [], ""
    for i, char in enumerate(phrase + BREAK):
        if i in copied:
            run += char
        elif run:
            runs.append(run)
            run = ""
    answer_div.locator("a.rs-open").first.click()
    return runs


def boxes_of(page, kind: str) -> list[list[float]]:
    boxes = page.locator(f"div.rs-page div.rs-box.{kind}")
    return [[float(v) for v in boxes.nth(i).get_attribute("data-box").split(",")]
            for i in range(boxes.count())]


def opened_page_number(page) -> int:
    picture = page.locator("div.rs-page img")
    picture.wait_for(timeout=120_000)
    assert picture.evaluate("i => i.naturalWidth") > 500  # really rendered, and loaded
    return int(page.locator("div.rs-page").get_attribute("data-page"))


def answered(page, count: int) -> None:
    """Wait until the chat shows `count` finished answers and takes a question again (the box is
    disabled while an answer is written, so an old copy of the page cannot satisfy both)."""
    page.wait_for_function("""n => {
      const done = [...document.querySelectorAll('summary')]
        .filter(s => s.innerText.includes('Passages used')).length;
      const box = document.querySelector('textarea[placeholder^="Ask a question"]');
      return done >= n && box && !box.disabled;
    }""", arg=count, timeout=600_000)


def in_view(page, locator) -> bool:
    box = shown_box(locator)
    return 0 <= box["y"] and box["y"] + box["height"] <= page.viewport_size["height"]


def ink_under_mark(page) -> tuple[float, float]:
    """How legible the copied letters stay under their mark, in the first copied box, the page
    drawn with the marks and without them: the pixels that are ink on the bare page, against
    the paper around them. Returns (contrast kept: the paper's luminance minus the ink's, marked
    over bare, 1 = as legible as unmarked, 0 = the letters are gone; the ink's mean luminance
    over the paper's under the mark, 0 = black on white)."""
    import numpy as np
    from PIL import Image

    box = shown_box(page.locator("div.rs-page div.rs-box.rs-copied").first)
    clip = {"x": round(box["x"]), "y": round(box["y"]),
            "width": max(1, int(box["width"])), "height": max(1, int(box["height"]))}

    def grey():
        shot = Image.open(io.BytesIO(page.screenshot(clip=clip, animations="disabled")))
        return np.asarray(shot.convert("L"), dtype=float)

    marked = grey()
    boxes = page.locator("div.rs-page")
    boxes.evaluate("p => p.querySelectorAll('.rs-box').forEach(b => b.style.visibility = 'hidden')")
    bare = grey()
    boxes.evaluate("p => p.querySelectorAll('.rs-box').forEach(b => b.style.visibility = '')")
    ink = bare < 0.6 * np.percentile(bare, 95)
    assert 10 <= ink.sum() < ink.size / 2, "no letters under the copied box"

    def contrast(image) -> float:
        return float(np.median(image[~ink]) - image[ink].mean())

    return contrast(marked) / contrast(bare), float(marked[ink].mean() / np.median(marked[~ink]))


def check_a_reader_can_use_the_view(page) -> None:
    """The source of a span clicked at the end of a long chat: on screen, the page as wide as its
    panel, the copied letters still dark under their mark, and a zoom that enlarges the page and
    keeps the copied words in sight."""
    answers = page.locator("div.rs-answer")
    for _ in range(40):  # Streamlit scrolls a chat to its end once it is drawn
        if in_view(page, answers.last) and not in_view(page, answers.first):
            break
        page.wait_for_timeout(250)
    else:
        raise AssertionError("the view did not settle at the end of a chat longer than the window")
    head = page.locator("div.rs-source-head")
    assert in_view(page, head), f"the source opened out of sight: {shown_box(head)}"
    column = page.locator('[data-testid="stColumn"]').filter(has=page.locator("div.rs-page"))
    picture = page.locator("div.rs-page img")
    fit, width = shown_box(picture)["width"], shown_box(column.last)["width"]
    assert fit >= 0.9 * width, (fit, width)
    assert shown_box(picture)["y"] < page.viewport_size["height"] / 2
    kept, ink = ink_under_mark(page)
    assert kept > 0.7 and ink < 0.5, (kept, ink)  # the letters dark on the paper, as unmarked

    page.get_by_text("300%", exact=True).first.click()
    zoomed = page.locator('div.rs-page[data-zoom="300"] img')
    zoomed.wait_for()
    zoomed.evaluate("i => i.decode()")
    assert shown_box(zoomed)["width"] >= 2.9 * fit, (shown_box(zoomed)["width"], fit)
    pane, copied = shown_box(page.locator("div.rs-scroll")), None
    for _ in range(40):  # the copied words are scrolled to once the zoomed page is drawn
        copied = shown_box(page.locator("div.rs-page div.rs-box.rs-copied").first)
        if (pane["x"] <= copied["x"] and copied["x"] + copied["width"] <= pane["x"] + pane["width"]
                and pane["y"] <= copied["y"]
                and copied["y"] + copied["height"] <= pane["y"] + pane["height"]):
            break
        page.wait_for_timeout(250)
    else:
        raise AssertionError(f"the copied words are outside the zoomed view: {copied}, {pane}")
    assert in_view(page, page.locator("div.rs-page div.rs-box.rs-copied").first)


def test_browser_copied_spans_open_their_source_with_exactly_the_copied_words_marked(
        chromium, tmp_path):  # noqa: F811
    pdfium = pytest.importorskip("pypdfium2")
    docs = documents(tmp_path)
    models = tuple(f"copy-{key}={copying_model_folder(tmp_path / key, phrase)}"
                   for key, (_, phrase, _) in CASES.items())
    with serving(tmp_path, models, RAGSPEC_MODEL_CACHE=str(tmp_path / "cache")) as url:
        page = chromium.new_context(viewport={"width": 1400, "height": 1100}).new_page()
        try:
            check_every_source(page, url, docs, pdfium)
        except BaseException:
            page.screenshot(path=str(tmp_path / "failed.png"), full_page=True)
            raise


def check_every_source(page, url: str, docs: dict[str, Path], pdfium) -> None:
    page.set_default_timeout(120_000)  # the long waits (ingest, answers) name their own
    page.goto(url)
    page.get_by_placeholder("Ask a question about your documents").wait_for()
    page.locator(f'{SIDEBAR} input[type="file"]').set_input_files(list(docs.values()))
    for name, _, _ in CASES.values():
        page.get_by_text(f"{name}: added").wait_for(timeout=900_000)

    # PDFs: the boxes drawn for the copied span hold exactly its characters.
    for key, expect_pages, shot in (("manual", 38, "source"), ("columns", 1, "columns")):
        name, phrase, question = CASES[key]
        answer(page, f"copy-{key}", question)
        copied = open_copied_span(page, phrase)
        number = opened_page_number(page)
        head = page.locator("div.rs-source-head").inner_text()
        assert name in head and f" of {expect_pages}" in head
        found = boxes_of(page, "rs-copied")
        assert found, "no box for the copied characters"
        assert shown_box(page.locator("div.rs-page div.rs-box.rs-copied").first)["width"] > 0
        textpage = pdfium.PdfDocument(docs[key].read_bytes())[number - 1].get_textpage()
        assert _letters(_PdfiumLayer(textpage).under(found)) == _letters("".join(copied))
        assert boxes_of(page, "rs-shade")  # the rest of the passage, shaded
        if key == "columns":  # the phrase sits in the right-hand column, and so do its boxes
            half = pdfium.PdfDocument(docs[key].read_bytes())[0].get_size()[0] / 2
            assert all(box[0] >= half for box in found)
        save_screenshot(page, shot, docs[key].with_suffix(".png"))

    # A span in the last answer of a long chat on the manual: a source a reader can use, and
    # its view pages on at the zoom chosen.
    answer(page, "copy-manual", CASES["manual"][2])
    for count in (2, 3):
        ask(page, CASES["manual"][2])
        answered(page, count)
    open_copied_span(page, CASES["manual"][1])
    number = opened_page_number(page)
    check_a_reader_can_use_the_view(page)
    page.get_by_text("next page").first.click()
    page.locator(f'div.rs-page[data-page="{number + 1}"][data-zoom="300"]').wait_for()

    # HTML and Word: the text around the passage, the copied characters marked, as text.
    headings = {"html": ("Harwood forge", "Quenching & the <script> tag"),
                "docx": ("Elmstead turbine", "Service order")}
    for key in ("html", "docx"):
        name, phrase, question = CASES[key]
        answer(page, f"copy-{key}", question)
        copied = open_copied_span(page, phrase)
        view = page.locator("div.rs-source-text")
        view.wait_for(timeout=120_000)
        marks = view.locator("mark.rs-draft")
        assert "".join(marks.nth(i).inner_text() for i in range(marks.count())) == "".join(copied)
        assert all(any(m in run for run in copied) for m in marks.all_inner_texts())
        lines = view.inner_text().splitlines()
        for heading in headings[key]:
            assert heading in lines  # on a line of its own
        shown = view.inner_text()
        assert ("<script>alert(1)</script>" in shown if key == "html"
                else "<img src=x onerror=alert(1)>" in shown)
        assert view.locator("script, img, b, a").count() == 0
        assert "document.title" not in shown and "color: red" not in shown
