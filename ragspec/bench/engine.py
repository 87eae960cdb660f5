"""The engine benchmark behind `ragspec bench-engine`: this machine's limits, and what a forward
costs ragspec and the llama.cpp family on the same GGUF files at real model shapes.

Engines: ragspec (packed weights, its kernels), llamacpp (llama-cpp-python, when installed), and
the native builds of `make bench-anchors`: llama.cpp (mainline) and ik_llama.cpp (run-time
repacking on), measured through their anchor-probe (ragspec.bench.anchors.native) with the same
definitions of prefill, c(k) and memory.

Contract: `machine_limits()` measures memory bandwidth (reading a 1 GiB buffer; copying one) and
peak fp32 GEMM FLOP/s, with one thread and with every core. `measure_file(...)` runs one engine
on one GGUF file in a subprocess of its own (a clean resident-memory reading, no two thread
pools at once) and returns: load seconds, resident memory after a first forward, prefill of
`context` tokens, and c(k) — one forward over k new tokens after `context` cached ones, with
logits for every one of the k positions (what a verify needs), k = 1..max_tokens, each size
timed once per round in a shuffled order, the low quantile kept (ragspec.decoding.calibrate's
method, for both engines). Resident memory is what loading the model and a first forward added
to the process. `roofline(...)` is the bound no engine can beat: max(bytes of
weights streamed / bandwidth, 2 · multiply-accumulates · k / peak FLOP/s).

Shapes are random-weight models (ragspec.bench.shapes): costs, not answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ENGINES = ("ragspec", "llama.cpp", "ik_llama.cpp", "llamacpp")


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def machine_limits(repeats: int = 5) -> dict:
    """Bandwidth (GB/s) and peak fp32 GEMM (GFLOP/s), with 1 thread and with every core."""
    cores = len(os.sched_getaffinity(0))
    before = torch.get_num_threads()
    buffer = torch.ones(1 << 28, dtype=torch.float32)  # 1 GiB
    target = torch.empty_like(buffer)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    out = {"cores": cores, "cpu": _cpu_name()}
    try:
        for threads in sorted({1, cores}):
            torch.set_num_threads(threads)
            read = _best(lambda: buffer.sum(), repeats)
            copy = _best(lambda: target.copy_(buffer), repeats)
            gemm = _best(lambda: torch.mm(a, b), repeats)
            out[f"t{threads}"] = {"read_gb_s": buffer.nbytes / read / 1e9,
                                  "copy_gb_s": 2 * buffer.nbytes / copy / 1e9,
                                  "gemm_gflop_s": 2 * 2048**3 / gemm / 1e9}
    finally:
        torch.set_num_threads(before)
    return out


def _cpu_name() -> str:
    from ragspec.bench.anchors.llama_build import cpu_flags, cpu_name

    name, flags = cpu_name(), cpu_flags() or set()
    sets = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile")
            if f in flags]
    return f"{name} ({', '.join(sets)})" if name else "unknown CPU"


def roofline(weight_bytes: int, macs: int, k: int, limits: dict) -> float:
    """Seconds below which no forward over k tokens can run on this machine."""
    best = limits[f"t{limits['cores']}"]
    return max(weight_bytes / (best["read_gb_s"] * 1e9), 2 * macs * k / (best["gemm_gflop_s"] * 1e9))


# -- one engine on one file, in a subprocess ------------------------------------------------------

def measure_file(engine: str, gguf: Path, shape: str, mix: str, context: int, max_tokens: int,
                 rounds: int, threads: int, kernels_dir: str | None = None,
                 timeout: float = 3600) -> dict:
    """See the module docstring; raises RuntimeError with the child's last words on failure."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    from ragspec.bench.anchors import native as native_anchors

    if engine in native_anchors.NATIVE_ENGINES:  # a native process of its own already
        return native_anchors.measure(engine, gguf, context, max_tokens, rounds, threads)
    args = json.dumps({"engine": engine, "gguf": str(gguf), "shape": shape, "mix": mix,
                       "context": context,
                       "max_tokens": max_tokens, "rounds": rounds, "threads": threads})
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if kernels_dir:
        env["RAGSPEC_KERNELS_DIR"] = kernels_dir
    proc = subprocess.run([sys.executable, "-m", "ragspec.bench.engine", args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise RuntimeError(f"{engine} on {gguf.name}: " + (proc.stderr.strip().splitlines() or
                                                         ["no output"])[-1][:300])
    return json.loads(lines[-1])


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _timed_rounds(step, sizes: int, rounds: int) -> list[float]:
    """Low-quantile seconds of step(n) for n = 1..sizes, interleaved rounds (calibrate's method)."""
    from ragspec.decoding.calibrate import QUANTILE, interleaved, quantile

    samples = interleaved(list(range(1, sizes + 1)), step, rounds)
    return [quantile(samples[n], QUANTILE) for n in range(1, sizes + 1)]


def _ragspec(spec: dict) -> dict:
    from ragspec import paths
    from ragspec.bench.shapes import config
    from ragspec.decoding import native, native_step
    from ragspec.decoding.attention import install
    from ragspec.decoding.cache import crop_cache, new_cache
    from ragspec.decoding.packed import packed_bytes, step_forward
    from ragspec.models import packed_cache as packing

    native.ops(paths.models_dir())
    with tempfile.TemporaryDirectory() as scratch:  # the product's path: packed file, mmapped
        meta = packing.meta_model_from_config(config(spec["shape"]))
        try:
            entries = packing.gguf_entries(spec["gguf"], meta)
        except NotImplementedError:  # a family transformers' GGUF loader does not map
            from ragspec.bench.shapes import random_entries

            entries = random_entries(spec["shape"], spec["mix"])
            spec["from_gguf"] = False
        packing.save(entries, Path(scratch) / packing.PACKED_FILE)
        del meta, entries
        spec["rss_before_mb"] = _rss_mb()
        start = time.perf_counter()
        model = packing.build(None, packing.load(Path(scratch) / packing.PACKED_FILE),
                              packing.meta_model_from_config(config(spec["shape"])))
        install(model, native=True)
        native_step.install(model)  # as the product loads a packed model (RAGSPEC_NATIVE_STEP)
        load = time.perf_counter() - start
        return _ragspec_times(model, spec, load, packed_bytes(model), new_cache, crop_cache,
                              step_forward)


@torch.inference_mode()
def _ragspec_times(model, spec, load, nbytes, new_cache, crop_cache, step_forward) -> dict:
    from ragspec.decoding.sampling import greedy_picks  # the engine's greedy pick

    vocab, context = model.config.vocab_size, spec["context"]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=g)
    prefills = []
    for _ in range(2):
        cache = new_cache(model)
        start = time.perf_counter()
        model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
        prefills.append(time.perf_counter() - start)
    base = cache.get_seq_length()
    rss = _rss_mb() - spec["rss_before_mb"]
    inputs = [torch.randint(0, vocab, (1, n), generator=g) for n in range(1, spec["max_tokens"] + 1)]

    def step(n: int) -> float:
        start = time.perf_counter()
        with step_forward():
            greedy_picks(model(input_ids=inputs[n - 1], cache=cache, use_cache=True).logits[0])
        seconds = time.perf_counter() - start
        crop_cache(cache, base)
        return seconds

    return {"load_s": load, "rss_mb": rss, "prefill_s": min(prefills), "packed_bytes": nbytes,
            "from_gguf": spec.get("from_gguf", True),
            "c": _timed_rounds(step, spec["max_tokens"], spec["rounds"])}


def _llamacpp(spec: dict) -> dict:
    from llama_cpp import Llama

    context, threads = spec["context"], spec["threads"]
    before = _rss_mb()
    start = time.perf_counter()
    llm = Llama(model_path=spec["gguf"], n_ctx=context + spec["max_tokens"] + 8,
                n_batch=context, n_threads=threads, n_threads_batch=threads, logits_all=True,
                verbose=False)
    load = time.perf_counter() - start
    vocab = llm.n_vocab()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (context,), generator=g).tolist()
    prefills = []
    for _ in range(2):
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        prefills.append(time.perf_counter() - start)
    base = llm.n_tokens
    rss = _rss_mb() - before
    inputs = [torch.randint(3, vocab, (n,), generator=g).tolist()
              for n in range(1, spec["max_tokens"] + 1)]

    def step(n: int) -> float:
        llm.n_tokens = base  # eval() drops the positions past n_tokens from the KV cache first
        start = time.perf_counter()
        llm.eval(inputs[n - 1])
        return time.perf_counter() - start

    return {"load_s": load, "rss_mb": rss, "prefill_s": min(prefills),
            "c": _timed_rounds(step, spec["max_tokens"], spec["rounds"]),
            "system_info": __import__("llama_cpp").llama_print_system_info().decode().strip()}


def _child(spec: dict) -> dict:
    torch.set_num_threads(spec["threads"])
    return _ragspec(spec) if spec["engine"] == "ragspec" else _llamacpp(spec)


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
