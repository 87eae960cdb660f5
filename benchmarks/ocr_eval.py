"""Character error rate and speed of OCR engines on real PDF pages.

Each page is rendered to a grey picture (as a scan would be) at the resolution ragspec uses for
PDF pages without a text layer, recognised by each engine asked for, and compared with the page's
own text layer (pypdf), both with whitespace collapsed and Unicode compatibility forms folded
(ligatures). CER = Levenshtein distance / reference length. Pages with under 200 characters of
text layer are skipped (title pages, figures).

Engines: `tesseract` (ragspec.retrieval.readers.ocr, what ragspec uses) and `rapidocr` (the
rapidocr-onnxruntime wheel, PP-OCRv4 ONNX models inside it, if installed). With several, each
page goes to each engine in turn, so their times are measured side by side under the same load.
`--threads N` limits both (OMP_THREAD_LIMIT for Tesseract, onnxruntime's intra-op threads).

    python benchmarks/ocr_eval.py FILE.pdf [FILE.pdf ...] [--pages N] [--dpi 200]
        [--engine tesseract,rapidocr] [--threads 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
import unicodedata
from pathlib import Path

import numpy as np

from benchmarks import record


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


def tesseract_engine(threads: int):
    """A callable(image) -> text, or the sentence saying why it cannot run."""
    from ragspec.retrieval.readers.ocr import OcrSettings, missing, recognise

    settings = OcrSettings()
    if missing(settings):
        return missing(settings)
    if threads:
        os.environ["OMP_THREAD_LIMIT"] = str(threads)  # read by each tesseract process
    return lambda image: recognise(image, settings)[0]


def rapidocr_engine(threads: int):
    try:
        from rapidocr_onnxruntime import RapidOCR
    except ImportError:
        return ("rapidocr is not installed: `python -m pip install rapidocr-onnxruntime` "
                "(its wheel holds the models)")
    engine = RapidOCR(intra_op_num_threads=threads or -1, inter_op_num_threads=1)

    def run(image) -> str:
        result, _ = engine(np.asarray(image.convert("RGB")))
        return "\n".join(text for _, text, _ in result or [])  # lines, top to bottom

    return run


ENGINES = {"tesseract": tesseract_engine, "rapidocr": rapidocr_engine}


def main(argv=None) -> int:
    import pypdfium2 as pdfium
    from pypdf import PdfReader

    from ragspec.retrieval.readers.ocr import OcrSettings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pdfs", nargs="+")
    parser.add_argument("--pages", type=int, default=5, help="text pages per file")
    parser.add_argument("--dpi", type=int, default=OcrSettings.dpi)
    parser.add_argument("--engine", default="tesseract",
                        help="comma-separated: " + ", ".join(ENGINES))
    parser.add_argument("--threads", type=int, default=0, help="0: the engine's default")
    parser.add_argument("--json", dest="out")
    args = parser.parse_args(argv)
    engines = {}
    for name in args.engine.split(","):
        if name not in ENGINES:
            parser.error(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
        engine = ENGINES[name](args.threads)
        if isinstance(engine, str):
            print(f"{name}: {engine}", file=sys.stderr)
            return 2
        engines[name] = engine
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
            if not rows:  # load the models and start the runtimes before anything is timed
                for engine in engines.values():
                    engine(image)
            for name, engine in engines.items():
                start = time.perf_counter()
                got = normalise(engine(image))
                seconds = time.perf_counter() - start
                rows.append({"engine": name, "file": path, "page": number, "chars": len(truth),
                             "seconds": seconds, "cer": levenshtein(got, truth) / len(truth)})
                print(f"{name} {path} p{number}: CER {rows[-1]['cer']:.3f}, {len(truth)} chars, "
                      f"{seconds:.1f} s", flush=True)
            taken += 1
            if taken == args.pages:
                break
    summary = {name: _summary([r for r in rows if r["engine"] == name], args)
               for name in engines}
    print(json.dumps(summary))
    record.add_run(args.out and Path(args.out), {"summary": summary, "pages": rows})
    return 0


def _summary(rows: list[dict], args) -> dict:
    total_chars = sum(r["chars"] for r in rows)
    return {
        "pages": len(rows), "dpi": args.dpi, "threads": args.threads,
        "cer_median": statistics.median(r["cer"] for r in rows),
        "cer_pooled": sum(r["cer"] * r["chars"] for r in rows) / total_chars,
        "seconds_median": statistics.median(r["seconds"] for r in rows),
        "pages_per_second": len(rows) / sum(r["seconds"] for r in rows),
    }


if __name__ == "__main__":
    sys.exit(main())
