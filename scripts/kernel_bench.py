"""Time one packed product y = x·Wᵀ per format, layout and row count, at a model's shapes.

    python scripts/kernel_bench.py --formats Q4_0,Q4_K,Q6_K --shapes 2048x2048,8192x2048,2048x8192 --rows 1,8

Random blocks (ragspec.bench.shapes.random_blocks), each weight both as GGUF rows and tiled;
rounds interleave every case, the low quartile of each is kept. Prints one JSON line per case:
wall and thread CPU milliseconds (CPU time is the steadier figure under load, with --threads 1)
and the weight bytes read per CPU second (GB/s). Load average beside it.
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
            w = PackedWeight(torch.from_numpy(random_blocks(fmt, n, k, rng)), fmt, k)
            for layout in args.layouts.split(","):
                pw = tile(w) if layout == "tiled" else w
                for m in (int(v) for v in args.rows.split(",")):
                    x = torch.randn(m, k)
                    cases.append(((fmt, shape, layout, m), pw, x, []))
    for _ in range(args.rounds):
        for _key, pw, x, times in cases:
            t, c = time.perf_counter(), time.thread_time()
            ops.qmatmul(x, pw.data, pw.code, pw.in_features)
            times.append((time.perf_counter() - t, time.thread_time() - c))
    load = os.getloadavg()[0]
    for (fmt, shape, layout, m), pw, _x, times in cases:
        wall, cpu = (float(np.quantile([t[i] for t in times], 0.25)) * 1e3 for i in (0, 1))
        print(json.dumps({"fmt": fmt, "shape": shape, "layout": layout, "rows": m, "ms": round(wall, 3),
                          "cpu_ms": round(cpu, 3), "GBps_cpu": round(pw.nbytes / cpu / 1e6, 1), "load": load}))


if __name__ == "__main__":
    main()
