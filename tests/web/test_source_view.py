"""The source view: a cited document opened beside the answer (PDF pages rendered with the
copied characters boxed, other documents as escaped text around the passage), reachable only
from the user's own chats and index; pages render by number, cached."""

from __future__ import annotations

import base64
import gzip
import html
import io
import re
import statistics
import time
from pathlib import Path

import pytest
from fakes import HashEmbedder
from test_pdf_boxes import _letters, _PdfiumLayer
from test_ui_accounts import signed_in, site  # noqa: F401  (the accounts site, as a fixture)
from ui_support import METRICS_DOC, fast_page, live_markup, new_session, settle, tiny_model_folder

from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.ingest import ingest_paths
from ragspec.source_pages import (
    Source,
    SourceError,
    image_rects,
    open_source,
    render_page,
    text_window,
)

pdfium = pytest.importorskip("pypdfium2")

MANUAL = Path("/usr/share/doc/bzip2/manual.pdf.gz")  # Debian's bzip2 manual, 38 pages


def manual_bytes() -> bytes:
    if not MANUAL.exists():
        pytest.skip(f"{MANUAL} is not installed")
    return gzip.decompress(MANUAL.read_bytes())


@pytest.fixture
def indexed(tmp_path):
    pdf = tmp_path / "bzip2 manual.pdf"
    pdf.write_bytes(manual_bytes())
    store = PassageStore.open(tmp_path / "index", HashEmbedder())
    assert ingest_paths([pdf], store).ok
    return store, pdf


def test_a_document_opens_only_by_its_id_in_this_index_and_only_unchanged(indexed, tmp_path):
    store, pdf = indexed
    (info,) = store.documents()
    assert open_source(store, info.doc_id).data == pdf.read_bytes()
    other = PassageStore.open(tmp_path / "other", HashEmbedder())
    note = tmp_path / "other.md"
    note.write_bytes(METRICS_DOC)
    ingest_paths([note], other)
    (theirs,) = other.documents()
    for guess in (theirs.doc_id, str(note), str(pdf), "../other.md"):
        with pytest.raises(SourceError, match="not in the index"):
            open_source(store, guess)
    pdf.write_bytes(pdf.read_bytes() + b"\n%changed")
    with pytest.raises(SourceError, match="changed since it was ingested"):
        open_source(store, info.doc_id)


def test_a_rendered_page_is_cached_and_its_boxes_land_on_the_copied_words(indexed):
    store, _ = indexed
    from ragspec.citations import Citer

    passage = next(p for p in store.passages() if p.page == 3)
    source = open_source(store, passage.doc_id)
    first = render_page(source, 3)
    assert render_page(source, 3) is first  # from the cache
    assert first.png.startswith(b"\x89PNG") and first.pages == 38
    boxes = Citer(store).locate(passage, 0, 40).boxes
    assert boxes
    for left, top, width, height in image_rects(first, boxes):
        assert 0 <= left and left + width <= 1 and 0 <= top and top + height <= 1
    layer = _PdfiumLayer(pdfium.PdfDocument(source.data)[2].get_textpage())
    assert _letters(layer.under(boxes)) == _letters(passage.text[:40])


def long_pdf(data: bytes, pages: int) -> bytes:
    """A real manual's pages repeated to `pages` pages."""
    src = pdfium.PdfDocument(data)
    dest = pdfium.PdfDocument.new()
    while len(dest) < pages:
        dest.import_pages(src, list(range(min(len(src), pages - len(dest)))))
    out = io.BytesIO()
    dest.save(out)
    return out.getvalue()


def test_page_1500_of_a_2000_page_pdf_renders_as_fast_as_page_1(tmp_path):
    from ragspec.source_pages import _render

    data = long_pdf(manual_bytes(), 2000)
    timings = {1: [], 1500: []}
    for _ in range(3):
        for page in (1, 1500):  # side by side, not cached
            start = time.perf_counter()
            _render(data, page, 1.5)
            timings[page].append(time.perf_counter() - start)
    one, late = (statistics.median(timings[p]) for p in (1, 1500))
    # page 1500 is page 18 of the manual, page 1 its title page: both render by number
    assert late < 3 * one + 0.1, (one, late)


def _pdf_session(tmp_path, monkeypatch):
    fast_page(monkeypatch, tmp_path / "home",
              models=[["tiny", str(tiny_model_folder(tmp_path / "tiny"))]],
              model_cache=tmp_path / "cache")
    at = new_session()
    at.number_input(key="max_new_tokens").set_value(8)
    at.slider(key="k").set_value(1)  # the tiny model reads characters: keep the prompt short
    at.file_uploader[0].set_value(("bzip2 manual.pdf", manual_bytes(), "application/pdf"))
    at.run()
    at.chat_input[0].set_value("How does bzip2 recover data from damaged files?").run()
    settle(at, timeout=600)
    return at


def _png_width(markup: str) -> int:
    data = base64.b64decode(re.search(r"base64,([^\"]+)", markup).group(1))
    return int.from_bytes(data[16:20], "big")  # the PNG header's width


def _boxes(markup: str, kind: str) -> list[list[float]]:
    return [[float(v) for v in m.split(",")]
            for m in re.findall(rf'class="rs-box {kind}" data-box="([^"]+)"', markup)]


def _placed(markup: str, kind: str) -> list[list[float]]:
    """The [left, top, width, height] percentages of the page of each element of class `kind`
    drawn over it."""
    number = r"([-\d.]+)%;"
    return [[float(v) for v in m] for m in re.findall(
        rf'class="{kind}"[^>]*? style="left:{number}top:{number}'
        rf'width:{number}height:([-\d.]+)%"', markup)]


def _union(rects) -> list[float]:
    left, top = min(r[0] for r in rects), min(r[1] for r in rects)
    return [left, top, max(r[0] + r[2] for r in rects) - left,
            max(r[1] + r[3] for r in rects) - top]


def _within(inner, outer, slack: float = 2e-3) -> bool:
    """Whether the [left, top, width, height] rect `inner` lies inside `outer`."""
    return (outer[0] - slack <= inner[0] and outer[1] - slack <= inner[1]
            and inner[0] + inner[2] <= outer[0] + outer[2] + slack
            and inner[1] + inner[3] <= outer[1] + outer[3] + slack)


def test_a_pdf_passage_opens_as_its_page_with_the_passage_shaded(tmp_path, monkeypatch):
    at = _pdf_session(tmp_path, monkeypatch)
    chat = at.query_params["chat"]
    links = [html.unescape(m.value) for m in at.markdown if "rs-open-passage" in m.value]
    assert f'href="?chat={chat}&src=1-0"' in links[0]
    at.query_params["src"] = "1-0"
    at.run()
    assert not at.exception, at.exception
    (page_html,) = [m.value for m in at.markdown if '<div class="rs-page"' in m.value]
    head = next(m.value for m in at.markdown if m.value.startswith('<div class="rs-source-head"'))
    from ui_support import saved_chat

    passage = saved_chat(at)["messages"][1]["passages"][0]
    assert f"page {passage['page']} of 38" in head
    assert "data:image/png;base64," in page_html
    shaded, copied = _boxes(page_html, "rs-shade"), _boxes(page_html, "rs-copied")
    assert shaded
    textpage = pdfium.PdfDocument(manual_bytes())[passage["page"] - 1].get_textpage()
    under = _letters(_PdfiumLayer(textpage).under(shaded + copied))
    assert under and under in _letters(passage["text"])  # the passage's own words, no others
    assert any(b.label.startswith("Download") for b in at.get("download_button"))
    # Where the zoomed pane opens (the browser test scrolls it): with nothing copied, the
    # region of the passage's own boxes (at least its largest), not the page's corner.
    (focus,) = _placed(page_html, "rs-focus")
    if not copied:
        shades = _placed(page_html, "rs-box rs-shade")
        largest = max(shades, key=lambda r: r[2] * r[3])
        assert _within(largest, focus) and _within(focus, _union(shades))

    # Zoomed: the page drawn twice the panel's width, with more pixels, and the links to the
    # next and previous pages keep the zoom (the browser test checks the address's `&zoom=`).
    at.radio(key="rs-zoom").set_value(200).run()
    assert not at.exception, at.exception
    assert at.query_params["zoom"] == "200%"  # a reload or a link keeps it
    (zoomed,) = [m.value for m in at.markdown if '<div class="rs-page"' in m.value]
    head = next(m.value for m in at.markdown if m.value.startswith('<div class="rs-source-head"'))
    assert 'data-zoom="200" style="width:200%"' in zoomed
    assert _png_width(zoomed) == 2 * _png_width(page_html)
    assert f"src=1-0&page={passage['page'] + 1}&zoom=200%25" in head
    at.radio(key="rs-zoom").set_value(100).run()
    assert "zoom" not in at.query_params


def test_a_text_source_is_shown_escaped_around_the_passage(tmp_path, monkeypatch):
    hostile = (METRICS_DOC + b"\n<script>alert(1)</script> <img src=x onerror=alert(2)> "
               b"[a link](http://example.com) **bold** $x$\n")
    fast_page(monkeypatch, tmp_path / "home",
              models=[["tiny", str(tiny_model_folder(tmp_path / "tiny"))]],
              model_cache=tmp_path / "cache")
    at = new_session()
    at.number_input(key="max_new_tokens").set_value(8)
    at.file_uploader[0].set_value(("notes.md", hostile, "text/markdown"))
    at.run()
    at.chat_input[0].set_value("On which port does the metrics endpoint listen?").run()
    settle(at, timeout=600)
    at.query_params["src"] = "1-0"
    at.run()
    assert not at.exception, at.exception
    (view,) = [m.value for m in at.markdown if 'class="rs-source-text"' in m.value]
    assert 'class="rs-shade"' in view
    assert live_markup(view) == []
    assert "script" in html.unescape(view) and "<script>" not in view


def test_a_member_cannot_open_another_members_document(site):  # noqa: F811
    from ragspec.accounts.users import AccountStore, Quotas

    AccountStore(site / "accounts.json").update("mia", quotas=Quotas(upload_mb=5))
    mia = signed_in("mia")
    mia.radio(key="collection").set_value("mia").run()
    mia.file_uploader[0].set_value(("private.md", METRICS_DOC, "text/markdown"))
    mia.run()
    mia.chat_input[0].set_value("On which port does the metrics endpoint listen?").run()
    settle(mia, timeout=600)
    chat = mia.query_params["chat"]
    mia.query_params["src"] = "1-0"
    mia.run()
    assert [m for m in mia.markdown if 'class="rs-source-text"' in m.value]

    max_ = signed_in("max")
    max_.query_params["chat"] = chat
    max_.query_params["src"] = "1-0"
    max_.run()
    assert not max_.exception, max_.exception
    assert not [m for m in max_.markdown if "rs-source" in m.value or "rs-page" in m.value]
    assert not [b for b in max_.get("download_button")]
    assert not any("private" in m.value for m in max_.markdown)



def test_every_span_copied_from_a_pdf_passage_carries_its_page_and_boxes(indexed):
    from ragspec.citations import Citer
    from ragspec.decoding.types import Span, SpanOrigin
    from ragspec.retrieval.layouts import layout_dir

    store, pdf = indexed
    passage = next(p for p in store.passages() if p.page == 5 and len(p.text) > 120)
    copied = Span(passage.text[30:110], [1, 2], True, SpanOrigin(400, True, 0, 30, 110))
    own = Span(" and so on", [3], False)
    echo = Span("the question", [4], True, SpanOrigin(10, True, None))
    spans = Citer(store).span_dicts([copied, own, echo], [passage])
    assert "page" not in spans[1] and "page" not in spans[2]
    cited = spans[0]
    assert cited["page"] == 5 and cited["rotation"] == 0 and cited["section"] is None
    assert cited["page_size"] == [612.0, 792.0]  # US letter, in points
    layer = _PdfiumLayer(pdfium.PdfDocument(pdf.read_bytes())[4].get_textpage())
    assert _letters(layer.under(cited["boxes"])) == _letters(copied.text)
    # an index ingested before layouts were kept: the page, and boxes null
    from ragspec import citations

    for layout in layout_dir(store).iterdir():
        layout.unlink()
    citations._layouts.clear()  # what this process read before (named by content: kept)
    fresh = PassageStore.open(store.index_dir, HashEmbedder())
    again = Citer(fresh).span_dicts([copied], [passage])[0]
    assert again["page"] == 5 and again["boxes"] is None


def test_a_milvus_index_keeps_layouts_beside_its_file_and_its_spans_get_boxes(tmp_path):
    pytest.importorskip("pymilvus")
    from ragspec.citations import Citer
    from ragspec.retrieval import backends
    from ragspec.retrieval.layouts import layout_dir

    pdf = tmp_path / "bzip2 manual.pdf"
    pdf.write_bytes(manual_bytes())
    store = backends.open_index(f"milvus:{tmp_path}/m.db", HashEmbedder())
    try:
        assert ingest_paths([pdf], store).ok
        folder = layout_dir(store)
        assert folder == tmp_path / ".m.db.ragspec.layouts"
        assert len(list(folder.glob("*.npz"))) == 1  # written by the ingest, by content
        passage = next(p for p in store.passages() if p.page == 3)
        boxes = Citer(store).locate(passage, 0, 40).boxes
        assert boxes
        layer = _PdfiumLayer(pdfium.PdfDocument(pdf.read_bytes())[2].get_textpage())
        assert _letters(layer.under(boxes)) == _letters(passage.text[:40])
    finally:
        store.close()


def test_a_text_window_is_the_whole_lines_within_reach_of_the_passage(tmp_path):
    """text_window against a brute-force oracle, on a real plain-text document (zlib's FAQ):
    the window starts at the first line start at most `context` characters before the passage
    and ends at the last line end at most `context` after it (cut inside a line only where no
    line boundary is in reach), and holds the passage where its offsets say."""
    from types import SimpleNamespace

    from ragspec.retrieval.readers.loaders import load_bytes

    faq = Path("/usr/share/doc/zlib1g-dev/FAQ.gz")
    if not faq.exists():
        pytest.skip(f"{faq} is not installed (`make testdocs`)")
    path = tmp_path / "zlib FAQ.txt"
    path.write_bytes(gzip.decompress(faq.read_bytes()))
    source = Source("id", path, "", path.read_bytes())
    text = load_bytes(source.data, path)[0].page_content
    for start in range(0, len(text) - 200, 97):
        for length, context in ((1, 0), (60, 7), (120, 80), (200, 1500)):
            passage = SimpleNamespace(start=start, text=text[start : start + length])
            window, begin = text_window(source, passage, context)
            stop = start + length
            starts = [i for i in range(max(0, start - context), start + 1)
                      if i == 0 or text[i - 1] == "\n"]
            ends = [j for j in range(stop, min(len(text), stop + context) + 1)
                    if j == len(text) or text[j] == "\n"]
            want = (min(starts, default=max(0, start - context)),
                    max(ends, default=min(len(text), stop + context)))
            assert (begin, begin + len(window)) == want, (start, length, context)
            assert window == text[begin : begin + len(window)]
            assert window[start - begin : stop - begin] == passage.text
