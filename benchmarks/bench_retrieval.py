"""Benchmark retrieval: ingestion throughput and search latency.

Usage:  PYTHONPATH=. python benchmarks/bench_retrieval.py [--queries 200] [--json out.json]

Measures, on this machine:
  1. ingestion of data/corpus end to end (load, split, embed with the bundled model, commit),
     and embedding throughput alone on passage-sized texts: passages per second;
  2. query embedding latency, and PassageStore.search latency without it (FAISS + LangChain
     docstore lookup), median over many queries, with 1k and 100k stored passages (synthetic
     unit vectors: the latency of exact search does not depend on what they mean); commit and
     open times. End-to-end search = the two added.
  3. raw FAISS IndexFlatIP latency for one query from 1k up to 1M vectors, and IVF / HNSW at
     the largest size, to show where exact search stops fitting a ~20 ms budget.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np

from benchmarks import record
from ragspec.retrieval.embeddings.embedder import Embedder
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.ingest import ingest_paths
from ragspec.retrieval.passages import PassageDraft

REPO = Path(__file__).resolve().parent.parent
THREADS = faiss.omp_get_max_threads()
QUERIES = [
    "which port does the metrics endpoint use", "how long are logs kept", "what is error E204",
    "how do I upgrade to version 3", "what happens when a job is cancelled",
    "how many retries by default", "where does the daemon keep its state",
    "how are namespaces weighted", "what exit status means the daemon is unreachable",
    "how do I back up the queue database",
]


def median_ms(fn, repeats: int) -> float:
    """Median wall-clock milliseconds of fn(i) over `repeats` calls."""
    return _medians(fn, repeats)[0]


def _medians(fn, repeats: int) -> tuple[float, float]:
    # CPU time as well as wall time: on a shared machine (other jobs running) wall time
    # includes waiting for a core; the CPU time of a single-threaded call does not.
    wall, cpu = [], []
    for i in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn(i)
        cpu.append((time.process_time() - c) * 1000)
        wall.append((time.perf_counter() - w) * 1000)
    return statistics.median(wall), statistics.median(cpu)


class CachedQueries:
    """Wraps an embedder so repeated queries skip the model: isolates index + lookup cost."""

    def __init__(self, embedder: Embedder) -> None:
        self._embedder, self._cache = embedder, {}
        self.name, self.dim = embedder.name, embedder.dim

    def embed_array(self, texts):
        key = tuple(texts)
        if key not in self._cache:
            self._cache[key] = self._embedder.embed_array(texts)
        return self._cache[key]


def unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((n, dim), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def bench_ingest(embedder: Embedder) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        store = PassageStore.open(tmp, embedder)
        start = time.perf_counter()
        report = ingest_paths([REPO / "data" / "corpus"], store)
        seconds = time.perf_counter() - start
        passages = [p.text for p in store.passages()]
    # Embedding alone, on passage-sized texts (the bulk of ingest time on a real folder).
    texts = (passages * (128 // len(passages) + 1))[:128]
    start, cpu = time.perf_counter(), time.process_time()
    embedder.embed_array(texts)
    embed_seconds, embed_cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "corpus_files": len(report.added), "corpus_passages": report.passages_added,
        "corpus_seconds": round(seconds, 2),
        "corpus_passages_per_s": round(report.passages_added / seconds, 1),
        "embed_only_passages": len(texts),
        "embed_only_passages_per_s": round(len(texts) / embed_seconds, 1),
        "embed_only_cpu_s_per_passage": round(embed_cpu / len(texts), 3),
    }


def synthetic_store(directory: str, embedder: Embedder, n: int, per_doc: int = 100) -> PassageStore:
    store = PassageStore.open(directory, embedder)
    vectors = unit_vectors(n, embedder.dim, seed=n)
    text = "Synthetic passage about job scheduling, retries and queue limits. " * 12
    with store.writing():
        for d in range(0, n, per_doc):
            drafts = [PassageDraft(text=text, page=None, start=0)] * min(per_doc, n - d)
            store.add_document(f"/synthetic/doc{d:07d}.txt", f"{d:064x}", len(text), drafts,
                               vectors[d : d + len(drafts)])
    return store


def bench_store(embedder: Embedder, n: int, queries: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        store = synthetic_store(tmp, embedder, n)
        build_commit_s = time.perf_counter() - start
        start = time.perf_counter()
        store = PassageStore.open(tmp, embedder)
        open_s = time.perf_counter() - start
        size_mb = sum(p.stat().st_size for p in Path(tmp).iterdir()) / 2**20
        store.embedder = CachedQueries(embedder)
        for q in QUERIES:
            store.search(q)  # fill the cache: what follows times FAISS + LangChain lookups
        faiss.omp_set_num_threads(1)  # one query at a time: one thread, no OpenMP spinning
        wall, cpu = _medians(lambda i: store.search(QUERIES[i % len(QUERIES)], k=4), queries)
        faiss.omp_set_num_threads(THREADS)
    return {
        "passages": n, "build_and_commit_s": round(build_commit_s, 2), "open_s": round(open_s, 2),
        "on_disk_mib": round(size_mb, 1),
        "search_without_embedding_ms_median": round(wall, 2),
        "search_without_embedding_cpu_ms_median": round(cpu, 2),
    }


def bench_query_embedding(embedder: Embedder, queries: int) -> dict:
    wall, cpu = _medians(lambda i: embedder.embed_array([QUERIES[i % len(QUERIES)]]), queries)
    return {"ms_median": round(wall, 2), "cpu_ms_median": round(cpu, 2),
            "torch_threads": __import__("torch").get_num_threads()}


def bench_faiss(sizes: list[int], approx_size: int, dim: int, queries: int) -> dict:
    q = unit_vectors(queries, dim, seed=1)
    flat = {}
    faiss.omp_set_num_threads(1)
    for n in sizes:
        index = faiss.IndexFlatIP(dim)
        index.add(unit_vectors(n, dim, seed=2))
        wall, cpu = _medians(lambda i, ix=index: ix.search(q[i : i + 1], 4), queries)
        flat[n] = {"ms": round(wall, 3), "cpu_ms": round(cpu, 3)}
        del index
    faiss.omp_set_num_threads(THREADS)
    # Approximate indexes need data with structure (real embeddings cluster by topic; random
    # vectors have no near neighbours to find): passages around 1000 topic centres, queries
    # close to one passage each.
    n = approx_size
    rng = np.random.default_rng(3)
    centres = unit_vectors(1000, dim, seed=4)
    base = centres[rng.integers(0, 1000, n)] + 0.08 * rng.standard_normal((n, dim), dtype=np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    q = base[rng.integers(0, n, queries)] + 0.03 * rng.standard_normal((queries, dim), dtype=np.float32)
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    exact = faiss.IndexFlatIP(dim)
    exact.add(base)
    _, truth = exact.search(q, 4)
    others = {}
    nlist = int(np.sqrt(n))
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
    start = time.perf_counter()
    ivf.train(base[: min(n, 40 * nlist)])
    ivf.add(base)
    build = time.perf_counter() - start
    for nprobe in (8, 32):
        ivf.nprobe = nprobe
        others[f"IVFFlat nlist={nlist} nprobe={nprobe}"] = _approx(ivf, q, truth, queries, build)
    hnsw = faiss.IndexHNSWFlat(dim, 16, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = 40
    start = time.perf_counter()
    hnsw.add(base)
    build = time.perf_counter() - start
    hnsw.hnsw.efSearch = 64
    others["HNSWFlat M=16 efSearch=64"] = _approx(hnsw, q, truth, queries, build)
    return {"flat_ms_median_by_size": flat, f"approximate_at_{n}": others}


def _approx(index, q, truth, queries, build_s) -> dict:
    faiss.omp_set_num_threads(1)
    ms = median_ms(lambda i: index.search(q[i : i + 1], 4), queries)
    faiss.omp_set_num_threads(THREADS)
    _, found = index.search(q, 4)
    recall = np.mean([len(set(a) & set(b)) / 4 for a, b in zip(found, truth, strict=True)])
    return {"ms_median": round(ms, 3), "recall_at_4": round(float(recall), 3),
            "build_s": round(build_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=100, help="queries per latency median")
    parser.add_argument("--faiss-sizes", default="1000,10000,100000,300000,1000000")
    parser.add_argument("--approx-size", type=int, default=100_000,
                        help="vectors for the IVF/HNSW comparison (HNSW builds slowly on 2 cores)")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args()
    results = {"cores": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    embedder = Embedder()
    embedder.embed_array(["warm up"])
    results["ingest"] = bench_ingest(embedder)
    print("ingest:", json.dumps(results["ingest"]), flush=True)
    results["query_embedding"] = bench_query_embedding(embedder, min(args.queries, 50))
    print("query embedding:", json.dumps(results["query_embedding"]), flush=True)
    results["store"] = [bench_store(embedder, n, args.queries) for n in (1_000, 100_000)]
    for row in results["store"]:
        print("store:", json.dumps(row), flush=True)
    sizes = [int(s) for s in args.faiss_sizes.split(",")]
    results["faiss"] = bench_faiss(sizes, args.approx_size, embedder.dim, args.queries)
    print("faiss:", json.dumps(results["faiss"]), flush=True)
    results["load_average_at_end"] = os.getloadavg()
    print("load average (1, 5, 15 min) at start / end:", results["load_average_at_start"],
          results["load_average_at_end"])
    record.add_run(args.json, results)


if __name__ == "__main__":
    main()
