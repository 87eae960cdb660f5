"""The llama.cpp family's own speed on GGUF files, and on the same models re-quantised to other
formats.

llama.cpp's fastest CPU kernels cover some formats only (Q4_0 and a few others are repacked for
wide SIMD; Q4_1 is not), and ik_llama.cpp repacks more of them at load (`-rtr 1`), so the format
of the file a user holds changes these engines' prompt speed several-fold. This measures it on
the files at hand with the anchors `make bench-anchors` built:

    python benchmarks/llama_requant.py FILE.gguf [FILE.gguf ...] [--to Q4_0,Q4_K_M] [--keep DIR]
        [--threads 2] [--prompt 512] [--generate 64] [--engines llama.cpp,ik_llama.cpp]
        [--probe]

Each file is measured as it is and re-quantised to each --to format (mainline llama.cpp's own
llama-quantize, else ik_llama.cpp's, `--allow-requantize`; `--to none` re-quantises nothing;
--keep DIR keeps the re-quantised files, e.g. for `ragspec bench --model`). For every file and engine: llama-bench
`-t THREADS -p PROMPT -n GENERATE` (with `-rtr 1` for ik_llama.cpp), its own pp/tg tokens/s;
with --probe also bench-engine's measurement through anchor-probe (prefill of 800 tokens, c(1),
c(2), c(4), c(8) in ms). Each engine's build line (flags, instruction sets) is recorded. Prints
one JSON object; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K")


def requantize(src: Path, dst: Path, to: str, threads: int) -> None:
    from ragspec.bench.anchors import build as anchor_build

    # mainline's quantiser where it is built, else ik_llama.cpp's (the same standard formats)
    manifest = anchor_build.load("llama.cpp") or anchor_build.load("ik_llama.cpp")
    if manifest is None:
        raise SystemExit("no llama-quantize: `make bench-anchors`")
    quantize = Path(manifest["bin"]) / "llama-quantize"
    proc = subprocess.run([str(quantize), "--allow-requantize", str(src), str(dst), to,
                           str(threads)], capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"llama-quantize could not re-quantise {src} to {to}: {tail}")


def measure(path: Path, engines: list[str], threads: int, prompt: int, generate: int,
            probe: bool) -> dict:
    from ragspec.bench.anchors import native as native_anchors

    out = {"file": str(path), "mb": round(path.stat().st_size / 1e6, 1)}
    for engine in engines:
        print(f"{engine} on {path.name}...", file=sys.stderr, flush=True)
        got = native_anchors.llama_bench(engine, path, threads, prompt, generate)
        if probe:
            ck = native_anchors.measure(engine, path, 800, 8, 5, threads)
            got["probe"] = {"prefill_800_s": round(ck["prefill_s"], 3),
                            "c_ms": {k: round(1000 * ck["c"][k - 1], 2) for k in (1, 2, 4, 8)},
                            "rss_mb": round(ck["rss_mb"], 1)}
        out[engine] = got
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf", type=Path, nargs="+")
    parser.add_argument("--to", default="Q4_0,Q4_K_M",
                        help=f"formats, comma-separated, from {', '.join(FORMATS)}; or none")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the re-quantised files in this folder")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--generate", type=int, default=64)
    parser.add_argument("--engines", default="llama.cpp,ik_llama.cpp")
    parser.add_argument("--probe", action="store_true",
                        help="also bench-engine's prefill and c(k) through anchor-probe")
    args = parser.parse_args(argv)
    formats = [] if args.to == "none" else [f.strip() for f in args.to.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        parser.error(f"unknown format(s) {', '.join(bad)}")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    from ragspec.bench.anchors import build as anchor_build
    from ragspec.bench.anchors.llama_build import cpu_name

    report = {"cpu": cpu_name(), "threads": args.threads, "prompt": args.prompt,
              "generate": args.generate, "load_before": Path("/proc/loadavg").read_text().strip(),
              "builds": {e: anchor_build.describe(m) for e in engines
                         if (m := anchor_build.load(e)) is not None}, "files": []}
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        for source in args.gguf:
            entry = {"as_is": measure(source, engines, args.threads, args.prompt, args.generate,
                                      args.probe)}
            for fmt in formats:
                other = where / f"{source.stem}-{fmt}.gguf"
                if not other.is_file():
                    print(f"re-quantising {source.name} to {fmt}...", file=sys.stderr)
                    requantize(source, other, fmt, args.threads)
                entry[fmt] = measure(other, engines, args.threads, args.prompt, args.generate,
                                     args.probe)
            report["files"].append(entry)
    report["load_after"] = Path("/proc/loadavg").read_text().strip()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
