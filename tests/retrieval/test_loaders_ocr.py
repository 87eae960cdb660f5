"""OCR of pictures of pages: image files and PDF pages without a text layer, with word boxes,
a switch, a page budget, and pictures too large to decode refused before decoding."""

from __future__ import annotations

import io
import re
import struct
import time
import zlib
from pathlib import Path

import pytest
from test_retrieval_badfiles import _peak_mib

from ragspec.retrieval.errors import LoadError
from ragspec.retrieval.readers import ocr
from ragspec.retrieval.readers.loaders import load_bytes

PDF = Path(__file__).resolve().parents[2] / "data" / "corpus" / "operations-guide.pdf"
needs_tesseract = pytest.mark.skipif(ocr.missing(ocr.OcrSettings()) is not None,
                                     reason="Tesseract (tesseract-ocr, eng) is not installed")


def _page_image(dpi: int = 150):
    """Page 1 of the corpus PDF as a grey picture, and the page's own text layer."""
    import pypdfium2 as pdfium
    from pypdf import PdfReader

    data = PDF.read_bytes()
    image = pdfium.PdfDocument(data)[0].render(scale=dpi / 72, grayscale=True).to_pil()
    return image, PdfReader(io.BytesIO(data)).pages[0].extract_text()


def _as_scan_pdf(images, dpi: int = 150) -> bytes:
    out = io.BytesIO()
    images[0].save(out, "PDF", resolution=dpi, save_all=True, append_images=images[1:])
    return out.getvalue()


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


@pytest.fixture(scope="module")
def page():
    return _page_image()


@needs_tesseract
def test_a_scanned_pdf_page_is_read_with_word_boxes_in_page_points(page, monkeypatch):
    image, truth = page
    heard = []
    token = ocr.on_page.set(lambda done, total, seconds: heard.append((done, total)))
    try:
        docs = load_bytes(_as_scan_pdf([image]), "scan.pdf")
    finally:
        ocr.on_page.reset(token)
    assert heard == [(1, 1)]
    (doc,) = docs
    assert doc.metadata["page"] == 1 and doc.metadata["ocr"] is True
    got, want = _words(doc.page_content), _words(truth)
    shared = sum(1 for w in set(want) if w in got)
    assert shared > 0.9 * len(set(want)), (doc.page_content, truth)
    boxes = doc.metadata["ocr_words"]
    assert [w for w, *_ in boxes] == doc.page_content.split()  # the text's words, in order
    width, height = image.width * 72 / 150, image.height * 72 / 150  # the page in points
    assert all(0 <= x0 < x1 <= width + 1 and 0 <= y0 < y1 <= height + 1
               for _, x0, y0, x1, y1 in boxes)
    # The page's first line sits above its last.
    assert boxes[0][2] < boxes[-1][2]


@needs_tesseract
def test_an_image_file_is_read_and_ocr_can_be_turned_off(page, monkeypatch):
    image, truth = page
    out = io.BytesIO()
    image.save(out, "PNG")
    (doc,) = load_bytes(out.getvalue(), "scan.png")
    assert doc.metadata["page"] == 1 and "larkspur" in _words(doc.page_content)
    monkeypatch.setenv("RAGSPEC_OCR", "0")
    with pytest.raises(LoadError, match="OCR is turned off"):
        load_bytes(out.getvalue(), "scan.png")
    with pytest.raises(LoadError, match="no text layer .*OCR is turned off"):
        load_bytes(_as_scan_pdf([image]), "scan.pdf")


def test_over_the_page_budget_the_file_fails_before_any_page_is_read(page, monkeypatch):
    image, _ = page
    monkeypatch.setenv("RAGSPEC_OCR_MAX_PAGES", "2")
    monkeypatch.setattr(ocr, "missing", lambda settings: None)  # as if Tesseract were here
    monkeypatch.setattr(ocr, "recognise", lambda *a, **k: pytest.fail("recognised a page"))
    with pytest.raises(LoadError, match="3 pages need OCR, over the budget of 2 .*"
                                        "RAGSPEC_OCR_MAX_PAGES"):
        load_bytes(_as_scan_pdf([image] * 3), "long-scan.pdf")
    tiff = io.BytesIO()
    image.save(tiff, "TIFF", save_all=True, append_images=[image, image])
    with pytest.raises(LoadError, match="3 pages need OCR, over the budget of 2"):
        load_bytes(tiff.getvalue(), "long-scan.tiff")


def test_without_tesseract_the_reason_names_what_to_install(page, monkeypatch):
    image, _ = page
    monkeypatch.setattr(ocr.shutil, "which", lambda name: None)
    out = io.BytesIO()
    image.save(out, "PNG")
    with pytest.raises(LoadError, match=r"needs Tesseract.*apt-get install tesseract-ocr"):
        load_bytes(out.getvalue(), "scan.png")
    with pytest.raises(LoadError, match="no text layer .*needs Tesseract"):
        load_bytes(_as_scan_pdf([image]), "scan.pdf")


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height grey pixels and holds a few bytes of them."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 1000)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("side, reason", [
    (30_000, "too large to decode safely"),  # Pillow's own guard, at 179 million pixels
    (10_000, "10,000 x 10,000 pixels, over the limit of 60 million"),  # ours, below Pillow's
])
def test_a_huge_picture_is_refused_before_it_is_decoded(monkeypatch, side, reason):
    monkeypatch.setattr(ocr, "missing", lambda settings: None)
    monkeypatch.setattr(ocr, "recognise", lambda *a, **k: pytest.fail("decoded and recognised"))
    bomb = _png_header_only(side, side)
    start = time.perf_counter()

    def load():
        with pytest.raises(LoadError, match=reason):
            load_bytes(bomb, "huge.png")

    peak = _peak_mib(load)
    assert peak < 8 and time.perf_counter() - start < 5, f"{peak:.0f} MiB"


def test_ingest_no_ocr_turns_it_off_for_that_command_only(page, run, tmp_path):
    image, _ = page
    out = io.BytesIO()
    image.save(out, "PNG")
    (tmp_path / "scan.png").write_bytes(out.getvalue())
    result = run("ingest", "--no-ocr", str(tmp_path / "scan.png"))
    assert result.exit_code == 1 and "OCR is turned off" in result.output, result.output
    assert ocr.OcrSettings.from_env().enabled  # the switch did not outlive the command


def _mixed_pdf(image) -> bytes:
    """Page 1: the corpus PDF's text page; pages 2-4: the scan, a blank page, the scan again."""
    import pypdfium2 as pdfium

    out = pdfium.PdfDocument.new()
    out.import_pages(pdfium.PdfDocument(PDF.read_bytes()), [0])
    out.import_pages(pdfium.PdfDocument(_as_scan_pdf([image])), [0])
    out.new_page(612, 792)
    out.import_pages(pdfium.PdfDocument(_as_scan_pdf([image])), [0])
    buffer = io.BytesIO()
    out.save(buffer)
    return buffer.getvalue()


def test_pictured_pages_are_found_among_pdfiums_page_objects(page):
    from ragspec.retrieval.readers.limits import IngestLimits
    from ragspec.retrieval.readers.pdf_text import read_pdf

    heard = []
    pages = read_pdf(_mixed_pdf(page[0]), IngestLimits(),
                     lambda document, numbers: heard.append((len(document), numbers)))
    assert [p.pictured for p in pages] == [False, True, False, True]  # the blank page is not
    assert heard == [(4, [2, 4])]  # called once, with the document still open


@needs_tesseract
def test_a_pdf_with_scanned_pages_is_parsed_once(page, monkeypatch):
    import pypdf
    import pypdfium2 as pdfium

    data = _mixed_pdf(page[0])
    opened = []
    real = pdfium.PdfDocument

    class Counting(real):
        def __init__(self, *args, **kwargs):
            opened.append(args[0] if args else None)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(pdfium, "PdfDocument", Counting)
    monkeypatch.setattr(pypdf, "PdfReader", lambda *a, **k: pytest.fail("parsed by pypdf"))
    docs = load_bytes(data, "mixed.pdf")
    assert len(opened) == 1
    assert [(d.metadata["page"], bool(d.metadata.get("ocr"))) for d in docs] == \
        [(1, False), (2, True), (4, True)]
    assert "larkspur" in _words(docs[1].page_content)


@needs_tesseract
def test_the_ingest_report_names_the_pages_read_by_ocr(page, run, tmp_path):
    import json

    (tmp_path / "mixed.pdf").write_bytes(_mixed_pdf(page[0]))
    result = run("ingest", str(tmp_path / "mixed.pdf"))
    assert result.exit_code == 0, result.output
    assert f"{tmp_path / 'mixed.pdf'}: OCR on pages 2, 4\n" in result.output, result.output
    (tmp_path / "more.pdf").write_bytes(_as_scan_pdf([page[0]] * 3))
    result = run("ingest", "--json", str(tmp_path / "more.pdf"))
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{"):])
    assert report["ocr_pages"] == [{"path": str(tmp_path / "more.pdf"), "pages": [1, 2, 3]}]


def test_page_ranges_are_written_short():
    from ragspec.retrieval.ingest import page_ranges

    assert page_ranges([4]) == "page 4"
    assert page_ranges([1, 2, 3, 7]) == "pages 1-3, 7"
    assert page_ranges([1, 3, 4, 9, 10, 11]) == "pages 1, 3-4, 9-11"
