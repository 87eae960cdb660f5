"""llama.cpp's own speed on a GGUF file and on the same model re-quantised to another format.

llama.cpp's fastest CPU kernels cover some formats only (Q4_0 and a few others are repacked for
wide SIMD; Q4_1 is not), so the format of the file a user holds changes llama.cpp's prompt
speed several-fold. This measures it on the file at hand, with llama-cpp-python
(`make bench-anchors`):

    python scripts/llama_requant.py FILE.gguf [--to Q4_0] [--tokens 800] [--threads 2]

For each file, as `ragspec bench-engine` measures llama.cpp (a process of its own): the faster of
2 prefills of --tokens random token ids, and c(1)..c(4) in ms, forwards over 1..4 new tokens
after them. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import tempfile
from pathlib import Path

FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K")


def requantize(src: Path, dst: Path, to: str, threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{to}")
    params.allow_requantize = True
    params.nthread = threads
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)):
        raise SystemExit(f"llama.cpp could not re-quantise {src} to {to}")


def measure(path: Path, tokens: int, threads: int) -> dict:
    """bench-engine's llama.cpp measurement (its own process) on one file."""
    from ragspec.bench.engine import measure_file

    got = measure_file("llamacpp", path, "file", path.stem, tokens, 4, 3, threads)
    return {"prefill_s": round(got["prefill_s"], 3),
            "c_ms": [round(1000 * c, 2) for c in got["c"]]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--to", default="Q4_0", choices=FORMATS)
    parser.add_argument("--tokens", type=int, default=800)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / f"requantised-{args.to}.gguf"
        requantize(args.gguf, other, args.to, args.threads)
        report = {"file": str(args.gguf), "threads": args.threads, "tokens": args.tokens,
                  "as_is": measure(args.gguf, args.tokens, args.threads),
                  args.to: measure(other, args.tokens, args.threads)}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
