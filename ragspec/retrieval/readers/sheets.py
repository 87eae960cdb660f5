"""Spreadsheets (.xlsx) and comma-separated files (.csv) as passages of rows under their header.

Contract: `xlsx_pages(data, limits)` and `csv_pages(data, limits)` return `(page, text)` pairs,
one per group of rows: `page` is the sheet's 1-based position in the workbook (None for .csv),
and each text is
    Sheet "Prices", rows 2-19          (for .csv: "rows 2-19")
    Item | Price | Unit               <- the sheet's header row (its first non-empty row)
    Apples | 2.5 | kg                  <- the rows, cells joined by " | "
so every passage cut from it names its sheet and rows and repeats the header, and a question
about a value finds the column it sits in. Groups stay under `GROUP_CHARS` characters (a few
rows fill an embedder's 200 word pieces: numbers cut into many pieces), so the splitter keeps a
group whole; a longer row is a group of its own. Empty rows are skipped but keep their numbers.

Bounds: .xlsx is checked part by part before openpyxl opens it (archive.check_parts), read in
openpyxl's streaming mode with the sheet's declared size ignored (a sheet claiming 16,384
columns would otherwise pad every row), and every cell visited counts against `MAX_CELLS`
(missing rows count one each); all text together stops at `limits.max_chars`. A .csv is decoded
as text files are (encoding.py) and parsed by the csv module, whose field size limit holds.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
from collections.abc import Iterable, Iterator

from ragspec.retrieval.errors import LoadError, type_name
from ragspec.retrieval.readers.archive import check_parts, open_archive
from ragspec.retrieval.readers.encoding import decode_text
from ragspec.retrieval.readers.limits import IngestLimits, too_many_chars

GROUP_CHARS = 450
MAX_GROUP_ROWS = 40
# Cells one workbook may make us visit: 100,000 rows of 50 columns. Only a crafted file has more
# (a cell at column XFD pads its row to 16,384), and each costs time before it yields any text.
MAX_CELLS = 5_000_000
_SEP = " | "


def xlsx_pages(data: bytes, limits: IngestLimits) -> list[tuple[int | None, str]]:
    from openpyxl import load_workbook

    what = ".xlsx file (Excel 2007 or later)"
    with open_archive(data, limits, what=what) as archive:
        check_parts(archive, limits)
    try:
        book = load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except LoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - openpyxl raises many types on broken files
        raise LoadError(f"not a readable {what}: {type_name(exc)}: {exc}") from exc
    out: list[tuple[int | None, str]] = []
    budget = _Budget(limits)
    try:
        for number, sheet in enumerate(book.worksheets, start=1):
            sheet.reset_dimensions()
            rows = _counted(sheet.iter_rows(values_only=True), budget)
            title = f'Sheet "{sheet.title}", '
            out.extend((number, text) for text in _groups(rows, title, budget))
    except LoadError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise LoadError(f"a sheet of the {what} is damaged: {type_name(exc)}: {exc}") from exc
    finally:
        book.close()
    return out


def csv_pages(data: bytes, limits: IngestLimits) -> list[tuple[int | None, str]]:
    if len(data) > 4 * limits.max_chars:  # no encoding spends more than 4 bytes a character
        raise too_many_chars(limits.max_chars)
    text, _ = decode_text(data)
    try:
        dialect = csv.Sniffer().sniff(text[:8192], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    budget = _Budget(limits)
    try:
        rows = _counted(csv.reader(io.StringIO(text, newline=""), dialect), budget)
        return [(None, t) for t in _groups(rows, "", budget)]
    except csv.Error as exc:
        raise LoadError(f"not a readable CSV file: {exc}") from exc


class _Budget:
    def __init__(self, limits: IngestLimits) -> None:
        self.max_chars, self.chars, self.cells = limits.max_chars, 0, 0

    def cells_seen(self, n: int) -> None:
        self.cells += max(1, n)
        if self.cells > MAX_CELLS:
            raise LoadError(
                f"the sheet has more than {MAX_CELLS:,} cells (rows x columns, empty ones "
                "included); split it, or delete the empty columns that stretch it"
            )

    def text_made(self, text: str) -> None:
        self.chars += len(text)
        if self.chars > self.max_chars:
            raise too_many_chars(self.max_chars)


def _counted(rows: Iterable[tuple], budget: _Budget) -> Iterator[list[str]]:
    for row in rows:
        budget.cells_seen(len(row))
        cells = [_cell_text(v) for v in row]
        while cells and not cells[-1]:
            cells.pop()
        yield cells


def _groups(rows: Iterator[list[str]], title: str, budget: _Budget) -> Iterator[str]:
    header: str | None = None
    group: list[str] = []
    first = last = header_number = 0
    size = 0

    def flush() -> str:
        span = f"row {first}" if first == last else f"rows {first}-{last}"
        text = f"{title}{span}\n{header}\n" + "\n".join(group)
        budget.text_made(text)
        return text

    for number, cells in enumerate(rows, start=1):
        if not any(cells):
            continue
        line = _SEP.join(cells)
        if header is None:
            header, header_number, size = line, number, len(title) + len(line)
            continue
        if group and (size + len(line) > GROUP_CHARS or len(group) >= MAX_GROUP_ROWS):
            yield flush()
            group, size = [], len(title) + len(header)
        if not group:
            first = number
        group.append(line)
        last, size = number, size + len(line) + 1
    if group:
        yield flush()
    elif header is not None:  # a sheet of one row: the row is the passage
        budget.text_made(header)
        yield f"{title}row {header_number}\n{header}"


def _cell_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    # A cell's own line breaks would split the row in the passage.
    return " ".join(str(value).split())
