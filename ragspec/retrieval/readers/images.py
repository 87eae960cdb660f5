"""Pictures of pages as text: image files (.png, .jpg, .jpeg, .tif, .tiff) and the PDF pages
that have no text layer, recognised page by page (ocr.py).

Contract: `image_pages(data, settings)` returns `(page, text, metadata)` for every frame of an
image file (a TIFF may hold many; page is the 1-based frame number), and
`pdf_scanned_pages(document, numbers, settings)` the same for the given 1-based pages of an
open pypdfium2 document (the one pdf_text.read_pdf read the text layer from: a PDF is parsed
once), rendered at `settings.dpi`. `metadata` is {"ocr": True, "ocr_words": [(word, x0, y0, x1, y1),
...]}: boxes in the page's own coordinates, origin top left (pixels for image files, PDF points
for PDF pages), the page's words in reading order.

Bounds: the page count is checked against the OCR budget before any page is recognised; an
image's size is read from its header and checked against `ocr.MAX_PIXELS` before it is decoded
(a 30,000 x 30,000 picture would take 900 MB), and a PDF page whose rendering would exceed it is
rendered at a lower resolution instead.
"""

from __future__ import annotations

import io
import time
import warnings

from ragspec.retrieval.errors import LoadError, type_name
from ragspec.retrieval.readers import ocr

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff")


def image_pages(data: bytes, settings: ocr.OcrSettings) -> list[tuple[int, str, dict]]:
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():  # Pillow warns from 89 million pixels; we refuse below
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError as exc:
        raise LoadError(f"the image is too large to decode safely ({exc})") from exc
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise LoadError(f"not a readable image (damaged, or another format): {exc}") from exc
    _check_size(*image.size, "the image")
    ocr.require(settings, "a picture's text can only be read by OCR")
    frames = getattr(image, "n_frames", 1)
    ocr.check_budget(frames, settings, "the image")
    tick = ocr.timed_pages(frames)
    pages = []
    for frame in range(frames):
        started = time.perf_counter()
        try:
            image.seek(frame)
            _check_size(*image.size, f"frame {frame + 1}" if frames > 1 else "the image")
            grey = image.convert("L")
        except LoadError:
            raise
        except Exception as exc:  # noqa: BLE001 - Pillow's decoders raise many types
            raise LoadError(f"the image is damaged ({type_name(exc)}: {exc})") from exc
        text, words = ocr.recognise(grey, settings)
        pages.append((frame + 1, text, {"ocr": True, "ocr_words": words}))
        tick(started)
    return pages


def _check_size(width: int, height: int, what: str) -> None:
    if width * height > ocr.MAX_PIXELS:
        raise LoadError(
            f"{what} is {width:,} x {height:,} pixels, over the limit of "
            f"{ocr.MAX_PIXELS / 1e6:.0f} million for OCR (a page scanned at 600 dpi has 35 "
            "million); scale it down first")


def pdf_scanned_pages(document, numbers: list[int],
                      settings: ocr.OcrSettings) -> list[tuple[int, str, dict]]:
    ocr.check_budget(len(numbers), settings, "the PDF")
    tick = ocr.timed_pages(len(numbers))
    pages = []
    for number in numbers:
        started = time.perf_counter()
        page = document[number - 1]
        try:
            width, height = page.get_size()  # points
            scale = settings.dpi / 72
            if width * height * scale * scale > ocr.MAX_PIXELS:
                scale = (ocr.MAX_PIXELS / (width * height)) ** 0.5
            image = page.render(scale=scale, grayscale=True).to_pil()
        finally:
            page.close()
        text, words = ocr.recognise(image, settings, scale=1 / scale)
        pages.append((number, text, {"ocr": True, "ocr_words": words}))
        tick(started)
    return pages
