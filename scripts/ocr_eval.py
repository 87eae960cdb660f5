"""Character error rate and speed of ragspec's OCR on real PDF pages.

Each page is rendered to a grey picture (as a scan would be) at the resolution ragspec uses for
PDF pages without a text layer, recognised by ragspec.retrieval.ocr, and compared with the page's
own text layer (pypdf), both with whitespace collapsed and Unicode compatibility forms folded
(ligatures). CER = Levenshtein distance / reference length. Pages with under 200 characters of
text layer are skipped (title pages, figures).

    python scripts/ocr_eval.py FILE.pdf [FILE.pdf ...] [--pages N] [--dpi 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
import unicodedata

import numpy as np


def normalise(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).split())


def levenshtein(a: str, b: str) -> int:
    """Edit distance, one numpy row per character of `a` (insertions by a running minimum)."""
    if not a or not b:
        return max(len(a), len(b))
    bv = np.frombuffer(b.encode("utf-32-le"), dtype=np.uint32)
    ramp = np.arange(len(b) + 1)
    row = ramp.copy()
    for i, ch in enumerate(a, start=1):
        sub = row[:-1] + (bv != ord(ch))
        new = np.empty_like(row)
        new[0] = i
        new[1:] = np.minimum(sub, row[1:] + 1)
        row = np.minimum.accumulate(new - ramp) + ramp  # insertions: new[j] <= new[j-1] + 1
    return int(row[-1])


def main(argv=None) -> int:
    import pypdfium2 as pdfium
    from pypdf import PdfReader

    from ragspec.retrieval.ocr import OcrSettings, missing, recognise

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pdfs", nargs="+")
    parser.add_argument("--pages", type=int, default=5, help="text pages per file")
    parser.add_argument("--dpi", type=int, default=OcrSettings.dpi)
    parser.add_argument("--json", dest="out")
    args = parser.parse_args(argv)
    settings = OcrSettings()
    if missing(settings):
        print(missing(settings), file=sys.stderr)
        return 2
    rows = []
    for path in args.pdfs:
        data = open(path, "rb").read()
        reader = PdfReader(io.BytesIO(data))
        document = pdfium.PdfDocument(data)
        taken = 0
        for number, page in enumerate(reader.pages, start=1):
            truth = normalise(page.extract_text() or "")
            if len(truth) < 200:
                continue
            image = document[number - 1].render(scale=args.dpi / 72, grayscale=True).to_pil()
            start = time.perf_counter()
            text, words = recognise(image, settings)
            seconds = time.perf_counter() - start
            got = normalise(text)
            rows.append({"file": path, "page": number, "chars": len(truth), "seconds": seconds,
                         "cer": levenshtein(got, truth) / len(truth), "words": len(words)})
            print(f"{path} p{number}: CER {rows[-1]['cer']:.3f}, {len(truth)} chars, "
                  f"{seconds:.1f} s", flush=True)
            taken += 1
            if taken == args.pages:
                break
    total_chars = sum(r["chars"] for r in rows)
    summary = {
        "pages": len(rows), "dpi": args.dpi,
        "cer_median": statistics.median(r["cer"] for r in rows),
        "cer_pooled": sum(r["cer"] * r["chars"] for r in rows) / total_chars,
        "seconds_median": statistics.median(r["seconds"] for r in rows),
        "pages_per_second": len(rows) / sum(r["seconds"] for r in rows),
    }
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "pages": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
