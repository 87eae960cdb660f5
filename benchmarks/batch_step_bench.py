"""How much one native call over several sequences saves against one call per sequence.

Usage: PYTHONPATH=. .venv/bin/python benchmarks/batch_step_bench.py --docs /work/realdocs/dev
       [--sequences 8] [--context 700] [--rows 1] [--rounds 10] [--prompt-rows 128]

Loads the bundled model (packed, native step), reads `--context` tokens of a different
document into each of `--sequences` caches, then times, in interleaved rounds at that context
(each round's rows are rolled back): one sequence's step alone, every sequence's step as its
own native call (one call per sequence), and every sequence's step in one native call
(native_step.forward_many); the prompts' read (prefill) is timed too. Checks that the one call gives each sequence's logits bit for bit
and prints one JSON line: median seconds per step of each, and tokens/s.

--prompt-rows P also times a shared step as the server runs one (ragspec.decoding.batch): a
piece of P rows of one more document's prompt (its rows after `--context`) alone, and that
piece in the same native call as every sequence's step; with the seconds each spent in
products and attention (native_step.stats), and `shared_saves`, the share of the two calls'
time that one call saves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from ragspec import paths
from ragspec.decoding import native_step
from ragspec.decoding.cache import crop_cache, new_cache
from ragspec.models.load import load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=Path, required=True)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--context", type=int, default=700)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-rows", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(None, paths.models_dir(), device="cpu")
    model, tok = loaded.model, loaded.tokenizer
    if not native_step.installed(model):
        raise SystemExit("the native step is not installed on the bundled model")
    files = sorted(p for p in args.docs.rglob("*") if p.is_file())
    extra = files[args.sequences] if args.prompt_rows and len(files) > args.sequences else None
    if args.prompt_rows and extra is None:
        raise SystemExit("--prompt-rows needs one more document than --sequences")
    files = files[: args.sequences]
    caches, nexts, prefill = [], [], []
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for f in files:
            ids = tok(f.read_text(errors="replace"))["input_ids"][: args.context]
            cache = new_cache(model)
            start = time.perf_counter()
            model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
            prefill.append(time.perf_counter() - start)
            caches.append(cache)
            nexts.append(torch.randint(3, model.config.vocab_size, (args.rows,), generator=g).tolist())
        piece: list[int] = []
        prompt = new_cache(model)
        if extra is not None:  # one more prompt, read up to `context`; its next rows are the piece
            ids = tok(extra.read_text(errors="replace"))["input_ids"][: args.context + args.prompt_rows]
            if len(ids) <= args.context:
                raise SystemExit(f"{extra} has no rows after --context {args.context}")
            model(input_ids=torch.tensor([ids[: args.context]]), cache=prompt, use_cache=True,
                  logits_to_keep=1)
            piece = ids[args.context:]
        base = [c.get_seq_length() for c in (*caches, prompt)]

        def undo():
            for c, n in zip((*caches, prompt), base, strict=True):
                crop_cache(c, n)

        def one():
            model(input_ids=torch.tensor([nexts[0]]), cache=caches[0], use_cache=True)

        def each():
            return [model(input_ids=torch.tensor([t]), cache=c, use_cache=True).logits[0]
                    for t, c in zip(nexts, caches, strict=True)]

        def together():
            return native_step.forward_many(model, [(t, c, len(t)) for t, c in zip(nexts, caches, strict=True)])

        def prompt_piece():
            native_step.forward_many(model, [(piece, prompt, 0)])

        def shared():
            return native_step.forward_many(
                model, [(piece, prompt, 0), *((t, c, len(t)) for t, c in zip(nexts, caches, strict=True))])

        a = each()
        undo()
        b = together()
        undo()
        identical = all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        variants = [("one", one), ("each", each), ("together", together)]
        if piece:
            c = shared()[1:]
            undo()
            identical = identical and all(torch.equal(x, y) for x, y in zip(a, c, strict=True))
            variants += [("prompt", prompt_piece), ("shared", shared)]
        times = {name: [] for name, _ in variants}
        split = {name: [] for name, _ in variants}  # (product, attention) seconds
        for _ in range(args.rounds):
            for name, fn in variants:
                native_step.reset_stats(model)
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
                st = native_step.stats(model)
                split[name].append((st["product_seconds"], st["attention_seconds"]))
                undo()
    med = {k: statistics.median(v) for k, v in times.items()}
    shared_out = {}
    if piece:
        shared_out = {"prompt_rows": len(piece), "seconds_prompt": round(med["prompt"], 4),
                      "seconds_shared": round(med["shared"], 4),
                      "shared_saves": round(1 - med["shared"] / (med["prompt"] + med["together"]), 3)}
        for name in ("prompt", "together", "shared"):
            for i, part in enumerate(("products", "attention")):
                shared_out[f"seconds_{part}_{name}"] = round(
                    statistics.median(x[i] for x in split[name]), 4)
    n, r = len(files), args.rows
    print(json.dumps({
        "sequences": n, "rows": r, "context": args.context, "identical": identical,
        "threads": args.threads, "seconds_prefill": round(statistics.median(prefill), 4),
        "seconds_one": round(med["one"], 4), "seconds_each": round(med["each"], 4),
        "seconds_together": round(med["together"], 4),
        "tokens_per_s_one": round(r / med["one"], 1),
        "tokens_per_s_each": round(n * r / med["each"], 1),
        "tokens_per_s_together": round(n * r / med["together"], 1),
        "together_over_one": round(n * med["one"] / med["together"], 2),
        "each_over_one": round(n * med["one"] / med["each"], 2),
        **shared_out,
    }))


if __name__ == "__main__":
    main()
