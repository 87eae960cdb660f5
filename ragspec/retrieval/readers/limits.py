"""How much one input file may cost: bytes read, bytes inflated, pages, characters.

Contract: `IngestLimits` bounds the work and memory one file can demand, whatever it holds, so
that a hostile or merely huge file is one failed file with a reason, never a stalled or killed
ingest. `IngestLimits.from_env()` reads the settings below (each overrides its default):

  RAGSPEC_MAX_FILE_MB      size of the file on disk (default 50; fractions allowed)
  RAGSPEC_MAX_PDF_PAGES    pages in one PDF (default 2000)
  RAGSPEC_MAX_CHARS        characters of text in one document, all pages together
                           (default 10000000: about 5000 pages of prose)
  RAGSPEC_MAX_UNZIPPED_MB  bytes one part of a .docx may inflate to (default 128)
  RAGSPEC_MAX_ZIP_RATIO    inflated / compressed size of one part (default 200; Word's XML
                           compresses 5-20 times, zip bombs about 1000 times)

Each limit is checked before the work it bounds (declared sizes before inflating, the page
count before extracting) and enforced while it is done (reads are capped, extraction stops at the
character limit), so a file that lies about itself is stopped too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from ragspec.retrieval.errors import LoadError

MiB = 2**20

# name of the setting -> (field, parser)
_ENV = {
    "RAGSPEC_MAX_FILE_MB": ("max_file_bytes", "mib"),
    "RAGSPEC_MAX_PDF_PAGES": ("max_pdf_pages", "int"),
    "RAGSPEC_MAX_CHARS": ("max_chars", "int"),
    "RAGSPEC_MAX_UNZIPPED_MB": ("max_unzipped_bytes", "mib"),
    "RAGSPEC_MAX_ZIP_RATIO": ("max_zip_ratio", "float"),
}
ENV_FOR = {field: name for name, (field, _) in _ENV.items()}


def size_text(n: int | float) -> str:
    """A byte count for people: '512 bytes', '3.5 KiB', '51.0 MiB'."""
    if n < 1024:
        return f"{n:.0f} bytes"
    return f"{n / 1024:.1f} KiB" if n < MiB else f"{n / MiB:,.1f} MiB"


@dataclass(frozen=True)
class IngestLimits:
    """See the module docstring; every value must be > 0."""

    max_file_bytes: int = 50 * MiB
    max_pdf_pages: int = 2000
    max_chars: int = 10_000_000
    max_unzipped_bytes: int = 128 * MiB
    max_zip_ratio: float = 200.0
    # Parts in one .docx archive: Word writes a few dozen. Not a setting: only a crafted file
    # has more, and each costs memory as soon as the archive's directory is read.
    max_zip_members: int = 10_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                hint = f" ({ENV_FOR[f.name]})" if f.name in ENV_FOR else ""
                raise ValueError(f"{f.name}{hint} must be > 0, got {value!r}")

    @classmethod
    def from_env(cls, **overrides) -> IngestLimits:
        """The defaults, then the RAGSPEC_MAX_* settings, then `overrides` (None = not given).

        Raises ValueError naming the setting when one is not a positive number."""
        values = {}
        for name, (field, kind) in _ENV.items():
            raw = os.environ.get(name)
            if raw:
                values[field] = _parse(name, raw, kind)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _parse(name: str, raw: str, kind: str) -> int | float:
    try:
        number = float(raw) if kind != "int" else int(raw)
    except ValueError:
        unit = " of megabytes" if kind == "mib" else ""
        raise ValueError(f"{name}={raw!r} is not a number{unit}") from None
    if not number > 0:
        raise ValueError(f"{name} must be > 0, got {raw!r}")
    return int(number * MiB) if kind == "mib" else number


class TextBuffer:
    """Collects a document's text piece by piece and stops it at `max_chars` characters, so an
    extractor never holds more text than the limit allows (raises LoadError past it)."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._parts: list[str] = []
        self._size = 0

    def add(self, text: str) -> None:
        self._size += len(text)
        if self._size > self.max_chars:
            raise too_many_chars(self.max_chars)
        self._parts.append(text)

    def text(self) -> str:
        return "".join(self._parts)


def too_many_chars(max_chars: int) -> LoadError:
    return LoadError(
        f"the document holds more than {max_chars:,} characters of text, the limit per "
        f"document; split it, or raise the limit with {ENV_FOR['max_chars']}"
    )
