"""One speculative step for many sequences: plan each one's rows, run them in one forward, accept
per sequence.

Contract: a `BatchSequence` is one request's whole generation state — the single-sequence
engine's GenerationStream (n-gram index, sampling stream, span text, stats; built by
`Generator.stream`, so a request is validated exactly as `ragspec generate` validates it), its
own KV cache and its own draft policy. `batch_step(gen, sequences, prefill_chunk)` advances every
sequence by one step in ONE forward (ragspec.decoding.ragged) and returns what each produced:

    prefilling   its prompt, in a forward of its own: whole (the default: one newcomer per
                 step, oldest first, computed as the engine's prefill is) or in chunks of at
                 most `prefill_chunk` rows per step (running answers pause less, but a chunked
                 prompt may round differently from a whole one); or, `shared` (where the
                 native step reads prompts, so a piece gives what the whole prompt gives, bit
                 for bit), in pieces inside the decoding rows' own native call; the last piece
                 also yields the first token;
    decoding     [last token, draft...]: propose (n-gram index) ► decide (its policy, costing the
                 draft as the step's extra rows) ► verify (the shared forward) ► accept (greedy or
                 the point-mass rule) ► crop its own cache.

Greedy output equals the sequence run alone with the engine up to the kernels' rounding of a
row computed among T rows against the same row among fewer (batch-invariant kernels make it
exact). With the native step installed (ragspec.decoding.native_step) the "one forward" is one
native call over every decoding sequence's rows, each against its own cache
(ragged.packed_forward, native_step.forward_many): the weights are read once per step for all
of them, and the output is exactly the solo output (the step is row-invariant). `StepTimes`
adds up where the steps' time went, including how long decoding sequences waited for a prompt. A model that cannot be packed (ragspec.decoding.ragged.packing_problem) runs the same
plan with one forward per sequence: still interleaved, not queued.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ragspec.decoding.cache import new_cache
from ragspec.decoding.engine import GenerationStream, Generator, Step
from ragspec.decoding.native_step import PIECE_ROWS
from ragspec.decoding.packed import step_forward
from ragspec.decoding.policy import DraftPolicy, ForwardCost
from ragspec.decoding.ragged import Block, alone, packed_forward
from ragspec.decoding.sampling import next_token
from ragspec.decoding.types import GenerationConfig, SourceRegion, Span


class ShiftedCost:
    """A forward-cost curve seen by one sequence in a shared step: c'(n) = c(others + n), where
    `others` is the rows the rest of the step already has. Its draft then pays only for the
    time it adds to the step."""

    def __init__(self, base: ForwardCost, others: int = 0):
        self.base, self.others = base, others

    def __call__(self, n: int, context: int | None = None) -> float:
        return self.base(self.others + n, context)

    def curve(self, count: int, context: int | None = None) -> list[float]:
        """[c'(1), ..., c'(count)] (ForwardCost.curve)."""
        return self.base.curve(self.others + count, context)[self.others:]


@dataclass
class Outcome:
    """What one step produced for one sequence: spans ready to stream; done when finished."""

    spans: list[Span] = field(default_factory=list)
    done: bool = False


class BatchSequence:
    """One request's generation state in the batch (see the module docstring)."""

    def __init__(self, gen: Generator, prompt_ids: Sequence[int], config: GenerationConfig,
                 sources: Sequence[SourceRegion] = (), recall: bool = False):
        """recall: this sequence's prompt would be read in one forward (the scheduler reads
        whole prompts), or in pieces that read as one (where prefixes are reused), so an
        identical prompt kept whole (Generator.whole_prompts) may be recalled instead, and this
        one kept whole once read."""
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
        self.started = time.perf_counter()  # when its prompt read began
        self.whole = recall
        # an identical prompt's logits, recalled with its cache: its first token needs no forward
        self.recalled = self.stream._recall_prompt() if recall else None
        # prompt positions already in the cache: those the prompt cache had, to begin with
        self.prefilled = (len(self.prompt) if self.recalled is not None
                          else self.stream._reuse_prompt())
        self.first_token_at: float | None = None
        self._plan: tuple | None = None  # this step's (kind, match, draft)

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prompt) or self.recalled is not None

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
        end = min(len(self.prompt), self.prefilled + budget)
        self._plan = ("prefill", end, self.prefilled == 0 and end == len(self.prompt))
        return Block(self.cache, self.prompt[self.prefilled:end], self.prefilled,
                     "last" if end == len(self.prompt) else "none")

    def plan_decode(self, others: int) -> Block:
        """[last token, draft...] with the draft sized for a step that has `others` other rows."""
        stream = self.stream
        stream._settle()  # the prompt read, kept now that its first token is out (take)
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
            # kept whole after one read, or after pieces that read as one (prefixes reused);
            # kept once the first token is out: before this sequence's next forward
            # (plan_decode), or now if the answer ends here
            exact = b or stream._prefix is not None
            stream._unkept = (logits if self.whole and exact else None,)
            outcome = self._commit(self._first(logits))
            if outcome.done:
                stream._settle()
            return outcome
        step = stream._accept(logits, a, b)
        if stream._governor is not None:  # by the curve: a shared step has no time of its own
            stream._governor.record(len(b), step.accepted, len(stream._index) - 1)
        return self._commit(step)

    def take_recalled(self) -> Outcome:
        """The first token from the recalled prompt's logits (no forward)."""
        logits, self.recalled = self.recalled, None
        return self._commit(self._first(logits))

    def _first(self, logits: torch.Tensor) -> Step:
        stream = self.stream
        step = Step([next_token(logits[-1], stream.config.sampling, stream._uniforms)])
        self.first_token_at = time.perf_counter()
        stream.stats.prefill_seconds = stream.stats.ttft_seconds = (
            self.first_token_at - self.started)
        return step

    def _commit(self, step: Step) -> Outcome:
        stream = self.stream
        spans, done = stream._commit(step)
        if not done and stream._stop_requested:
            spans, done = [*spans, *stream._stopped()], True
        if self.first_token_at is not None:
            stream.stats.decode_seconds = time.perf_counter() - self.first_token_at
        return Outcome(spans, done)


@dataclass
class StepTimes:
    """Where a batch's steps spent their time (summed over the steps given it): forwards of
    prompt rows alone, forwards of decode rows alone, forwards that carried both (`shared`:
    prompt pieces riding in the decoding rows' forward), and `stalled_seconds`,
    sequence-seconds of decoding sequences that waited for a prompt forward in their step (a
    prompt's time × the sequences decoding beside it) — what reading prompts apart costs the
    running answers. decode_steps counts every forward with decode rows, shared or not."""

    steps: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    shared_seconds: float = 0.0
    stalled_seconds: float = 0.0
    decode_steps: int = 0
    shared_steps: int = 0
    decode_sequences: int = 0  # summed over decode steps: mean sequences per decode step
    decode_rows: int = 0

    def count_decodes(self, decodes: Sequence[tuple[BatchSequence, Block]]) -> None:
        self.decode_steps += 1
        self.decode_sequences += len(decodes)
        self.decode_rows += sum(len(block.tokens) for _, block in decodes)

    def as_dict(self) -> dict:
        return {"steps": self.steps, "prefill_seconds": round(self.prefill_seconds, 4),
                "decode_seconds": round(self.decode_seconds, 4),
                "shared_seconds": round(self.shared_seconds, 4),
                "stalled_seconds": round(self.stalled_seconds, 4),
                "decode_steps": self.decode_steps, "shared_steps": self.shared_steps,
                "decode_sequences": self.decode_sequences, "decode_rows": self.decode_rows}


# With shared steps: the prompt rows a step carries beside decoding rows (unless the scheduler
# is given its own prefill_chunk), and at most, with nothing decoding, native_step.PIECE_ROWS.
SHARED_CHUNK = 256


def plan_step(sequences: Sequence[BatchSequence], prefill_chunk: int | None,
              shared: bool = False
              ) -> tuple[list[tuple[BatchSequence, Block]], list[tuple[BatchSequence, Block]]]:
    """(prompt pieces, decode rows) for one step. Prompt pieces, oldest newcomer first: with
    prefill_chunk None, the oldest newcomer's whole prompt (one per step); else at most
    prefill_chunk prompt rows in all. shared (the prompt pieces ride in the decoding rows'
    forward): at most prefill_chunk (None: SHARED_CHUNK) prompt rows while any sequence
    decodes, else at most PIECE_ROWS. Then every decoding sequence's rows."""
    prefills: list[tuple[BatchSequence, Block]] = []
    prefilling = [s for s in sequences if s.prefilling]
    decoding = [s for s in sequences if not s.prefilling]
    if shared:
        prefill_chunk = (prefill_chunk or SHARED_CHUNK) if decoding else PIECE_ROWS
    if prefill_chunk is None:
        if prefilling:
            prefills.append((prefilling[0], prefilling[0].plan_prefill(1 << 62)))
    else:
        budget = prefill_chunk
        for seq in prefilling:
            if budget <= 0:
                break
            block = seq.plan_prefill(budget)
            budget -= len(block.tokens)
            prefills.append((seq, block))
    decodes: list[tuple[BatchSequence, Block]] = []
    rows = len(decoding)
    for seq in decoding:
        block = seq.plan_decode(rows - 1)  # the others: every row planned but its own
        rows += len(block.tokens) - 1
        decodes.append((seq, block))
    return prefills, decodes


def batch_step(gen: Generator, sequences: Sequence[BatchSequence],
               prefill_chunk: int | None = None, *, packed: bool = True, shared: bool = False,
               times: StepTimes | None = None) -> dict[BatchSequence, Outcome]:
    """Advance every sequence by one step (see the module docstring). packed=False runs one
    forward per sequence (for models that cannot be packed); `times` adds up where the step's
    time went.

    Each prompt piece is a forward of its own, as the engine's prefill is (a prefill-sized
    forward takes the weights' prefill path, ragspec.decoding.packed); all decode rows go in
    one forward inside `step_forward()`, so the weights' row-invariant step kernels compute
    every row as a step of its own sequence would. shared=True (only where the native step
    reads the model's prompts, native_step.reads_prompts: a piece then gives what the whole
    prompt gives) puts the step's prompt pieces in that one forward too."""
    # a recalled prompt's first token needs no forward (BatchSequence(recall=True))
    outcomes: dict[BatchSequence, Outcome] = {
        seq: seq.take_recalled() for seq in sequences if seq.recalled is not None}
    sequences = [seq for seq in sequences if seq not in outcomes]
    prefills, decodes = plan_step(sequences, prefill_chunk, shared)
    clock = time.perf_counter()
    if shared and prefills:
        planned = [*prefills, *decodes]
        logits = packed_forward(gen.model, [block for _, block in planned])
        outcomes.update((seq, seq.take(rows)) for (seq, _), rows in zip(planned, logits, strict=True))
        if times is not None:
            spent = time.perf_counter() - clock
            times.steps += 1
            if decodes:
                times.shared_seconds += spent
                times.shared_steps += 1
                times.count_decodes(decodes)
            else:
                times.prefill_seconds += spent
        return outcomes
    for seq, block in prefills:
        rows = packed_forward(gen.model, [block])[0] if packed else alone(gen.model, block)
        outcomes[seq] = seq.take(rows)
    if times is not None:
        times.steps += 1
        if prefills:
            spent = time.perf_counter() - clock
            times.prefill_seconds += spent
            times.stalled_seconds += spent * len(decodes)
    if not decodes:
        return outcomes
    clock = time.perf_counter()
    with step_forward():
        if packed:
            logits = packed_forward(gen.model, [block for _, block in decodes])
        else:
            logits = [alone(gen.model, block) for _, block in decodes]
    outcomes.update((seq, seq.take(rows)) for (seq, _), rows in zip(decodes, logits, strict=True))
    if times is not None:
        times.decode_seconds += time.perf_counter() - clock
        times.count_decodes(decodes)
    if len(decodes) == 1 and not prefills and decodes[0][0].stream._policy:
        # a lone decode step is what the cost curve measures: let the engine's watch see it
        block = decodes[0][1]
        gen.watch.observe(len(block.tokens), time.perf_counter() - clock, block.start)
    return outcomes
