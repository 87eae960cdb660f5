"""The source view: a cited document opened beside the answer, where the answer copied from it.

Contract: the address names what is open, `?chat=ID&src=M-P` (message M of the chat, its
passage P, both 0-based) and optionally `&page=N` and `&zoom=200%25`, so a highlighted span or
a passage in the list is a plain link (`href`), and reloading keeps the view. The column that
holds the view stays in sight (sticky) while the chat beside it scrolls. `show(store, chat_id,
record, M, P, page)`:
  * finds the document by the passage's doc_id in the page's own store (the signed-in user's
    collection) and nowhere else: a chat only holds its user's answers, and an id from another
    index, or a path, finds nothing (ragspec.source_pages.open_source);
  * a PDF: the page rendered by PDFium as wide as the panel, or `ZOOMS` percent of it in a
    scrolled pane that opens at the clicked passage (`focus`: its first copied box, or, when
    the answer copied nothing of it, the passage's own region less stray specks such as a
    page number); the characters the answer
    copied from any passage of that page boxed (class rs-copied; `data-box` holds the
    PDF-space box), the rest of the clicked passage shaded (rs-shade), both translucent and
    blended so the letters under them stay dark; says so where boxes are not known or not
    found; the header names the file and "page N of M", with previous/next links (keeping the
    zoom) and a download button;
  * any other document: its text around the passage (whole lines, spaces kept), passage
    shaded and copied characters marked, all escaped (ragspec.web.page_html.escape_text):
    nothing of a document becomes markup; the text opens scrolled to the passage as the PDF
    pane does.
"""

from __future__ import annotations

import base64
from urllib.parse import quote

import streamlit as st

from ragspec.citations import Citer
from ragspec.describe import copied_ranges, merge_ranges
from ragspec.highlights import shown_spans
from ragspec.source_pages import (
    DEFAULT_SCALE,
    SourceError,
    image_rects,
    open_source,
    render_page,
    text_window,
)
from ragspec.web import page_html as rd

ZOOMS = (100, 150, 200, 300)  # percent of the panel's width; 100 = the page fits the panel

# The source column stays in view (sticky) beside a chat of any length: Streamlit opens a chat
# scrolled to its end, where the top of a plain column would be out of sight. The marks keep
# the copied words legible: a translucent fill blended by `multiply` leaves dark glyphs dark
# (a border or an opaque fill drawn over small print strikes it through), and the copied
# characters get an underline drawn below their box, not over them. A text keeps its spaces
# (pre-wrap): the indented answers and code of a plain-text document stay indented. A link of
# the header wraps as a whole (in a narrow panel "next page" left its arrow on a line alone).
STYLE = """<style>
div[data-testid="stColumn"]:has(.rs-source-view) {
  position: sticky; top: 3.75rem; align-self: flex-start;
  max-height: calc(100vh - 11.5rem); overflow-y: auto; }
.rs-source-head a { white-space: nowrap; }
.rs-scroll { overflow: auto; max-height: calc(100vh - 22rem); border: 1px solid #ccc; }
.rs-page { position: relative; isolation: isolate; }
.rs-page img { width: 100%; display: block; }
.rs-box { position: absolute; box-sizing: border-box; pointer-events: none;
  mix-blend-mode: multiply; }
.rs-box.rs-copied { background: rgba(255, 200, 40, 0.5); box-shadow: 0 2px 0 #d9480f; }
.rs-box.rs-shade { background: rgba(70, 130, 230, 0.16); }
.rs-page .rs-focus { position: absolute; visibility: hidden; pointer-events: none; }
.rs-source-text { font-size: 0.9em; line-height: 1.55; max-height: calc(100vh - 22rem);
  overflow-y: auto; white-space: pre-wrap; overflow-wrap: anywhere; border: 1px solid #ccc;
  padding: 0 0.5rem; }
.rs-source-text .rs-shade { background: #dfe9fb; }
</style><span class="rs-source-view"></span>"""

# Scrolls the pane (a zoomed page, or the text around a passage) to the element marked
# rs-focus: centred when it fits in the pane, else its start at the pane's top left, so the
# reader never has to hunt for the passage. `data-view` names what is open (message, passage,
# page, zoom): the script waits for that view's mark (the markup it belongs to can reach the
# browser after it, and an earlier view's mark may still be there), and Streamlit runs it
# again whenever the name changes (the same text would not run again).
FOCUS = """<script>
(() => {  // a scope of its own: Streamlit runs this again in the same page
const view = "%s";
const shift = (start, size, paneStart, paneSize) => size <= 0.9 * paneSize
  ? start + size / 2 - (paneStart + paneSize / 2) : start - paneStart - 0.05 * paneSize;
const find = (tries) => {
  const focus = document.querySelector(`.rs-focus[data-view="${view}"]`);
  const pane = focus && focus.closest(".rs-scroll, .rs-source-text");
  if (!pane) {
    if (tries > 0) setTimeout(() => find(tries - 1), 100);
    return;
  }
  const go = () => {
    const p = pane.getBoundingClientRect(), b = focus.getBoundingClientRect();
    pane.scrollLeft += shift(b.left, b.width, p.left + pane.clientLeft, pane.clientWidth);
    pane.scrollTop += shift(b.top, b.height, p.top + pane.clientTop, pane.clientHeight);
  };
  const img = pane.querySelector("img");  // positions are known once the picture has its size
  img ? img.decode().then(go, go) : requestAnimationFrame(go);
};
find(100);
})();
</script>"""


def href(chat_id: str, message: int, passage: int, page: int | None = None,
         zoom: int | None = None) -> str:
    out = f"?chat={quote(chat_id, safe='')}&src={message}-{passage}"
    out += f"&page={page}" if page is not None else ""
    return out + (f"&zoom={quote(zoom_label(zoom))}" if zoom not in (None, ZOOMS[0]) else "")


def zoom_label(zoom: int) -> str:
    """The zoom as the control shows it and the address holds it (`&zoom=200%25`)."""
    return "Fit width" if zoom == ZOOMS[0] else f"{zoom}%"


def requested() -> tuple[int, int, int | None] | None:
    """(message, passage, page) named in the address, or None."""
    src = st.query_params.get("src")
    if not src:
        return None
    try:
        message, passage = (int(x) for x in src.split("-", 1))
        page = st.query_params.get("page")
        return message, passage, int(page) if page else None
    except ValueError:
        return None


def show(store, chat_id: str, record: dict | None, message: int, passage: int,
         page: int | None) -> None:
    st.markdown(STYLE, unsafe_allow_html=True)
    passages = record["passages"] if record else []
    if not 0 <= passage < len(passages):
        st.warning("That source is not part of this chat.")
        return
    cited = passages[passage]
    try:
        source = open_source(store, cited.doc_id)
    except SourceError as exc:
        st.warning(rd.escape_text(str(exc), inline=True))
        return
    # the copies as the answer marks them (ragspec.highlights): merged, the too-short ones not
    spans = shown_spans(record["runs"][-1]["spans"]) if record["runs"] else []
    if source.is_pdf and cited.page is not None:
        _show_pdf(store, source, chat_id, message, passage, passages, spans, page or cited.page)
    else:
        _show_text(source, cited, copied_ranges(spans).get(passage, []), f"{message}-{passage}")
    st.download_button(f"Download {source.name}", data=source.data, file_name=source.name,
                       key=f"download-{message}-{passage}")


def _show_pdf(store, source, chat_id, message, passage, passages, spans, page) -> None:
    head = st.empty()  # the header above the zoom, written once the page count is known
    zoom = _zoom()
    try:
        # More pixels when zoomed (up to twice the default), so the print stays sharp.
        rendered = render_page(source, page, DEFAULT_SCALE * min(zoom, 200) / 100)
    except SourceError as exc:
        st.warning(rd.escape_text(str(exc), inline=True))
        return
    links = []
    if page > 1:
        links.append(f'<a href="{href(chat_id, message, passage, page - 1, zoom)}" '
                     f'target="_self">&#8592; previous page</a>')
    if page < rendered.pages:
        links.append(f'<a href="{href(chat_id, message, passage, page + 1, zoom)}" '
                     f'target="_self">next page &#8594;</a>')
    citer = Citer(store)
    layout = citer.layout(source.doc_id)
    section = layout.page(page).section if layout and layout.page(page) else None
    named = f" · {rd.escape_text(section)}" if section else ""
    head.markdown(f'<div class="rs-source-head"><b>{rd.escape_text(source.name)}</b> · page '
                  f'{page} of {rendered.pages}{named} &nbsp; {" · ".join(links)}</div>',
                  unsafe_allow_html=True)
    copied, mine, shaded, unknown = [], [], [], False
    for i, ranges in copied_ranges(spans).items():
        p = passages[i] if 0 <= i < len(passages) else None
        if p is None or p.doc_id != source.doc_id or p.page != page:
            continue
        for start, end in ranges:
            boxes = citer.locate(p, start, end).boxes
            unknown |= boxes is None
            copied += boxes or []
            if i == passage:
                mine += boxes or []
    cited = passages[passage]
    if cited.page == page:
        own = copied_ranges(spans).get(passage, [])
        for start, end in _gaps(own, len(cited.text)):
            shaded += citer.locate(cited, start, end).boxes or []
    # Where the pane opens: the clicked passage's first copy; when the answer copied nothing of
    # it, the passage itself; on another page of the document, the first copy there.
    focus = mine[:1] or shaded or copied[:1]
    boxes = ([("rs-copied", b) for b in copied] + [("rs-shade", b) for b in shaded])
    rects = image_rects(rendered, [b for _, b in boxes])
    image = base64.b64encode(rendered.png).decode("ascii")
    overlay = "".join(
        f'<div class="rs-box {kind}" data-box="{",".join(f"{v:.2f}" for v in box)}" '
        f'style="{_placed(r)}"></div>' for (kind, box), r in zip(boxes, rects, strict=True))
    view = f"{message}-{passage} page {page} zoom {zoom}"
    if focus:
        where = _union(_without_specks(image_rects(rendered, focus)))
        overlay += f'<div class="rs-focus" data-view="{view}" style="{_placed(where)}"></div>'
    st.markdown(f'<div class="rs-scroll"><div class="rs-page" data-page="{page}" '
                f'data-zoom="{zoom}" style="width:{zoom}%"><img alt="page {page}" '
                f'src="data:image/png;base64,{image}">{overlay}</div></div>',
                unsafe_allow_html=True)
    if focus:
        st.html(FOCUS % view, unsafe_allow_javascript=True)
    if unknown:
        st.caption("This index holds no character positions for this document (it was "
                   "ingested before they were kept): run `ragspec ingest` on it again to see "
                   "the copied words boxed.")
    elif cited.page == page and copied_ranges(spans).get(passage) and not copied:
        st.caption("The copied characters could not be placed on this page: shown without "
                   "boxes.")


def _zoom() -> int:
    """The zoom chosen, kept in the address (`&zoom=`) so that paging (a link) and reloading
    keep it. Not Streamlit's `bind="query-params"`: a bound parameter makes the page's own
    `st.query_params.clear()` (New chat) fail."""
    asked = st.query_params.get("zoom", "")
    start = next((z for z in ZOOMS if zoom_label(z) == asked), ZOOMS[0])
    zoom = st.radio("Zoom", ZOOMS, index=ZOOMS.index(start), key="rs-zoom", horizontal=True,
                    format_func=zoom_label, label_visibility="collapsed")
    if zoom != start:
        if zoom == ZOOMS[0]:
            del st.query_params["zoom"]
        else:
            st.query_params["zoom"] = zoom_label(zoom)
    return zoom


def _placed(rect) -> str:
    """[left, top, width, height] fractions of the page as the style of a box over it."""
    left, top, width, height = (v * 100 for v in rect)
    return f"left:{left:.3f}%;top:{top:.3f}%;width:{width:.3f}%;height:{height:.3f}%"


def _union(rects) -> list[float]:
    """The smallest [left, top, width, height] that holds every rect."""
    left, top = min(r[0] for r in rects), min(r[1] for r in rects)
    right, bottom = max(r[0] + r[2] for r in rects), max(r[1] + r[3] for r in rects)
    return [left, top, right - left, bottom - top]


def _without_specks(rects) -> list[list[float]]:
    """A passage's rects less the specks far smaller than its largest: a page number or a rule
    of dots that a passage takes in at its end would stretch the region across the page (the
    bzip2 manual's page 5: the "2" at its foot)."""
    largest = max(r[2] * r[3] for r in rects)
    return [r for r in rects if r[2] * r[3] >= 0.05 * largest]


def _gaps(ranges, length: int) -> list[tuple[int, int]]:
    out, pos = [], 0
    for start, end in merge_ranges(list(ranges)):
        if start > pos:
            out.append((pos, start))
        pos = max(pos, end)
    if pos < length:
        out.append((pos, length))
    return out


def _show_text(source, cited, copied, view: str) -> None:
    try:
        text, begin = text_window(source, cited)
    except (SourceError, ValueError) as exc:
        st.warning(rd.escape_text(str(exc), inline=True))
        return
    st.markdown(f"<div><b>{rd.escape_text(source.name)}</b></div>", unsafe_allow_html=True)
    start = cited.start - begin
    end = start + len(cited.text)
    marks = sorted((start + s, start + e) for s, e in copied)
    before, inside, after = [], [], []
    cuts = sorted({0, start, end, len(text), *[m for r in marks for m in r]})
    for a, b in zip(cuts, cuts[1:], strict=False):
        piece = rd.escape_text(text[a:b])
        if any(s <= a and b <= e for s, e in marks):
            # the text opens at the first copy (FOCUS), as a PDF's pane does
            kind = f'rs-draft rs-focus" data-view="{view}' if a == marks[0][0] else "rs-draft"
            piece = f'<mark class="{kind}" style="background:{rd.DRAFT_COLOUR}">{piece}</mark>'
        if start <= a and b <= end:
            piece = f'<span class="rs-shade">{piece}</span>'
        (before if b <= start else after if a >= end else inside).append(piece)
    # nothing copied: it opens at the passage itself
    kind = "rs-cited" if marks else f'rs-cited rs-focus" data-view="{view}'
    st.markdown(f'<div class="rs-source-text" id="rs-source">{"".join(before)}'
                f'<span class="{kind}">{"".join(inside)}</span>{"".join(after)}</div>',
                unsafe_allow_html=True)
    st.html(FOCUS % view, unsafe_allow_javascript=True)
