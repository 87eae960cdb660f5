"""In a real browser (headless Chromium, as test_ui_browser.py): upload a PDF nobody here wrote,
ask about it, click the copied span (or the passage in the list), and see its page rendered
beside the answer with boxes whose region holds the passage's words on PDFium's text layer."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest
from conftest import make_char_tokenizer, make_tiny_model
from test_pdf_boxes import _letters, _PdfiumLayer
from test_ui_browser import SCREENSHOT_ENV, SIDEBAR, ask, chromium, serving  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.slow]

MANUAL = Path("/usr/share/doc/bzip2/manual.pdf.gz")


def long_context_model(path: Path) -> Path:
    """A tiny random model reading characters, with room for four PDF passages of prompt."""
    tok = make_char_tokenizer()
    tok.eos_token = None
    model = make_tiny_model(len(tok), max_position_embeddings=16384, eos_token_id=None)
    model.generation_config.eos_token_id = None
    tok.save_pretrained(path)
    model.save_pretrained(path)
    return path


def test_browser_a_cited_pdf_opens_at_its_page_with_the_copied_words_boxed(chromium,  # noqa: F811
                                                                            tmp_path):
    pdfium = pytest.importorskip("pypdfium2")
    if not MANUAL.exists():
        pytest.skip(f"{MANUAL} is not installed")
    data = gzip.decompress(MANUAL.read_bytes())
    pdf = tmp_path / "bzip2 manual.pdf"
    pdf.write_bytes(data)
    folder = long_context_model(tmp_path / "tiny")
    with serving(tmp_path, (f"tiny={folder}",), RAGSPEC_MODEL_CACHE=str(tmp_path / "cache")) as url:
        page = chromium.new_context(viewport={"width": 1400, "height": 1250}).new_page()
        page.set_default_timeout(600_000)  # the first page run loads the embedding model
        page.goto(url)
        page.get_by_placeholder("Ask a question about your documents").wait_for()
        page.locator(f'{SIDEBAR} input[type="file"]').set_input_files(pdf)
        page.get_by_text("bzip2 manual.pdf: added").wait_for(timeout=600_000)
        ask(page, "How does bzip2recover recover data from damaged bzip2 files?")
        try:
            page.get_by_text("Passages used").first.wait_for(timeout=600_000)
        except Exception as exc:  # say what the page said instead
            alerts = page.locator('[data-testid="stAlert"]')
            raise AssertionError([alerts.nth(i).inner_text()
                                  for i in range(alerts.count())]) from exc

        spans = page.locator("div.rs-answer a.rs-open")
        if spans.count():  # a span copied from a passage: click it
            spans.first.click()
        else:  # the model copied nothing: open the first passage from the list
            page.get_by_text("Passages used").first.click()
            page.locator("a.rs-open-passage").first.click()
        picture = page.locator("div.rs-page img")
        picture.wait_for(timeout=120_000)
        assert "src=" in page.url
        assert picture.evaluate("i => i.naturalWidth") > 500  # really rendered, and loaded
        head = page.locator("div.rs-source-head").inner_text()
        number = int(head.split("page ")[1].split(" of ")[0])
        assert " of 38" in head

        boxes = page.locator("div.rs-page div.rs-box")
        assert boxes.count() > 0
        found = [[float(v) for v in boxes.nth(i).get_attribute("data-box").split(",")]
                 for i in range(boxes.count())]
        drawn = boxes.first.bounding_box()
        assert drawn and drawn["width"] > 0 and drawn["height"] > 0  # laid over the picture
        textpage = pdfium.PdfDocument(data)[number - 1].get_textpage()
        under = _letters(_PdfiumLayer(textpage).under(found))
        page_text = _letters(textpage.get_text_range())
        assert len(under) > 20 and under in page_text  # one stretch of the page's own words
        shot = Path(os.environ.get(SCREENSHOT_ENV, "").replace(".png", "-source.png")
                    or tmp_path / "source.png")
        page.screenshot(path=str(shot), full_page=True)

        page.get_by_text("next page").first.click()
        page.locator(f'div.rs-page[data-page="{number + 1}"]').wait_for()
