"""Where a passage's characters sit on their PDF page: layout files kept with the index.

Contract:
  * `save_layouts(directory, sha256, docs)` writes `directory/<sha256>.npz` for a document whose
    loaded pages carry a `layout` (PDFs, see pdf_text.py): per page its number, size, rotation
    and one box per character of the page's text, and the outline's section at that page. The file is named by the document's content
    hash, so it never changes once written (written atomically; an existing one is kept) and
    every index commit that holds that content finds it. Non-PDF documents write nothing.
  * `load_layout(directory, sha256)` reads it back without unpickling (None when there is none:
    an index ingested before layouts existed, a non-PDF, another backend).
  * `DocumentLayout.boxes(page, start, end)` gives the boxes of characters [start, end) of that
    page's text as [x0, y0, x1, y1] in PDF user space: runs of neighbouring glyphs merged into
    one rectangle only where that rectangle holds the centre of no glyph outside the range, so a
    box never covers other words; characters without a glyph (spaces, line ends) have none, nor
    do the letters of a ligature glyph the range cuts in two, nor a glyph whose box holds the
    centre of another glyph outside the range (glyphs drawn over each other).
  * `layout_dir(store)`: the folder of a store's layouts: `<index>/layouts` for a FAISS
    folder; for Milvus, beside the keyword files this machine keeps for the index
    (milvus_location.keywords_folder: `.<file>.<collection>.layouts` next to a Milvus Lite file,
    `<data dir>/milvus-keywords/<server-collection>.layouts` for a server); None for a store
    with neither.
An index ingested before layouts existed keeps working without boxes; running `ragspec ingest` on
the same files again writes the missing layouts (it re-reads the PDFs, embeds nothing).
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ragspec.fileio import write_atomically

LAYOUT_DIR = "layouts"
LAYOUT_VERSION = 1
_SHA = re.compile(r"^[0-9a-f]{64}$")
# Two glyphs are on one line when they overlap by this share of the smaller one's height (or,
# for vertical text, width).
_LINE_OVERLAP = 0.5


def layout_dir(store) -> Path | None:
    index_dir = getattr(store, "index_dir", None)
    if isinstance(index_dir, Path):
        return index_dir / LAYOUT_DIR
    keywords = getattr(getattr(store, "location", None), "keywords_folder", None)
    if keywords is None:
        return None
    folder = keywords()
    return folder.with_name(f"{folder.name.removesuffix('.keywords')}.{LAYOUT_DIR}")


def layout_path(directory: Path, sha256: str) -> Path:
    if not _SHA.match(sha256):
        raise ValueError(f"a layout is named by a sha256 (64 hex digits), got {sha256!r}")
    return directory / f"{sha256}.npz"


def missing_layout(directory: Path | None, sha256: str, path: Path) -> bool:
    """Whether a PDF stored in this index has no layout file yet (ingested before they
    existed): running `ragspec ingest` on it again writes one, without embedding anything."""
    return (directory is not None and path.suffix.lower() == ".pdf"
            and not layout_path(directory, sha256).exists())


def save_layouts(directory: Path | None, sha256: str, docs) -> Path | None:
    """Write the layout of a loaded PDF (see the module docstring); None when nothing to do."""
    pages = [doc.metadata["layout"] for doc in docs if doc.metadata.get("layout") is not None]
    if directory is None or not pages:
        return None
    path = layout_path(directory, sha256)
    if path.exists():
        return path
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    offsets = np.cumsum([0] + [len(p.text) for p in pages]).astype(np.int64)
    out = io.BytesIO()
    np.savez_compressed(
        out,
        version=np.array([LAYOUT_VERSION], dtype=np.int32),
        pages=np.array([p.number for p in pages], dtype=np.int32),
        sizes=np.array([p.size for p in pages], dtype=np.float32).reshape(len(pages), 2),
        rotations=np.array([p.rotation for p in pages], dtype=np.int32),
        sections=np.array([p.section or "" for p in pages], dtype=str),
        offsets=offsets,
        boxes=np.concatenate([p.boxes for p in pages]).astype(np.float32).reshape(-1, 4),
    )
    try:
        write_atomically(path, out.getvalue())
    except OSError:
        if created:  # leave the index folder as it was (fileio removed the partial file)
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise
    return path


@dataclass(frozen=True)
class PageLayout:
    number: int
    size: tuple[float, float]
    rotation: int
    boxes: np.ndarray  # (characters, 4), NaN rows for characters without a glyph
    section: str | None = None  # the outline's titles at this page


class DocumentLayout:
    """The pages of one stored PDF, as read from its layout file."""

    def __init__(self, pages: dict[int, PageLayout]) -> None:
        self.pages = pages

    def page(self, number: int) -> PageLayout | None:
        return self.pages.get(number)

    def boxes(self, page: int, start: int, end: int) -> list[list[float]] | None:
        """Merged boxes of characters [start, end) of `page`'s text; None when the page has no
        layout or the range is not inside its text (the index and the layout disagree)."""
        layout = self.pages.get(page)
        if layout is None or not 0 <= start <= end <= len(layout.boxes):
            return None
        return merged_boxes(layout.boxes, start, end)


def load_layout(directory: Path | None, sha256: str) -> DocumentLayout | None:
    if directory is None:
        return None
    path = layout_path(directory, sha256)
    try:
        with np.load(path, allow_pickle=False) as npz:
            if int(npz["version"][0]) != LAYOUT_VERSION:
                return None
            numbers, sizes, rotations = npz["pages"], npz["sizes"], npz["rotations"]
            offsets, boxes = npz["offsets"], npz["boxes"]
            sections = npz["sections"].tolist() if "sections" in npz else [""] * len(numbers)
    except (OSError, KeyError, ValueError):
        return None  # none written (or unreadable): the page is shown without boxes
    pages = {}
    for i, number in enumerate(numbers.tolist()):
        pages[number] = PageLayout(number, (float(sizes[i][0]), float(sizes[i][1])),
                                   int(rotations[i]), boxes[offsets[i]:offsets[i + 1]],
                                   sections[i] or None)
    return DocumentLayout(pages)


def merged_boxes(boxes: np.ndarray, start: int, end: int) -> list[list[float]]:
    """See `DocumentLayout.boxes`: `boxes` is one page's (characters, 4) array."""
    finite = np.isfinite(boxes).all(axis=1)
    centres = np.where(finite[:, None], (boxes[:, :2] + boxes[:, 2:]) / 2, np.nan)
    outside = np.ones(len(boxes), dtype=bool)
    outside[start:end] = False
    outside &= finite
    foreign = centres[outside]
    first, last = _whole_glyphs(boxes, finite, start, end)
    runs: list[np.ndarray] = []
    for i in range(first, last):
        if not finite[i]:
            continue
        box = boxes[i].astype(np.float64)
        if _holds_any(box, foreign):
            continue  # glyphs drawn over each other (figure labels): which is which is unknown
        if runs and _same_line(runs[-1], box):
            union = np.concatenate([np.minimum(runs[-1][:2], box[:2]),
                                    np.maximum(runs[-1][2:], box[2:])])
            if not _holds_any(union, foreign):
                runs[-1] = union
                continue
        runs.append(box)
    return [[round(float(v), 2) for v in run] for run in runs]


def _whole_glyphs(boxes: np.ndarray, finite: np.ndarray, start: int, end: int
                  ) -> tuple[int, int]:
    """[start, end) less the letters of a ligature cut by the range ("i" of "fi" where "f" is
    outside): they share the glyph's box, and half a glyph cannot be boxed."""
    def same(a: int, b: int) -> bool:
        return bool(finite[a] and finite[b] and (boxes[a] == boxes[b]).all())
    first, last = start, end
    while 0 < first < last and same(first - 1, first) and same(start - 1, first):
        first += 1
    while first < last < len(boxes) and same(last, last - 1) and same(end, last - 1):
        last -= 1
    return first, last


def _same_line(run: np.ndarray, box: np.ndarray) -> bool:
    def overlap(lo: int, hi: int) -> bool:
        shared = min(run[hi], box[hi]) - max(run[lo], box[lo])
        return shared >= _LINE_OVERLAP * min(run[hi] - run[lo], box[hi] - box[lo])
    return overlap(1, 3) or overlap(0, 2)


def _holds_any(rect: np.ndarray, points: np.ndarray) -> bool:
    if not len(points):
        return False
    inside = ((points[:, 0] >= rect[0]) & (points[:, 0] <= rect[2])
              & (points[:, 1] >= rect[1]) & (points[:, 1] <= rect[3]))
    return bool(inside.any())
