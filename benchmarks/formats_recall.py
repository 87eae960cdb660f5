"""Recall@5 per document format, on real text and real tables put into each format.

Text: the sections of Python's tutorial (Debian's python3-doc, /usr/share/doc/python3*/html/
tutorial) become slides (.pptx, .odp), chapters (.epub) and paragraphs (.odt), without their
headings; the question is the section's heading, and a hit is right when a top-5 passage comes
from that section (same slide/chapter; for .odt its text lies inside the section). Tables:
tzdata's country list (/usr/share/zoneinfo/iso3166.tab) and zone list (zone1970.tab) become a
.csv and a two-sheet .xlsx; the question names a country ("ISO 3166 country code of Peru") and
a hit is right when a top-5 passage holds the country's row. The containers are written here
(python-pptx, ebooklib, odfpy, openpyxl): no office suite is on this machine; the words are not
ours. Uses the bundled embedder.

With --scan-pages N, also the first N pages of text of a real PDF (--scan-pdf) rendered to
pictures and put into a picture-only PDF (a scan), read back by OCR; the question is a sentence
of the page's own text layer, and a hit is right when a top-5 passage is from that page.

    python benchmarks/formats_recall.py [--sections 40] [--countries 40] [--mode dense|hybrid]
                                     [--scan-pages 0] [--scan-pdf PATH]
"""

from __future__ import annotations

import argparse
import glob
import html
import json
import random
import re
import sys
import tempfile
from pathlib import Path

from benchmarks import record


def tutorial_sections(limit: int) -> list[tuple[str, str]]:
    from bs4 import BeautifulSoup

    out = []
    for page in sorted(glob.glob("/usr/share/doc/python3*/html/tutorial/*.html")):
        soup = BeautifulSoup(Path(page).read_bytes(), "html.parser")
        for section in soup.find_all("section"):
            heading = section.find(["h2", "h3"], recursive=False)
            if heading is None:
                continue
            title = re.sub(r"^[\d.]+\s*", "", heading.get_text(" ", strip=True).rstrip("¶")).strip()
            paragraphs = [p.get_text(" ", strip=True) for p in section.find_all("p", recursive=False)]
            text = "\n".join(p for p in paragraphs if p)
            if len(text) >= 300 and title:
                out.append((title, text[:1500]))
    random.Random(0).shuffle(out)
    return out[:limit]


def countries() -> list[list[str]]:
    rows = []
    for line in Path("/usr/share/zoneinfo/iso3166.tab").read_text().splitlines():
        if line and not line.startswith("#"):
            code, name = line.split("\t", 1)
            rows.append([code, name])
    return rows


def zones() -> list[list[str]]:
    rows = []
    for line in Path("/usr/share/zoneinfo/zone1970.tab").read_text().splitlines():
        if line and not line.startswith("#"):
            parts = line.split("\t")
            rows.append((parts + [""] * 4)[:4])
    return rows


def scan_pdf(source: str, pages: int, out: Path) -> list[tuple[int, str]]:
    """Write a picture-only copy of `source`'s first `pages` pages of text to `out`; returns
    (page in the copy, a sentence of that page's text layer) per page."""
    import pypdfium2 as pdfium
    from pypdf import PdfReader

    reader = PdfReader(source)
    document = pdfium.PdfDocument(source)
    images, questions = [], []
    for number, page in enumerate(reader.pages, start=1):
        text = " ".join((page.extract_text() or "").split())
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if 60 <= len(s) <= 300]
        if not sentences:
            continue
        images.append(document[number - 1].render(scale=200 / 72, grayscale=True).to_pil())
        questions.append((len(images), sentences[len(sentences) // 2]))
        if len(images) == pages:
            break
    images[0].save(out, "PDF", resolution=200, save_all=True, append_images=images[1:])
    return questions


def main(argv=None) -> int:
    from ragspec.retrieval.embeddings.embedder import Embedder
    from ragspec.retrieval.faiss.store import PassageStore
    from ragspec.retrieval.ingest import ingest_paths

    # The office files are written by the test suite's own writers (the formats' libraries):
    # benchmarks -> tests/support -> ragspec, one way (tests/test_layers.py checks it).
    from tests.support.format_fakes import epub_bytes, odp_bytes, odt_bytes, pptx_bytes, xlsx_bytes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", type=int, default=40)
    ap.add_argument("--countries", type=int, default=40)
    ap.add_argument("--mode", default="dense")
    ap.add_argument("--scan-pages", type=int, default=0)
    ap.add_argument("--scan-pdf", default="/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf")
    record.out_option(ap)
    args = ap.parse_args(argv)
    sections = tutorial_sections(args.sections)
    table = countries()
    folder = Path(tempfile.mkdtemp(prefix="formats-recall-"))
    bodies = [text for _, text in sections]
    (folder / "tutorial.pptx").write_bytes(pptx_bytes(
        [{"title": f"Slide {i + 1}", "body": t.split("\n")} for i, t in enumerate(bodies)]))
    (folder / "tutorial.odp").write_bytes(odp_bytes([t.split("\n") for t in bodies]))
    (folder / "tutorial.epub").write_bytes(epub_bytes(
        [(f"Chapter {i + 1}", "".join(f"<p>{html.escape(p)}</p>" for p in t.split("\n")))
         for i, t in enumerate(bodies)]))
    (folder / "tutorial.odt").write_bytes(odt_bytes("Tutorial", [p for t in bodies
                                                                 for p in t.split("\n")]))
    header = ["Code", "Country"]
    (folder / "countries.csv").write_text(
        "\n".join(",".join(f'"{c}"' for c in row) for row in [header, *table]) + "\n")
    (folder / "tzdata.xlsx").write_bytes(xlsx_bytes({
        "Zones": [["Codes", "Coordinates", "TZ", "Comments"], *zones()],
        "Countries": [header, *table]}))
    questions = scan_pdf(args.scan_pdf, args.scan_pages, folder / "scan.pdf") \
        if args.scan_pages else []
    embedder = Embedder()
    stores = {}
    for path in sorted(folder.iterdir()):  # one index per file: the texts repeat across them
        stores[path.name] = PassageStore.open(folder / f"index-{path.name}", embedder)
        report = ingest_paths([path], stores[path.name])
        assert not report.failed, report.failed
    picked = random.Random(1).sample(table, args.countries)
    results = {}
    for name in ("tutorial.pptx", "tutorial.odp", "tutorial.epub", "tutorial.odt"):
        suffix = name.rsplit(".", 1)[1]
        right = 0
        for i, (title, text) in enumerate(sections):
            hits = [h.passage for h in stores[name].search(title, k=5, mode=args.mode)]
            page = {"pptx": i + 1, "odp": i + 1, "epub": i + 2}.get(suffix)  # epub: nav is 1
            ok = any(p.page == page for p in hits) if page else any(
                p.text[:60] in text or text[:60] in p.text for p in hits)
            right += ok
        results[suffix] = right / len(sections)
    for name in ("countries.csv", "tzdata.xlsx"):
        right = 0
        for code, country in picked:
            hits = stores[name].search(f"ISO 3166 country code of {country}", k=5,
                                       mode=args.mode)
            right += any(f"{code} | {country}" in h.passage.text for h in hits)
        results[name.rsplit(".", 1)[1]] = right / len(picked)
    if questions:
        right = 0
        for page, sentence in questions:
            hits = stores["scan.pdf"].search(sentence, k=5, mode=args.mode)
            right += any(h.passage.page == page for h in hits)
        results["scanned pdf (OCR)"] = right / len(questions)
    result = {"mode": args.mode, "sections": len(sections), "countries": len(picked),
              "scan_pages": len(questions),
              "passages": {n: st.passage_count() for n, st in stores.items()},
              "recall_at_5": results}
    print(json.dumps(result))
    record.add_run(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
