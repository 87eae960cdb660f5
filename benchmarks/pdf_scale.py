"""Where the time of ingesting a large PDF goes: text extraction, cutting passages, embedding.

Builds a PDF of --pages pages by concatenating real PDFs (pypdf; e.g. Debian's under
/usr/share/doc) until the count is reached, then times, on it: `load_bytes` (PDFium extraction,
page by page, as ingest runs it), `split_documents` (the bundled embedder's tokenizer), and the
bundled embedder on the first --embed passages (extrapolated to all, as embedding is linear in
passages; in calls of 64 in order of length, as ingest embeds). Peak memory: resident set size
of this process after each stage (ru_maxrss). --backend picks the embedder's forward: torch
(sentence-transformers), onnx (onnxruntime) or auto (what ingest does by default); run the
script once per backend for a before/after with each one's own peak memory. Wall and CPU
seconds are both given, and the load average before and after.

--whole fp32,bf16 then ingests the built PDF whole, `ragspec ingest` into a fresh index (and a
fresh RAGSPEC_HOME), once per embedder precision (RAGSPEC_EMBEDDER_DTYPE), each in a child
process: its wall seconds, pages per second, CPU seconds (user + system, from os.wait4) and
peak resident memory, as `/usr/bin/time -v` would give them. --out appends the whole run to a
results file (benchmarks/record.py).

    python benchmarks/pdf_scale.py A.pdf B.pdf ... [--pages 2000] [--embed 512] [--keep OUT.pdf]
        [--backend torch|onnx|auto] [--whole fp32,bf16] [--out docs/results/NAME.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import record

INGEST = "import sys; from ragspec.cli import main; sys.argv[0] = 'ragspec'; main()"


def build(sources: list[str], pages: int) -> bytes:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    readers = [PdfReader(path) for path in sources]
    while len(writer.pages) < pages:
        for reader in readers:
            for page in reader.pages:
                if len(writer.pages) == pages:
                    break
                writer.add_page(page)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def loadavg() -> list[str]:
    return open("/proc/loadavg").read().split()[:3]


def whole_ingest(data: bytes, pages: int, dtype: str) -> dict:
    """`ragspec ingest` of the PDF `data` into a fresh index with the embedder in `dtype`, in a
    child process: wall and CPU seconds, pages per second, the child's peak RSS."""
    with tempfile.TemporaryDirectory(prefix="pdf-scale-") as scratch:
        pdf = Path(scratch) / "large.pdf"
        pdf.write_bytes(data)
        env = {**os.environ, "RAGSPEC_EMBEDDER_DTYPE": dtype, "RAGSPEC_HOME": f"{scratch}/home"}
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", INGEST, "ingest", str(pdf), "--index",
                                  f"{scratch}/index"], env=env, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"ragspec ingest ({dtype}) failed: status {status}")
    return {"dtype": dtype, "wall_s": round(wall, 1), "pages_per_s": round(pages / wall, 2),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_mib": round(usage.ru_maxrss / 1024), "loadavg_after": loadavg()}


def main(argv=None) -> int:
    from ragspec.retrieval.embeddings.embedder import Embedder
    from ragspec.retrieval.ingest import embed_in_order
    from ragspec.retrieval.passages import split_documents
    from ragspec.retrieval.readers.loaders import load_bytes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pdfs", nargs="+")
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--embed", type=int, default=512)
    ap.add_argument("--keep")
    ap.add_argument("--backend", choices=["torch", "onnx", "auto"], default="auto")
    ap.add_argument("--whole", default="",
                    help="comma-separated embedder precisions (fp32,bf16) to ingest the PDF "
                         "whole with, one child process each")
    record.out_option(ap)
    args = ap.parse_args(argv)
    data = build(args.pdfs, args.pages)
    if args.keep:
        open(args.keep, "wb").write(data)
    out = {"pages": args.pages, "pdf_mib": len(data) / 2**20, "rss_mib_built": rss_mib(),
           "loadavg_before": loadavg()}
    start = time.perf_counter()
    docs = load_bytes(data, "large.pdf")
    out["extract_s"] = time.perf_counter() - start
    out["rss_mib_extracted"] = rss_mib()
    embedder = Embedder(onnx={"torch": False, "onnx": True, "auto": None}[args.backend])
    start = time.perf_counter()
    drafts = split_documents(docs, embedder)
    out["split_s"] = time.perf_counter() - start
    out["passages"] = len(drafts)
    sample = [d.text for d in drafts[: args.embed]]
    out["backend"] = embedder.backend  # loads the model (and the ONNX file), untimed
    embedder.embed_array(sample[:8])
    start, start_cpu = time.perf_counter(), time.process_time()
    embed_in_order(embedder, sample, lambda done, total: None)
    seconds = time.perf_counter() - start
    out["embed_sample_s"] = seconds
    out["embed_sample_cpu_s"] = time.process_time() - start_cpu
    out["embed_all_s_extrapolated"] = seconds * len(drafts) / len(sample)
    out["rss_mib_peak"] = rss_mib()
    total = out["extract_s"] + out["split_s"] + out["embed_all_s_extrapolated"]
    out["pages_per_s_extract"] = args.pages / out["extract_s"]
    out["pages_per_s_total"] = args.pages / total
    out["share"] = {k: round(out[k] / total, 3)
                    for k in ("extract_s", "split_s", "embed_all_s_extrapolated")}
    out["loadavg_after"] = loadavg()
    print(json.dumps(out, indent=1), flush=True)
    out["whole_ingest"] = []
    for dtype in filter(None, args.whole.split(",")):
        out["whole_ingest"].append(whole_ingest(data, args.pages, dtype))
        print(json.dumps(out["whole_ingest"][-1]), flush=True)
    record.add_run(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
