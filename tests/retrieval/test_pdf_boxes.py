"""PDF character boxes on real PDFs nobody here wrote (Debian's manuals under /usr/share/doc):
the boxes of any character range hold exactly those characters per PDFium's own text layer
(the glyphs whose centre they hold),
on plain pages, a rotated page, a two-column page, and across ligatures."""

from __future__ import annotations

import gzip
import io
import random
import re
from pathlib import Path

import numpy as np
import pytest

pdfium = pytest.importorskip("pypdfium2")

from ragspec.retrieval.layouts import load_layout, merged_boxes, save_layouts  # noqa: E402
from ragspec.retrieval.readers.limits import IngestLimits  # noqa: E402
from ragspec.retrieval.readers.loaders import load_bytes  # noqa: E402
from ragspec.retrieval.readers.pdf_text import read_pdf  # noqa: E402

DEBIAN_PDFS = [
    "/usr/share/doc/zlib1g-dev/crc-doc.1.0.pdf.gz",  # ligatures (fi) mapped to two letters
    "/usr/share/doc/bzip2/manual.pdf.gz",
    "/usr/share/doc/libtasn1-doc/libtasn1.pdf",
    "/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf",
]
_NOT_TEXT = re.compile(r"[\s\x00-\x1f\ufffe\ufffd-]")


def _bytes(path: str) -> bytes:
    data = Path(path).read_bytes()
    return gzip.decompress(data) if path.endswith(".gz") else data


def _available() -> list[str]:
    return [p for p in DEBIAN_PDFS if Path(p).exists()]


def _letters(text: str) -> str:
    # PDFium's bounded text keeps its raw markers (U+FFFE hyphens, NULs) and ligature glyphs;
    # compare letters only, with ligatures spelled out as our text spells them.
    import unicodedata
    text = "".join(unicodedata.normalize("NFKC", c) if "\ufb00" <= c <= "\ufb06" else c
                   for c in text)
    return _NOT_TEXT.sub("", text)


class _PdfiumLayer:
    """One page as PDFium's own text layer sees it: each character's text and glyph centre,
    by PDFium's indices (none of our extraction is used)."""

    def __init__(self, textpage) -> None:
        chars, centres = [], []
        for i in range(textpage.count_chars()):
            left, bottom, right, top = textpage.get_charbox(i)
            if right > left:
                chars.append(textpage.get_text_range(i, 1))
                centres.append(((left + right) / 2, (bottom + top) / 2))
        self.chars, self.centres = chars, np.array(centres).reshape(-1, 2)

    def under(self, boxes: list[list[float]]) -> str:
        """The characters whose glyph centre lies in one of `boxes`, in PDFium's order. (Its
        bounded-text call also takes glyphs that merely touch a rectangle, and glyphs of italic
        fonts overlap their neighbours.)"""
        x, y = self.centres[:, 0], self.centres[:, 1]
        hit = np.zeros(len(self.chars), dtype=bool)
        for b in boxes:
            hit |= (x >= b[0]) & (x <= b[2]) & (y >= b[1]) & (y <= b[3])
        return "".join(c for c, h in zip(self.chars, hit, strict=True) if h)


def _text_under(textpage, boxes: list[list[float]]) -> str:
    return _PdfiumLayer(textpage).under(boxes)


def _centred(box, boxes) -> bool:
    if not np.isfinite(box).all():
        return False
    x, y = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return any(b[0] <= x <= b[2] and b[1] <= y <= b[3] for b in boxes)


def _cut_glyph(page, i: int, start: int, end: int) -> bool:
    """Whether character i shares its glyph (a ligature: equal boxes) with a character outside
    [start, end)."""
    return any((page.boxes[j] == page.boxes[i]).all() for j in (start - 1, end)
               if 0 <= j < len(page.boxes) and abs(j - i) <= 2)


def _check_ranges(data: bytes, ranges_per_page: int = 6, seed: int = 0, pages: int = 10) -> int:
    """For random ranges of each page: text under the merged boxes == the range's boxed
    characters. Returns how many ranges were checked."""
    rng = random.Random(seed)
    pdf = pdfium.PdfDocument(data)
    checked = 0
    for page in read_pdf(data, IngestLimits())[:pages]:
        if len(page.text) < 40:
            continue
        layer = _PdfiumLayer(pdf[page.number - 1].get_textpage())
        for _ in range(ranges_per_page):
            start = rng.randrange(0, len(page.text) - 20)
            end = min(len(page.text), start + rng.randrange(10, 400))
            boxes = merged_boxes(page.boxes, start, end)
            under = layer.under(boxes)
            # Exactly the range's own characters whose glyph lies in a box, as PDFium sees the
            # page (a glyph the range cannot claim alone is left out, never another's boxed).
            ours = "".join(page.text[i] for i in range(start, end) if _centred(page.boxes[i], boxes))
            assert _letters(under) == _letters(ours), (page.number, start, end)
            boxed = sum(len(_letters(page.text[i])) for i in range(start, end)
                        if np.isfinite(page.boxes[i]).all()
                        and not _cut_glyph(page, i, start, end))
            assert len(_letters(under)) >= 0.97 * boxed, (page.number, start, end)
            checked += 1
    return checked


def test_every_letter_has_a_box_and_a_range_boxes_exactly_its_letters():
    paths = _available()
    if not paths:
        pytest.skip("no PDF manuals under /usr/share/doc")
    for path in paths:
        data = _bytes(path)
        pages = read_pdf(data, IngestLimits())
        letters = sum(len(_letters(p.text)) for p in pages)
        unboxed = sum(1 for p in pages for c, b in zip(p.text, p.boxes, strict=True)
                      if _letters(c) and not np.isfinite(b).all())
        assert unboxed <= 0.01 * letters, path
        assert _check_ranges(data) > 20, path


def test_ligature_letters_share_the_glyph_box_and_are_found_under_it():
    path = DEBIAN_PDFS[0]
    if not Path(path).exists():
        pytest.skip(f"{path} is not installed")
    pages = read_pdf(_bytes(path), IngestLimits())
    page = pages[0]
    at = page.text.index("Definition")  # "fi" is one glyph in this manual's font
    fi = page.boxes[at + 2 : at + 4]
    assert np.isfinite(fi).all() and (fi[0] == fi[1]).all()
    textpage = pdfium.PdfDocument(_bytes(path))[0].get_textpage()
    (box,) = merged_boxes(page.boxes, at, at + len("Definition"))
    assert _letters(textpage.get_text_bounded(*box)) == "Definition"
    assert _letters(_text_under(textpage, [box])) == "Definition"


def _rotated(data: bytes, rotation: int) -> bytes:
    pdf = pdfium.PdfDocument(data)
    for index in range(min(3, len(pdf))):
        pdf[index].set_rotation(rotation)
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()


@pytest.mark.parametrize("rotation", [90, 270])
def test_a_rotated_page_keeps_its_boxes_in_unrotated_page_space(rotation):
    paths = _available()
    if not paths:
        pytest.skip("no PDF manuals under /usr/share/doc")
    plain = _bytes(paths[0])
    turned = _rotated(plain, rotation)
    before, after = read_pdf(plain, IngestLimits())[0], read_pdf(turned, IngestLimits())[0]
    assert after.rotation == rotation and after.size == before.size
    # PDFium breaks lines as the page is seen (turned), so the texts differ in line ends; a
    # word's glyphs stay where they are in page space.
    word = "Kadatch"
    a, b = before.text.index(word), after.text.index(word)
    np.testing.assert_array_equal(after.boxes[b : b + 7], before.boxes[a : a + 7])
    assert _check_ranges(turned, ranges_per_page=10, seed=rotation, pages=3) == 30


def _two_columns(data: bytes) -> tuple[bytes, float]:
    """Pages 1 and 2 of a real manual side by side on one page: a two-column layout."""
    src = pdfium.PdfDocument(data)
    width, height = src[0].get_size()
    dest = pdfium.PdfDocument.new()
    page = dest.new_page(2 * width, height)
    for column in (0, 1):
        obj = src.page_as_xobject(column, dest).as_pageobject()
        obj.transform(pdfium.PdfMatrix().translate(column * width, 0))
        page.insert_obj(obj)
    page.gen_content()
    out = io.BytesIO()
    dest.save(out)
    return out.getvalue(), width


def test_on_a_two_column_page_no_box_crosses_the_gutter():
    paths = _available()
    if not paths:
        pytest.skip("no PDF manuals under /usr/share/doc")
    data, width = _two_columns(_bytes(paths[1]))
    (page,) = read_pdf(data, IngestLimits())
    left = read_pdf(_bytes(paths[1]), IngestLimits())[0]
    assert page.text.startswith(left.text.rstrip()[:200])  # column 1 read before column 2
    # A range that runs from the bottom of column 1 into the top of column 2.
    start = len(left.text.rstrip()) - 120
    boxes = merged_boxes(page.boxes, start, start + 300)
    assert any(b[2] <= width for b in boxes) and any(b[0] >= width for b in boxes)
    assert all(b[2] <= width + 0.5 or b[0] >= width - 0.5 for b in boxes)
    assert _check_ranges(data, ranges_per_page=60) == 60


def test_layouts_are_kept_with_the_index_by_content_hash(tmp_path):
    paths = _available()
    if not paths:
        pytest.skip("no PDF manuals under /usr/share/doc")
    data = _bytes(paths[0])
    docs = load_bytes(data, "crc.pdf")
    sha = "ab" * 32
    path = save_layouts(tmp_path / "layouts", sha, docs)
    assert path is not None and path.name == f"{sha}.npz"
    layout = load_layout(tmp_path / "layouts", sha)
    doc = docs[1]
    page = doc.metadata["page"]
    assert layout.boxes(page, 10, 60) == merged_boxes(doc.metadata["layout"].boxes, 10, 60)
    assert layout.boxes(page, 0, len(doc.page_content) + 1) is None  # outside: no boxes
    assert load_layout(tmp_path / "layouts", "cd" * 32) is None
    assert save_layouts(tmp_path / "layouts", "cd" * 32, load_bytes(b"plain", "a.txt")) is None


def test_ingest_writes_the_layout_and_a_rerun_adds_it_to_an_older_index(tmp_path):
    import hashlib

    from fakes import HashEmbedder

    from ragspec.retrieval.faiss.store import PassageStore
    from ragspec.retrieval.ingest import ingest_paths
    from ragspec.retrieval.layouts import layout_dir

    paths = _available()
    if not paths:
        pytest.skip("no PDF manuals under /usr/share/doc")
    pdf = tmp_path / "manual.pdf"
    pdf.write_bytes(_bytes(paths[1]))
    sha = hashlib.sha256(pdf.read_bytes()).hexdigest()
    store = PassageStore.open(tmp_path / "index", HashEmbedder())
    assert ingest_paths([pdf], store).added == [str(pdf)]
    layouts = layout_dir(store)
    passage = store.passages()[3]
    boxes = load_layout(layouts, sha).boxes(passage.page, passage.start,
                                           passage.start + len(passage.text))
    assert boxes and all(len(b) == 4 for b in boxes)
    # An index from before layouts: the file is unchanged, the rerun writes its layout only.
    (layouts / f"{sha}.npz").unlink()
    report = ingest_paths([pdf], PassageStore.open(tmp_path / "index", HashEmbedder()))
    assert report.unchanged == [str(pdf)] and (layouts / f"{sha}.npz").exists()


def test_a_page_knows_its_section_from_the_pdf_outline(tmp_path):
    path = "/usr/share/doc/libtasn1-doc/libtasn1.pdf"  # bookmarks: chapters and sections
    if not Path(path).exists():
        pytest.skip(f"{path} is not installed")
    docs = load_bytes(_bytes(path), "libtasn1.pdf")
    sections = {d.metadata["page"]: d.metadata["layout"].section for d in docs}
    assert sections[1] is None  # before the first bookmark
    assert sections[5] == "2 ASN.1 structure handling \u203a ASN.1 syntax"
    save_layouts(tmp_path, "ef" * 32, docs)
    assert load_layout(tmp_path, "ef" * 32).page(5).section == sections[5]
