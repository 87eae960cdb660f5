"""Passages per second of the bundled embedder: torch's forward against onnxruntime's.

Cuts real PDFs (e.g. Debian's under /usr/share/doc) into passages as ingest does, then embeds
the first --passages of them as ingest does (calls of 64 in order of length) with each variant,
in interleaved rounds in one process (so every variant sees the same load), and compares every
variant's vectors with the first one's. Wall seconds and CPU seconds (all threads of the
process) are both given: on a busy machine the CPU time is the steadier measure of the work.

  torch-bN   sentence-transformers' own forward (RAGSPEC_EMBEDDER_ONNX=0), batch size N
  onnx-bN    the transformer in onnxruntime (RAGSPEC_EMBEDDER_ONNX=1), batch N
  onnx8-bN   onnxruntime with the weights in int8 (onnx_embed's build="int8": dynamic, per
             output column; not an option of the product, measured only)
  torch8-bN  torch's dynamic int8 of every Linear layer, one scale per output column
             (torch.ao.quantization.quantize_dynamic; measured only)
  torchbf16-bN  the product's bf16 forward (RAGSPEC_EMBEDDER_DTYPE=bf16): the transformer
             under torch.autocast("cpu", bfloat16), matrix products in bf16 (oneDNN: AVX512_BF16
             or AMX where the CPU has them), pooling and normalisation in fp32

    python benchmarks/embed_speed.py A.pdf [B.pdf ...] [--passages 512] [--rounds 3]
        [--threads 2] [--batches 32] [--builds torch,onnx,onnx8,torch8,torchbf16] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import record


def passages(paths: list[str], embedder) -> list[str]:
    from ragspec.retrieval.passages import split_documents
    from ragspec.retrieval.readers.loaders import load_file

    out: list[str] = []
    for path in paths:
        out += [d.text for d in split_documents(load_file(Path(path)), embedder)]
    return out


def int8_encoder(embedder, threads: int | None = None):
    """An OnnxEncoder of the int8 build of `embedder`'s (the bundled) model."""
    from ragspec import paths
    from ragspec.retrieval.embeddings.embedder import bundled_model_dir
    from ragspec.retrieval.embeddings.onnx_model import OnnxEncoder

    return OnnxEncoder.load(embedder.model, bundled_model_dir(), paths.models_dir() / "embedders",
                            threads, build="int8")


def onnx8_embedder(threads: int):
    """The bundled embedder with its transformer in onnxruntime's int8 build."""
    from ragspec.retrieval.embeddings.embedder import Embedder

    embedder = Embedder(onnx=True)
    embedder._encoder = int8_encoder(embedder, threads)
    return embedder


def quantise_linear(model) -> None:
    """Replace the transformer of a loaded SentenceTransformer by torch's dynamic int8 of every
    Linear layer (one scale per output column)."""
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    first = model[0]
    spec = {name: per_channel_dynamic_qconfig for name, module in first.model.named_modules()
            if isinstance(module, torch.nn.Linear)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its notes on moving to torchao
        first.model = quantize_dynamic(first.model, spec, dtype=torch.qint8)


def torch8_embedder():
    """The bundled embedder with torch's dynamic int8 Linear layers."""
    from ragspec.retrieval.embeddings.embedder import Embedder

    embedder = Embedder(onnx=False, dtype="fp32")
    quantise_linear(embedder.model)
    return embedder


def main(argv=None) -> int:
    import torch

    from ragspec.retrieval.embeddings.embedder import Embedder
    from ragspec.retrieval.ingest import embed_in_order

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pdfs", nargs="+")
    ap.add_argument("--passages", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="32")
    ap.add_argument("--builds", default="torch,onnx")
    ap.add_argument("--json", dest="out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch_embedder = Embedder(onnx=False, dtype="fp32")
    makers = {"torch": lambda: torch_embedder, "onnx": lambda: Embedder(onnx=True),
              "onnx8": lambda: onnx8_embedder(args.threads), "torch8": torch8_embedder,
              "torchbf16": lambda: Embedder(onnx=False, dtype="bf16")}
    builds = {label: makers[label]() for label in args.builds.split(",")}
    if "onnx" in builds and builds["onnx"].backend != "onnxruntime":
        raise SystemExit("onnxruntime is not in use here (see the line above)")
    texts = passages(args.pdfs, torch_embedder)[: args.passages]
    tokens = [torch_embedder.count_tokens(t) for t in texts]
    variants = {}
    for size in map(int, args.batches.split(",")):
        for label, embedder in builds.items():
            def run(embedder=embedder, size=size):
                embedder.batch_size = size
                return embed_in_order(embedder, texts, lambda done, total: None)
            variants[f"{label}-b{size}"] = run
    for embedder in builds.values():  # warm each, untimed
        embedder.embed_array(texts[:16])
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(args.rounds):
        for name, run in variants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            vectors[name] = run()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    base = vectors[next(iter(variants))]
    report = {"passages": len(texts), "threads": args.threads,
              "loadavg_before": load_before,
              "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
              "tokens_median": statistics.median(tokens), "tokens_min": min(tokens),
              "variants": {}}
    for name in variants:
        v = vectors[name]
        median = statistics.median(times[name])
        report["variants"][name] = {
            "seconds_median": round(median, 2), "passages_per_s": round(len(texts) / median, 1),
            "cpu_seconds_median": round(statistics.median(cpu[name]), 2),
            "max_abs_delta": float(np.abs(v - base).max()),
            "min_cosine": float((v * base).sum(axis=1).min())}
        print(name, report["variants"][name], flush=True)
    print(json.dumps(report))
    record.add_run(args.out and Path(args.out), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
