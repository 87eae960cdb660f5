"""Benchmark ingestion on pathological files: time and peak memory as the input doubles.

Usage:  PYTHONPATH=. python benchmarks/bench_ingest.py [--repeats 1] [--embedder null|bundled]
            [--cases nested-html,...] [--steps 4] [--code CHECKOUT] [--json out.json]

Generates files that have broken document loaders elsewhere, each at growing sizes, in a
temporary folder, and ingests each file alone with `ragspec.retrieval.ingest.ingest_paths` into a fresh
index, in a fresh child process. Per run it records the wall and CPU seconds `ingest_paths` took
(inside the child, imports excluded; CPU time does not count waiting for a core on a busy machine)
and the child's peak resident memory (its own rusage, from os.wait4).
Cases:
  nested-html   <div> nested 10,000 to 80,000 deep, a word in each
  no-space-txt  one run of base64-like characters without whitespace, 1 to 8 MiB
  table-md      a Markdown table whose rows repeat, 1 to 8 MiB
  table-html    an HTML table whose rows repeat, 1 to 8 MiB
  docx-bomb     a .docx whose document.xml inflates to 32 to 256 MiB (about 1000:1)
  small-docx    a normal small .docx (the baseline for the bomb's memory)
The table gives, per case and size, the medians over --repeats runs, and the CPU time's ratio to
the previous size (the input doubles each step: about 2 when time is linear).

--embedder null (default) replaces the neural network with a stand-in that counts the real
all-MiniLM-L6-v2 word pieces and returns constant vectors: what is measured is reading, parsing,
splitting and committing, the parts a hostile file controls. --embedder bundled adds the model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

from benchmarks import record

REPO = Path(__file__).resolve().parent.parent
MiB = 2**20
W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"

_CHILD = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from ragspec.retrieval.ingest import ingest_paths
    from ragspec.retrieval.faiss.store import PassageStore

    class NullEmbedder:
        # The real word pieces (passages are cut exactly as with the model), constant vectors.
        name, dim = "bench:null", 384

        def __init__(self):
            from ragspec.retrieval.embeddings.embedder import bundled_model_dir
            from ragspec.retrieval.embeddings.tokens import WordPieces

            self._pieces = WordPieces.from_file(bundled_model_dir() / "tokenizer.json", 256)
            self.max_tokens, self.special_tokens = 256, self._pieces.special_tokens
            self.count_tokens, self.token_spans = self._pieces.count_tokens, self._pieces.token_spans

        def embed_array(self, texts):
            out = np.zeros((len(texts), self.dim), dtype=np.float32)
            out[:, 0] = 1.0
            return out

    path, index, which = sys.argv[1:4]
    if which == "bundled":
        from ragspec.retrieval.embeddings.embedder import Embedder
        embedder = Embedder()
        embedder.embed_array(["warm up"])
    else:
        embedder = NullEmbedder()
    store = PassageStore.open(index, embedder)
    started, cpu = time.perf_counter(), time.process_time()
    report = ingest_paths([path], store)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "passages": report.passages_added,
                      "failed": report.failed[0][1] if report.failed else None}))
    """
)


# -- generated inputs ----------------------------------------------------------------------------


def nested_html(path: Path, depth: int) -> None:
    path.write_text("<html><body>" + "<div>x " * depth + "</div>" * depth + "</body></html>")


def no_space_text(path: Path, size: int) -> None:
    block = "QmVyaXRoIDQgaXMgY2xvc2VkIG9uIFN1bmRheXMu" * 1024
    path.write_text((block * (size // len(block) + 1))[:size])


_ROW = "| 2024-03-01 | Harbour ferry | 08:15 | on time | berth 4 |\n"


def table_md(path: Path, size: int) -> None:
    head = "| date | service | time | status | where |\n|---|---|---|---|---|\n"
    path.write_text(head + _ROW * (size // len(_ROW)))


def table_html(path: Path, size: int) -> None:
    row = ("<tr><td>2024-03-01</td><td>Harbour ferry</td><td>08:15</td><td>on time</td>"
           "<td>berth 4</td></tr>\n")
    path.write_text("<html><body><table>" + row * (size // len(row)) + "</table></body></html>")


def docx(path: Path, inflated: int | None) -> None:
    """A .docx: a few paragraphs (inflated None), or one run of 'A' inflating to `inflated`."""
    head = f'<w:document xmlns:w="{W_NS}"><w:body>'.encode()
    tail = b"</w:body></w:document>"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("word/document.xml", "w", force_zip64=True) as part:
            part.write(head)
            if inflated is None:
                for i in range(40):
                    part.write(f"<w:p><w:r><w:t>Paragraph {i}: the harbour ferry leaves "
                               f"berth {i % 5} at {8 + i % 10}:15.</w:t></w:r></w:p>".encode())
            else:
                part.write(b"<w:p><w:r><w:t>")
                left = inflated - len(head) - len(tail) - 30
                while left > 0:
                    part.write(b"A" * min(left, MiB))
                    left -= MiB
                part.write(b"</w:t></w:r></w:p>")
            part.write(tail)


CASES = {
    # name: (suffix, maker, sizes, unit of the size column)
    "nested-html": (".html", nested_html, [10_000, 20_000, 40_000, 80_000], "levels"),
    "no-space-txt": (".txt", no_space_text, [MiB, 2 * MiB, 4 * MiB, 8 * MiB], "bytes"),
    "table-md": (".md", table_md, [MiB, 2 * MiB, 4 * MiB, 8 * MiB], "bytes"),
    "table-html": (".html", table_html, [MiB, 2 * MiB, 4 * MiB, 8 * MiB], "bytes"),
    "docx-bomb": (".docx", docx, [32 * MiB, 64 * MiB, 128 * MiB, 256 * MiB], "inflated"),
    "small-docx": (".docx", lambda path, size: docx(path, None), [0], "bytes"),
}


# -- measuring -----------------------------------------------------------------------------------


def run_child(path: Path, embedder: str, code: Path) -> dict:
    """Ingest `path` in a fresh process running the ragspec in `code`; its result plus its peak
    RSS in MiB."""
    with tempfile.TemporaryDirectory() as index, tempfile.TemporaryFile() as err:
        env = {**os.environ, "PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1"}
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), index, embedder],
                                stdout=subprocess.PIPE, stderr=err, env=env, cwd=code)
        out = proc.stdout.read()
        # wait4 gives this child's own rusage (RUSAGE_CHILDREN would be the max over all).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"the child failed on {path.name}: {err.read().decode()[-2000:]}")
    result = json.loads(out)
    result["peak_rss_mib"] = usage.ru_maxrss / 1024  # Linux reports KiB
    return result


def measure(cases: list[str], args: argparse.Namespace, folder: Path) -> list[dict]:
    rows = []
    for case in cases:
        suffix, make, sizes, unit = CASES[case]
        previous = None
        for size in sizes[: args.steps]:
            path = folder / f"{case}-{size}{suffix}"
            make(path, size)
            runs = [run_child(path, args.embedder, args.code) for _ in range(args.repeats)]
            seconds = statistics.median(r["seconds"] for r in runs)
            cpu = statistics.median(r["cpu_seconds"] for r in runs)
            row = {
                "case": case, "size": size, "unit": unit, "file_bytes": path.stat().st_size,
                "seconds": seconds, "cpu_seconds": cpu,
                "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs),
                "passages": runs[0]["passages"], "failed": runs[0]["failed"],
                "cpu_ratio": cpu / previous if previous else None,
            }
            rows.append(row)
            print(_line(row), flush=True)
            path.unlink()
            previous = cpu
    return rows


def _line(row: dict) -> str:
    size = (f"{row['size'] / MiB:g} MiB" if row["unit"] in ("bytes", "inflated") and row["size"]
            else f"{row['size']:,} {row['unit']}" if row["size"] else "-")
    ratio = f"{row['cpu_ratio']:.2f}" if row["cpu_ratio"] else "-"
    outcome = f"failed: {row['failed'][:60]}" if row["failed"] else f"{row['passages']} passages"
    return (f"| {row['case']} | {size} | {row['file_bytes']:,} | {row['seconds']:.2f} | "
            f"{row['cpu_seconds']:.2f} | {ratio} | {row['peak_rss_mib']:.0f} | {outcome} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--embedder", choices=["null", "bundled"], default="null")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--steps", type=int, default=4, help="sizes per case (the first N)")
    parser.add_argument("--code", type=Path, default=REPO,
                        help="the ragspec checkout to measure (default: this one), e.g. an "
                             "older commit unpacked elsewhere, for a before/after comparison")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown or args.repeats < 1:
        parser.error(f"unknown cases {sorted(unknown)}" if unknown else "--repeats must be >= 1")
    print("| case | size | file bytes | wall s | CPU s | CPU ratio to previous size | "
          "peak RSS MiB | outcome |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        rows = measure(cases, args, Path(folder))
    bombs = [r["peak_rss_mib"] for r in rows if r["case"] == "docx-bomb"]
    baseline = [r["peak_rss_mib"] for r in rows if r["case"] == "small-docx"]
    if bombs and baseline:
        print(f"\ndocx bomb peak RSS minus small docx: {max(bombs) - baseline[0]:+.0f} MiB")
    record.add_run(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
