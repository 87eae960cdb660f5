"""Measuring what a forward over n new tokens costs on this machine, robustly, once per model.

The draft policy needs c(n), n = 1..max_draft+1 (ragspec.decoding.policy). Only the curve's *shape*
matters to it (c(k+1)/c(1) decides how long a draft pays), and a shape measured while other
work runs is wrong in a way that costs time on every question (a curve flat from 3 to 16
tokens makes the policy draft long). So the measurement:

  * interleaves the sizes: each of `rounds` rounds times every size once, in a shuffled
    order, so a burst of load hits a few samples of many sizes rather than all samples of a
    few sizes;
  * keeps a low quantile per size (load only ever adds time), then makes the curve monotone;
  * reports its spread (the median over sizes of (q75 - q25) / q25) and refuses to cache a
    curve whose spread says the machine was busy: the curve is still used for this process,
    and measured again next time.

Cached curves live in one JSON file next to the converted models, keyed by model, shape,
device, dtype, 4-bit layers and thread count, each with when and how it was measured.
`CostWatch` compares live step times with the curve's shape; the engine re-measures when
they disagree for a sustained stretch (ragspec.decoding.engine).
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from ragspec.decoding.cache import crop_cache, new_cache
from ragspec.decoding.packed import packed_formats, step_forward
from ragspec.decoding.policy import ForwardCost
from ragspec.fileio import write_atomically

COSTS_FILE = "forward_costs.json"  # in the model cache directory, one entry per cost_key
CONTEXT_TOKENS = 512  # a typical RAG prompt's order of magnitude
ROUNDS = 9
QUANTILE = 0.25
MAX_SPREAD = 0.25  # above this the machine was busy: the curve is not cached
# Part of every cache key: bump it when the engine's forward path or the measurement changes
# what a forward costs (3: interleaved rounds, low quantile, spread check).
CURVE_VERSION = 3

Clock = Callable[[], float]


@dataclass(frozen=True)
class Calibration:
    """A measured curve and how it was measured. seconds[n-1] = cost of a forward over n new
    tokens after `context` cached ones."""

    seconds: tuple[float, ...]
    spread: float
    rounds: int
    context: int
    measured_at: str  # ISO 8601, UTC

    def __post_init__(self) -> None:
        if not self.seconds or any(not s > 0 for s in self.seconds):
            raise ValueError("a calibration needs a positive time for every size")

    @property
    def noisy(self) -> bool:
        return self.spread > MAX_SPREAD

    @property
    def cost(self) -> ForwardCost:
        return ForwardCost(list(self.seconds))

    def to_dict(self) -> dict:
        return {**asdict(self), "seconds": list(self.seconds)}

    @classmethod
    def from_dict(cls, data) -> Calibration | None:
        """The calibration in a cache entry, or None when the entry is not a valid one."""
        try:
            return cls(seconds=tuple(float(s) for s in data["seconds"]),
                       spread=float(data["spread"]), rounds=int(data["rounds"]),
                       context=int(data["context"]), measured_at=str(data["measured_at"]))
        except (KeyError, TypeError, ValueError):
            return None


def cost_key(model, device: torch.device, dtype: torch.dtype) -> str:
    cfg = model.config
    name = getattr(cfg, "_name_or_path", "") or cfg.model_type
    shape = (f"{cfg.model_type}-L{getattr(cfg, 'num_hidden_layers', '?')}"
             f"-H{getattr(cfg, 'hidden_size', '?')}")
    formats = packed_formats(model)
    variant = "packed-" + "+".join(formats) if formats else str(dtype).replace("torch.", "")
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    return f"{Path(str(name)).name}|{shape}|{device.type}|{variant}|t{threads}|v{CURVE_VERSION}"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(samples: list[list[float]], rounds: int, context: int) -> Calibration:
    """samples[n-1]: the timings of size n -> a Calibration (low quantile, monotone, spread)."""
    curve = [quantile(s, QUANTILE) for s in samples]
    for i in range(1, len(curve)):  # non-decreasing in truth; what says otherwise is noise
        curve[i] = max(curve[i], curve[i - 1])
    spreads = [(quantile(s, 0.75) - quantile(s, 0.25)) / quantile(s, 0.25) for s in samples]
    return Calibration(tuple(curve), statistics.median(spreads), rounds, context,
                       datetime.now(timezone.utc).isoformat(timespec="seconds"))


@torch.inference_mode()
def measure(model, max_tokens: int, context: int = CONTEXT_TOKENS, rounds: int = ROUNDS,
            clock: Clock = time.perf_counter) -> Calibration:
    """Time a forward over n = 1..max_tokens new tokens after `context` cached ones, every
    size once per round, in a shuffled order per round (see the module docstring)."""
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    context = min(context, int(getattr(model.config, "max_position_embeddings", 2048)) - max_tokens)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=gen).to(device)
    cache = new_cache(model)
    model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
    base = cache.get_seq_length()
    inputs = [torch.randint(0, vocab, (1, n), generator=gen).to(device)
              for n in range(1, max_tokens + 1)]
    samples: list[list[float]] = [[] for _ in inputs]
    order = random.Random(0)
    for round_ in range(rounds + 1):  # round 0 warms every shape up and is not kept
        sizes = list(range(max_tokens))
        order.shuffle(sizes)
        for i in sizes:
            start = clock()
            with step_forward():  # timed as the engine runs verify forwards
                logits = model(input_ids=inputs[i], cache=cache, use_cache=True).logits
            logits[0].float().argmax(-1).tolist()  # includes the device sync and read-back
            if round_:
                samples[i].append(clock() - start)
            crop_cache(cache, base)
    return summarize(samples, rounds, context)


def cached(model, device: torch.device, dtype: torch.dtype, cache_dir: Path | None,
           max_tokens: int = 1) -> Calibration | None:
    """The cached calibration for this model and machine if it covers max_tokens."""
    entry = _read_table(cache_dir).get(cost_key(model, device, dtype))
    calibration = Calibration.from_dict(entry) if isinstance(entry, dict) else None
    if calibration is None or len(calibration.seconds) < max_tokens:
        return None
    return calibration


def save(model, device: torch.device, dtype: torch.dtype, cache_dir: Path,
         calibration: Calibration) -> None:
    """Store a calibration (atomically; other models' entries are kept)."""
    path = Path(cache_dir) / COSTS_FILE
    table = _read_table(cache_dir)
    table[cost_key(model, device, dtype)] = calibration.to_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(table, indent=1))


def _read_table(cache_dir: Path | None) -> dict:
    path = Path(cache_dir) / COSTS_FILE if cache_dir else None
    if not path or not path.is_file():
        return {}
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # a damaged cache is only a lost measurement: measure again
    return table if isinstance(table, dict) else {}


def measure_and_save(model, device: torch.device, dtype: torch.dtype, max_tokens: int,
                     cache_dir: Path | None, attempts: int = 2) -> Calibration:
    """Measure (a second time if the first was noisy) and cache the result unless noisy;
    returns the least noisy calibration either way."""
    best = None
    for _ in range(attempts):
        calibration = measure(model, max_tokens)
        if best is None or calibration.spread < best.spread:
            best = calibration
        if not calibration.noisy:
            break
    if cache_dir and not best.noisy:
        save(model, device, dtype, cache_dir, best)
    return best


def load_or_measure(model, device: torch.device, dtype: torch.dtype, max_tokens: int,
                    cache_dir: Path | None) -> ForwardCost:
    """The cached curve for this model/device if it covers max_tokens, else measure it."""
    calibration = cached(model, device, dtype, cache_dir, max_tokens)
    if calibration is None:
        calibration = measure_and_save(model, device, dtype, max_tokens, cache_dir)
    return calibration.cost


class CostWatch:
    """Live step times against the curve's shape.

    observe(n, seconds) after every verify forward over n tokens. `verdict(cost)` is True when,
    over recent steps, the cost of n-token forwards relative to one-token forwards differs from
    what the curve says by more than `tolerance` for most sizes seen often enough; False when
    they agree; None while too few steps were seen to tell. A uniform
    slowdown (a busy machine) changes no ratio and is not a disagreement: only the shape
    matters to the policy.
    """

    def __init__(self, window: int = 48, min_samples: int = 8, tolerance: float = 1.35):
        self.window = window
        self.min_samples = min_samples
        self.tolerance = tolerance
        self._samples: dict[int, deque[float]] = {}

    def observe(self, tokens: int, seconds: float) -> None:
        self._samples.setdefault(tokens, deque(maxlen=self.window)).append(seconds)

    def reset(self) -> None:
        self._samples.clear()

    def verdict(self, cost: ForwardCost) -> bool | None:
        ones = self._samples.get(1, ())
        if len(ones) < self.min_samples:
            return None
        base = quantile(list(ones), QUANTILE)
        verdicts = []
        for n, values in self._samples.items():
            if n == 1 or len(values) < self.min_samples or n > cost.max_tokens:
                continue
            live = quantile(list(values), QUANTILE) / base
            expected = cost(n) / cost(1)
            verdicts.append(abs(math.log(live / expected)) > math.log(self.tolerance))
        if not verdicts:
            return None
        return sum(verdicts) > len(verdicts) / 2
