"""Prompt reads of the bundled model in each precision, side by side in one process.

Usage: python benchmarks/prefill_precision_ab.py [--tokens 400,650,900] [--rounds 5]
           [--files F1,F2,...] [--out results.json]

Each round reads, for every length, the first N tokens of each file (default: six manual pages
rendered by `man`, text this project did not write) once per arm, the arms in a rotated order:
"bf16" (weights de-quantised to bf16, torch's matmul: the default where the CPU has AMX-BF16 or
AVX512-BF16), "int8" (the step kernels, bit for bit what one-token steps give: the default on
VNNI CPUs, and the read the exact prompt cache needs), where the CPU has AVX-512
"int8-narrow" (the same with attention's 8-lane loops, `set_wide_attention(False)`: the same
bits, the speed before the 16-lane ones), "int8-rows" (the same with a prompt's activations in
one row-major layout only, `set_interleaved_rows(False)`: the same bits, the speed before rows
were also kept interleaved by 8) and, where the CPU has AMX, "int8-amx" (the same
kernels with the tile unit, the `set_amx` op). Prints per arm and length
the median seconds and the per-read ratio to bf16 (median of paired ratios), with the load
average around each round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

import torch

MANPAGES = ("tar", "grep", "ssh", "make", "sed", "find")


def manpage(name: str) -> str:
    env = dict(os.environ, MANWIDTH="80", MAN_KEEP_FORMATTING="0")
    out = subprocess.run(["man", "-P", "cat", name], capture_output=True, text=True, env=env,
                         timeout=60, check=True).stdout
    return out.replace("\b", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="400,650,900")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", default="", help="text files to read (default: man pages)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    from ragspec import cpuinfo
    from ragspec.bench import provenance
    from ragspec.decoding import native, packed
    from ragspec.decoding.cache import new_cache
    from ragspec.decoding.engine import forward
    from ragspec.loading import load_generator

    _, gen = load_generator(None, prompt_cache_bytes=0)
    model = gen.model
    texts = ([open(f, encoding="utf-8", errors="replace").read() for f in args.files.split(",")]
             if args.files else [manpage(m) for m in MANPAGES])
    lengths = [int(n) for n in args.tokens.split(",")]
    ids = [gen.tokenizer(t)["input_ids"] for t in texts]
    if min(len(i) for i in ids) < max(lengths):
        raise SystemExit("a text is shorter than the longest length asked for")
    ops = native.ops(".")  # loaded by load_generator already; the argument is not used
    wide = ops.set_wide_attention(True)
    arms = (["bf16", "int8"] + (["int8-narrow", "int8-rows"] if wide else [])
            + (["int8-amx"] if ops.amx_available() else []))

    def arm(name: str) -> None:
        os.environ[packed.PREFILL_ENV] = name.split("-")[0]
        packed.prefill_precision.cache_clear()
        ops.set_amx(name == "int8-amx")
        ops.set_wide_attention(name != "int8-narrow")
        ops.set_interleaved_rows(name != "int8-rows")

    times: dict[str, dict[int, list[float]]] = {a: {n: [] for n in lengths} for a in arms}
    loads = []
    with torch.inference_mode():
        arm("bf16")  # one untimed read per arm: first-touch costs out of the way
        for a in arms:
            arm(a)
            forward(model, ids[0][:lengths[0]], new_cache(model), logits_to_keep=1)
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            order = arms[r % len(arms):] + arms[:r % len(arms)]
            for n in lengths:
                for text_ids in ids:
                    for a in order:
                        arm(a)
                        cache = new_cache(model)
                        start = time.perf_counter()
                        forward(model, text_ids[:n], cache, logits_to_keep=1)
                        times[a][n].append(time.perf_counter() - start)
            print(f"round {r + 1}/{args.rounds} load {loads[-1]:.1f}: " + ", ".join(
                f"{a} {statistics.median(times[a][lengths[-1]]):.3f}s@{lengths[-1]}" for a in arms),
                flush=True)
    arm("bf16")
    summary = {a: {n: {"median_s": statistics.median(times[a][n]),
                       "ratio_to_bf16": statistics.median(
                           x / y for x, y in zip(times[a][n], times["bf16"][n], strict=True))}
                   for n in lengths} for a in arms}
    record = {"command": "python benchmarks/prefill_precision_ab.py " + " ".join(
                  f"--{k} {v}" for k, v in (("tokens", args.tokens), ("rounds", args.rounds)) if v),
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip(),
              "machine": f"{cpuinfo.field('model name') or platform.machine()} (family "
                         f"{cpuinfo.field('cpu family')} model {cpuinfo.field('model')}), "
                         f"{os.cpu_count()} CPUs, "
                         f"{torch.get_num_threads()} torch threads",
              "environment": provenance.settings(),  # OMP_WAIT_POLICY moves bf16 most
              "texts": list(MANPAGES) if not args.files else args.files.split(","),
              "loads": loads, "summary": summary, "times": times}
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=1)


if __name__ == "__main__":
    main()
