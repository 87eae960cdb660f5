"""Measuring what a forward over n new tokens costs on this machine, once per model and device.

The draft policy needs c(n), n = 1..max_draft+1 (decoding.policy). The curve depends on the
model, the device, the dtype and the thread count, so it is measured on the first use of each
combination (a few seconds on the CPU) and kept as JSON next to the converted models.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch

from decoding.cache import crop_cache, new_cache
from decoding.policy import ForwardCost

COSTS_FILE = "forward_costs.json"  # in the model cache directory, one entry per cost_key
CONTEXT_TOKENS = 512  # a typical RAG prompt's order of magnitude
REPEATS = 3
# Part of every cache key: bump it when the engine's forward path changes what a forward costs
# (2: the in-place KV cache of decoding.cache), so curves measured before are not reused.
CURVE_VERSION = 2


def cost_key(model, device: torch.device, dtype: torch.dtype) -> str:
    name = getattr(model.config, "_name_or_path", "") or model.config.model_type
    cfg = model.config
    shape = f"{cfg.model_type}-L{getattr(cfg, 'num_hidden_layers', '?')}-H{getattr(cfg, 'hidden_size', '?')}"
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    return (f"{Path(str(name)).name}|{shape}|{device.type}|{str(dtype).replace('torch.', '')}"
            f"|t{threads}|v{CURVE_VERSION}")


@torch.inference_mode()
def measure(model, max_tokens: int, context: int = CONTEXT_TOKENS) -> ForwardCost:
    """Median time of a forward over n = 1..max_tokens new tokens after `context` cached ones."""
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    context = min(context, int(getattr(model.config, "max_position_embeddings", 2048)) - max_tokens)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=gen).to(device)
    cache = new_cache(model)
    model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
    base = cache.get_seq_length()
    seconds = []
    for n in range(1, max_tokens + 1):
        x = torch.randint(0, vocab, (1, n), generator=gen).to(device)
        samples = []
        for _ in range(REPEATS + 1):  # the first call warms up this shape
            t0 = time.perf_counter()
            logits = model(input_ids=x, cache=cache, use_cache=True).logits
            logits[0].float().argmax(-1).tolist()  # includes the device sync and read-back
            samples.append(time.perf_counter() - t0)
            crop_cache(cache, base)
        seconds.append(statistics.median(samples[1:]))
    # the curve is non-decreasing in truth; smooth away timing noise that says otherwise
    for i in range(1, len(seconds)):
        seconds[i] = max(seconds[i], seconds[i - 1])
    return ForwardCost(seconds)


def load_or_measure(model, device: torch.device, dtype: torch.dtype, max_tokens: int,
                    cache_dir: Path | None) -> ForwardCost:
    """The cached curve for this model/device if it covers max_tokens, else measure and save."""
    key = cost_key(model, device, dtype)
    path = Path(cache_dir) / COSTS_FILE if cache_dir else None
    table: dict = {}
    if path and path.is_file():
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}  # a damaged cache is only a lost measurement: measure again
        entry = table.get(key)
        if isinstance(entry, list) and len(entry) >= max_tokens and all(
            isinstance(v, (int, float)) and v > 0 for v in entry
        ):
            return ForwardCost([float(v) for v in entry])
    cost = measure(model, max_tokens)
    if path:
        table[key] = cost.seconds
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(path)
    return ForwardCost(list(cost.seconds))
