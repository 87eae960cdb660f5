"""A cited document, opened where the answer copied from it: PDF pages rendered with the copied
characters' boxes, other documents as their text around the passage.

Contract:
  * `open_source(store, doc_id)` finds the document by its id in this store only (never by a
    path: a path or an id from another index finds nothing) and returns a `Source` when the
    file is still there with the content that was ingested (same sha256), else raises
    SourceError saying why (removed, changed since: ingest it again).
  * `render_page(source, page, scale)` renders one PDF page with PDFium (pypdfium2) as PNG
    bytes, with the affine map from PDF user space to the image's fractions (0..1, origin top
    left) that PDFium's own display matrix gives (the page's /Rotate included). Rendered pages
    are kept in memory (`PAGE_CACHE` pages, by content hash, page and scale); PDFium loads a
    page by its number, so page 1,500 of a long PDF costs what page 1 does.
  * `image_rects(rendered, boxes)`: boxes ([x0, y0, x1, y1], PDF user space) as [left, top,
    width, height] fractions of the image.
  * `text_window(source, passage, context)`: for a non-PDF document, the loaded text around a
    passage, whole lines of up to `context` characters either side: (text, start of the
    window in the document's text).
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SCALE = 1.5  # 108 dpi: a US-letter page is 918 x 1188 pixels
PAGE_CACHE = 64


class SourceError(Exception):
    """A cited document that cannot be shown: the sentence says why and what to do."""


@dataclass(frozen=True)
class Source:
    doc_id: str
    path: Path
    sha256: str
    data: bytes

    @property
    def is_pdf(self) -> bool:
        return self.path.suffix.lower() == ".pdf"

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class RenderedPage:
    png: bytes
    width: int
    height: int
    pages: int  # pages in the document
    # image fraction = (a*x + c*y + e, b*x + d*y + f) for PDF user-space (x, y)
    matrix: tuple[float, float, float, float, float, float]


def open_source(store, doc_id: str) -> Source:
    info = next((d for d in store.documents() if d.doc_id == doc_id), None)
    if info is None:
        raise SourceError("this document is not in the index")
    path = Path(info.source)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SourceError(f"{path.name} cannot be read any more ({exc.strerror or exc}); "
                          "it was moved or removed after it was ingested") from exc
    if hashlib.sha256(data).hexdigest() != info.sha256:
        raise SourceError(f"{path.name} has changed since it was ingested; ingest it again "
                          "to see it where the answer cited it")
    return Source(doc_id, path, info.sha256, data)


_cache: OrderedDict[tuple, RenderedPage] = OrderedDict()
_cache_lock = threading.Lock()


def render_page(source: Source, page: int, scale: float = DEFAULT_SCALE) -> RenderedPage:
    key = (source.sha256, page, scale)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    rendered = _render(source.data, page, scale)
    with _cache_lock:
        _cache[key] = rendered
        while len(_cache) > PAGE_CACHE:
            _cache.popitem(last=False)
    return rendered


def _render(data: bytes, page: int, scale: float) -> RenderedPage:
    import io

    import pypdfium2 as pdfium
    import pypdfium2.raw as raw

    pdf = pdfium.PdfDocument(data)
    try:
        if not 1 <= page <= len(pdf):
            raise SourceError(f"the document has {len(pdf)} pages; there is no page {page}")
        handle = pdf[page - 1]
        try:
            image = handle.render(scale=scale).to_pil()
            width, height = image.size
            matrix = _display_matrix(raw, handle.raw, width, height)
        finally:
            handle.close()
        out = io.BytesIO()
        image.save(out, format="PNG", compress_level=1)  # speed over size: it is sent once
        return RenderedPage(out.getvalue(), width, height, len(pdf), matrix)
    finally:
        pdf.close()


def _display_matrix(raw, page, width: int, height: int):
    """The affine map PDFium renders with, read off three points of FPDF_PageToDevice."""
    x, y = ctypes.c_int(), ctypes.c_int()

    def device(px: float, py: float) -> tuple[float, float]:
        raw.FPDF_PageToDevice(page, 0, 0, width, height, 0, px, py, x, y)
        return x.value / width, y.value / height

    # Far-apart points so the rounding to whole pixels is negligible.
    origin, right, up = device(0, 0), device(1000, 0), device(0, 1000)
    a, b = (right[0] - origin[0]) / 1000, (right[1] - origin[1]) / 1000
    c, d = (up[0] - origin[0]) / 1000, (up[1] - origin[1]) / 1000
    return (a, b, c, d, origin[0], origin[1])


def image_rects(rendered: RenderedPage, boxes) -> list[list[float]]:
    a, b, c, d, e, f = rendered.matrix
    rects = []
    for x0, y0, x1, y1 in boxes or ():
        xs, ys = [], []
        for px, py in ((x0, y0), (x1, y0), (x0, y1), (x1, y1)):
            xs.append(a * px + c * py + e)
            ys.append(b * px + d * py + f)
        rects.append([min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)])
    return rects


def text_window(source: Source, passage, context: int = 1500) -> tuple[str, int]:
    from ragspec.retrieval.readers.loaders import load_bytes

    docs = load_bytes(source.data, source.path)
    text = docs[0].page_content
    if text[passage.start : passage.start + len(passage.text)] != passage.text:
        raise SourceError(f"{source.name} reads differently now than when it was ingested; "
                          "ingest it again")
    stop = passage.start + len(passage.text)
    begin, end = max(0, passage.start - context), min(len(text), stop + context)
    # Whole lines: a window cut inside a line opens on a fragment of it ("png)").
    if begin > 0 and (cut := text.find("\n", begin - 1, passage.start)) != -1:
        begin = cut + 1
    if end < len(text) and (cut := text.rfind("\n", stop, end + 1)) != -1:
        end = cut
    return text[begin:end], begin
