"""Time one packed product y = x·Wᵀ per format, layout and row count, at a model's shapes.

    python benchmarks/kernel_bench.py --formats Q4_0,Q4_K,Q6_K --shapes 2048x2048,8192x2048,2048x8192 --rows 1,8
    python benchmarks/kernel_bench.py --formats Q4_0,Q4_K,Q6_K,Q8_0 --layouts tiled --threads 2 \
        --shapes 6144x2048,2048x2048,16384x2048,2048x8192 --rows 1,2,4,8 --copies 24 --rounds 7

Random blocks (ragspec.bench.shapes.random_blocks), each weight both as GGUF rows and tiled;
rounds interleave every case, the low quartile of each is kept. One weight of a few MB stays in
the CPU's caches from one call to the next; --copies N makes N different weights of each shape
and times one pass over all of them (the figures are per product, the pass divided by N), so
that with enough of them (24 copies of SmolLM2-1.7B's four products per layer: 0.9 GB in Q4_0)
the weights stream from memory, as in a decode step of a model larger than the last cache (a
round takes the cases row count by row count, so a weight is read again only after all the
others). Prints one JSON line per case: wall and thread CPU milliseconds (CPU time is the
steadier figure under load, with --threads 1) and the weight bytes read per CPU second and per
second (GB/s). Load average beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="Q4_0,Q4_K,Q6_K")
    ap.add_argument("--shapes", default="2048x2048,8192x2048,2048x8192", help="NxK, comma separated")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--layouts", default="rows,tiled")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--copies", type=int, default=1, help="different weights per shape, timed in one pass")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from ragspec import paths
    from ragspec.bench.shapes import random_blocks
    from ragspec.decoding import native
    from ragspec.decoding.packed import PackedWeight, tile

    ops = native.ops(paths.models_dir())
    rng = np.random.default_rng(0)
    cases = []
    for fmt in args.formats.split(","):
        for shape in args.shapes.split(","):
            n, k = (int(v) for v in shape.split("x"))
            ws = [PackedWeight(torch.from_numpy(random_blocks(fmt, n, k, rng)), fmt, k)
                  for _ in range(args.copies)]
            for layout in args.layouts.split(","):
                pws = [tile(w) if layout == "tiled" else w for w in ws]
                for m in (int(v) for v in args.rows.split(",")):
                    x = torch.randn(m, k)
                    cases.append(((fmt, shape, layout, m), pws, x, []))
    cases.sort(key=lambda case: case[0][3])  # by row count (stable): see the docstring
    for _ in range(args.rounds):
        for _key, pws, x, times in cases:
            t, c = time.perf_counter(), time.thread_time()
            for pw in pws:
                ops.qmatmul(x, pw.data, pw.code, pw.in_features)
            times.append(((time.perf_counter() - t) / len(pws), (time.thread_time() - c) / len(pws)))
    load = os.getloadavg()[0]
    for (fmt, shape, layout, m), pws, _x, times in cases:
        wall, cpu = (float(np.quantile([t[i] for t in times], 0.25)) * 1e3 for i in (0, 1))
        print(json.dumps({"fmt": fmt, "shape": shape, "layout": layout, "rows": m, "ms": round(wall, 3),
                          "cpu_ms": round(cpu, 3), "GBps_cpu": round(pws[0].nbytes / cpu / 1e6, 1), "GBps_wall": round(pws[0].nbytes / wall / 1e6, 1),
                          "copies": len(pws), "load": load}))


if __name__ == "__main__":
    main()
