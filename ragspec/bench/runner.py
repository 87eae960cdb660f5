"""The benchmark behind `ragspec bench`: ragspec against greedy, transformers and an oracle.

Contract: given prepared prompts (token ids, built by the real pipeline: `prepare_prompts`) and
one Generator, run every method on every question, interleaved question by question in one
process, after a warm-up, each timed with the same clock (time.perf_counter) around the whole
generation; `ragspec.bench.summary` aggregates the entries. Knows nothing of click.

Methods (all greedy, all capped at max_new_tokens):
    greedy     ragspec's engine with speculation off: the baseline of the engine methods;
    ragspec    the engine with its default speculation (adaptive n-gram drafts);
    hf_greedy  transformers' model.generate(do_sample=False) as a transformers user runs it:
               the same weights in fp32 (4-bit layers off), transformers' own attention (sdpa)
               and cache, for these runs only;
    hf_pld     the same with prompt_lookup_num_tokens=10: transformers' own prompt lookup;
    oracle     the engine drafting the true greedy continuation (greedy's output), max_draft at a
               time: the ceiling for any drafter on this machine;
    llamacpp, llamacpp_pld  llama.cpp on the same GGUF file when llama_cpp is installed
               (ragspec.bench.llamacpp).

identical_to_greedy compares token ids with greedy's output; for greedy itself it compares with
hf_greedy's (the engine against transformers, when both run the same weights: see the README),
for llamacpp_pld with llamacpp's; llamacpp's own is not compared (null).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ragspec.bench.llamacpp import LLAMACPP_METHODS
from ragspec.decoding.types import DraftConfig, GenerationConfig

METHODS = ("greedy", "ragspec", "hf_greedy", "hf_pld", "oracle")
KINDS = ("copy", "open")
# speedups are over each method's own plain decoding
BASELINE = {"greedy": "greedy", "ragspec": "greedy", "oracle": "greedy",
            "hf_greedy": "greedy", "hf_pld": "hf_greedy",
            "llamacpp": "llamacpp", "llamacpp_pld": "llamacpp"}
# what each method's output is compared with (identical_to_greedy); None: nothing (llama.cpp's
# kernels quantise activations too, so its greedy text is its own, not the engine's)
REFERENCE = {"greedy": "hf_greedy", "llamacpp": None, "llamacpp_pld": "llamacpp"}
PLD_TOKENS = 10  # transformers' prompt_lookup_num_tokens, as users would set it
WARMUP_TOKENS = 16
ANCHOR_CONTEXT = 4096  # tokens of context for the llama.cpp methods (prompt + answer)


class BenchInputError(ValueError):
    """A questions file or prompt the benchmark cannot use; the message says where and why."""


@dataclass(frozen=True)
class Question:
    """answers: the verbatim snippets that hold the answer (empty when the file gives none).
    unanswerable: the documents do not hold the answer."""

    id: str
    question: str
    kind: str = "copy"
    answers: tuple[str, ...] = ()
    unanswerable: bool = False


def load_questions(path: str | Path, limit: int | None = None, *,
                   unanswerable: bool = False) -> list[Question]:
    """Questions from a JSONL file: one {"id", "question", "kind", "answer"} object per line.

    kind is "copy" (the answer should quote the documents) or "open"; missing means "copy".
    answer: a snippet or a list of snippets that hold the answer (optional). Questions marked
    "unanswerable" are skipped unless `unanswerable` is True (the quality evaluation asks them
    to see them refused). A missing id becomes the line number. Blank lines are skipped.
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
        if obj.get("unanswerable") and not unanswerable:
            continue  # the documents do not hold the answer: nothing to time
        kind = obj.get("kind") or "copy"
        if kind not in KINDS:
            raise BenchInputError(f"{where}: \"kind\" must be \"copy\" or \"open\", got {kind!r}")
        qid = str(obj["id"]) if obj.get("id") not in (None, "") else str(number)
        if qid in seen:
            raise BenchInputError(f"{where}: duplicate id {qid!r}")
        seen.add(qid)
        answers = obj.get("answer") or []
        answers = [answers] if isinstance(answers, str) else answers
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise BenchInputError(f"{where}: \"answer\" must be a string or a list of strings")
        questions.append(Question(qid, text.strip(), kind, tuple(a for a in answers if a.strip()),
                                  bool(obj.get("unanswerable"))))
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

    def to_dict(self, identical: bool | None) -> dict:
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
            "identical_to_greedy": identical,
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


STOCK_ATTENTION = "sdpa"


@contextmanager
def stock_transformers(model) -> Iterator[None]:
    """The model as transformers runs it, for the duration of the block: its own attention and
    fp32 weights (ragspec's 4-bit layers off); the weights stay where they are."""
    from ragspec.decoding.quant import fp32_weights

    own = model.config._attn_implementation
    if own != STOCK_ATTENTION:
        model.set_attn_implementation(STOCK_ATTENTION)
    try:
        with fp32_weights(model):
            yield
    finally:
        if own != STOCK_ATTENTION:
            model.set_attn_implementation(own)


class Runner:
    """Runs one method on one prompt with a shared Generator (its model serves the HF methods)."""

    def __init__(self, generator, draft: DraftConfig | None = None, pld_tokens: int = PLD_TOKENS,
                 anchors=None, stock: bool = True, methods: Sequence[str] | None = None):
        """anchors: an ragspec.bench.llamacpp.LlamaCppAnchors, to run the llama.cpp methods too.
        stock: run hf_greedy/hf_pld as transformers runs the model (fp32, sdpa); False runs
            model.generate on the model exactly as the engine runs it (ragspec's attention and
            4-bit layers): the reference of the engine's greedy identity.
        methods: run only these (see `select_methods`); default all that can run."""
        self.gen = generator
        self.stock = stock
        self.draft = draft or DraftConfig()
        self.pld_tokens = pld_tokens
        self.anchors = anchors
        available = METHODS + (LLAMACPP_METHODS if anchors is not None else ())
        self.methods = available if methods is None else select_methods(methods, available)

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
        if method in LLAMACPP_METHODS and self.anchors is not None:
            tokens, seconds, ttft = self.anchors.generate(method, prompt_ids, max_new_tokens,
                                                          self.gen.eos_token_ids)
            return MethodRun(tokens, seconds, ttft)
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
                         dict(s.accepted_lengths))

    @torch.inference_mode()
    def _hf(self, prompt_ids, max_new_tokens: int, extra: dict) -> MethodRun:
        model, gen = self.gen.model, self.gen
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=gen.device)
        eos = sorted(gen.eos_token_ids)
        pad = getattr(gen.tokenizer, "pad_token_id", None)
        with stock_transformers(model) if self.stock else contextlib.nullcontext():
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
        results[m] = best.to_dict(identical)
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




# -- prompts, as the product builds them ------------------------------------------------------

@dataclass
class Setup:
    """What a benchmark run needs: the generator and each question's prompt (tests inject it)."""

    model_name: str
    device: str
    generator: object  # ragspec.decoding.engine.Generator
    prepared: list[Prepared] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    anchors: object = None  # ragspec.bench.llamacpp.LlamaCppAnchors, or None


def build_setup(model: str | None, corpus: str, index: str | None,
                questions: Sequence[Question], max_new_tokens: int,
                log: Callable[[str], None] = lambda message: None,
                llamacpp: bool | None = None) -> Setup:
    """Load the model, ingest `corpus` (into a temporary index, or into `index`, where unchanged
    files are skipped) and build every question's prompt with the real pipeline.

    llamacpp: run the llama.cpp methods too (None: when llama_cpp is installed and the model
    came from a GGUF file). Raises ragspec.decoding.model.ModelNotFound and retrieval's RetrievalError;
    a corpus file or a question that fails is listed in Setup.failures and the rest go on."""
    from ragspec.loading import describe_device, load_generator, open_store

    loaded, generator = load_generator(model)
    # llama.cpp's prompt-lookup context keeps float32 logits for every position it may hold
    # (n_ctx x vocabulary: 0.8 GB at 4096 for SmolLM2), so it gets the room a RAG prompt needs
    anchors = _open_anchors(model, llamacpp, min(generator.context_length, ANCHOR_CONTEXT), log)
    with tempfile.TemporaryDirectory(prefix="ragspec-bench-") as scratch:
        store = open_store(index or scratch)
        log(f"Ingesting {corpus} ...")
        failures = ingest_corpus(store, corpus)
        prepared = prepare_prompts(generator, store, questions, max_new_tokens, failures)
    return Setup(loaded.name, describe_device(loaded), generator, prepared, failures, anchors)


def ingest_corpus(store, corpus: str) -> list[str]:
    """Ingest the folder `corpus` into `store`; the files that failed, each with its reason.
    Raises BenchInputError when no passage could be made at all."""
    from ragspec.retrieval.ingest import ingest_paths

    report = ingest_paths([corpus], store)
    if store.passage_count() == 0:
        raise BenchInputError(f"no passages could be made from {corpus}: nothing to "
                              "retrieve (give a folder of .md/.txt/.pdf/.html/.docx)")
    return [f"corpus file {path}: {why}" for path, why in report.failed]


def _open_anchors(model: str | None, wanted: bool | None, n_ctx: int, log):
    from ragspec.bench import llamacpp as bench_llamacpp
    from ragspec.decoding.model import BUNDLED, bundled_gguf_path

    if wanted is False or (wanted is None and not bench_llamacpp.available()):
        return None
    if not bench_llamacpp.available():
        raise BenchInputError("llama_cpp is not installed: `make bench-anchors` installs "
                              "llama-cpp-python (a source build, ~10 minutes)")
    if model in (None, "", BUNDLED):
        gguf = bundled_gguf_path()
    elif str(model).lower().endswith(".gguf"):
        gguf = Path(model).expanduser()
    else:
        if wanted:
            raise BenchInputError(f"the llama.cpp methods need a GGUF file; {model} is not one")
        return None
    log(f"llama.cpp anchors on {gguf}")
    return bench_llamacpp.LlamaCppAnchors.open(gguf, n_ctx)


def prepare_prompts(generator, store, questions: Sequence[Question], max_new_tokens: int,
                    failures: list[str], k: int = 4) -> list[Prepared]:
    """Each question's prompt as `ragspec ask` builds it (k passages, room for the answer);
    a question whose prompt cannot be built is appended to `failures`."""
    from ragspec.pipeline import NoDocumentsError, Pipeline, PipelineConfig
    from ragspec.retrieval.errors import RetrievalError

    pipe = Pipeline(store, generator, PipelineConfig(k=k, max_new_tokens=max_new_tokens))
    prepared = []
    for q in questions:
        try:
            p = pipe.prepare(q.question)
        except (RetrievalError, NoDocumentsError, ValueError) as exc:
            failures.append(f"question {q.id}: {exc}")
            continue
        prepared.append(Prepared(q, list(p.prompt_ids), tuple(p.sources)))
    return prepared
