"""Retrieval quality as a results file: `python -m ragspec.eval.retrieval`'s table, recorded.

The evaluation itself is the package's (`ragspec/eval/retrieval.py`: four question sets, recall
@1/3/5 of dense and hybrid search, the relevance floor chosen on the tuning sets and the
refusals at it); this script runs it with a chosen backend and embedder precision and appends
the summary (per set: passages, recall per mode, refusals, best-score medians, the lowest
answerable score; the floor) to a results file through benchmarks/record.py, so that the
pages quoting these figures link to one file naming the command, commit and machine. One run
per backend and precision; a series appends to the same file.

    PYTHONPATH=. python benchmarks/retrieval_recall.py [--backend faiss|milvus]
        [--dtype auto|fp32|bf16] [--work DIR] [--out docs/results/NAME.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import record
from ragspec.retrieval.embeddings import precision


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["faiss", "milvus"], default="faiss")
    ap.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto",
                    help="the embedder's precision (RAGSPEC_EMBEDDER_DTYPE); auto: what "
                         "ingest chooses on this CPU")
    ap.add_argument("--work", type=Path, default=None,
                    help="folder for the built real-document corpora (reused when there)")
    record.out_option(ap)
    args = ap.parse_args(argv)
    os.environ[precision.ENV_VAR] = args.dtype  # read when the embedder loads
    from ragspec.eval import retrieval

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="retrieval-recall-") as scratch:
        sets = retrieval.corpora(args.work or Path(scratch))
        results = [retrieval.evaluate_set(name, corpus, questions, args.backend)
                   for name, (corpus, questions) in sets.items()]
    floor = retrieval.choose_floor(results)
    table = retrieval.summarise(results, floor)
    retrieval.print_table(table, floor)
    record.add_run(args.out, {"backend": args.backend, "embedder_dtype": precision.choose(args.dtype, "cpu"),
                              "floor": floor, "table": table,
                              "seconds": round(time.perf_counter() - start, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
