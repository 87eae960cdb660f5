"""What one decode step costs on each path, and the random-weight model of a published shape.

Contract: `step_times(model, prompt_ids, rows)` reads the prompt once, then times steps of
`rows` new tokens on every path the model runs: "modules" (transformers' modules on ragspec's
cache, the engine's module path), "fixed_eager" and "fixed_compiled" (ragspec.decoding.
fixed.step; compiled = torch.compile, plus the CUDA graph on CUDA). Each step is rolled back
after it, so every timed step sees the same context; the first steps are warm-ups (the compiled
path compiles there, reported apart as "compile_seconds"). Returns {path: {rows: median ms}}.
A path that fails says why instead of a number.

`shape_model(name, device, dtype)` builds a randomly initialised transformers model at one of
ragspec.bench.shapes' published shapes directly on the device (no file, no download). Its weights
are random: it measures what a step costs at that size, never what a model answers, and every
report names it "random weights at <name>'s published shape".

`engine_speed(loaded, prompts, new_tokens)` runs the engine greedy and with speculation on each
prompt, on the module path and on the compiled fixed step: tokens/s, the speedup and whether
speculation on == off.

    python -m ragspec.bench.step_speed --prompts FILE --out docs/results/fixed-step-cpu.json
(FILE: a `gpu_check --save-prompts` file) is the CPU record: step times of the bundled model in
fp32 and bf16 and the engine on a few real-document prompts, beside the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from ragspec.decoding.cache import crop_cache, new_cache
from ragspec.decoding.engine import forward
from ragspec.decoding.fixed import step as fixed_step

PATHS = ("modules", "fixed_eager", "fixed_compiled")


def _timed(fn, device: torch.device, repeats: int, warmup: int) -> tuple[float, float]:
    """(median ms of `repeats` calls, seconds the `warmup` calls took)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
    sync()
    warm = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), warm


@torch.inference_mode()
def step_times(model, prompt_ids: list[int], rows=(1, fixed_step.ROWS), repeats: int = 10,
               warmup: int = 3, paths=PATHS) -> dict:
    device = next(model.parameters()).device
    cache = new_cache(model)
    forward(model, list(prompt_ids), cache, logits_to_keep=1)
    length = len(prompt_ids)
    out: dict = {"context": length}
    for path in paths:
        try:
            out[path] = _path_times(model, path, cache, length, rows, device, repeats, warmup)
        # one path failing (a model it does not cover, a compiler missing) is that path's result
        except Exception as exc:
            out[path] = {"error": f"{exc.__class__.__name__}: {str(exc)[:300]}"}
    return out


def _path_times(model, path, cache, length, rows, device, repeats, warmup) -> dict:
    token = [int(model.config.bos_token_id or 1)]
    result: dict = {}
    if path == "modules":
        def step(n):
            forward(model, token * n, cache)
            crop_cache(cache, length)
    else:
        why = fixed_step.unsupported(model)
        if why is not None:
            return {"skipped": f"the fixed step does not run {why}"}
        owner = fixed_step.FixedStep(model, compiled=path == "fixed_compiled")
        seq = owner.sequence(cache, length + 128)  # the room a 128-token answer asks for

        def step(n):
            seq.step(token * n)
            seq.crop(length)
    for n in rows:
        ms, warm = _timed(lambda n=n: step(n), device, repeats, warmup)
        result[str(n)] = round(ms, 3)
        result.setdefault("compile_seconds", round(warm, 2))  # the first warm-up compiles
    if path != "fixed_compiled":
        result.pop("compile_seconds")
    return result


def shape_model(name: str, device: str | torch.device, dtype: torch.dtype):
    """A randomly initialised causal LM at bench.shapes' `name`, built on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM

    from ragspec.bench.shapes import config

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config(name), dtype=dtype)
    return model.eval()


def engine_speed(loaded, prompts: list[list[int]], new_tokens: int,
                 modes=("off", "compiled")) -> dict:
    """prompts: token ids. Per step mode: median tokens/s greedy and with speculation, their ratio per prompt, and
    on how many prompts speculation changed the answer (after one untimed warm-up)."""
    from ragspec.decoding.engine import Generator
    from ragspec.decoding.types import DraftConfig, GenerationConfig

    out = {}
    for mode in modes:
        gen = Generator(loaded.model, loaded.tokenizer, eos_token_ids=sorted(loaded.eos_token_ids),
                        fixed_step=mode)
        greedy = GenerationConfig(new_tokens, draft=DraftConfig(enabled=False))
        spec = GenerationConfig(new_tokens)
        start = time.perf_counter()
        gen.generate(prompts[0], greedy)  # warm-up: compiles the fixed step
        warm = time.perf_counter() - start
        rates, ratios, differing = [], [], 0
        for ids in prompts:
            off = gen.generate(ids, greedy)
            on = gen.generate(ids, spec)
            differing += on.token_ids != off.token_ids
            rates.append((off.stats.tokens_per_s, on.stats.tokens_per_s))
            ratios.append(on.stats.tokens_per_s / off.stats.tokens_per_s)
        out[mode] = {"step": off.stats.step, "warm_up_seconds": round(warm, 2),
                     "greedy_tokens_per_s": round(statistics.median(r[0] for r in rates), 2),
                     "speculation_tokens_per_s": round(statistics.median(r[1] for r in rates), 2),
                     "speedups": [round(r, 2) for r in ratios],
                     "speculation_changed_the_answer": differing}
    return out


def main(argv: list[str] | None = None) -> int:
    """Per-step times of the bundled model on this machine's CPU, fp32 and bf16, every path,
    beside the load average (the CPU record of docs/results/fixed-step-cpu.json)."""
    from ragspec import cpuinfo
    from ragspec.models.load import load_model
    from ragspec.paths import models_dir

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--context", type=int, default=800, help="prompt tokens before a step")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--prompts", default=None, help="a gpu_check --save-prompts file")
    parser.add_argument("--prompt-count", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    loaded = load_model(None, models_dir(), weights="fp32")
    vocab = loaded.model.config.vocab_size
    prompt = [(7 * i + 11) % vocab for i in range(args.context)]
    saved = json.loads(open(args.prompts).read()) if args.prompts else None
    report = {"command": "python -m ragspec.bench.step_speed " + " ".join(argv or sys.argv[1:]),
              "cpu": cpuinfo.field("model name"),
              "threads": torch.get_num_threads(), "load_before": os.getloadavg(),
              "model": loaded.name, "rows": [1, fixed_step.ROWS], "dtypes": {}}
    for dtype in (torch.float32, torch.bfloat16):
        model = loaded.model.to(dtype)
        report["dtypes"][str(dtype)] = step_times(model, prompt, repeats=args.repeats)
        if saved is not None:  # the first prompts of data/ (built with the bundled tokenizer)
            items = [p for p in saved["prompts"] if p["set"] == "data"][: args.prompt_count]
            report["dtypes"][str(dtype)]["engine"] = {
                "prompts": [p["question"]["id"] for p in items], "new_tokens": args.new_tokens,
                **engine_speed(loaded, [p["prompt_ids"] for p in items], args.new_tokens)}
        print(json.dumps(report["dtypes"][str(dtype)]), file=sys.stderr, flush=True)
    report["load_after"] = os.getloadavg()
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
