"""Text from pictures of pages (scans, photos, PDF pages without a text layer), with Tesseract.

Contract: `OcrSettings.from_env()` reads the settings below; `missing()` is None when OCR can
run here, else the sentence saying what to install; `recognise(image, settings, scale)` returns
`(text, words)` for one page image: the text as Tesseract reads it (words of a line joined by
spaces, lines by "\\n", paragraphs by a blank line) and `words`, a list of (word, x0, y0, x1, y1)
in page coordinates (pixel boxes times `scale`, origin at the top left), so a source view can
mark copied words on the scanned page. The words are exactly the text's words, in order.

  RAGSPEC_OCR            "0", "off", "false" or "no" turns OCR off (default on)
  RAGSPEC_OCR_MAX_PAGES  pages one file may send to OCR (default 200); a file needing more
                         fails with that reason, before any page is recognised
  RAGSPEC_OCR_LANG       Tesseract languages, "eng" or "eng+deu" (default eng); each needs
                         its data package (Debian: tesseract-ocr-deu)

`on_page`, a context variable, may hold a callable(done, total, seconds) that hears of every
page recognised (the ingest progress line); `turned_off`, another, set True turns OCR off for
one command (`ragspec ingest --no-ocr`). Tesseract is given a time limit per page.
"""

from __future__ import annotations

import contextvars
import functools
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from ragspec.retrieval.errors import LoadError

_OFF = {"0", "off", "false", "no"}
PAGE_SECONDS = 120  # one page; Tesseract takes 1-10 s for a dense A4 page at 200 dpi
# The most pixels a page image may have (a 30,000 x 30,000 picture is 900 million: 900 MB
# decoded as grey). An A4 page scanned at 600 dpi is 35 million.
MAX_PIXELS = 60_000_000

on_page: contextvars.ContextVar[Callable[[int, int, float], None] | None] = \
    contextvars.ContextVar("on_page", default=None)
# True turns OCR off in this context whatever RAGSPEC_OCR says (`ragspec ingest --no-ocr`).
turned_off: contextvars.ContextVar[bool] = contextvars.ContextVar("turned_off", default=False)


@dataclass(frozen=True)
class OcrSettings:
    enabled: bool = True
    max_pages: int = 200
    languages: str = "eng"
    dpi: int = 200  # PDF pages are rendered at this resolution for recognition

    def __post_init__(self) -> None:
        if self.max_pages < 1 or not 50 <= self.dpi <= 600:
            raise ValueError(f"OCR max_pages must be >= 1 and dpi in 50..600, got {self}")
        if not self.languages or not all(p.isidentifier() for p in self.languages.split("+")):
            raise ValueError(f"RAGSPEC_OCR_LANG={self.languages!r}: expected e.g. eng or eng+deu")

    @classmethod
    def from_env(cls) -> OcrSettings:
        raw = os.environ.get("RAGSPEC_OCR_MAX_PAGES")
        try:
            max_pages = int(raw) if raw else cls.max_pages
        except ValueError:
            raise ValueError(f"RAGSPEC_OCR_MAX_PAGES={raw!r} is not a whole number") from None
        on = os.environ.get("RAGSPEC_OCR", "1").strip().lower() not in _OFF
        return cls(enabled=on and not turned_off.get(),
                   max_pages=max_pages,
                   languages=os.environ.get("RAGSPEC_OCR_LANG") or cls.languages)


def missing(settings: OcrSettings) -> str | None:
    """None when Tesseract and the languages' data are here; else what to install."""
    binary = shutil.which("tesseract")
    if binary is None:
        return ("OCR needs Tesseract, which is not installed: `apt-get install tesseract-ocr` "
                "(or `make ocr` as root), or set RAGSPEC_OCR=0 to skip pages without text")
    have = _languages(binary)
    lacking = [lang for lang in settings.languages.split("+") if lang not in have]
    if lacking:
        return (f"Tesseract has no data for {', '.join(lacking)}: install "
                f"{', '.join('tesseract-ocr-' + lang for lang in lacking)} or change "
                f"RAGSPEC_OCR_LANG (it has: {', '.join(sorted(have)) or 'none'})")
    return None


@functools.lru_cache(maxsize=4)
def _languages(binary: str) -> frozenset[str]:
    try:
        out = subprocess.run([binary, "--list-langs"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(line.strip() for line in out.splitlines()[1:] if line.strip())


def require(settings: OcrSettings, what: str) -> None:
    """LoadError unless OCR is on and can run; `what` says what needed it."""
    if not settings.enabled:
        raise LoadError(f"{what}, and OCR is turned off (RAGSPEC_OCR=0 or --no-ocr)")
    problem = missing(settings)
    if problem:
        raise LoadError(f"{what}; {problem}")


def check_budget(pages: int, settings: OcrSettings, what: str) -> None:
    if pages > settings.max_pages:
        raise LoadError(
            f"{what}: {pages:,} pages need OCR, over the budget of {settings.max_pages:,} "
            "pages per file; raise it with RAGSPEC_OCR_MAX_PAGES, or split the file")


def recognise(image, settings: OcrSettings, scale: float = 1.0):
    """(text, words) for one page image (a PIL image); see the module docstring."""
    import pytesseract

    try:
        data = pytesseract.image_to_data(image, lang=settings.languages,
                                         output_type=pytesseract.Output.DICT,
                                         timeout=PAGE_SECONDS)
    except RuntimeError as exc:  # pytesseract's timeout
        raise LoadError(f"OCR of a page took over {PAGE_SECONDS} s; gave up ({exc})") from exc
    except pytesseract.TesseractError as exc:
        raise LoadError(f"Tesseract failed on a page: {exc}") from exc
    lines: list[list[str]] = []
    words = []
    last_line = last_par = None
    for i, word in enumerate(data["text"]):
        word = word.strip()
        if not word or float(data["conf"][i]) < 0:
            continue
        par = (data["block_num"][i], data["par_num"][i])
        line = (*par, data["line_num"][i])
        if line != last_line:
            if last_par is not None and par != last_par:
                lines.append([])  # a blank line between paragraphs
            lines.append([])
            last_line, last_par = line, par
        lines[-1].append(word)
        x, y = data["left"][i], data["top"][i]
        w, h = data["width"][i], data["height"][i]
        words.append((word, round(x * scale, 2), round(y * scale, 2),
                      round((x + w) * scale, 2), round((y + h) * scale, 2)))
    return "\n".join(" ".join(line) for line in lines), words


def timed_pages(total: int):
    """A counter that reports each recognised page to `on_page` (if set)."""
    done = 0
    listener = on_page.get()

    def tick(started: float) -> None:
        nonlocal done
        done += 1
        if listener is not None:
            listener(done, total, time.perf_counter() - started)

    return tick
