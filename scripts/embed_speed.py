"""Passages per second of the bundled embedder, by the way passages are handed to it.

Cuts real PDFs (e.g. Debian's under /usr/share/doc) into passages as ingest does, then embeds
the first --passages of them with each variant, in interleaved rounds in one process (so every
variant sees the same load), and compares every variant's vectors with the first one's:

  chunks64-b32   what ingest did: calls of 64 passages in file order, batch size 32
  sorted-bN      all passages ordered by length first (shorter batches pad less), calls of 64,
                 batch size N, vectors put back in file order

    python scripts/embed_speed.py A.pdf [B.pdf ...] [--passages 512] [--rounds 3]
        [--threads 2] [--batches 16,32,64] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def passages(paths: list[str], embedder) -> list[str]:
    from ragspec.retrieval.loaders import load_file
    from ragspec.retrieval.passages import split_documents

    out: list[str] = []
    for path in paths:
        out += [d.text for d in split_documents(load_file(Path(path)), embedder)]
    return out


def in_chunks(embedder, texts: list[str], chunk: int = 64) -> np.ndarray:
    return np.concatenate([embedder.embed_array(texts[i : i + chunk])
                           for i in range(0, len(texts), chunk)])


def main(argv=None) -> int:
    import torch

    from ragspec.retrieval.embeddings import Embedder
    from ragspec.retrieval.ingest import embed_in_order

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pdfs", nargs="+")
    ap.add_argument("--passages", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="16,32,64")
    ap.add_argument("--json", dest="out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    embedder = Embedder()
    texts = passages(args.pdfs, embedder)[: args.passages]
    tokens = [embedder.count_tokens(t) for t in texts]
    variants = {"chunks64-b32": lambda: in_chunks(Embedder(batch_size=32), texts)}
    for size in map(int, args.batches.split(",")):
        def sorted_run(size=size):
            other = Embedder(batch_size=size)
            return embed_in_order(other, texts, lambda done, total: None)
        variants[f"sorted-b{size}"] = sorted_run
    in_chunks(embedder, texts[:64])  # load the weights and warm the kernels, untimed
    times: dict[str, list[float]] = {name: [] for name in variants}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(args.rounds):
        for name, run in variants.items():
            start = time.perf_counter()
            vectors[name] = run()
            times[name].append(time.perf_counter() - start)
    base = vectors["chunks64-b32"]
    report = {"passages": len(texts), "threads": args.threads,
              "tokens_median": statistics.median(tokens), "tokens_min": min(tokens),
              "variants": {}}
    for name in variants:
        v = vectors[name]
        median = statistics.median(times[name])
        report["variants"][name] = {
            "seconds_median": round(median, 2), "passages_per_s": round(len(texts) / median, 1),
            "max_abs_delta": float(np.abs(v - base).max()),
            "min_cosine": float((v * base).sum(axis=1).min())}
        print(name, report["variants"][name], flush=True)
    print(json.dumps(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
