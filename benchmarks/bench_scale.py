"""Search at scale: latency and memory of dense and hybrid search, keyword search alone, and
store-side ingest, at 10k / 100k / 1M passages, FAISS folder vs Milvus Lite.

Usage:
  PYTHONPATH=. python benchmarks/bench_scale.py texts --n 1000000 --out /tmp/scale-texts.jsonl
  PYTHONPATH=. python benchmarks/bench_scale.py vectors --texts /tmp/scale-texts.jsonl
  PYTHONPATH=. python benchmarks/bench_scale.py keywords --texts /tmp/scale-texts.jsonl \\
      --sizes 10000,100000,1000000 --repeats 3 [--baseline-ref main] --json OUT
  PYTHONPATH=. python benchmarks/bench_scale.py search --texts /tmp/scale-texts.jsonl \\
      --sizes 10000,100000,1000000 --backends faiss,milvus --repeats 3 --json OUT
  PYTHONPATH=. python benchmarks/bench_scale.py search --texts /tmp/scale-texts.jsonl \\
      --sizes 1000000 --backends milvus --keep /tmp/kept   # keep the index, then time it again:
  PYTHONPATH=. python benchmarks/bench_scale.py retime --texts /tmp/scale-texts.jsonl \\
      --index milvus:/tmp/kept/milvus-1000000/index.db --n 1000000 --json OUT
  PYTHONPATH=. python benchmarks/bench_scale.py finish --texts /tmp/scale-texts.jsonl \\
      --index milvus:/tmp/kept/milvus-1000000/index.db   # side files of an older kept index
  PYTHONPATH=. python benchmarks/bench_scale.py sameness --texts /tmp/scale-texts.jsonl \\
      --index milvus:/tmp/kept/milvus-1000000/index.db   # hits = Milvus' rows for their ids
  PYTHONPATH=. python benchmarks/bench_scale.py ingest --texts /tmp/scale-texts.jsonl \\
      --sizes 100000,1000000 --code .,/work/main --json OUT   # before/after, vectors given
  PYTHONPATH=. python benchmarks/bench_scale.py hybrid --texts /tmp/scale-texts.jsonl \
      --n 1000000 --repeats 3 [--keywords-file KW.npz] --json OUT   # the parts, no store

Inputs (documents nobody here wrote):
  * texts: passages cut from the documentation installed on this machine — every readable file
    under /usr/share/doc (changelogs, READMEs, copyright files, HTML) and the manual pages under
    /usr/share/man (troff requests and font escapes stripped) — ~150 words each, grouped 100 to a
    "document". When they hold fewer than n passages, the texts are cut again starting a few
    words later (each round a different offset), so every passage is still a distinct stretch
    of real text; the output says how many rounds it took.
  * vectors (the cheaper route than embedding a million passages on 2 cores): the bundled
    embedder embeds a sample of SAMPLE passages; passage i gets the normalised sum of two
    sample vectors (chosen by i) with random weights, plus small noise. Exact (FLAT) search
    costs the same whatever the vectors hold; the mixture keeps their distribution close to
    real ones for anything that is not exact.
  * queries: the questions of data/realdocs/dev and heldout, embedded by the bundled embedder;
    timings exclude embedding the query (measured once and printed separately).

Each (backend, size) runs in a fresh process: `peak_rss_mb` is that process's peak resident
memory (for Milvus Lite plus the peak of its server process), so sizes do not pollute each
other. Timings are wall-clock per query: p50 and p95 over every query and repeat. The machine
state matters: say whether it was idle when quoting a number.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import importlib.util
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import numpy as np

from benchmarks import record

REPO = Path(__file__).resolve().parent.parent
DOC_ROOTS = (Path("/usr/share/doc"), Path("/usr/share/man"))
WORDS_PER_PASSAGE = 150
PASSAGES_PER_DOC = 100
SAMPLE = 2000
K = 5
COMMIT_DOCS = 100  # `ragspec ingest`'s default --commit-every


# -- texts ------------------------------------------------------------------------------------

_TROFF_ESCAPE = re.compile(r"\\f[BIRP]|\\f\(..|\\\(..|\\[&|^%]|\\s[-+]?\d")


def _read(path: Path) -> str | None:
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if b"\0" in raw[:4096]:
        return None
    text = raw.decode("utf-8", errors="replace")
    if "/man" in str(path):
        lines = [ln for ln in text.splitlines() if not ln.startswith((".", "'"))]
        text = _TROFF_ESCAPE.sub("", "\n".join(lines)).replace("\\-", "-")
    return text


def doc_words() -> list[list[str]]:
    """The words of every readable documentation file, in a fixed order."""
    out = []
    for root in DOC_ROOTS:
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            text = _read(path)
            if text:
                words = text.split()
                if len(words) >= 20:
                    out.append(words)
    return out


@click.group()
def main() -> None:
    """Search-at-scale benchmarks (see the module docstring)."""


@main.command()
@click.option("--n", type=int, required=True, help="Passages to write.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
def texts(n: int, out: Path) -> None:
    """Passages cut from the installed documentation, as JSON lines {"doc", "text"}."""
    files = doc_words()
    written, rounds = 0, 0
    with open(out, "w", encoding="utf-8") as f:
        while written < n:
            offset = (rounds * 37) % WORDS_PER_PASSAGE
            for words in files:
                for start in range(offset, len(words), WORDS_PER_PASSAGE):
                    chunk = words[start : start + WORDS_PER_PASSAGE]
                    if len(chunk) < 10 or written >= n:
                        continue
                    f.write(json.dumps({"doc": written // PASSAGES_PER_DOC,
                                        "text": " ".join(chunk)}) + "\n")
                    written += 1
            rounds += 1
    click.echo(f"{written} passages from {len(files)} files in {rounds} round(s) -> {out}")


# -- vectors --------------------------------------------------------------------------------

def _vectors_path(texts_path: Path) -> Path:
    return texts_path.with_suffix(".vectors.npz")


@main.command()
@click.option("--texts", "texts_path", type=click.Path(exists=True, path_type=Path),
              required=True)
def vectors(texts_path: Path) -> None:
    """Embed SAMPLE passages and the question sets with the bundled embedder."""
    from ragspec.bench import realdocs
    from ragspec.retrieval.embeddings.embedder import Embedder

    embedder = Embedder()
    sample = []
    with open(texts_path, encoding="utf-8") as f:
        for line in f:
            sample.append(json.loads(line)["text"])
            if len(sample) >= SAMPLE * 5:
                break
    sample = sample[::5][:SAMPLE]
    questions = [q["question"] for name in ("dev", "heldout")
                 for q in realdocs.read_questions(name)]
    started = time.perf_counter()
    base = embedder.embed_array(sample)
    per_passage = (time.perf_counter() - started) / len(sample)
    timed = []
    for q in questions:
        t = time.perf_counter()
        embedder.embed_array([q])
        timed.append(time.perf_counter() - t)
    np.savez(_vectors_path(texts_path), base=base, queries=embedder.embed_array(questions),
             questions=np.array(questions))
    click.echo(f"embedded {len(sample)} passages ({per_passage * 1000:.1f} ms each) and "
               f"{len(questions)} questions (median {statistics.median(timed) * 1000:.1f} ms "
               f"each) -> {_vectors_path(texts_path)}")


def passage_vectors(base: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """n unit vectors, each a random mixture of two embedded sample passages plus noise."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, len(base), n), rng.integers(0, len(base), n)
    w = rng.uniform(0.2, 1.0, (n, 1)).astype(np.float32)
    out = base[a] + w * base[b] + rng.normal(0, 0.02, (n, base.shape[1])).astype(np.float32)
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out.astype(np.float32)


def peak_rss_mb(children: bool = False) -> float:
    """This process's peak RSS (and, with children, the largest peak of its live children:
    Milvus Lite's server)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if not children:
        return own
    import psutil

    extra = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            status = Path(f"/proc/{child.pid}/status").read_text()
            extra = max(extra, int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024)
        except (OSError, AttributeError):
            continue
    return own + extra


TIMING_LOCK = Path("/tmp/ragspec-timing.lock")


@contextlib.contextmanager
def timing(out: dict, key: str):
    """Hold the machine's timing lock (other sessions take it to time too) around the timed
    queries only, and record the load average when they start and end under out[key]."""
    with open(TIMING_LOCK, "a") as lock:
        waited = time.perf_counter()
        fcntl.flock(lock, fcntl.LOCK_EX)
        start_load = os.getloadavg()[0]
        out.setdefault(key, {})["lock_wait_s"] = round(time.perf_counter() - waited, 1)
        try:
            yield
        finally:
            out[key]["load_start"], out[key]["load_end"] = start_load, os.getloadavg()[0]
            fcntl.flock(lock, fcntl.LOCK_UN)


def percentiles(samples: list[float]) -> dict:
    ms = sorted(s * 1000 for s in samples)
    return {"p50_ms": round(statistics.median(ms), 3),
            "p95_ms": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 3),
            "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 3), "n": len(ms)}


# -- keyword search alone ---------------------------------------------------------------------

def _baseline_bm25(ref: str):
    """The BM25 module as it was at git `ref` (for before/after numbers)."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:ragspec/retrieval/bm25/index.py"],
                            capture_output=True, text=True, check=True).stdout
    folder = Path(tempfile.mkdtemp(prefix="bm25-baseline-"))
    (folder / "bm25_baseline.py").write_text(source)
    spec = importlib.util.spec_from_file_location("bm25_baseline", folder / "bm25_baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BM25Index


def iter_texts(path: Path, n: int):
    """The first n passages' texts, read as they are consumed (no list of a million dicts)."""
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= n:
                return
            yield json.loads(line)["text"]


def _keywords_child(texts_path: Path, n: int, impl: str, repeats: int, ref: str) -> dict:
    questions = [str(q) for q in np.load(_vectors_path(texts_path))["questions"]]
    before = peak_rss_mb()
    started = time.perf_counter()
    extra = {}
    if impl == "bm25s":
        import bm25s

        from ragspec.retrieval.bm25.index import tokenize

        index = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
        index.index([tokenize(t) for t in iter_texts(texts_path, n)], show_progress=False)

        def top(q):
            tokens = [t for t in tokenize(q) if t in index.vocab_dict]
            return index.retrieve([tokens], k=50, show_progress=False) if tokens else None
    else:
        cls = _baseline_bm25(ref) if impl == "baseline" else None
        if cls is None:
            from ragspec.retrieval.bm25.index import BM25Index as cls
        index = cls.build((str(i), t) for i, t in enumerate(iter_texts(texts_path, n)))

        def top(q):
            return index.top(q, 50)
    build = time.perf_counter() - started
    top(questions[0])  # first search seals pending postings: part of building
    build_total = time.perf_counter() - started
    timed = []
    exhaustive = []
    maxscore = []
    with timing(extra, "timing"):
        for _ in range(repeats):
            for q in questions:
                t = time.perf_counter()
                found = top(q)
                timed.append(time.perf_counter() - t)
                if impl == "ours":  # side by side: the reference scorer on the same index
                    t = time.perf_counter()
                    reference = index.top_exhaustive(q, 50)
                    exhaustive.append(time.perf_counter() - t)
                    extra["differ"] = extra.get("differ", 0) + (found != reference)
                    t = time.perf_counter()  # the list-level MaxScore it replaced, same index
                    pruned = index.top_maxscore(q, 50)
                    maxscore.append(time.perf_counter() - t)
                    extra["maxscore_differ"] = extra.get("maxscore_differ", 0) + \
                        (pruned != reference)
    if exhaustive:
        extra["exhaustive"] = percentiles(exhaustive)
        extra["maxscore"] = percentiles(maxscore)
    return {"impl": impl, "passages": n, "build_s": round(build, 2),
            "build_and_first_search_s": round(build_total, 2), **percentiles(timed), **extra,
            "peak_rss_mb": round(peak_rss_mb(), 1), "rss_before_build_mb": round(before, 1)}


@main.command()
@click.option("--texts", "texts_path", type=click.Path(exists=True, path_type=Path),
              required=True)
@click.option("--sizes", default="10000,100000", show_default=True)
@click.option("--impls", default="ours,baseline", show_default=True,
              help="ours (ragspec/retrieval/bm25/index.py now), baseline (the same file at "
                   "--baseline-ref), bm25s (if installed).")
@click.option("--baseline-ref", default="main", show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--child", hidden=True, default=None)
def keywords(texts_path, sizes, impls, baseline_ref, repeats, json_out, child) -> None:
    """BM25 top-50 latency, build time and memory per implementation and size."""
    if child:
        impl, n = child.split(":")
        click.echo(json.dumps(_keywords_child(texts_path, int(n), impl, repeats,
                                              baseline_ref)))
        return
    results = []
    for n in [int(s) for s in sizes.split(",")]:
        for impl in impls.split(","):
            results.append(_in_child(["keywords", "--texts", str(texts_path), "--repeats",
                                      str(repeats), "--baseline-ref", baseline_ref,
                                      "--child", f"{impl}:{n}"]))
            click.echo(json.dumps(results[-1]))
    if json_out:
        save(json_out, results)


def _in_child(args: list[str], code: Path = REPO) -> dict:
    """Run this script with `args` in a fresh process, importing ragspec from `code` (another
    checkout, for before/after numbers) and the scripts from here; its last line, as JSON."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], cwd=code,
                          stdout=subprocess.PIPE, text=True,  # stderr: the progress line
                          env={**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{REPO}"})
    if done.returncode != 0:
        raise click.ClickException(f"{args}: exit status {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the stores -----------------------------------------------------------------------------

class _Lookup:
    """Stands in for the embedder at search time: the questions' vectors were computed once,
    so the timings are the search's own."""

    name = "all-MiniLM-L6-v2 (bundled)"

    def __init__(self, questions, vectors) -> None:
        self._vectors = dict(zip(questions, vectors, strict=True))
        self.dim = vectors.shape[1]

    def embed_array(self, texts):
        return np.stack([self._vectors[t] for t in texts])


def _doc_vectors(base: np.ndarray, doc: int, count: int) -> np.ndarray:
    """The vectors of document `doc`'s passages (deterministic per document, so they can be
    made again for the exact search without holding a million of them)."""
    return passage_vectors(base, count, seed=doc + 1)


def _texts_by_doc(path: Path, n: int):
    """(document number, its passages' texts) for the first n passages, read as consumed."""
    doc, texts = 0, []
    for i, text in enumerate(iter_texts(path, n)):
        if i and i % PASSAGES_PER_DOC == 0:
            yield doc, texts
            doc, texts = doc + 1, []
        texts.append(text)
    if texts:
        yield doc, texts


class _Progress:
    """One stderr line per second: passages done, passages/s, time left."""

    def __init__(self, total: int, what: str) -> None:
        self.total, self.what = total, what
        self.started = self.shown = time.perf_counter()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.shown < 1 and done < self.total:
            return
        self.shown = now
        rate = done / max(now - self.started, 1e-9)
        left = (self.total - done) / rate if rate else float("inf")
        print(f"\r{self.what}: {done:,}/{self.total:,} passages, {rate:,.0f}/s, "
              f"{left:,.0f} s left", end="", file=sys.stderr, flush=True)


def _exact_top(base, n: int, queries: np.ndarray, k: int) -> list[list[tuple[int, int]]]:
    """Brute-force top k (doc, passage-in-doc) per query over the regenerated vectors."""
    best_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    best_ids = np.zeros((len(queries), k), dtype=np.int64)
    for doc in range((n + PASSAGES_PER_DOC - 1) // PASSAGES_PER_DOC):
        count = min(PASSAGES_PER_DOC, n - doc * PASSAGES_PER_DOC)
        scores = queries @ _doc_vectors(base, doc, count).T
        ids = doc * PASSAGES_PER_DOC + np.arange(count)
        both = np.concatenate([best_scores, scores], axis=1)
        both_ids = np.concatenate([best_ids, np.broadcast_to(ids, scores.shape)], axis=1)
        keep = np.argsort(-both, axis=1, kind="stable")[:, :k]
        best_scores = np.take_along_axis(both, keep, 1)
        best_ids = np.take_along_axis(both_ids, keep, 1)
    return [[divmod(int(i), PASSAGES_PER_DOC) for i in row] for row in best_ids]


def _pid(doc_id_for, doc: int, i: int) -> str:
    """The id the store gives passage i of document `doc` (store_base.add_document)."""
    return f"{doc_id_for(f'/scale/doc-{doc:07d}.txt')}-{f'{doc:064x}'[:8]}-{i:05d}"


def _search_child(texts_path: Path, n: int, backend: str, repeats: int,
                  keep: Path | None) -> dict:
    import gc
    import shutil

    from ragspec.retrieval.backends import open_index
    from ragspec.retrieval.passages import PassageDraft

    saved = np.load(_vectors_path(texts_path))
    questions = [str(q) for q in saved["questions"]]
    lookup = _Lookup(questions, saved["queries"])
    base = saved["base"]
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=False)
    scratch = keep or Path(tempfile.mkdtemp(prefix=f"scale-{backend}-"))
    where = str(scratch / "index") if backend == "faiss" else f"milvus:{scratch}/index.db"
    if backend == "milvus-ivf":  # approximate from the start: IVF_FLAT lists
        os.environ["RAGSPEC_MILVUS_INDEX"] = "IVF_FLAT"
    store = open_index(where, lookup)
    # Milvus commits as `ragspec ingest` does (every COMMIT_DOCS files); the FAISS folder once
    # at the end, as in the earlier rows of docs/changelog.md ("scaling measured on a loaded machine"), when each of its commits rewrote the
    # whole index (its commits append now: the `ingest` command measures them every COMMIT_DOCS).
    per_commit = COMMIT_DOCS if backend != "faiss" else n
    progress = _Progress(n, f"ingest {backend}")
    started, commits, done = time.perf_counter(), 0, 0
    docs = _texts_by_doc(texts_path, n)
    exhausted = False
    while not exhausted:
        with store.writing():
            for _ in range(per_commit):
                item = next(docs, None)
                if item is None:
                    exhausted = True
                    break
                doc, texts = item
                drafts = [PassageDraft(text=t, page=None, start=0) for t in texts]
                store.add_document(f"/scale/doc-{doc:07d}.txt", f"{doc:064x}", 1, drafts,
                                   _doc_vectors(base, doc, len(texts)))
                done += len(texts)
                progress.update(done)
        commits += 1
    ingest = time.perf_counter() - started
    print(file=sys.stderr)
    started = time.perf_counter()
    store.close()  # a Milvus writer brings its side files up to its last commit here
    closed = time.perf_counter() - started
    del store, docs
    gc.collect()
    started = time.perf_counter()
    store = open_index(where, lookup)
    opened = time.perf_counter() - started
    out = {"backend": backend, "passages": n, "ingest_s": round(ingest, 2),
           "ingest_passages_per_s": round(n / ingest, 1), "commits": commits,
           "close_s": round(closed, 2), "open_s": round(opened, 2), "rss_after_ingest_mb": round(peak_rss_mb(), 1)}
    _measure(store, saved, n, repeats, out, children=backend != "faiss")
    out["disk_mb"] = round(sum(p.stat().st_size for p in scratch.rglob("*") if p.is_file())
                           / 2**20, 1)
    store.close()
    if keep is None:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        out["index"] = where
    return out


def _measure(store, saved, n: int, repeats: int, out: dict, children: bool) -> None:
    """First searches (they build what is built lazily), then the timed dense and hybrid
    searches under the timing lock, recall@10 of dense search against a brute-force scan of
    the same vectors, and the peak RSS, into `out`."""
    from ragspec.retrieval.base import doc_id_for

    questions = [str(q) for q in saved["questions"]]
    for mode in ("dense", "hybrid"):
        started = time.perf_counter()
        store.retrieve(questions[0], k=K, mode=mode)  # warm: the first search builds / seals
        out[f"first_{mode}_s"] = round(time.perf_counter() - started, 2)
    with timing(out, "timing"):
        for mode in ("dense", "hybrid"):
            timed = []
            for _ in range(repeats):
                for q in questions:
                    t = time.perf_counter()
                    store.retrieve(q, k=K, mode=mode)
                    timed.append(time.perf_counter() - t)
            out[mode] = percentiles(timed)
    truth = _exact_top(saved["base"], n, saved["queries"], 10)
    hits = 0
    for q, expected in zip(questions, truth, strict=True):
        found = {h.passage.id for h in store.retrieve(q, k=10, mode="dense").hits}
        hits += sum(_pid(doc_id_for, d, i) in found for d, i in expected)
    out["recall_at_10"] = round(hits / (10 * len(questions)), 4)
    out["peak_rss_mb"] = round(peak_rss_mb(children=children), 1)


@main.command()
@click.option("--texts", "texts_path", type=click.Path(exists=True, path_type=Path),
              required=True)
@click.option("--sizes", default="10000", show_default=True)
@click.option("--backends", "names", default="faiss,milvus", show_default=True,
              help="faiss, milvus (exact FLAT) and milvus-ivf (IVF_FLAT, approximate).")
@click.option("--repeats", default=3, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Build each index in KEEP/<backend>-<n> (new folders) and keep it, for "
                   "`retime`; by default the indexes are deleted after measuring.")
@click.option("--child", hidden=True, default=None)
def search(texts_path, sizes, names, repeats, json_out, keep, child) -> None:
    """Store-side ingest, open, and dense/hybrid search latency and memory per backend."""
    if child:
        backend, n = child.split(":")
        where = keep / f"{backend}-{n}" if keep is not None else None
        click.echo(json.dumps(_search_child(texts_path, int(n), backend, repeats, where)))
        return
    results = []
    for n in [int(s) for s in sizes.split(",")]:
        for backend in names.split(","):
            results.append(_in_child(["search", "--texts", str(texts_path), "--repeats",
                                      str(repeats), "--child", f"{backend}:{n}",
                                      *(["--keep", str(keep)] if keep is not None else [])]))
            click.echo(json.dumps(results[-1]))
    if json_out:
        save(json_out, results)


def _kept_milvus(command):
    """The --texts and --index options of the commands that work on a kept Milvus Lite index."""
    command = click.option("--index", "where", required=True,
                           help="A Milvus Lite index `search --keep` left (its `index` field).")(
        command)
    return click.option("--texts", "texts_path", type=click.Path(exists=True, path_type=Path),
                        required=True)(command)


@main.command()
@_kept_milvus
def finish(texts_path, where) -> None:
    """Open a kept Milvus index and bring its side files up to its last commit, as a writer's
    close does (an index kept before writers did that): the time to open (catching up from
    Milvus) and to finish, and the peak RSS."""
    from ragspec.retrieval.backends import open_index

    saved = np.load(_vectors_path(texts_path))
    lookup = _Lookup([str(q) for q in saved["questions"]], saved["queries"])
    started = time.perf_counter()
    store = open_index(where, lookup)
    out = {"index": where, "open_s": round(time.perf_counter() - started, 2),
           "stale": {k: c.stale for k, c in store._copies.files().items()}}
    started = time.perf_counter()
    store.finish()
    out["finish_s"] = round(time.perf_counter() - started, 2)
    out["files"] = {k: c.file for k, c in store._copies.files().items()}
    store.close()
    out["peak_rss_mb"] = round(peak_rss_mb(children=True), 1)
    click.echo(json.dumps(out))


@main.command()
@_kept_milvus
def sameness(texts_path, where) -> None:
    """Every question's hits (dense and hybrid, k = 5 and 50), as a search returns them (on
    Milvus Lite from the records file beside it), against the same ids' rows read from Milvus
    by row key: how many searches give exactly Milvus' passages."""
    from ragspec.retrieval.backends import open_index

    saved = np.load(_vectors_path(texts_path))
    questions = [str(q) for q in saved["questions"]]
    store = open_index(where, _Lookup(questions, saved["queries"]))
    fields = ["pid", "doc_id", "page", "start", "text"]
    same = searches = 0
    for mode in ("dense", "hybrid"):
        for k in (K, 50):
            for q in questions:
                hits = store.retrieve(q, k=k, mode=mode).hits
                rows = store._by_key([h.passage.id for h in hits], fields)
                searches += 1
                same += [h.passage for h in hits] == [
                    store._passage(rows[h.passage.id]) if h.passage.id in rows else None
                    for h in hits]
    store.close()
    click.echo(json.dumps({"index": where, "searches": searches, "same_as_milvus": same}))


@main.command()
@click.option("--texts", "texts_path", type=click.Path(exists=True, path_type=Path),
              required=True)
@click.option("--index", "where", required=True,
              help="An index `search --keep` left (its `index` field).")
@click.option("--n", type=int, required=True, help="The passages it holds (for recall).")
@click.option("--repeats", default=3, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
def retime(texts_path, where, n, repeats, json_out) -> None:
    """Open a kept index again and measure its searches as `search` does (RAGSPEC_DENSE=exact
    in the environment times exact dense search)."""
    from ragspec.retrieval.backends import open_index

    saved = np.load(_vectors_path(texts_path))
    lookup = _Lookup([str(q) for q in saved["questions"]], saved["queries"])
    started = time.perf_counter()
    store = open_index(where, lookup)
    out = {"index": where, "passages": n, "dense_mode": os.environ.get("RAGSPEC_DENSE", "auto"),
           "open_s": round(time.perf_counter() - started, 2)}
    if store.passage_count() != n:
        raise click.ClickException(f"{where} holds {store.passage_count():,} passages, not {n:,}")
    _measure(store, saved, n, repeats, out, children=where.startswith("milvus:"))
    store.close()
    click.echo(json.dumps(out))
    if json_out:
        save(json_out, out)


def _dense_child(texts_path: Path, n: int, repeats: int) -> dict:
    """The FAISS folder store's dense search alone (faiss_ann.py) over n vectors: build, latency
    approximate vs exact, recall@10 against exact."""
    import faiss

    from ragspec.retrieval.faiss.ann import ApproxIndex

    saved = np.load(_vectors_path(texts_path))
    base, queries = saved["base"], saved["queries"].astype(np.float32)
    out: dict = {"component": "faiss-dense", "passages": n}
    started = time.perf_counter()
    flat = faiss.IndexFlatIP(base.shape[1])
    for doc in range((n + PASSAGES_PER_DOC - 1) // PASSAGES_PER_DOC):
        flat.add(_doc_vectors(base, doc, min(PASSAGES_PER_DOC, n - doc * PASSAGES_PER_DOC)))
    out["flat_add_s"] = round(time.perf_counter() - started, 2)
    approx = ApproxIndex()
    started = time.perf_counter()
    approx.search(flat, queries[0], K)  # trains the lists and fills them
    out["approx_build_s"] = round(time.perf_counter() - started, 2)
    with timing(out, "timing"):
        for name, search in (
                ("approx_k5", lambda q: approx.search(flat, q, K)),
                ("approx_k50", lambda q: approx.search(flat, q, 50)),
                ("exact_k5", lambda q: flat.search(q.reshape(1, -1), K))):
            timed = []
            for _ in range(repeats if name != "exact_k5" else 1):
                for q in queries:
                    t = time.perf_counter()
                    search(q)
                    timed.append(time.perf_counter() - t)
            out[name] = percentiles(timed)
    _, exact = flat.search(queries, 10)
    found = [{row for row, _ in approx.search(flat, q, 10)} for q in queries]
    out["recall_at_10"] = round(float(np.mean(
        [len(f & set(e.tolist())) / 10 for f, e in zip(found, exact, strict=True)])), 4)
    out["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return out


@main.command()
@click.option("--texts", "texts_path", type=click.Path(exists=True, path_type=Path),
              required=True)
@click.option("--n", type=int, default=1_000_000, show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
def dense(texts_path, n, repeats, json_out) -> None:
    """Dense search alone at n passages: the approximate FAISS index against exact search."""
    result = _dense_child(texts_path, n, repeats)
    click.echo(json.dumps(result))
    if json_out:
        save(json_out, [result])


def _hybrid_child(texts_path: Path, n: int, repeats: int, shares: list[float],
                  keywords_file: Path | None = None) -> dict:
    """The FAISS folder's two searches and their fusion without the store around them: the
    approximate dense index (faiss_ann.py) over n vectors, ragspec's BM25 over the n texts, and
    reciprocal-rank fusion of their top HYBRID_DEPTH (store_base.py's hybrid mode). Passage i's
    text and vector are the i-th of the inputs, so both rankings name rows alike."""
    import faiss

    from ragspec.retrieval.base import HYBRID_DEPTH
    from ragspec.retrieval.bm25 import native as bm25_native
    from ragspec.retrieval.bm25.index import BM25Index
    from ragspec.retrieval.faiss.ann import PROBED_LISTS, ApproxIndex
    from ragspec.retrieval.fusion import fuse

    saved = np.load(_vectors_path(texts_path))
    base, queries = saved["base"], saved["queries"].astype(np.float32)
    questions = [str(q) for q in saved["questions"]]
    out: dict = {"component": "hybrid", "passages": n}
    started = time.perf_counter()
    flat = faiss.IndexFlatIP(base.shape[1])
    for doc in range((n + PASSAGES_PER_DOC - 1) // PASSAGES_PER_DOC):
        flat.add(_doc_vectors(base, doc, min(PASSAGES_PER_DOC, n - doc * PASSAGES_PER_DOC)))
    out["flat_add_s"] = round(time.perf_counter() - started, 2)
    approx = ApproxIndex()
    started = time.perf_counter()
    approx.search(flat, queries[0], K)  # trains the lists and fills them
    out["approx_build_s"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    if keywords_file is not None and keywords_file.exists():  # saved by an earlier run
        index = BM25Index.from_bytes(keywords_file.read_bytes(), [str(i) for i in range(n)])
        out["bm25_read_s"] = round(time.perf_counter() - started, 2)
    else:
        index = BM25Index.build((str(i), t) for i, t in enumerate(iter_texts(texts_path, n)))
        index.top(questions[0], HYBRID_DEPTH)  # the first search seals the pending postings
        out["bm25_build_s"] = round(time.perf_counter() - started, 2)
        if keywords_file is not None:
            keywords_file.write_bytes(index.to_bytes([str(i) for i in range(n)]))
    index.top(questions[0], HYBRID_DEPTH)
    out["peak_rss_after_build_mb"] = round(peak_rss_mb(), 1)
    _, exact = flat.search(queries, 10)
    exact_sets = [set(e.tolist()) for e in exact]

    def recall() -> float:
        found = [{row for row, _ in approx.search(flat, q, 10)} for q in queries]
        return round(float(np.mean([len(f & e) / 10 for f, e in
                                    zip(found, exact_sets, strict=True)])), 4)

    sweep = []
    for share in shares:  # one pass each: recall@10 and k = 5 latency per share of lists probed
        approx.set_probe_share(share)
        timed, cpu = [], []
        for q in queries:
            t, c = time.perf_counter(), time.process_time()
            approx.search(flat, q, K)
            cpu.append(time.process_time() - c)
            timed.append(time.perf_counter() - t)
        sweep.append({"probe_share": share, "recall_at_10": recall(), **percentiles(timed),
                      "cpu": percentiles(cpu)})
    out["sweep"] = sweep
    approx.set_probe_share(None)  # the default: PROBED_LISTS lists
    out["probed_lists"] = PROBED_LISTS
    out["recall_at_10"] = recall()
    native = bm25_native.scorer()
    dense_t, keyword_t, hybrid_t, visited = [], [], [], []
    cpu: dict[str, list[float]] = {"dense_k5": [], "keywords_top50": [], "hybrid_k5": []}
    differ = 0
    with timing(out, "timing"):
        for repeat in range(repeats):
            for q, vector in zip(questions, queries, strict=True):
                t, c = time.perf_counter(), time.process_time()
                approx.search(flat, vector, K)
                cpu["dense_k5"].append(time.process_time() - c)
                dense_t.append(time.perf_counter() - t)
                t, c = time.perf_counter(), time.process_time()
                dense = approx.search(flat, vector, HYBRID_DEPTH)
                keywords = index.top(q, HYBRID_DEPTH)
                fuse([[str(row) for row, _ in dense], [pid for pid, _ in keywords]], K)
                cpu["hybrid_k5"].append(time.process_time() - c)
                hybrid_t.append(time.perf_counter() - t)
                t, c = time.perf_counter(), time.process_time()
                found = index.top(q, HYBRID_DEPTH)
                cpu["keywords_top50"].append(time.process_time() - c)
                keyword_t.append(time.perf_counter() - t)
                if native is not None:
                    visited.append(native.visited)
                if repeat == 0:  # the exhaustive numpy scorer once: the answers must be its
                    differ += found != index.top_exhaustive(q, HYBRID_DEPTH)
    out["dense_k5"] = percentiles(dense_t)
    out["keywords_top50"] = percentiles(keyword_t)
    out["hybrid_k5"] = percentiles(hybrid_t)
    out["cpu"] = {name: percentiles(values) for name, values in cpu.items()}
    out["keywords_differ_from_exhaustive"] = f"{differ} of {len(questions)}"
    if visited:
        out["postings_read_median"] = int(statistics.median(visited))
    out["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return out


@main.command()
@click.option("--texts", "texts_path", type=click.Path(exists=True, path_type=Path),
              required=True)
@click.option("--n", type=int, default=1_000_000, show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--shares", default="0.05,0.1,0.2,0.35", show_default=True,
              help="Shares of the IVF lists to probe in the recall/latency sweep.")
@click.option("--keywords-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Read the keyword index from this file when it exists (BM25Index.to_bytes "
                   "of these n passages, ids 0..n-1); else build it and save it there.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
def hybrid(texts_path, n, repeats, shares, keywords_file, json_out) -> None:
    """Hybrid search's parts at n passages (approximate FAISS + BM25 + fusion, no store).
    Wall-clock and CPU time (this process, all threads) per query: on a shared machine the
    CPU time is the one that does not count waiting for a core."""
    result = _hybrid_child(texts_path, n, repeats, [float(x) for x in shares.split(",")],
                           keywords_file)
    click.echo(json.dumps(result))
    if json_out:
        save(json_out, [result])


# -- ingest alone ------------------------------------------------------------------------------

class _Timer:
    """Wraps methods to add the seconds spent inside them (outermost calls only) to a total."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self._depth: dict[str, int] = {}

    def wrap(self, owner, name: str, key: str) -> None:
        real = getattr(owner, name)
        totals, depth = self.totals, self._depth
        totals.setdefault(key, 0.0)

        def timed(*args, **kwargs):
            if depth.get(key):
                return real(*args, **kwargs)
            depth[key] = 1
            started = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                totals[key] += time.perf_counter() - started
                depth[key] = 0

        setattr(owner, name, timed)


def _ingest_child(texts_path: Path, n: int) -> dict:
    import faiss

    import ragspec
    from ragspec.retrieval.bm25 import index as bm25
    from ragspec.retrieval.faiss import store
    from ragspec.retrieval.passages import PassageDraft

    saved = np.load(_vectors_path(texts_path))
    base = saved["base"]

    class Given:  # the embedder, never called: the vectors come with the passages
        name = "all-MiniLM-L6-v2 (bundled)"
        dim = base.shape[1]

        def embed_array(self, texts):
            raise AssertionError("the benchmark gives the vectors")

    timer = _Timer()
    timer.wrap(bm25.BM25Index, "add_many", "keywords")
    timer.wrap(faiss.IndexFlatIP, "add", "faiss_add")
    timer.wrap(store.PassageStore, "add_document", "add_document")
    timer.wrap(store.PassageStore, "_save", "commit")
    scratch = Path(tempfile.mkdtemp(prefix="bench-ingest-", dir=os.environ.get("BENCH_TMP")))
    folder = scratch / "index"
    index = store.PassageStore.open(folder, Given())
    load_start = os.getloadavg()
    progress = _Progress(n, "ingest")
    outside = outside_cpu = 0.0  # reading texts and making vectors: not the store's work
    done = commits = 0
    started, cpu = time.perf_counter(), time.process_time()
    docs = _texts_by_doc(texts_path, n)
    exhausted = False
    while not exhausted:
        with index.writing():
            for _ in range(COMMIT_DOCS):
                t, c = time.perf_counter(), time.process_time()
                item = next(docs, None)
                if item is None:
                    exhausted = True
                    break
                doc, texts = item
                drafts = [PassageDraft(text=x, page=None, start=0) for x in texts]
                vectors = _doc_vectors(base, doc, len(texts))
                outside += time.perf_counter() - t
                outside_cpu += time.process_time() - c
                index.add_document(f"/scale/doc-{doc:07d}.txt", f"{doc:064x}", 1, drafts,
                                   vectors)
                done += len(texts)
                progress.update(done)
        commits += 1
    wall = time.perf_counter() - started - outside
    cpu = time.process_time() - cpu - outside_cpu
    print(file=sys.stderr)
    t = timer.totals
    split = {"keywords_s": t["keywords"], "faiss_add_s": t["faiss_add"],
             "records_s": t["add_document"] - t["keywords"] - t["faiss_add"],
             "commit_s": t["commit"]}
    disk = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    out = {"ragspec": str(Path(ragspec.__file__).parent), "passages": n, "store_s": round(wall, 2), "passages_per_s": round(n / wall, 1),
           "cpu_s": round(cpu, 2), "passages_per_cpu_s": round(n / cpu, 1),
           **{k: round(v, 2) for k, v in split.items()},
           "other_s": round(wall - sum(split.values()), 2),
           "outside_s (texts + vectors, not counted)": round(outside, 2),
           "commits": commits, "peak_rss_mb": round(peak_rss_mb(), 1),
           "disk_mb": round(disk / 2**20, 1), "files": sorted(p.name for p in folder.iterdir()),
           "load_start": load_start, "load_end": os.getloadavg()}
    t = time.perf_counter()
    reopened = store.PassageStore.open(folder, Given())
    out["open_s"] = round(time.perf_counter() - t, 2)
    out["reopened_passages"] = reopened.passage_count()
    return out


@main.command()
@click.option("--texts", "texts_path", type=click.Path(exists=True, path_type=Path),
              required=True)
@click.option("--sizes", default="100000", show_default=True)
@click.option("--code", default=".", show_default=True,
              help="Checkouts to import ragspec from, comma-separated (e.g. .,/work/main): "
                   "before and after side by side, one fresh process each.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--child", hidden=True, default=None)
def ingest(texts_path, sizes, code, json_out, child) -> None:
    """Store-side ingest into the FAISS folder, vectors given: passages/s, the time split
    (keywords, FAISS add, records, commit), peak RSS, disk, load (see _ingest_child)."""
    if child:
        click.echo(json.dumps(_ingest_child(texts_path, int(child))))
        return
    results = []
    for n in [int(s) for s in sizes.split(",")]:
        for folder in code.split(","):
            where = Path(folder) if Path(folder).is_absolute() else (REPO / folder).resolve()
            head = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True).stdout.strip()
            results.append({"code": str(where), "commit": head, **_in_child(
                ["ingest", "--texts", str(texts_path), "--child", str(n)], where)})
            click.echo(json.dumps(results[-1]))
    if json_out:
        save(json_out, results)


def save(json_out: Path, rows: list | dict) -> None:
    """Append `rows` as one run of the results file `json_out` (benchmarks/record.py: the
    command, commit and machine beside them)."""
    record.add_run(json_out, {"rows": rows})


def saved_rows(path: Path) -> list:
    """The rows of a file `save` wrote (every run's), or of an older plain JSON list."""
    data = json.loads(path.read_text())
    if isinstance(data, dict) and "runs" in data:
        rows = [run["result"]["rows"] for run in data["runs"]]
        return [r for rs in rows for r in (rs if isinstance(rs, list) else [rs])]
    return data


@main.command()
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def table(files) -> None:
    """Markdown tables from the JSON files `search` and `keywords` wrote."""
    rows = [r for f in files for r in saved_rows(f)]
    stores = sorted((r for r in rows if "backend" in r),
                    key=lambda r: (r["passages"], r["backend"]))

    def ms(d: dict) -> str:
        return f"{d['p50_ms']:.1f} / {d['p95_ms']:.1f} / {d['p99_ms']:.1f}"

    def load(r: dict) -> str:
        t = r.get("timing", {})
        return f"{t['load_start']:.0f}-{t['load_end']:.0f}" if t else "?"

    if stores:
        click.echo("| passages | backend | dense p50 / p95 / p99 ms | hybrid p50 / p95 / p99 ms | "
                   "recall@10 | ingest passages/s (commits) | open s | peak RSS MiB | load |")
        click.echo("|---|---|---|---|---|---|---|---|---|")
        for r in stores:
            click.echo(f"| {r['passages']:,} | {r['backend']} | {ms(r['dense'])} | "
                       f"{ms(r['hybrid'])} | {r.get('recall_at_10', float('nan')):.3f} | "
                       f"{r['ingest_passages_per_s']:,.0f} ({r['commits']}) | {r['open_s']:.1f} "
                       f"| {r['peak_rss_mb']:,.0f} | {load(r)} |")
    for r in (r for r in rows if r.get("component") == "faiss-dense"):
        click.echo(f"\n| passages | approximate k=5 p50 / p95 / p99 ms | k=50 | exact k=5 | "
                   f"recall@10 | build s | peak RSS MiB | load |\n|---|---|---|---|---|---|---|---|"
                   f"\n| {r['passages']:,} | {ms(r['approx_k5'])} | {ms(r['approx_k50'])} | "
                   f"{ms(r['exact_k5'])} | {r['recall_at_10']:.3f} | {r['approx_build_s']:.0f} | "
                   f"{r['peak_rss_mb']:,.0f} | {load(r)} |")
    keywords = sorted((r for r in rows if "impl" in r), key=lambda r: (r["passages"], r["impl"]))
    if keywords:
        click.echo("\n| passages | BM25 | top-50 p50 / p95 / p99 ms | exhaustive, same run | "
                   "differ | build s | peak RSS MiB | load |")
        click.echo("|---|---|---|---|---|---|---|---|")
        for r in keywords:
            ex = ms(r["exhaustive"]) if "exhaustive" in r else "—"
            click.echo(f"| {r['passages']:,} | {r['impl']} | {ms(r)} | {ex} | "
                       f"{r.get('differ', '—')} | {r['build_and_first_search_s']:.1f} | "
                       f"{r['peak_rss_mb']:,.0f} | {load(r)} |")


if __name__ == "__main__":
    main()
