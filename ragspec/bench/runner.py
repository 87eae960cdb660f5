"""The benchmark behind `ragspec bench`: ragspec against greedy, transformers and an oracle.

Contract: given prepared prompts (token ids, built by the real pipeline: `prepare_prompts`) and
one Generator, run every method on every question, interleaved question by question in one
process, after a warm-up, each timed with the same clock (time.perf_counter) around the whole
generation; `ragspec.bench.summary` aggregates the entries. Knows nothing of click.

Methods (all greedy, all capped at max_new_tokens):
    greedy     ragspec's engine with speculation off: the baseline of the engine methods;
    ragspec    the engine with its default speculation (adaptive n-gram drafts);
    hf_greedy  transformers' model.generate(do_sample=False) as a transformers user runs it:
               fp32 weights (de-quantised from the same file when the engine runs packed
               weights: a second, stock model object), transformers' own attention (sdpa) and
               cache;
    hf_pld     the same with prompt_lookup_num_tokens=10: transformers' own prompt lookup;
    hf_static  (ragspec.bench.gpu_check only) the same with transformers' static cache, which
               transformers compiles with torch.compile on CUDA;
    oracle     the engine drafting the true greedy continuation (greedy's output), max_draft at a
               time: the ceiling for any drafter on this machine;
    llamacpp, llamacpp_pld  llama.cpp on the same GGUF file when llama_cpp is installed
               (ragspec.bench.anchors.llamacpp);
    llama_server, llama_server_ngram_*  mainline llama-server (a native build) on the same GGUF
               file and prompt ids, greedy and with each of its draft-free n-gram modes
               (ragspec.bench.anchors.llama_server), timed on the client's clock.

identical_to_greedy compares token ids with greedy's output; for greedy itself it compares with
model.generate on the engine's own model object (hf_greedy's output when that runs the same
weights; else an untimed model.generate on the packed model), for llamacpp_pld with llamacpp's, for each llama-server
n-gram mode with llama_server's; llamacpp's and llama_server's own are not compared (null).
Every entry splits its time into the first token (prefill and one step: `ttft_seconds`) and
the decode phase after it (`decode_seconds`), so a ratio can be traced to one or the other.

Every method ends an answer by the same repetition stop rule the product uses (`repeat`, by
default ragspec.decoding.types.ANSWER_REPEAT): the engine methods in the engine, the transformers
methods through a StoppingCriteria and the llama.cpp methods in their token loop, each deciding
on tokens already produced. transformers' prompt lookup may write past the stop inside its last
verify step; those tokens are timed and then dropped, so every method is compared on the same
text. Each entry says whether its answer looped ("looping": the stop rule ended greedy's
answer, or it holds a run of 8 tokens written 3 times; ragspec.eval.quality), so speedups can be
reported on the answers that do not.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ragspec.bench.anchors.llama_server import NGRAM_METHODS, SERVER_METHODS
from ragspec.bench.anchors.llamacpp import LLAMACPP_METHODS
from ragspec.bench.questions import KINDS, BenchInputError, Prepared, Question, load_questions
from ragspec.decoding.repetition import RepetitionGuard, max_repeats, stop_point
from ragspec.decoding.types import ANSWER_REPEAT, DraftConfig, GenerationConfig, RepeatConfig

METHODS = ("greedy", "ragspec", "hf_greedy", "hf_pld", "oracle")
# speedups are over each method's own plain decoding
BASELINE = {"greedy": "greedy", "ragspec": "greedy", "oracle": "greedy",
            "hf_greedy": "greedy", "hf_pld": "hf_greedy",
            "llamacpp": "llamacpp", "llamacpp_pld": "llamacpp",
            **{m: "llama_server" for m in SERVER_METHODS}}
# what each method's output is compared with (identical_to_greedy); None: nothing (llama.cpp's
# kernels quantise activations too, so its greedy text is its own, not the engine's)
REFERENCE = {"greedy": "hf_greedy", "llamacpp": None, "llamacpp_pld": "llamacpp",
             "llama_server": None, **{m: "llama_server" for m in NGRAM_METHODS}}
PLD_TOKENS = 10  # transformers' prompt_lookup_num_tokens, as users would set it
WARMUP_TOKENS = 16


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
    stop_reason: str | None = None
    anchor: dict | None = None  # what an external engine said of the run (llama-server's timings)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    def to_dict(self, identical: bool | None) -> dict:
        n, after_first = self.new_tokens, self.seconds - self.ttft_seconds
        out = {
            "new_tokens": n,
            "seconds": self.seconds,
            "ttft_seconds": self.ttft_seconds,
            "decode_seconds": after_first,
            "tokens_per_s": n / self.seconds if self.seconds > 0 else 0.0,
            "decode_tokens_per_s": (n - 1) / after_first if n > 1 and after_first > 0 else 0.0,
            "forward_passes": self.forward_passes,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "identical_to_greedy": identical,
            "accepted_lengths": {str(k): v for k, v in sorted(self.accepted_lengths.items())},
            "stop_reason": self.stop_reason,
        }
        if self.anchor is not None:
            out["anchor"] = self.anchor
        return out


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


STOCK_ATTENTION = "sdpa"


@contextmanager
def stock_transformers(model) -> Iterator[None]:
    """The model as transformers runs it, for the duration of the block: its own attention."""
    own = model.config._attn_implementation
    if own != STOCK_ATTENTION:
        model.set_attn_implementation(STOCK_ATTENTION)
    try:
        yield
    finally:
        if own != STOCK_ATTENTION:
            model.set_attn_implementation(own)


class Runner:
    """Runs one method on one prompt with a shared Generator (its model serves the HF methods)."""

    def __init__(self, generator, draft: DraftConfig | None = None, pld_tokens: int = PLD_TOKENS,
                 anchors=None, stock: bool = True, methods: Sequence[str] | None = None,
                 stock_model=None, repeat: RepeatConfig | None = None, servers=None):
        """anchors: an ragspec.bench.anchors.llamacpp.LlamaCppAnchors, to run the llama.cpp methods too.
        servers: an ragspec.bench.anchors.llama_server.LlamaServers, to run its llama-server methods.
        stock: run hf_greedy/hf_pld as transformers runs the model (fp32, sdpa); False runs
            model.generate on the model exactly as the engine runs it (ragspec's attention and
            4-bit layers): the reference of the engine's greedy identity.
        methods: run only these (see `select_methods`); default all that can run.
        stock_model: the model hf_greedy/hf_pld run when it is not the engine's own (an fp32
            transformers model beside a packed one).
        repeat: the stop rule every method applies (default: the product's, ANSWER_REPEAT); a
            repetition penalty is not supported (transformers' and llama.cpp's differ)."""
        if repeat is None:
            repeat = ANSWER_REPEAT
        if repeat.penalty != 1.0:
            raise BenchInputError("the benchmark runs without a repetition penalty: the "
                                  "transformers and llama.cpp methods apply theirs differently")
        self.repeat = repeat
        self.gen = generator
        self.stock = stock
        self.stock_model = stock_model if stock_model is not None else generator.model
        self.draft = draft or DraftConfig()
        self.pld_tokens = pld_tokens
        self.anchors = anchors
        self.servers = servers
        available = (METHODS + (LLAMACPP_METHODS if anchors is not None else ())
                     + (tuple(servers.methods) if servers is not None else ()))
        self.methods = available if methods is None else select_methods(methods, available)

    def run(self, method: str, prompt_ids: Sequence[int], max_new_tokens: int, *,
            sources: Sequence = (), reference: Sequence[int] | None = None) -> MethodRun:
        if method == "greedy":
            cfg = GenerationConfig(max_new_tokens, draft=DraftConfig(enabled=False),
                                   repeat=self.repeat)
            return self._engine(prompt_ids, cfg, sources, None)
        if method == "ragspec":
            return self._engine(prompt_ids, GenerationConfig(max_new_tokens, draft=self.draft,
                                                             repeat=self.repeat), sources, None)
        if method == "oracle":
            if reference is None:
                raise ValueError("the oracle needs greedy's output: run greedy first")
            return self._engine(prompt_ids, GenerationConfig(max_new_tokens, draft=self.draft,
                                                             repeat=self.repeat),
                                sources, list(reference))
        if method == "hf_greedy":
            return self._hf(prompt_ids, max_new_tokens, {})
        if method == "hf_pld":
            return self._hf(prompt_ids, max_new_tokens,
                            {"prompt_lookup_num_tokens": self.pld_tokens})
        if method == "hf_static":  # not in METHODS: gpu_check's (auto-compiled on CUDA)
            return self._hf(prompt_ids, max_new_tokens, {"cache_implementation": "static"})
        if method in LLAMACPP_METHODS and self.anchors is not None:
            tokens, seconds, ttft = self.anchors.generate(method, prompt_ids, max_new_tokens,
                                                          self.gen.eos_token_ids,
                                                          stop=self._guard())
            return MethodRun(tokens, seconds, ttft)
        if self.servers is not None and method in self.servers.methods:
            run = self.servers.generate(method, prompt_ids, max_new_tokens,
                                        self.gen.eos_token_ids, stop=self._guard())
            return MethodRun(run.token_ids, run.seconds, run.ttft_seconds, anchor=run.summary())
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(self.methods)}")

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
                         dict(s.accepted_lengths), s.stop_reason)

    def _guard(self):
        """A fresh stop-rule check for one generation: token -> True when the answer ends."""
        if not self.repeat.stop_ngram:
            return lambda token: False
        return RepetitionGuard(self.repeat.stop_ngram, self.repeat.stop_count).push

    def same_model_greedy(self, prompt_ids, max_new_tokens: int) -> list[int]:
        """model.generate on the engine's own model object, untimed: the reference of greedy's
        identity when hf_greedy runs another model object."""
        return self._hf(prompt_ids, max_new_tokens, {}, model=self.gen.model, stock=False).token_ids

    @torch.inference_mode()
    def _hf(self, prompt_ids, max_new_tokens: int, extra: dict, model=None,
            stock: bool | None = None) -> MethodRun:
        gen = self.gen
        model = self.stock_model if model is None else model
        stock = self.stock if stock is None else stock
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=gen.device)
        eos = sorted(gen.eos_token_ids)
        pad = getattr(gen.tokenizer, "pad_token_id", None)
        with stock_transformers(model) if stock else contextlib.nullcontext():
            start = time.perf_counter()
            timer = _first_token_timer(start)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, eos_token_id=eos or None,
                                 pad_token_id=pad if pad is not None else (eos[0] if eos else None),
                                 streamer=timer, stopping_criteria=self._criteria(ids.shape[1]),
                                 **extra)
            tokens = out[0, ids.shape[1]:].tolist()
            seconds = time.perf_counter() - start
        if extra and self.repeat.stop_ngram:  # prompt lookup may write past the stop: drop it
            tokens = tokens[: stop_point(tokens, self.repeat.stop_ngram, self.repeat.stop_count)
                            or len(tokens)]
        drafted = 0 if not extra else None  # hf_greedy drafts nothing; hf_pld does not say
        return MethodRun(tokens, seconds, timer.ttft if timer.ttft is not None else seconds,
                         forward_passes=None, drafted_tokens=drafted, accepted_tokens=drafted)


    def _criteria(self, prompt_length: int):
        """The stop rule as transformers' StoppingCriteria, fed the tokens added since its last
        call (several at once under prompt lookup)."""
        from transformers import StoppingCriteria, StoppingCriteriaList

        push = self._guard()

        class RepetitionStop(StoppingCriteria):
            def __init__(self) -> None:
                self.seen, self.fired = prompt_length, False

            def __call__(self, input_ids, scores, **kwargs):
                for token in input_ids[0, self.seen:].tolist():
                    self.fired = push(token) or self.fired
                self.seen = input_ids.shape[1]
                return torch.full((input_ids.shape[0],), self.fired, dtype=torch.bool,
                                  device=input_ids.device)

        return StoppingCriteriaList([RepetitionStop()])


ProgressFn = Callable[[Question, str], None]


def warm_up(runner: Runner, prompt: Prepared) -> None:
    """One short untimed run of every method: first-call costs (allocations, kernel choice,
    lazy imports) stay out of the timings."""
    tokens = min(WARMUP_TOKENS, runner.gen.context_length - len(prompt.prompt_ids))
    reference = runner.run("greedy", prompt.prompt_ids, max(1, tokens)).token_ids
    for method in runner.methods:
        runner.run(method, prompt.prompt_ids, max(1, tokens), sources=prompt.sources,
                   reference=reference)


def select_methods(requested: Sequence[str], available: Sequence[str]) -> tuple[str, ...]:
    """The methods to run for `requested`, in `available`'s order: each requested method plus
    its speedup baseline (greedy always: the oracle and every engine method need it). A
    method's identity reference is not added: without it, `identical` is null."""
    unknown = [m for m in requested if m not in available]
    if unknown:
        raise BenchInputError(f"unknown method(s) {', '.join(unknown)}; choose from "
                              f"{', '.join(available)}")
    wanted = {"greedy", *requested, *(BASELINE[m] for m in requested)}
    return tuple(m for m in available if m in wanted)


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
    runs: dict[str, list[MethodRun]] = {m: [] for m in runner.methods}
    policies = runner.gen.policy_state()
    for round_ in range(repeats):
        runner.gen.restore_policy_state(policies)
        for method in method_order(index + round_, runner.methods):
            reference = runs["greedy"][0].token_ids if runs["greedy"] else None
            runs[method].append(runner.run(method, item.prompt_ids, max_new_tokens,
                                           sources=item.sources, reference=reference))
            if progress:
                progress(item.question, method)
    results = {}
    for m in runner.methods:
        best = min(runs[m], key=lambda r: r.seconds)
        ref = REFERENCE.get(m, "greedy")
        identical = None if ref is None or ref not in runs else all(
            r.token_ids == runs[ref][0].token_ids for r in runs[m])
        if m == "greedy" and runner.stock_model is not runner.gen.model:
            same = runner.same_model_greedy(item.prompt_ids, max_new_tokens)
            identical = all(r.token_ids == same for r in runs[m])
        results[m] = best.to_dict(identical)
        results[m]["runs_seconds"] = [r.seconds for r in runs[m]]
    q = item.question
    return {"id": q.id, "kind": q.kind, "prompt_tokens": len(item.prompt_ids),
            "looping": looping(runs["greedy"][0]), "results": results}


def looping(run: MethodRun) -> bool:
    """Whether an answer repeated itself: the stop rule ended it, or it holds a loop as
    ragspec.eval.quality counts one (a run of 8 tokens written 3 or more times)."""
    from ragspec.eval.quality import LOOP_NGRAM, LOOP_TIMES

    return run.stop_reason == "repetition" or max_repeats(run.token_ids, LOOP_NGRAM) >= LOOP_TIMES


def run_bench(runner: Runner, prepared: Sequence[Prepared], max_new_tokens: int, *,
              progress: ProgressFn | None = None, warmup: bool = True,
              repeats: int = 1) -> list[dict]:
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup and prepared:
        warm_up(runner, prepared[0])
    return [bench_question(runner, i, item, max_new_tokens, progress, repeats)
            for i, item in enumerate(prepared)]


# Callers reach the whole benchmark through this module (`ragspec.bench.runner as core`).
from ragspec.bench.prepare import Setup, build_setup, ingest_corpus, prepare_prompts  # noqa: E402

__all__ = ["METHODS", "KINDS", "BASELINE", "REFERENCE", "BenchInputError", "Question",
           "load_questions", "Prepared", "MethodRun", "Runner", "Setup", "build_setup",
           "ingest_corpus", "prepare_prompts", "run_bench", "bench_question", "select_methods",
           "method_order", "warm_up", "looping", "stock_transformers"]
