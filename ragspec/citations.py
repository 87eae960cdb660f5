"""Where each copied span sits in its document: the page, and its characters' boxes on a PDF page.

Contract:
  * `Citer(store)` reads the store's documents once; `citer.locate(passage, start, end)` gives
    the `Location` of characters [start, end) of a passage's text: its page (PDFs; None for other
    types) and, for PDFs, the page size and rotation and the boxes of those characters (see
    ragspec.retrieval.layouts: [x0, y0, x1, y1] in PDF user space, points, origin at the page's
    bottom left, before the page's /Rotate; a box never covers characters outside the range).
    `boxes` is None when the index holds no layout for the document (ingested before layouts
    were kept: running `ragspec ingest` on it again adds them), [] when none of the characters
    has a glyph box of its own.
  * `citer.span_dicts(spans, passages)` is `Span.to_dict()` for each span, with `page`, and for
    PDFs `page_size`, `rotation`, `boxes` and `section` (the PDF outline's titles at that page,
    or None), added to every span copied from a passage (origin
    `source` is the passage's 0-based index in `passages`, `char_start/char_end` its range).
Plain data out; the front ends draw (or print) it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ragspec.describe import PASSAGE, draft_source
from ragspec.retrieval.layouts import DocumentLayout, layout_dir, load_layout

# Layouts kept in memory, shared by every Citer of the process: a layout is named by its
# document's content hash, so a cached one is never stale; a chat or server cites a few
# documents at a time.
_CACHED_LAYOUTS = 16
_layouts: OrderedDict[tuple, DocumentLayout | None] = OrderedDict()
_layouts_lock = threading.Lock()


@dataclass(frozen=True)
class Location:
    page: int | None
    page_size: tuple[float, float] | None = None
    rotation: int = 0
    boxes: list[list[float]] | None = None
    section: str | None = None

    def to_dict(self) -> dict:
        out: dict = {"page": self.page}
        if self.page_size is not None:
            out.update(page_size=list(self.page_size), rotation=self.rotation, boxes=self.boxes,
                       section=self.section)
        elif self.page is not None:
            out["boxes"] = None  # a PDF page whose layout this index does not hold
        return out


class Citer:
    """See the module docstring."""

    def __init__(self, store) -> None:
        self.directory = layout_dir(store)
        self.sha = {d.doc_id: d.sha256 for d in store.documents()}

    def layout(self, doc_id: str) -> DocumentLayout | None:
        sha = self.sha.get(doc_id)
        if sha is None or self.directory is None:
            return None
        key = (str(self.directory), sha)
        with _layouts_lock:
            if key in _layouts:
                _layouts.move_to_end(key)
                return _layouts[key]
        layout = load_layout(self.directory, sha)
        if layout is not None:  # none yet: a later ingest may write it
            with _layouts_lock:
                _layouts[key] = layout
                while len(_layouts) > _CACHED_LAYOUTS:
                    _layouts.popitem(last=False)
        return layout

    def locate(self, passage, start: int, end: int) -> Location:
        if passage.page is None:
            return Location(None)
        layout = self.layout(passage.doc_id)
        page = layout.page(passage.page) if layout is not None else None
        if page is None:
            return Location(passage.page)
        boxes = layout.boxes(passage.page, passage.start + start, passage.start + end)
        return Location(passage.page, page.size, page.rotation, boxes, page.section)

    def span_dicts(self, spans: Sequence, passages: Sequence) -> list[dict]:
        out = []
        for span in spans:
            item = span.to_dict()
            o = span.origin
            if (draft_source(span) == PASSAGE and isinstance(o.source, int)
                    and 0 <= o.source < len(passages) and o.char_start is not None):
                item.update(self.locate(passages[o.source], o.char_start, o.char_end).to_dict())
            out.append(item)
        return out
