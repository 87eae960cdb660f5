"""Make (or reuse) the bundled embedder's ONNX file and say whether onnxruntime pays on this machine.

Loads all-MiniLM-L6-v2 from its package folder, exports its transformer with torch.onnx into
--cache (default: the model cache the product uses, $RAGSPEC_HOME/models/embedders; no network),
prints the file, the once-per-machine speed measurement the embedder decides by (CPU time of
torch's forward over onnxruntime's on a fixed batch), and, given a PDF, how far the two engines'
vectors of its first --passages passages are apart. For timings on real passages in rounds, see
benchmarks/embed_speed.py.

    python benchmarks/embed_onnx.py [/usr/share/doc/libtasn1-doc/libtasn1.pdf] [--passages 64]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ragspec import paths
    from ragspec.retrieval.embeddings.embedder import MIN_SPEEDUP, Embedder, bundled_model_dir
    from ragspec.retrieval.embeddings.onnx_model import OnnxEncoder
    from ragspec.retrieval.ingest import embed_in_order

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pdf", nargs="?")
    ap.add_argument("--passages", type=int, default=64)
    ap.add_argument("--cache", type=Path, default=None)
    args = ap.parse_args(argv)
    embedder = Embedder(onnx=False, dtype="fp32")
    cache = args.cache or paths.models_dir() / "embedders"
    encoder = OnnxEncoder.load(embedder.model, bundled_model_dir(), cache)
    speedup = encoder.speedup()
    out = {"onnx_file": str(encoder.path), "mib": encoder.path.stat().st_size / 2**20,
           "threads": encoder.threads, "speedup_cpu": round(speedup, 3),
           "default_backend": "onnxruntime" if speedup >= MIN_SPEEDUP else "sentence-transformers"}
    if args.pdf:
        from ragspec.retrieval.passages import split_documents
        from ragspec.retrieval.readers.loaders import load_file

        drafts = split_documents(load_file(Path(args.pdf)), embedder)
        texts = [d.text for d in drafts][: args.passages]
        want = embed_in_order(embedder, texts, lambda done, total: None)
        got = encoder.encode(texts)
        out.update(passages=len(texts), max_abs_delta=float(np.abs(got - want).max()),
                   min_cosine=float((got * want).sum(axis=1).min()))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
