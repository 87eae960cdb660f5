"""Time per decode/verify step, and the part of it outside the kernels, with the native step
(ragspec.decoding.native_step) and with transformers' modules around the same kernels, side by
side in one process on one model object.

    python benchmarks/step_overhead.py --shape bundled --context 800 --sizes 1,4,8
    python benchmarks/step_overhead.py --shape smollm2-1.7b --mix Q4_0   # random weights

For each path and each k in --sizes: c(k), a forward over k new tokens after --context cached
ones with logits for all k, in interleaved rounds (median and low quartile kept), and for each
of those forwards the time in the kernels — the native step's own counters; for the module
path the time inside its calls of torch.ops.ragspec.qmatmul and .attend, timed around each
call (so one op dispatch each counts as kernel time, and the timers add ~0.1 ms to its
forward) — and outside them (median of wall minus kernels); for the native step also its
products and its attention apart.
Prints one JSON line; the load average and CPU go beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch


def _bundled():
    from ragspec import paths
    from ragspec.models.load import load_model

    return load_model(None, paths.models_dir()).model


def _random(shape: str, mix: str):
    from ragspec import paths
    from ragspec.bench.shapes import config, random_entries
    from ragspec.decoding import native, native_step
    from ragspec.decoding.attention import install
    from ragspec.models import packed_cache as packing

    native.ops(paths.models_dir())
    model = packing.build(None, _tiled(random_entries(shape, mix)),
                          packing.meta_model_from_config(config(shape)))
    install(model, native=True)
    reason = native_step.install(model)
    if reason is not None:
        sys.exit(f"no native step for {shape}: {reason}")
    return model


def _tiled(entries: dict) -> dict:
    """The entries with their weights tiled, as the packed file stores them and the product
    runs them (a weight shared by two names stays one)."""
    from ragspec.decoding.packed import PackedWeight, tile

    done: dict[int, object] = {}
    for name, value in entries.items():
        if isinstance(value, PackedWeight):
            entries[name] = done.setdefault(id(value), tile(value))
    return entries


class _TimedOps:
    """torch.ops.ragspec with qmatmul and attend timed (the module path's kernel calls)."""

    def __init__(self):
        self.ns, self.seconds = torch.ops.ragspec, 0.0
        self.originals = {name: getattr(self.ns, name) for name in ("qmatmul", "attend")}

    def _timed(self, op):
        def call(*args):
            start = time.perf_counter()
            try:
                return op(*args)
            finally:
                self.seconds += time.perf_counter() - start
        return call

    def __enter__(self):
        for name, op in self.originals.items():
            setattr(self.ns, name, self._timed(op))
        return self

    def __exit__(self, *exc):
        for name, op in self.originals.items():
            setattr(self.ns, name, op)


@torch.inference_mode()
def main() -> None:
    from ragspec.decoding import native_step
    from ragspec.decoding.cache import crop_cache, new_cache
    from ragspec.decoding.calibrate import interleaved, quantile
    from ragspec.decoding.packed import step_forward

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="bundled")
    ap.add_argument("--mix", default="Q4_0")
    ap.add_argument("--context", type=int, default=800)
    ap.add_argument("--sizes", default="1,4,8")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: every core)")
    args = ap.parse_args()
    model = _bundled() if args.shape == "bundled" else _random(args.shape, args.mix)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not native_step.installed(model):
        sys.exit("the native step is not installed on this model")
    paths = {"native": model.forward, "modules": model.forward.__wrapped__}
    sizes = [int(s) for s in args.sizes.split(",")]
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(3, vocab, (1, args.context), generator=g)
    inputs = {k: torch.randint(3, vocab, (1, k), generator=g) for k in sizes}
    cache = new_cache(model)
    model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
    base = cache.get_seq_length()

    timed = _TimedOps()
    kernel_samples: dict = {}
    part_samples: dict = {}  # the native step's products and attention apart

    def step(cell) -> float:
        path, k = cell
        before = native_step.stats(model)
        timed.seconds = 0.0
        start = time.perf_counter()
        with step_forward():
            paths[path](input_ids=inputs[k], cache=cache, use_cache=True).logits[0].argmax(-1)
        seconds = time.perf_counter() - start
        after = native_step.stats(model)
        if path == "native":
            parts = {key: after[key] - before[key] for key in ("product_seconds", "attention_seconds")}
            part_samples.setdefault(cell, []).append(parts)
        kernels = timed.seconds if path == "modules" else sum(parts.values())
        kernel_samples.setdefault(cell, []).append(kernels)
        crop_cache(cache, base)
        return seconds

    cells = [(p, k) for p in paths for k in sizes]
    with timed:
        samples = interleaved(cells, step, args.rounds)
    out = {"shape": args.shape, "mix": args.mix if args.shape != "bundled" else "Q4_1+Q8_0",
           "context": args.context, "rounds": args.rounds, "threads": torch.get_num_threads(),
           "cpu": platform.processor() or platform.machine(), "load_before": os.getloadavg()[0]}
    for path, k in cells:
        walls = samples[(path, k)]
        kernels = kernel_samples[(path, k)][-len(walls):]  # the kept rounds (round 0 warms up)
        out[f"{path}_c{k}_ms"] = round(statistics.median(walls) * 1e3, 3)
        out[f"{path}_c{k}_q25_ms"] = round(quantile(walls, 0.25) * 1e3, 3)
        out[f"{path}_c{k}_kernels_ms"] = round(statistics.median(kernels) * 1e3, 3)
        out[f"{path}_c{k}_outside_ms"] = round(
            statistics.median(w - x for w, x in zip(walls, kernels, strict=True)) * 1e3, 3)
        for key, name in (("product_seconds", "products"), ("attention_seconds", "attention")):
            if (path, k) in part_samples:
                kept = part_samples[(path, k)][-len(walls):]
                out[f"{path}_c{k}_{name}_ms"] = round(statistics.median(p[key] for p in kept) * 1e3, 3)
    for k in sizes:
        out[f"modules_over_native_c{k}"] = round(out[f"modules_c{k}_ms"] / out[f"native_c{k}_ms"], 3)
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
