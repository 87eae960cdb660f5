"""Slides, sheets, e-books and OpenDocument files for the loader tests, written by the formats'
own libraries (python-pptx, openpyxl, ebooklib, odfpy), and hostile versions of them."""

from __future__ import annotations

import io
import zipfile


def pptx_bytes(slides) -> bytes:
    """`slides`: a list of dicts with "title", "body" (list of lines), optional "table" (list of
    rows) and "notes"; a dict {} is an empty slide."""
    from pptx import Presentation
    from pptx.util import Inches

    deck = Presentation()
    for spec in slides:
        slide = deck.slides.add_slide(deck.slide_layouts[1 if spec else 6])
        if not spec:
            continue
        slide.shapes.title.text = spec["title"]
        body = slide.placeholders[1].text_frame
        body.text = "\n".join(spec.get("body", []))
        if "table" in spec:
            rows = spec["table"]
            shape = slide.shapes.add_table(len(rows), len(rows[0]), Inches(1), Inches(4),
                                           Inches(6), Inches(1.5))
            for r, row in enumerate(rows):
                for c, value in enumerate(row):
                    shape.table.cell(r, c).text = value
        if "notes" in spec:
            slide.notes_slide.notes_text_frame.text = spec["notes"]
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def xlsx_bytes(sheets: dict[str, list[list]]) -> bytes:
    from openpyxl import Workbook

    book = Workbook()
    book.remove(book.active)
    for title, rows in sheets.items():
        sheet = book.create_sheet(title)
        for row in rows:
            sheet.append(row)
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def epub_bytes(chapters: list[tuple[str, str]]) -> bytes:
    """(title, XHTML body) per chapter."""
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("test-book")
    book.set_title("A test book")
    book.set_language("en")
    items = []
    for n, (title, body) in enumerate(chapters, start=1):
        item = epub.EpubHtml(title=title, file_name=f"chap_{n}.xhtml", lang="en")
        item.content = f"<html><body><h1>{title}</h1>{body}</body></html>"
        book.add_item(item)
        items.append(item)
    book.toc = items
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *items]
    out = io.BytesIO()
    epub.write_epub(out, book)
    return out.getvalue()


def odt_bytes(heading: str, paragraphs: list[str]) -> bytes:
    from odf.opendocument import OpenDocumentText
    from odf.text import H, P

    doc = OpenDocumentText()
    doc.text.addElement(H(outlinelevel=1, text=heading))
    for p in paragraphs:
        doc.text.addElement(P(text=p))
    out = io.BytesIO()
    doc.write(out)
    return out.getvalue()


def odp_bytes(slides: list[list[str]]) -> bytes:
    """One list of paragraphs per slide."""
    from odf.draw import Frame, Page, TextBox
    from odf.opendocument import OpenDocumentPresentation
    from odf.style import MasterPage, PageLayout
    from odf.text import P

    doc = OpenDocumentPresentation()
    layout = PageLayout(name="layout")
    doc.automaticstyles.addElement(layout)
    master = MasterPage(name="master", pagelayoutname=layout)
    doc.masterstyles.addElement(master)
    for paragraphs in slides:
        page = Page(masterpagename=master)
        frame = Frame(width="20cm", height="10cm", x="1cm", y="1cm")
        box = TextBox()
        for p in paragraphs:
            box.addElement(P(text=p))
        frame.addElement(box)
        page.addElement(frame)
        doc.presentation.addElement(page)
    out = io.BytesIO()
    doc.write(out)
    return out.getvalue()


def with_member(data: bytes, member: str, content: bytes | None = None, *,
                bomb_bytes: int = 0) -> bytes:
    """`data` (a zip) with `member` replaced (or added): by `content`, or by a zip bomb of
    `bomb_bytes` (one run of the letter A, about 1000:1), written in pieces; with neither,
    `member` is left out."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename != member:
                dst.writestr(info, src.read(info))
        if content is not None:
            dst.writestr(member, content)
        elif bomb_bytes:
            with dst.open(member, "w") as stream:
                block = b"A" * 2**20
                for _ in range(bomb_bytes // len(block)):
                    stream.write(block)
    return out.getvalue()


def sheet_xml(rows: int, columns: int = 3, far_column: bool = False) -> bytes:
    """A worksheet part of `rows` numeric rows; `far_column` puts one more cell in column XFD
    (the last one Excel has) on every row."""
    letters = "ABCDEFGHIJ"[:columns]
    # Excel and LibreOffice write the dimension (without it openpyxl reads the sheet twice).
    last = "XFD" if far_column else letters[-1]
    parts = ['<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
             f'<dimension ref="A1:{last}{rows}"/><sheetData>']
    for r in range(1, rows + 1):
        cells = "".join(f'<c r="{c}{r}"><v>{r * 10 + i}</v></c>' for i, c in enumerate(letters))
        if far_column:
            cells += f'<c r="XFD{r}"><v>1</v></c>'
        parts.append(f'<row r="{r}">{cells}</row>')
    parts.append("</sheetData></worksheet>")
    return "".join(parts).encode()
