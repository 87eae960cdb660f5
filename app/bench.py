"""The benchmark behind `ragspec bench`: ragspec against greedy, transformers and an oracle.

Contract: given prepared prompts (token ids, built by the real pipeline) and one Generator, run
every method on every question, interleaved question by question in one process, after a
warm-up, each timed with the same clock (time.perf_counter) around the whole generation; then
aggregate into the results.json object of issue 5. Knows nothing of click or of retrieval.

Methods (all greedy, all capped at max_new_tokens):
    greedy     ragspec's engine with speculation off: the baseline of the engine methods;
    ragspec    the engine with its default speculation (adaptive n-gram drafts);
    hf_greedy  transformers' model.generate(do_sample=False);
    hf_pld     the same with prompt_lookup_num_tokens=10: the baseline users would otherwise pick;
    oracle     the engine drafting the true greedy continuation (greedy's output), max_draft at a
               time: the ceiling for any drafter on this machine.

speedup = a method's tokens_per_s over greedy's on the same question, except hf_pld's, which is
over hf_greedy's (each tool against its own baseline); decode_speedup likewise with
decode_tokens_per_s. identical_to_greedy compares token ids with greedy's output; for greedy
itself it compares with hf_greedy's, i.e. it checks the engine against transformers.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from decoding.types import DraftConfig, GenerationConfig

METHODS = ("greedy", "ragspec", "hf_greedy", "hf_pld", "oracle")
KINDS = ("copy", "open")
BASELINE = {"greedy": "greedy", "ragspec": "greedy", "oracle": "greedy",
            "hf_greedy": "greedy", "hf_pld": "hf_greedy"}
PLD_TOKENS = 10  # transformers' prompt_lookup_num_tokens, as users would set it
WARMUP_TOKENS = 16


class BenchInputError(ValueError):
    """A questions file or prompt the benchmark cannot use; the message says where and why."""


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    kind: str = "copy"


def load_questions(path: str | Path, limit: int | None = None) -> list[Question]:
    """Questions from a JSONL file: one {"id", "question", "kind"} object per line.

    kind is "copy" (the answer should quote the documents) or "open"; missing means "copy".
    A missing id becomes the line number. Blank lines are skipped.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchInputError(f"cannot read questions file {path}: {exc}") from exc
    questions: list[Question] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise BenchInputError(f"{where}: not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise BenchInputError(f"{where}: expected an object like "
                                  '{"id": "q1", "question": "...", "kind": "copy"}')
        text = obj.get("question")
        if not isinstance(text, str) or not text.strip():
            raise BenchInputError(f"{where}: \"question\" must be a non-empty string")
        kind = obj.get("kind") or "copy"
        if kind not in KINDS:
            raise BenchInputError(f"{where}: \"kind\" must be \"copy\" or \"open\", got {kind!r}")
        qid = str(obj["id"]) if obj.get("id") not in (None, "") else str(number)
        if qid in seen:
            raise BenchInputError(f"{where}: duplicate id {qid!r}")
        seen.add(qid)
        questions.append(Question(qid, text.strip(), kind))
    if not questions:
        raise BenchInputError(f"{path} holds no questions: write one JSON object per line")
    return questions[:limit] if limit else questions


@dataclass
class MethodRun:
    """One timed generation. Counters a method cannot report are None."""

    token_ids: list[int]
    seconds: float
    ttft_seconds: float
    forward_passes: int | None = None
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    accepted_lengths: dict[int, int] = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    def to_dict(self, reference: Sequence[int] | None) -> dict:
        n, after_first = self.new_tokens, self.seconds - self.ttft_seconds
        return {
            "new_tokens": n,
            "seconds": self.seconds,
            "ttft_seconds": self.ttft_seconds,
            "tokens_per_s": n / self.seconds if self.seconds > 0 else 0.0,
            "decode_tokens_per_s": (n - 1) / after_first if n > 1 and after_first > 0 else 0.0,
            "forward_passes": self.forward_passes,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "identical_to_greedy": reference is not None and list(reference) == self.token_ids,
            "accepted_lengths": {str(k): v for k, v in sorted(self.accepted_lengths.items())},
        }


def _first_token_timer(start: float):
    from transformers.generation.streamers import BaseStreamer

    class FirstTokenTimer(BaseStreamer):
        """Records when generate() hands over its first new tokens (the first put is the prompt)."""

        def __init__(self) -> None:
            self.puts = 0
            self.ttft: float | None = None

        def put(self, value) -> None:
            self.puts += 1
            if self.puts == 2:
                self.ttft = time.perf_counter() - start

        def end(self) -> None:
            pass

    return FirstTokenTimer()


class Runner:
    """Runs one method on one prompt with a shared Generator (its model serves the HF methods)."""

    def __init__(self, generator, draft: DraftConfig | None = None, pld_tokens: int = PLD_TOKENS):
        self.gen = generator
        self.draft = draft or DraftConfig()
        self.pld_tokens = pld_tokens

    def run(self, method: str, prompt_ids: Sequence[int], max_new_tokens: int, *,
            sources: Sequence = (), reference: Sequence[int] | None = None) -> MethodRun:
        if method == "greedy":
            cfg = GenerationConfig(max_new_tokens, draft=DraftConfig(enabled=False))
            return self._engine(prompt_ids, cfg, sources, None)
        if method == "ragspec":
            return self._engine(prompt_ids, GenerationConfig(max_new_tokens, draft=self.draft),
                                sources, None)
        if method == "oracle":
            if reference is None:
                raise ValueError("the oracle needs greedy's output: run greedy first")
            return self._engine(prompt_ids, GenerationConfig(max_new_tokens, draft=self.draft),
                                sources, list(reference))
        if method == "hf_greedy":
            return self._hf(prompt_ids, max_new_tokens, {})
        if method == "hf_pld":
            return self._hf(prompt_ids, max_new_tokens,
                            {"prompt_lookup_num_tokens": self.pld_tokens})
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")

    def _engine(self, prompt_ids, cfg, sources, forced) -> MethodRun:
        start = time.perf_counter()
        stream = self.gen.stream(prompt_ids, cfg, sources=sources, forced_drafts=forced)
        ttft = None
        for _ in stream:
            if ttft is None:
                ttft = time.perf_counter() - start
        seconds = time.perf_counter() - start
        s = stream.stats
        return MethodRun(list(stream.token_ids), seconds, ttft if ttft is not None else seconds,
                         s.forward_passes, s.drafted_tokens, s.accepted_tokens,
                         dict(s.accepted_lengths))

    @torch.inference_mode()
    def _hf(self, prompt_ids, max_new_tokens: int, extra: dict) -> MethodRun:
        model, gen = self.gen.model, self.gen
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=gen.device)
        eos = sorted(gen.eos_token_ids)
        pad = getattr(gen.tokenizer, "pad_token_id", None)
        start = time.perf_counter()
        timer = _first_token_timer(start)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=eos or None,
                             pad_token_id=pad if pad is not None else (eos[0] if eos else None),
                             streamer=timer, **extra)
        tokens = out[0, ids.shape[1]:].tolist()
        seconds = time.perf_counter() - start
        drafted = 0 if not extra else None  # hf_greedy drafts nothing; hf_pld does not say
        return MethodRun(tokens, seconds, timer.ttft if timer.ttft is not None else seconds,
                         forward_passes=None, drafted_tokens=drafted, accepted_tokens=drafted)


@dataclass(frozen=True)
class Prepared:
    """A question with its prompt as the pipeline built it."""

    question: Question
    prompt_ids: list[int]
    sources: tuple = ()


ProgressFn = Callable[[Question, str], None]


def warm_up(runner: Runner, prompt: Prepared, methods: Sequence[str] = METHODS) -> None:
    """One short untimed run of every method: first-call costs (allocations, kernel choice,
    lazy imports) stay out of the timings."""
    tokens = min(WARMUP_TOKENS, runner.gen.context_length - len(prompt.prompt_ids))
    reference = runner.run("greedy", prompt.prompt_ids, max(1, tokens)).token_ids
    for method in methods:
        runner.run(method, prompt.prompt_ids, max(1, tokens), sources=prompt.sources,
                   reference=reference)


def method_order(index: int, methods: Sequence[str] = METHODS) -> list[str]:
    """greedy first (the oracle needs its output); the others rotate from question to question
    so that no method always runs right after another (caches, clock boost, neighbours' load)."""
    rest = [m for m in methods if m != "greedy"]
    shift = index % len(rest) if rest else 0
    return ["greedy", *rest[shift:], *rest[:shift]]


def bench_question(runner: Runner, index: int, item: Prepared, max_new_tokens: int,
                   progress: ProgressFn | None = None, repeats: int = 1) -> dict:
    """Run every method `repeats` times (rounds, each in its own rotated order) and keep each
    method's fastest run: on a shared machine load only ever adds time, so the minimum is the
    least disturbed measurement. Every round starts ragspec's draft policy from the state it had
    before this question, so a repeat does not learn from the question it is timed on. A method
    counts as identical only if all its runs were."""
    runs: dict[str, list[MethodRun]] = {m: [] for m in METHODS}
    policies = runner.gen.policy_state()
    for round_ in range(repeats):
        runner.gen.restore_policy_state(policies)
        for method in method_order(index + round_):
            reference = runs["greedy"][0].token_ids if runs["greedy"] else None
            runs[method].append(runner.run(method, item.prompt_ids, max_new_tokens,
                                           sources=item.sources, reference=reference))
            if progress:
                progress(item.question, method)
    greedy_ids = runs["greedy"][0].token_ids
    results = {}
    for m in METHODS:
        reference = runs["hf_greedy"][0].token_ids if m == "greedy" else greedy_ids
        best = min(runs[m], key=lambda r: r.seconds)
        results[m] = best.to_dict(reference)
        results[m]["identical_to_greedy"] = all(r.token_ids == list(reference) for r in runs[m])
        results[m]["runs_seconds"] = [r.seconds for r in runs[m]]
    q = item.question
    return {"id": q.id, "kind": q.kind, "prompt_tokens": len(item.prompt_ids), "results": results}


def run_bench(runner: Runner, prepared: Sequence[Prepared], max_new_tokens: int, *,
              progress: ProgressFn | None = None, warmup: bool = True,
              repeats: int = 1) -> list[dict]:
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup and prepared:
        warm_up(runner, prepared[0])
    return [bench_question(runner, i, item, max_new_tokens, progress, repeats)
            for i, item in enumerate(prepared)]


# -- aggregation -------------------------------------------------------------------------------

def entry_speedup(entry: dict, method: str, metric: str = "tokens_per_s") -> float | None:
    base = entry["results"][BASELINE[method]][metric]
    mine = entry["results"][method][metric]
    return mine / base if base else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _method_summary(entries: list[dict], method: str) -> dict:
    runs = [e["results"][method] for e in entries]
    speedups = [s for s in (entry_speedup(e, method) for e in entries) if s is not None]
    decode = [s for s in (entry_speedup(e, method, "decode_tokens_per_s") for e in entries)
              if s is not None]
    drafted = [r["drafted_tokens"] for r in runs]
    accept_rate = None
    if runs and None not in drafted and sum(drafted) > 0:
        accept_rate = sum(r["accepted_tokens"] for r in runs) / sum(drafted)
    histogram: dict[int, int] = {}
    for r in runs:
        for length, count in r.get("accepted_lengths", {}).items():
            histogram[int(length)] = histogram.get(int(length), 0) + count
    steps = sum(histogram.values())
    return {
        "median_speedup": _median(speedups),
        "min_speedup": min(speedups) if speedups else None,
        "median_decode_speedup": _median(decode),
        "median_tokens_per_s": _median([r["tokens_per_s"] for r in runs]),
        "accept_rate": accept_rate,
        "mean_accepted_length": sum(a * n for a, n in histogram.items()) / steps if steps else None,
        "all_identical": all(r["identical_to_greedy"] for r in runs) if runs else None,
    }


def summarize(entries: list[dict], methods: Sequence[str] = METHODS) -> dict:
    """{KIND: {METHOD: stats}} for "copy", "open" and "all" (stats are null for an empty kind)."""
    summary = {}
    for kind in (*KINDS, "all"):
        chosen = [e for e in entries if kind == "all" or e["kind"] == kind]
        summary[kind] = {m: _method_summary(chosen, m) for m in methods}
    return summary


def build_results(model: str, device: str, max_new_tokens: int, entries: list[dict],
                  repeats: int = 1) -> dict:
    return {"model": model, "device": device, "max_new_tokens": max_new_tokens,
            "repeats": repeats, "methods": list(METHODS), "questions": entries,
            "summary": summarize(entries)}


# -- reporting ---------------------------------------------------------------------------------

def _fmt(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def format_table(results: dict) -> str:
    """The summary as a fixed-width text table (Markdown-compatible)."""
    counts = {k: sum(1 for e in results["questions"] if k == "all" or e["kind"] == k)
              for k in (*KINDS, "all")}
    header = ("| kind | method | median speedup | min speedup | median decode speedup "
              "| median tok/s | accept rate | mean accepted | identical |")
    lines = [header, "|" + "---|" * 9]
    for kind, methods in results["summary"].items():
        if not counts[kind]:
            continue
        for method, s in methods.items():
            ident = {True: "yes", False: "NO", None: "-"}[s["all_identical"]]
            lines.append(
                f"| {kind} (n={counts[kind]}) | {method} | {_fmt(s['median_speedup'], '.2f', '×')} "
                f"| {_fmt(s['min_speedup'], '.2f', '×')} "
                f"| {_fmt(s['median_decode_speedup'], '.2f', '×')} "
                f"| {_fmt(s['median_tokens_per_s'], '.1f')} | {_fmt(s['accept_rate'], '.0%')} "
                f"| {_fmt(s['mean_accepted_length'], '.2f')} | {ident} |")
    return "\n".join(lines)


def check_targets(results: dict) -> list[tuple[str, bool | None, str]]:
    """Issue 5's targets for ragspec: (target, met? (None: no data), the numbers)."""
    s = results["summary"]
    copy, every = s["copy"], s["all"]
    rs, pld, oracle = (copy[m]["median_speedup"] for m in ("ragspec", "hf_pld", "oracle"))
    worst = every["ragspec"]["min_speedup"]

    def ok(value, bound):
        return None if value is None or bound is None else value >= bound

    identical = {m: every[m]["all_identical"] for m in ("greedy", "ragspec", "hf_greedy")}
    return [
        ("copy: ragspec median speedup >= 2.0x", ok(rs, 2.0), f"{_fmt(rs, '.2f')}x"),
        ("copy: ragspec >= 1.5x hf_pld's speedup", ok(rs, None if pld is None else 1.5 * pld),
         f"{_fmt(rs, '.2f')}x vs 1.5 x {_fmt(pld, '.2f')}x"),
        ("copy: ragspec >= 80% of the oracle", ok(rs, None if oracle is None else 0.8 * oracle),
         f"{_fmt(rs, '.2f')}x vs 0.8 x {_fmt(oracle, '.2f')}x"),
        ("every question: ragspec speedup >= 0.97x", ok(worst, 0.97), f"min {_fmt(worst, '.2f')}x"),
        ("greedy identity (greedy, ragspec, hf_greedy)",
         None if None in identical.values() else all(identical.values()),
         ", ".join(f"{m}={v}" for m, v in identical.items())),
    ]


def format_targets(results: dict) -> str:
    mark = {True: "met", False: "MISSED", None: "n/a"}
    return "\n".join(f"[{mark[ok]:>6}] {name}: {detail}"
                     for name, ok, detail in check_targets(results))


def plot(results: dict, path) -> Path:
    """PNG: speedup per question per method, accepted-length histogram (app.bench_plot)."""
    from app.bench_plot import plot as _plot

    return _plot(results, path)
