"""One speculative step for many sequences: plan each one's rows, run them in one forward, accept
per sequence.

Contract: a `BatchSequence` is one request's whole generation state — the single-sequence
engine's GenerationStream (n-gram index, sampling stream, span text, stats; built by
`Generator.stream`, so a request is validated exactly as `ragspec generate` validates it), its
own KV cache and its own draft policy. `batch_step(gen, sequences, prefill_budget)` advances every
sequence by one step in ONE forward (ragspec.decoding.packed) and returns what each produced:

    prefilling   the next chunk of its prompt (at most `prefill_budget` prompt rows in the whole
                 step, oldest sequence first, so the first newcomer gets its first token soonest
                 while running answers keep flowing); the last chunk also yields its first token;
    decoding     [last token, draft...]: propose (n-gram index) ► decide (its policy, costing the
                 draft as the step's extra rows) ► verify (the shared forward) ► accept (greedy or
                 the point-mass rule) ► crop its own cache.

Greedy output equals the sequence run alone with the engine up to the kernels' rounding of a
row computed among T rows against the same row among fewer (batch-invariant kernels make it
exact). A model that cannot be packed (ragspec.decoding.packed.packing_problem) runs the same
plan with one forward per sequence: still interleaved, not queued.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ragspec.decoding.cache import new_cache
from ragspec.decoding.engine import GenerationStream, Generator, Step, forward
from ragspec.decoding.packed import Block, packed_forward
from ragspec.decoding.policy import DraftPolicy, ForwardCost
from ragspec.decoding.sampling import next_token
from ragspec.decoding.types import GenerationConfig, SourceRegion, Span


class ShiftedCost:
    """A forward-cost curve seen by one sequence in a shared step: c'(n) = c(others + n), where
    `others` is the rows the rest of the step already has. Its draft then pays only for the
    time it adds to the step."""

    def __init__(self, base: ForwardCost, others: int = 0):
        self.base, self.others = base, others

    def __call__(self, n: int) -> float:
        return self.base(self.others + n)


@dataclass
class Outcome:
    """What one step produced for one sequence: spans ready to stream; done when finished."""

    spans: list[Span] = field(default_factory=list)
    done: bool = False


class BatchSequence:
    """One request's generation state in the batch (see the module docstring)."""

    def __init__(self, gen: Generator, prompt_ids: Sequence[int], config: GenerationConfig,
                 sources: Sequence[SourceRegion] = ()):
        self.stream: GenerationStream = gen.stream(prompt_ids, config, sources=sources)
        self.stream._cache = new_cache(gen.model)
        shared = self._shared = self.stream._policy
        if shared is not None:  # its own policy, starting from what the generator learned
            own = DraftPolicy(shared.config, gen.cost or ForwardCost.flat(shared.config.max_draft + 1))
            own.acceptance = copy.deepcopy(shared.acceptance)
            self._start = copy.deepcopy(shared.acceptance)
            self.stream._policy = own
            self._cost = own.cost
        self.prompt = self.stream.prompt_ids
        self.prefilled = 0  # prompt positions already in the cache
        self.started: float | None = None  # when its first prompt chunk ran
        self.first_token_at: float | None = None
        self._plan: tuple | None = None  # this step's (kind, match, draft)

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prompt)

    @property
    def cache(self):
        return self.stream._cache

    @property
    def stats(self):
        return self.stream.stats

    def stop(self) -> None:
        self.stream.stop()

    def teach(self) -> None:
        """Add what this sequence's drafts taught its policy to the generator's (called once,
        when it ends), so later requests start from it as the engine's later calls do."""
        own, shared = self.stream._policy, self._shared
        if own is None or shared is None:
            return
        for mine, start, total in ((own.acceptance.accepted, self._start.accepted,
                                    shared.acceptance.accepted),
                                   (own.acceptance.rejected, self._start.rejected,
                                    shared.acceptance.rejected)):
            for b, row in enumerate(mine):
                for i, value in enumerate(row):
                    total[b][i] += value - start[b][i]
        self._shared = None

    # -- one step ------------------------------------------------------------------------------

    def plan_prefill(self, budget: int) -> Block:
        """The next prompt chunk of at most `budget` rows."""
        if self.started is None:
            self.started = time.perf_counter()
        end = min(len(self.prompt), self.prefilled + budget)
        self._plan = ("prefill", end, None)
        return Block(self.cache, self.prompt[self.prefilled:end], self.prefilled,
                     "last" if end == len(self.prompt) else "none")

    def plan_decode(self, others: int) -> Block:
        """[last token, draft...] with the draft sized for a step that has `others` other rows."""
        stream = self.stream
        if stream._policy is not None:
            stream._policy.cost = ShiftedCost(self._cost, others)
        match, draft = stream._propose()
        self._plan = ("decode", match, draft)
        index = stream._index
        return Block(self.cache, [index.tokens[-1], *draft], len(index) - 1, "all")

    def take(self, logits: torch.Tensor | None) -> Outcome:
        """Apply this step's logits (None for a prompt chunk before the last)."""
        kind, a, b = self._plan
        self._plan = None
        stream = self.stream
        if kind == "prefill":
            self.prefilled = a
            if self.prefilling:
                return Outcome()
            step = Step([next_token(logits[-1], stream.config.sampling, stream._rng)])
            self.first_token_at = time.perf_counter()
            stream.stats.prefill_seconds = stream.stats.ttft_seconds = (
                self.first_token_at - self.started)
        else:
            step = stream._accept(logits, a, b)
        spans, done = stream._commit(step)
        if not done and stream._stop_requested:
            spans, done = [*spans, *stream._stopped()], True
        if self.first_token_at is not None:
            stream.stats.decode_seconds = time.perf_counter() - self.first_token_at
        return Outcome(spans, done)


def plan_step(sequences: Sequence[BatchSequence], prefill_budget: int
              ) -> list[tuple[BatchSequence, Block]]:
    """Every decoding sequence's rows, then prompt chunks (oldest first) within the budget."""
    decoding = [s for s in sequences if not s.prefilling]
    prefilling = [s for s in sequences if s.prefilling]
    planned: list[tuple[BatchSequence, Block]] = []
    budget = prefill_budget
    for seq in prefilling:
        if budget <= 0:
            break
        block = seq.plan_prefill(budget)
        budget -= len(block.tokens)
        planned.append((seq, block))
    rows = sum(len(b.tokens) for _, b in planned) + len(decoding)
    for seq in decoding:
        block = seq.plan_decode(rows - 1)  # the others: everything planned but its own row
        rows += len(block.tokens) - 1
        planned.append((seq, block))
    return planned


def batch_step(gen: Generator, sequences: Sequence[BatchSequence], prefill_budget: int, *,
               packed: bool = True) -> dict[BatchSequence, Outcome]:
    """Advance every sequence by one step (see the module docstring). packed=False runs one
    forward per sequence (for models that cannot be packed)."""
    planned = plan_step(sequences, prefill_budget)
    if not planned:
        return {}
    clock = time.perf_counter()
    if packed:
        logits = packed_forward(gen.model, [block for _, block in planned])
    else:
        logits = [_alone(gen.model, block) for _, block in planned]
    outcomes = {seq: seq.take(rows) for (seq, _), rows in zip(planned, logits, strict=True)}
    if len(planned) == 1 and planned[0][1].logits == "all" and planned[0][0].stream._policy:
        # a lone decode step is what the cost curve measures: let the engine's watch see it
        gen.watch.observe(len(planned[0][1].tokens), time.perf_counter() - clock)
    return outcomes


def _alone(model, block: Block) -> torch.Tensor | None:
    """One block as its own forward, with its own cache (the unpacked path)."""
    keep = {"all": 0, "last": 1, "none": 1}[block.logits]
    logits = forward(model, block.tokens, block.cache, logits_to_keep=keep)
    return None if block.logits == "none" else logits
