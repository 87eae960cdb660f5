"""Measuring what a forward over n new tokens costs on this machine, robustly, once per model.

The draft policy needs c(n), n = 1..max_draft+1 (ragspec.decoding.policy). Only the curve's *shape*
matters to it (c(k+1)/c(1) decides how long a draft pays), and a shape measured while other
work runs is wrong in a way that costs time on every question (a curve flat from 3 to 16
tokens makes the policy draft long). So the measurement:

  * interleaves the sizes: each of `rounds` rounds times every size once, in a shuffled
    order, so a burst of load hits a few samples of many sizes rather than all samples of a
    few sizes;
  * keeps a low quantile per size (load only ever adds time), then makes the curve monotone;
  * reports its spread (the median over sizes of (q75 - q25) / q25) and trusts a curve only
    when that spread says the machine was quiet and at least MIN_ROUNDS rounds were kept;
  * has a time bound, total over its attempts (`seconds`; MEASURE_SECONDS on a model's first
    use): no forward starts that the times taken so far say would end after it, nor a round
    that cannot finish (only a forward slower than the last of its kind overruns, by what it
    took). On a busy machine forwards run many times slower (one-token forwards of the bundled
    model 15x on a 2-core machine at load 11), and a measurement that waits for a quiet moment
    may never end;
  * measures every size after two context lengths (CONTEXT_TOKENS and FAR_CONTEXT, in the
    same shuffled rounds): attention makes a forward dearer as the context grows, so the policy
    and the live check take the curve at the context they are at.

Only a trusted curve is cached. Until one is, `load_or_measure` hands out `conservative_cost`,
a stand-in that drafts little and never loses much (see there), and says so; the next run, or the
generator between generations (ragspec.decoding.engine.Generator.recalibrate_if_due), measures
again, under the same bound.

Cached curves live in one JSON file next to the converted models, keyed by model, shape,
device, weights and thread count, and for packed weights by the build of the native kernels
that run them (a change to the kernels, the compiler or the CPU makes a new curve), each with
when and how it was measured; writers take a file
lock, so two processes saving at once keep both entries. `CostWatch` compares live step times
with the curve's shape at the same context; when they disagree for a sustained stretch the
generator marks the curve due for a re-measure, which its owner runs between generations
(ragspec.decoding.engine.Generator.recalibrate_if_due), never inside one.
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

from ragspec.decoding import native
from ragspec.decoding.cache import crop_cache, new_cache
from ragspec.decoding.packed import packed_formats, step_forward
from ragspec.decoding.policy import ForwardCost
from ragspec.decoding.sampling import accept_greedy
from ragspec.fileio import write_atomically

COSTS_FILE = "forward_costs.json"  # in the model cache directory, one entry per cost_key
CONTEXT_TOKENS = 256  # a short prompt
FAR_CONTEXT = 1024  # a RAG prompt with four passages
ROUNDS = 9
QUANTILE = 0.25
MAX_SPREAD = 0.25  # above this the machine was busy: the curve is not cached
PREFILL_CHUNK = 64  # tokens per forward while filling the contexts (see measure)
MIN_ROUNDS = 5  # kept rounds a trusted curve needs (a bound that cut it shorter: not trusted)
MEASURE_SECONDS = 20.0  # the bound on a model's first use (and every re-measure), all attempts
# The stand-in curve's cost of each token beyond the first, in one-token forwards: c(n) = c(1) *
# (1 + FALLBACK_SLOPE * (n - 1)). Steeper than every packed curve measured so far, so the policy
# drafts only what is very likely accepted (see conservative_cost).
FALLBACK_SLOPE = 0.5
# Part of every cache key: bump it when the engine's forward path or the measurement changes
# what a forward costs (3: interleaved rounds, low quantile, spread check; 4: two contexts;
# 5: packed models step natively on tiled weights; 6: verify rows as independent integer chains;
# 7: the fp16 KV cache; 8: tiled weights requested into L2 ahead of the kernel, which made
# one-row steps over weights in memory cheaper than verifies, relative to before; 9: AMD CPUs
# request them 8 KiB ahead, and prompt rows attend sharing key reads; 10: greedy picks read as
# ints by one native argmax, and the draft compared in Python; 11: a verify's rows attend in
# runs sharing key reads, their queries in even groups, and Q4_0/Q5_0/Q8_0 sums start at
# their offset; 12: a verify's runs request their keys and values ahead while scoring, and
# Q6_K's sums start at their offset; 13: Q4_K and Q5_K activations take one scale per block of
# 256, and those products' float work comes once per block).
CURVE_VERSION = 13

Clock = Callable[[], float]


@dataclass(frozen=True)
class Calibration:
    """A measured curve and how it was measured. seconds[n-1] = cost of a forward over n new
    tokens after `context` cached ones; far_seconds the same after `far_context` ones."""

    seconds: tuple[float, ...]
    spread: float
    rounds: int
    context: int
    measured_at: str  # ISO 8601, UTC
    far_seconds: tuple[float, ...] = ()
    far_context: int = 0

    def __post_init__(self) -> None:
        if not self.seconds or any(not s > 0 for s in (*self.seconds, *self.far_seconds)):
            raise ValueError("a calibration needs a positive time for every size")

    @property
    def noisy(self) -> bool:
        return self.spread > MAX_SPREAD

    @property
    def trusted(self) -> bool:
        """Quiet and long enough to stand for this machine: the only kind that is cached."""
        return self.rounds >= MIN_ROUNDS and not self.noisy

    @property
    def cost(self) -> ForwardCost:
        if self.far_seconds and self.far_context > self.context:
            return ForwardCost(list(self.seconds), self.context, list(self.far_seconds),
                               self.far_context)
        return ForwardCost(list(self.seconds), self.context)

    def to_dict(self) -> dict:
        return {**asdict(self), "seconds": list(self.seconds), "far_seconds": list(self.far_seconds)}

    @classmethod
    def from_dict(cls, data) -> Calibration | None:
        """The calibration in a cache entry, or None when the entry is not a valid one."""
        try:
            return cls(seconds=tuple(float(s) for s in data["seconds"]),
                       spread=float(data["spread"]), rounds=int(data["rounds"]),
                       context=int(data["context"]), measured_at=str(data["measured_at"]),
                       far_seconds=tuple(float(s) for s in data.get("far_seconds", ())),
                       far_context=int(data.get("far_context", 0)))
        except (KeyError, TypeError, ValueError):
            return None


def cost_key(model, device: torch.device, dtype: torch.dtype) -> str:
    cfg = model.config
    name = getattr(cfg, "_name_or_path", "") or cfg.model_type
    shape = (f"{cfg.model_type}-L{getattr(cfg, 'num_hidden_layers', '?')}"
             f"-H{getattr(cfg, 'hidden_size', '?')}")
    formats = packed_formats(model)
    variant = "packed-" + "+".join(formats) if formats else str(dtype).replace("torch.", "")
    kernels = native.loaded_build() if formats else None
    if kernels:  # packed weights run the native kernels: a curve holds for their build only
        variant += f"-k{kernels}"
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    return f"{Path(str(name)).name}|{shape}|{device.type}|{variant}|t{threads}|v{CURVE_VERSION}"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _curve(samples: list[list[float]]) -> tuple[float, ...]:
    curve = [quantile(s, QUANTILE) for s in samples]
    for i in range(1, len(curve)):  # non-decreasing in truth; what says otherwise is noise
        curve[i] = max(curve[i], curve[i - 1])
    return tuple(curve)


def summarize(samples: list[list[float]], rounds: int, context: int,
              far: list[list[float]] | None = None, far_context: int = 0) -> Calibration:
    """samples[n-1]: the timings of size n (far: the same at far_context) -> a Calibration
    (low quantile, monotone, spread over every size of both)."""
    spreads = [(quantile(s, 0.75) - quantile(s, 0.25)) / quantile(s, 0.25)
               for s in (*samples, *(far or ()))]
    return Calibration(_curve(samples), statistics.median(spreads), rounds, context,
                       datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       _curve(far) if far else (), far_context if far else 0)


@torch.inference_mode()
def interleaved(cells: list, run, rounds: int, deadline: float | None = None,
                clock: Clock = time.perf_counter) -> dict:
    """cell -> the seconds `run(cell)` took in each of `rounds` rounds; every round runs every
    cell once, in a shuffled order (round 0 warms every cell up and is not kept). With a
    deadline (on `clock`), no run starts that its last time says would end after it, and no
    round that the last round's times say cannot finish by then: the rounds completed are kept,
    a round cut short is dropped, so every cell has as many samples as any other."""
    samples: dict = {cell: [] for cell in cells}
    last: dict = {}  # cell -> its latest seconds, to tell what fits before the deadline
    order = random.Random(0)
    cells = list(cells)
    for round_ in range(rounds + 1):
        if deadline is not None and clock() + sum(last.values()) > deadline:
            return samples
        order.shuffle(cells)
        timed = []
        for cell in cells:
            guess = last.get(cell, max(last.values(), default=0.0))  # unseen: the slowest
            if deadline is not None and clock() + guess > deadline:
                return samples
            last[cell] = run(cell)
            timed.append((cell, last[cell]))
        if round_:
            for cell, seconds in timed:
                samples[cell].append(seconds)
    return samples


def measure(model, max_tokens: int, context: int = CONTEXT_TOKENS, rounds: int = ROUNDS,
            clock: Clock = time.perf_counter, far_context: int | None = FAR_CONTEXT,
            deadline: float | None = None) -> Calibration | None:
    """Time a forward over n = 1..max_tokens new tokens after `context` cached ones (and after
    `far_context` ones, unless None), every (size, context) once per round, in a shuffled order
    per round (see the module docstring). deadline (on `clock`): start no forward that what was
    timed so far says would end after it; the Calibration holds the rounds completed by then
    (None: not one was)."""
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    room = int(getattr(model.config, "max_position_embeddings", 2048)) - max_tokens
    contexts = [min(context, room)]
    if far_context is not None and min(far_context, room) > contexts[0]:
        contexts.append(min(far_context, room))
    gen = torch.Generator().manual_seed(0)
    caches = []
    last = 0.0  # the last chunk's seconds, to tell whether the next fits before the deadline
    for length in contexts:
        cache = new_cache(model)
        prompt = torch.randint(0, vocab, (1, length), generator=gen).to(device)
        # in chunks, each as long as the bound allows: a forward cannot be cut short, and on a
        # busy machine one over 1024 tokens can take longer than the whole bound
        for at in range(0, length, PREFILL_CHUNK):
            if deadline is not None and clock() + last > deadline:
                return None
            start = clock()
            model(input_ids=prompt[:, at:at + PREFILL_CHUNK], cache=cache, use_cache=True,
                  logits_to_keep=1)
            last = clock() - start
        caches.append((cache, cache.get_seq_length()))
    inputs = [torch.randint(0, vocab, (1, n), generator=gen).to(device)
              for n in range(1, max_tokens + 1)]
    drafts = [ids[0, 1:].tolist() for ids in inputs]

    def run(cell: tuple[int, int]) -> float:
        c, i = cell
        cache, base = caches[c]
        start = clock()
        with step_forward():  # timed as the engine runs verify forwards
            logits = model(input_ids=inputs[i], cache=cache, use_cache=True).logits
        accept_greedy(logits[0].float(), drafts[i])  # the engine's pick, sync and read-back
        seconds = clock() - start
        crop_cache(cache, base)
        return seconds

    timed = interleaved([(c, i) for c in range(len(contexts)) for i in range(max_tokens)],
                        run, rounds, deadline, clock)
    kept = len(timed[(0, 0)])
    if not kept:
        return None
    samples = [[timed[(c, i)] for i in range(max_tokens)] for c in range(len(contexts))]
    far = samples[1] if len(contexts) > 1 else None
    return summarize(samples[0], kept, contexts[0], far, contexts[-1])


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
    """Store a calibration: read, update and replace the file under a lock (a second process
    saving at the same time waits, then adds its entry to what the first wrote), atomically
    (readers see the old file or the new one); other models' entries are kept."""
    from filelock import FileLock

    path = Path(cache_dir) / COSTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=60):
        table = _read_table(cache_dir)
        table[cost_key(model, device, dtype)] = calibration.to_dict()
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
                     cache_dir: Path | None, attempts: int = 2,
                     seconds: float | None = MEASURE_SECONDS,
                     clock: Clock = time.perf_counter) -> Calibration | None:
    """Measure within `seconds` in all (None: no bound), a second time if the first was not
    trusted and took under half the bound, and cache the result if trusted. Returns the best
    calibration either way (trusted first, then the least noisy), None when the bound passed
    before one round was complete."""
    deadline = None if seconds is None else clock() + seconds
    best = None
    for _ in range(attempts):
        start = clock()
        calibration = measure(model, max_tokens, clock=clock, deadline=deadline)
        if calibration is not None and (best is None or _rank(calibration) < _rank(best)):
            best = calibration
        if best is not None and best.trusted:
            break
        if deadline is not None and clock() - start > deadline - clock():
            break  # another attempt as long would overrun the bound: no time to finish it
    if cache_dir and best is not None and best.trusted:
        save(model, device, dtype, cache_dir, best)
    return best


def _rank(calibration: Calibration) -> tuple:
    return (not calibration.trusted, calibration.spread)


def conservative_cost(max_tokens: int) -> ForwardCost:
    """The curve to work with until a trusted one is measured: c(n) = 1 + FALLBACK_SLOPE * (n-1)
    one-token forwards, at any context.

    Chosen from the shapes measured so far (docs/speed.md, docs/kernels.md, design.md): packed
    weights on 2-core machines gave c(4)/c(1) of 1.2-1.6, c(8)/c(1) 1.65-2.75 (1.7B) and
    c(17)/c(1) 2.7 (near) to 4.3 (1024 tokens back) for the bundled model; a 0.5 slope says
    2.5, 4.5 and 9, dearer than all of them, and matches the steepest fp32 machine's first
    sizes (c(2) 1.5-1.6, c(3) 1.9-2.0). A curve too steep only costs drafts not taken (the
    answer is as fast as plain decoding, never slower); one too flat would draft long and lose.
    With it a one-token draft pays only above a 50% chance of acceptance, a longer one only on
    a sure quotation. The live pace (policy.StepPace) and the per-answer governor still bound
    what a wrong curve can lose, as with a measured one."""
    return ForwardCost([1.0 + FALLBACK_SLOPE * n for n in range(max_tokens)])


@dataclass(frozen=True)
class Curve:
    """The curve a generator works with. trusted: this machine's, from the cache or measured
    now; False: conservative_cost, because the measurement was not trusted in time. note: one
    line for the user saying which curve is in use ("" for a cached one)."""

    cost: ForwardCost
    trusted: bool
    note: str = ""


def load_or_measure(model, device: torch.device, dtype: torch.dtype, max_tokens: int,
                    cache_dir: Path | None, seconds: float | None = MEASURE_SECONDS,
                    on_measure: Callable[[float | None], None] | None = None,
                    clock: Clock = time.perf_counter) -> Curve:
    """The cached curve for this model/device if it covers max_tokens, else measure it within
    `seconds` (on_measure(seconds) is called first, for a progress note); a measurement not
    trusted by then gives conservative_cost, and nothing is cached."""
    calibration = cached(model, device, dtype, cache_dir, max_tokens)
    if calibration is not None:
        return Curve(calibration.cost, True)
    if on_measure is not None:
        on_measure(seconds)
    start = clock()
    calibration = measure_and_save(model, device, dtype, max_tokens, cache_dir, seconds=seconds,
                                   clock=clock)
    took = clock() - start
    if calibration is not None and calibration.trusted:
        saved = f"; cached in {Path(cache_dir) / COSTS_FILE}" if cache_dir else ""
        return Curve(calibration.cost, True,
                     f"Measured this machine's forward cost in {took:.0f} s ({calibration.rounds} "
                     f"rounds, spread {calibration.spread:.0%}){saved}.")
    why = ("not one round finished" if calibration is None
           else f"{calibration.rounds} of {ROUNDS} rounds finished"
           if calibration.rounds < MIN_ROUNDS
           else f"the spread was {calibration.spread:.0%}, over {MAX_SPREAD:.0%}")
    return Curve(conservative_cost(max_tokens), False,
                 f"This machine was too busy to measure its forward cost in {took:.0f} s ({why}): "
                 f"using a conservative curve that drafts little until it is measured (next run, "
                 f"or `ragspec calibrate` when the machine is idle).")


class CostWatch:
    """Live step times against the curve's shape, like with like.

    observe(n, seconds, context) after every verify forward over n tokens with `context` tokens
    cached. `verdict(cost)` divides every sample by what the curve says at its own size and
    context, and is True when, over recent steps, n-token forwards relative to one-token
    forwards disagree with the curve by more than `tolerance` for most sizes seen often enough;
    False when they agree; None while too few steps were seen to tell. A uniform slowdown (a
    busy machine) changes no ratio and is not a disagreement: only the shape matters to the
    policy.
    """

    def __init__(self, window: int = 48, min_samples: int = 8, tolerance: float = 1.35):
        self.window = window
        self.min_samples = min_samples
        self.tolerance = tolerance
        self._samples: dict[int, deque[float]] = {}

    def observe(self, tokens: int, seconds: float, context: int | None = None) -> None:
        self._samples.setdefault(tokens, deque(maxlen=self.window)).append((seconds, context))

    def reset(self) -> None:
        self._samples.clear()

    def verdict(self, cost: ForwardCost) -> bool | None:
        def relative(n: int) -> list[float]:  # live time over the curve's, sample by sample
            return [s / cost(n, c) for s, c in self._samples.get(n, ())]

        ones = relative(1)
        if len(ones) < self.min_samples:
            return None
        base = quantile(ones, QUANTILE)
        verdicts = []
        for n, values in self._samples.items():
            if n == 1 or len(values) < self.min_samples or n > cost.max_tokens:
                continue
            live = quantile(relative(n), QUANTILE) / base
            verdicts.append(abs(math.log(live)) > math.log(self.tolerance))
        if not verdicts:
            return None
        return sum(verdicts) > len(verdicts) / 2
