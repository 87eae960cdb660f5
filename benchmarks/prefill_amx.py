"""Prompt-read (prefill) time with the AMX kernel on and off, interleaved in one process.

Usage: python benchmarks/prefill_amx.py --shapes smollm2-135m,smollm2-1.7b --mixes Q4_0,Q4_K_M
           [--context 800] [--rounds 3] [--dir FOLDER] [--profile]

Builds each shape's random-weight GGUF (ragspec.bench.shapes.write_gguf, kept in --dir) and
loads it the way `ragspec bench-engine` does (packed file, memory-mapped, native step
installed), then times a prefill of --context tokens (logits for the last one), alternating the
AMX kernel off and on (the `set_amx` op) round by round, and prints the fastest of each and
whether the last-token logits are the same bits. --profile adds torch.profiler's table of the
prefill with AMX on (time by op: the matrix products against everything else).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def load(gguf: Path, shape: str, scratch: Path):
    from ragspec.bench.shapes import config
    from ragspec.decoding import native_step
    from ragspec.decoding.attention import install
    from ragspec.models import packed_cache as packing

    meta = packing.meta_model_from_config(config(shape))
    packing.save(packing.gguf_entries(gguf, meta), scratch / packing.PACKED_FILE)
    model = packing.build(None, packing.load(scratch / packing.PACKED_FILE),
                          packing.meta_model_from_config(config(shape)))
    install(model, native=True)
    native_step.install(model)
    return model


@torch.inference_mode()
def prefill(model, prompt) -> tuple[float, torch.Tensor]:
    from ragspec.decoding.cache import new_cache

    cache = new_cache(model)
    start = time.perf_counter()
    out = model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
    return time.perf_counter() - start, out.logits[0, -1].clone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="smollm2-135m,smollm2-1.7b")
    parser.add_argument("--mixes", default="Q4_0,Q4_K_M")
    parser.add_argument("--context", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    from ragspec import paths
    from ragspec.bench.shapes import write_gguf
    from ragspec.decoding import native

    ops = native.ops(paths.models_dir())
    print(f"AMX available: {ops.amx_available()}, threads: {torch.get_num_threads()}")
    folder = args.dir or Path(tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    for shape in args.shapes.split(","):
        for mix in args.mixes.split(","):
            gguf = folder / f"{shape}-{mix}.gguf"
            if not gguf.exists():
                write_gguf(shape, mix, gguf)
            with tempfile.TemporaryDirectory() as scratch:
                model = load(gguf, shape, Path(scratch))
                vocab = model.config.vocab_size
                prompt = torch.randint(0, vocab, (1, args.context), generator=torch.Generator().manual_seed(0))
                times: dict[bool, list[float]] = {False: [], True: []}
                logits: dict[bool, torch.Tensor] = {}
                before = ops.set_amx(True)
                try:
                    prefill(model, prompt)  # warm-up
                    for _ in range(args.rounds):
                        for on in (False, True):
                            ops.set_amx(on)
                            seconds, logits[on] = prefill(model, prompt)
                            times[on].append(seconds)
                    if args.profile:
                        ops.set_amx(True)
                        with torch.profiler.profile() as prof:
                            prefill(model, prompt)
                        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
                finally:
                    ops.set_amx(before)
                same = torch.equal(logits[False], logits[True])
                off, on = min(times[False]), min(times[True])
                print(f"{shape} {mix}: prefill of {args.context} tokens, AMX off {off:.3f} s, on {on:.3f} s "
                      f"({off / on:.2f}x); last-token logits identical: {same}", flush=True)
                del model


if __name__ == "__main__":
    main()
