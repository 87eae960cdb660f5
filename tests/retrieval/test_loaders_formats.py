"""Slides (.pptx, .odp), sheets (.xlsx, .csv), e-books (.epub) and OpenDocument text (.odt):
what each loader reads, where its passages point, and that hostile files are one failure each,
refused before they cost memory or time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fakes import HashEmbedder
from format_fakes import (
    epub_bytes,
    odp_bytes,
    odt_bytes,
    pptx_bytes,
    sheet_xml,
    with_member,
    xlsx_bytes,
)
from test_retrieval_badfiles import _peak_mib

from ragspec.retrieval.errors import LoadError
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.ingest import ingest_paths
from ragspec.retrieval.readers.limits import IngestLimits
from ragspec.retrieval.readers.loaders import load_bytes, supported
from ragspec.retrieval.readers.sheets import GROUP_CHARS

_DECK = pptx_bytes([
    {"title": "Ferry timetable", "body": ["Boats leave every hour."],
     "table": [["Port", "First boat"], ["Oslo", "06:10"]], "notes": "Winter has fewer boats."},
    {},
    {"title": "Fares", "body": ["Adults pay 5 euros."]},
])
_BOOK = xlsx_bytes({
    "Prices": [["Item", "Price", "Unit"], ["Apples", 2.5, "kg"], [None], ["Pears", 3, "kg"]],
    "Staff": [["Name", "Room"], *[[f"Person {i}", 100 + i] for i in range(60)]],
})


def test_a_pptx_slide_is_a_page_with_its_text_table_and_notes():
    docs = load_bytes(_DECK, "deck.pptx")
    assert [d.metadata["page"] for d in docs] == [1, 3]  # slide 2 is empty, its number kept
    assert docs[0].page_content == (
        "Ferry timetable\nBoats leave every hour.\nPort | First boat\nOslo | 06:10\n"
        "Notes:\nWinter has fewer boats.")


def test_sheet_rows_are_grouped_under_the_header_with_sheet_and_rows_named():
    docs = load_bytes(_BOOK, "book.xlsx")
    prices = [d for d in docs if d.metadata["page"] == 1]
    assert [d.page_content for d in prices] == [
        'Sheet "Prices", rows 2-4\nItem | Price | Unit\nApples | 2.5 | kg\nPears | 3 | kg']
    staff = [d.page_content for d in docs if d.metadata["page"] == 2]
    assert len(staff) > 1
    assert all(t.split("\n")[1] == "Name | Room" and len(t) <= GROUP_CHARS + 40 for t in staff)
    # The row ranges follow one another and cover rows 2..61.
    spans = [t.split("\n")[0].removeprefix('Sheet "Staff", rows ').split("-") for t in staff]
    assert spans[0][0] == "2" and spans[-1][1] == "61"
    assert all(int(b[0]) == int(a[1]) + 1 for a, b in zip(spans, spans[1:], strict=False))
    row = next(t for t in staff if "Person 41 | 141" in t)
    first, last = map(int, row.split("\n")[0].rsplit(" ", 1)[1].split("-"))
    assert first <= 43 <= last  # Person 41 is sheet row 43


def test_csv_rows_repeat_the_header_and_the_delimiter_is_found():
    docs = load_bytes(b"city;ferries\nOslo;12\nBergen;7\n", "ports.csv")
    assert [(d.metadata["page"], d.page_content) for d in docs] == [
        (None, "rows 2-3\ncity | ferries\nOslo | 12\nBergen | 7")]


def test_an_epub_chapter_is_a_page_with_its_headings():
    data = epub_bytes([("Departures", "<p>The first boat leaves at six.</p>"),
                       ("Arrivals", "<h2>Evening</h2><p>The last boat lands at midnight.</p>")])
    docs = load_bytes(data, "book.epub")
    # Page 1 of the reading order is the navigation page, left out.
    assert [(d.metadata["page"], d.page_content) for d in docs] == [
        (2, "Departures\n\nThe first boat leaves at six."),
        (3, "Arrivals\n\nEvening\n\nThe last boat lands at midnight.")]


def test_odt_text_keeps_headings_spaces_and_tabs_and_odp_slides_are_pages():
    docs = load_bytes(odt_bytes("Timetable", ["Boats  leave\thourly.", "Fares vary."]), "t.odt")
    assert [(d.metadata["page"], d.page_content) for d in docs] == [
        (None, "Timetable\n\nBoats  leave\thourly.\n\nFares vary.")]
    docs = load_bytes(odp_bytes([["Ferries", "Every hour"], [], ["Fares"]]), "s.odp")
    assert [(d.metadata["page"], d.page_content) for d in docs] == [
        (1, "Ferries\n\nEvery hour"), (3, "Fares")]


@pytest.mark.parametrize("suffix", [".pptx", ".xlsx", ".csv", ".epub", ".odt", ".odp"])
def test_the_new_types_are_supported(suffix):
    assert supported(Path("x" + suffix)) and supported(Path("X" + suffix.upper()))


def test_ingest_cites_the_slide_and_the_sheet(tmp_path):
    (tmp_path / "deck.pptx").write_bytes(_DECK)
    (tmp_path / "book.xlsx").write_bytes(_BOOK)
    store = PassageStore.open(tmp_path / "index", HashEmbedder())
    report = ingest_paths([tmp_path], store)
    assert not report.failed and len(report.added) == 2
    pages = {(Path(p.source).name, p.page, p.text.split("\n")[0]) for p in store.passages()}
    assert ("deck.pptx", 3, "Fares") in pages
    assert ("book.xlsx", 1, 'Sheet "Prices", rows 2-4') in pages


# -- hostile files: one failure each, refused before the work -------------------------------

_BOMB = 24 * 2**20
HOSTILE = {
    # name: (bytes, words the reason must contain)
    "bomb.pptx": (with_member(_DECK, "ppt/slides/slide1.xml", bomb_bytes=_BOMB), "zip bomb"),
    "bomb.xlsx": (with_member(_BOOK, "xl/worksheets/sheet1.xml", bomb_bytes=_BOMB), "zip bomb"),
    "bomb.epub": (with_member(epub_bytes([("A", "<p>b</p>")]), "EPUB/chap_1.xhtml",
                              bomb_bytes=_BOMB), "zip bomb"),
    "bomb.odt": (with_member(odt_bytes("A", ["b"]), "content.xml", bomb_bytes=_BOMB),
                 "zip bomb"),
    "media-bomb.pptx": (with_member(_DECK, "ppt/media/picture.png", bomb_bytes=_BOMB),
                        "zip bomb"),
    "entities.epub": (with_member(epub_bytes([("A", "<p>b</p>")]), "EPUB/content.opf", (
        b'<?xml version="1.0"?><!DOCTYPE p [<!ENTITY a "aaaaaaaaaa">'
        b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><package>&b;</package>')),
        "declares XML entities"),
    "entities.odt": (with_member(odt_bytes("A", ["b"]), "content.xml", (
        b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa">]><d>&a;</d>')),
        "DOCTYPE"),
    "not-a-zip.pptx": (b"PK\x03\x04 this is not really an archive", "not a valid .pptx"),
    "truncated.xlsx": (_BOOK[: len(_BOOK) // 2], "not a valid .xlsx"),
    "no-content.odt": (with_member(odt_bytes("A", ["b"]), "content.xml"),
                       "no content.xml"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_file_is_one_failure_with_its_reason_in_bounded_memory(tmp_path, name):
    data, reason = HOSTILE[name]
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / name).write_bytes(data)
    (folder / "good.csv").write_bytes(b"a,b\n1,2\n")
    store = PassageStore.open(tmp_path / "index", HashEmbedder())
    report = ingest_paths([folder], store)
    assert [Path(p).name for p, _ in report.failed] == [name]
    assert reason in report.failed[0][1], report.failed[0][1]
    assert [Path(d.source).name for d in store.documents()] == ["good.csv"]

    def load():
        with pytest.raises(LoadError):
            load_bytes(data, name)

    peak = _peak_mib(load)
    assert peak < 8, f"refusing {name} used {peak:.1f} MiB"


def test_a_100000_row_sheet_loads_in_bounded_time_and_memory():
    book = with_member(_BOOK, "xl/worksheets/sheet2.xml", sheet_xml(100_000, columns=2))
    start = time.perf_counter()
    docs = load_bytes(book, "big.xlsx")
    seconds = time.perf_counter() - start
    assert docs[-1].page_content.endswith("999990 | 999991\n1000000 | 1000001")  # the last row
    assert seconds < 60
    # Memory follows the text, not the sheet (streamed): measured on a tenth of it, as the
    # tracer slows the parse several times.
    tenth = with_member(_BOOK, "xl/worksheets/sheet2.xml", sheet_xml(10_000, columns=2))
    texts = []
    peak = _peak_mib(lambda: texts.extend(d.page_content for d in load_bytes(tenth, "t.xlsx")))
    text_mib = sum(map(len, texts)) / 2**20
    assert peak < 3 * text_mib + 8, f"{peak:.0f} MiB for {text_mib:.1f} MiB of text"
    # ... and the character limit stops it early, whatever the row count.
    start = time.perf_counter()
    with pytest.raises(LoadError, match="more than 100,000 characters"):
        load_bytes(book, "big.xlsx", IngestLimits(max_chars=100_000))
    assert time.perf_counter() - start < seconds / 4


def test_a_sheet_stretched_to_the_last_column_is_refused_by_its_cell_count():
    # One cell in column XFD makes every row 16,384 cells wide: 20,000 such rows would be
    # 327 million cells to visit.
    book = with_member(_BOOK, "xl/worksheets/sheet2.xml", sheet_xml(20_000, far_column=True))
    start = time.perf_counter()
    with pytest.raises(LoadError, match="more than 5,000,000 cells"):
        load_bytes(book, "wide.xlsx", IngestLimits(max_zip_ratio=10_000, max_chars=10**9))
    assert time.perf_counter() - start < 30
