"""PowerPoint (.pptx) slides as pages: the text on each slide, its tables and its speaker notes.

Contract: `pptx_pages(data, limits)` returns `(slide number, text)` for every slide, 1-based in
the order the presentation shows them; the text is the title first, then every other shape's
text in the slide's drawing order (grouped shapes included), each table as one line per row with
cells joined by " | ", then the speaker notes after a line "Notes:". Slides without text are
left out but keep their numbers, so a passage's page is the slide a reader goes to.

Bounds: python-pptx reads the whole package into memory, so every part's declared size is
checked before it opens it (archive.check_parts: the ratio, per-part and total limits; zipfile
never inflates past a declared size) and the text stops at `limits.max_chars`. python-pptx
parses XML without resolving entities, so an entity bomb stays unexpanded.
"""

from __future__ import annotations

import io

from ragspec.retrieval.errors import LoadError, type_name
from ragspec.retrieval.readers.archive import check_parts, open_archive
from ragspec.retrieval.readers.limits import IngestLimits, TextBuffer

_WHAT = ".pptx file (PowerPoint 2007 or later)"


def pptx_pages(data: bytes, limits: IngestLimits) -> list[tuple[int, str]]:
    from pptx import Presentation

    with open_archive(data, limits, what=_WHAT) as archive:
        check_parts(archive, limits)
    buffer = TextBuffer(limits.max_chars)
    pages = []
    try:
        deck = Presentation(io.BytesIO(data))
        for number, slide in enumerate(deck.slides, start=1):
            lines = _slide_lines(slide)
            if slide.has_notes_slide:
                notes = slide.notes_slide.notes_text_frame
                if notes is not None and notes.text.strip():
                    lines += ["Notes:", notes.text.strip()]
            text = "\n".join(line for line in lines if line.strip())
            buffer.add(text)
            pages.append((number, text))
    except LoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - python-pptx raises many types on broken files
        raise LoadError(f"not a readable {_WHAT}: {type_name(exc)}: {exc}") from exc
    return pages


def _slide_lines(slide) -> list[str]:
    title = slide.shapes.title
    lines = [title.text_frame.text] if title is not None and title.has_text_frame else []
    for shape in _shapes(slide.shapes):
        if title is not None and shape.shape_id == title.shape_id:
            continue
        if shape.has_text_frame:
            lines.append(shape.text_frame.text)
        elif getattr(shape, "has_table", False) and shape.has_table:
            for row in shape.table.rows:
                cells = [" ".join(cell.text.split()) for cell in row.cells]
                lines.append(" | ".join(cells))
    return lines


def _shapes(shapes):
    """Every shape, the members of groups in their place (groups nest)."""
    for shape in shapes:
        members = getattr(shape, "shapes", None)  # only group shapes have members
        if members is not None:
            yield from _shapes(members)
        else:
            yield shape
