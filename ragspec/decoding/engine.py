"""The speculative generator: prefill once, then propose ► verify ► accept until done.

Contract: works on token ids in, Spans and GenerationStats out; batch size 1. With greedy
sampling the token ids equal `model.generate(do_sample=False)` for the same model and prompt,
speculation on or off (up to fp32 rounding of a k-token forward against k one-token forwards;
see docs/how-it-works.md, "Exactness"). With sampling, drafts are accepted by the point-mass rule in
ragspec.decoding.sampling, which leaves the output distribution unchanged.

One step, with the KV cache holding every token but the last:
    propose  the n-gram index suggests k draft tokens copied from earlier in the sequence;
             the policy decides how many of them are worth a forward (0 = plain decoding).
    verify   one forward over [last, d1..dk] (shape (1, k+1)) gives logits for k+1 positions.
    accept   the longest agreeing draft prefix plus one token of the model's own; the cache is
             cropped back to drop the rejected positions.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial

import torch

from ragspec.decoding import prefix_cache
from ragspec.decoding.cache import crop_cache, new_cache
from ragspec.decoding.calibrate import CostWatch
from ragspec.decoding.fixed import step as fixed
from ragspec.decoding.ngram import Match, NgramIndex, WordKeys
from ragspec.decoding.packed import step_forward
from ragspec.decoding.policy import DraftGovernor, DraftPolicy, DraftShadow, ForwardCost, StepPace
from ragspec.decoding.provenance import locate_origin
from ragspec.decoding.repetition import RepetitionGuard, penalty_windows
from ragspec.decoding.sampling import (
    Uniforms,
    accept_greedy,
    accept_sampled,
    apply_repeat_penalty,
    next_token,
)
from ragspec.decoding.spans import SpanText
from ragspec.decoding.types import (
    GenerationConfig,
    GenerationResult,
    GenerationStats,
    SamplingConfig,
    SourceRegion,
    Span,
)


class Generator:
    """Speculative n-gram generation over one loaded causal LM (not thread-safe: one at a time)."""

    def __init__(self, model, tokenizer, *, eos_token_ids: Sequence[int] = (),
                 cost: ForwardCost | None = None,
                 recalibrate: Callable[[], ForwardCost | None] | None = None,
                 speculation_off_reason: str | None = None, provisional: bool = False,
                 prompt_cache_bytes: int | None = None, fixed_step: str | None = None):
        """cost: this machine's forward-cost curve (None: every forward costs the same).
        recalibrate: measures the curve again (None when the curve is not this machine's);
            due when live step times disagreed with `cost` at the end of two generations in a
            row (CostWatch), run by `recalibrate_if_due` — between generations, by the owner
            of the generator, never inside a generation; returns the new curve, or None when
            the machine was too busy to measure.
        provisional: `cost` is a stand-in (calibrate.conservative_cost), not this machine's
            curve: a re-measure is due from the start, and while the measurements come back
            untrusted it is tried again at most every RETRY_SECONDS.
        speculation_off_reason: set for models whose cache cannot be rolled back
            (ragspec.models.load): every stream then decodes without drafts.
        prompt_cache_bytes: the budget of the prompt cache every stream of this generator
            shares (ragspec.decoding.prefix_cache; None: prefix_cache.budget_bytes, 0: off).
        fixed_step: "compiled", "eager" or "off": decode and verify on the fixed-shape step
            (ragspec.decoding.fixed.step; None: RAGSPEC_FIXED_STEP, else compiled on CUDA and
            off on a CPU). A model it cannot run keeps the module path, and the stats say why."""
        self.model = model
        self.speculation_off_reason = speculation_off_reason
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.eos_token_ids = set(int(t) for t in eos_token_ids)
        if not self.eos_token_ids and tokenizer.eos_token_id is not None:
            self.eos_token_ids = {int(tokenizer.eos_token_id)}
        self.cost = cost
        self.recalibrate = recalibrate
        self.watch = CostWatch()
        # live steps against the measured curve, for the policies and governors (None: they
        # judge by the curve; without a measured curve there is nothing to correct, and drafting
        # stays a function of what the policy learnt, not of step times)
        self.pace: StepPace | None = StepPace() if cost is not None else None
        self._strikes = 0  # consecutive checks in which live step times disagreed with the curve
        self.provisional = provisional and recalibrate is not None
        self.recalibration_due = self.provisional
        # before this time.monotonic() a provisional curve is not measured again (its owner
        # just tried: the machine is likely as busy as it was)
        self._retry_at = self.retry_clock() + self.RETRY_SECONDS
        self._policies: dict = {}  # DraftConfig -> DraftPolicy; learning persists across calls
        self.word_keys = WordKeys(tokenizer.decode)  # the drafter's word variants
        self._prompt_cache_bytes = prompt_cache_bytes
        self._prefix: prefix_cache.PrefixCache | None = None  # made on the first prompt read
        self._fixed_mode = fixed.mode(fixed_step, self.device)
        self._fixed: fixed.FixedStep | None = None  # built on the first prompt read

    RETRY_SECONDS = 300.0  # a busy machine is not measured again sooner (each try costs CPU)
    retry_clock = staticmethod(time.monotonic)  # what RETRY_SECONDS is counted on

    @classmethod
    def from_loaded(cls, loaded, cost: ForwardCost | None = None, recalibrate=None,
                    provisional: bool = False,
                    prompt_cache_bytes: int | None = None) -> Generator:
        return cls(loaded.model, loaded.tokenizer, eos_token_ids=sorted(loaded.eos_token_ids),
                   cost=cost, recalibrate=recalibrate,
                   speculation_off_reason=getattr(loaded, "speculation_off_reason", None),
                   provisional=provisional, prompt_cache_bytes=prompt_cache_bytes)

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 0) or 2048)

    # -- the loop ---------------------------------------------------------------------------

    def stream(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None, *,
               sources: Sequence[SourceRegion] = (),
               forced_drafts: Sequence[int] | None = None) -> GenerationStream:
        """Generate from prompt_ids, yielding Spans as they are accepted.

        sources: prompt regions that came from passages, so drafts copied from them carry the
            passage and character range in their origin.
        forced_drafts: bypass the drafter: at each step draft the next tokens of this sequence
            (from the current output length on), max_draft at a time. For the oracle benchmark
            (the true continuation) and for testing the accept rule with arbitrary drafts.
        """
        config = config or GenerationConfig()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        if len(prompt) + config.max_new_tokens > self.context_length:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({config.max_new_tokens}) exceeds "
                f"the model's context of {self.context_length} tokens; shorten the prompt or lower "
                f"max_new_tokens"
            )
        if self.speculation_off_reason and config.draft.enabled:
            config = replace(config, draft=replace(config.draft, enabled=False))
            forced_drafts = None
        return GenerationStream(self, prompt, config, tuple(sources), forced_drafts)

    def generate(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None,
                 **kwargs) -> GenerationResult:
        return self.stream(prompt_ids, config, **kwargs).result()

    def _budgeted_cache(self) -> prefix_cache.PrefixCache | None:
        """The generator's prompt cache, made on first use; None with a budget of 0."""
        if self._prefix is None:
            budget = self._prompt_cache_bytes
            self._prefix = prefix_cache.PrefixCache(
                prefix_cache.budget_bytes(self.model) if budget is None else budget)
        return self._prefix if self._prefix.budget_bytes else None

    def prompt_cache(self) -> tuple[prefix_cache.PrefixCache | None, str]:
        """The prompt cache whose pages prompt reads reuse now, or None and why not (the path
        is not exact piece by piece, prefix_cache.problem, or the budget is 0). Asked at every
        read: the prompt-read path is a fact of the process, but tests switch it."""
        reason = prefix_cache.problem(self.model)
        if reason is not None:
            return None, reason
        cache = self._budgeted_cache()
        return (cache, "") if cache is not None else (None, "turned off (a prompt cache of 0 MB)")

    def whole_prompts(self) -> prefix_cache.PrefixCache | None:
        """The prompt cache that keeps and recalls identical prompts whole, where whole reads
        can be (prefix_cache.whole_problem), beside the pages where prefixes are reused too (an
        identical prompt then needs no forward, not even for its last page); else None."""
        if prefix_cache.whole_problem(self.model):
            return None
        return self._budgeted_cache()

    def prompt_cache_stats(self) -> dict:
        """The prompt cache's counters (prefix_cache.PrefixStats), or why it is off; where only
        identical prompts are reused, the counters and "prefixes_off": why prefixes are not."""
        cache, why = self.prompt_cache()
        if cache is not None:
            return cache.stats().as_dict()
        whole = self.whole_prompts()
        if whole is not None:
            return {**whole.stats().as_dict(), "prefixes_off": why}
        return {"off": why}

    def fixed_step(self) -> tuple[fixed.FixedStep | None, str]:
        """The fixed-shape step decode and verify run on, or None; and how steps run (the
        GenerationStats.step line: "modules", or why the asked-for fixed step is not used)."""
        if self._fixed_mode == "off":
            return None, "modules"
        if self._fixed is None:
            why = fixed.unsupported(self.model)
            if why is not None:
                return None, f"modules (the fixed step does not run {why})"
            self._fixed = fixed.FixedStep(self.model, compiled=self._fixed_mode == "compiled")
        return self._fixed, self._fixed.describe()

    def policy_for(self, config: GenerationConfig) -> DraftPolicy:
        key = config.draft
        if key not in self._policies:
            # on the fixed step every forward has the same rows, whatever the draft: flat cost
            cost = None if self.fixed_step()[0] is not None else self.cost
            self._policies[key] = DraftPolicy(key, cost or ForwardCost.flat(key.max_draft + 1),
                                              self.pace)
        return self._policies[key]

    def policy_state(self) -> dict:
        """A copy of what the draft policies have learned so far (for restore_policy_state)."""
        return copy.deepcopy(self._policies, {id(self.pace): self.pace})  # the pace is shared

    def restore_policy_state(self, state: dict) -> None:
        """Forget what was learned since policy_state() returned `state`."""
        self._policies = copy.deepcopy(state, {id(self.pace): self.pace})

    def review_cost(self) -> bool:
        """At the end of a generation (cheap; no forward): compare the live step times with
        the curve; after two disagreeing verdicts in a row, each on fresh samples (a generation
        too short to tell changes nothing), mark the curve due for a re-measure. True when it
        is due."""
        if self.cost is None or self.recalibrate is None:
            return False
        verdict = self.watch.verdict(self.cost)
        if verdict is not None:
            self.watch.reset()
            self._strikes = self._strikes + 1 if verdict else 0
            if self._strikes >= 2:
                self._strikes = 0
                self.recalibration_due = True
        return self.recalibration_due

    def measure_after_first(self) -> None:
        """For a provisional curve nobody has tried to measure yet (the owner chose to answer
        first): the owner's next `recalibrate_if_due`, after the first generation, measures
        without waiting RETRY_SECONDS."""
        if self.provisional:
            self.recalibration_due = True
            self._retry_at = self.retry_clock()

    def recalibrate_if_due(self) -> bool:
        """Re-measure the curve if `review_cost` said so: call it between generations (a chat
        worker after a turn, a command after printing), never while one is timed. True when
        the curve changed. The re-measure is as bounded as `recalibrate` makes it (the
        product's: calibrate.MEASURE_SECONDS)."""
        if not self.recalibration_due or self.recalibrate is None:
            return False
        if self.provisional and self.retry_clock() < self._retry_at:
            return False  # the last try found the machine busy: not again so soon
        self.recalibration_due = False
        fresh = self.recalibrate()
        if fresh is None:
            if self.provisional:  # still a stand-in: try again, later
                self.recalibration_due = True
                self._retry_at = self.retry_clock() + self.RETRY_SECONDS
            return False
        self.provisional = False
        self.cost = fresh
        for policy in self._policies.values():
            policy.cost = fresh
        if self.pace is not None:  # its ratios were taken against the old curve
            self.pace.reset()
        return True

@dataclass
class Step:
    """What one forward produced: `accepted` draft tokens copied from `origin`, then the model's
    own token. `drafted` is the draft length that was verified (0: a plain step; None: the
    prefill, which is not a decode forward)."""

    tokens: list[int]
    accepted: int = 0
    drafted: int | None = None
    origin: int | None = None


@torch.inference_mode()
def forward(model, ids: list[int], cache, logits_to_keep: int = 0) -> torch.Tensor:
    """ids: n new tokens -> logits (n, or logits_to_keep, vocab) in fp32 on the model's device;
    the cache grows by n positions."""
    x = torch.tensor([ids], dtype=torch.long, device=model.device)
    out = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=logits_to_keep)
    return out.logits[0].float()


class GenerationStream:
    """Iterate for Spans; `.stats`, `.token_ids` and `.text` are final once iteration ends."""

    def __init__(self, gen: Generator, prompt: list[int], config: GenerationConfig,
                 sources: tuple[SourceRegion, ...], forced: Sequence[int] | None):
        self.gen = gen
        self.prompt_ids = prompt
        self.config = config
        self.forced = forced
        self.token_ids: list[int] = []
        self.spans: list[Span] = []
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self._text = SpanText(gen.tokenizer, config.stop_strings,
                              locate=partial(locate_origin, prompt_length=len(prompt),
                                             sources=sources))
        self._uniforms = _uniforms(config.sampling)
        self._policy = (gen.policy_for(config)
                        if config.draft.enabled and forced is None else None)
        self._index = NgramIndex(prompt, min_n=config.draft.min_ngram,
                                 max_n=config.draft.max_ngram,
                                 occurrences=config.draft.occurrences,
                                 follow=config.draft.follow,
                                 keys=gen.word_keys if config.draft.variants else None)
        # per generation: what drafts may lose to plain steps (None: unbounded)
        self._governor = (DraftGovernor(self._policy.cost, pace=gen.pace)
                          if self._policy is not None and config.draft.adaptive
                          and config.draft.governed else None)
        # declined proposals, learnt from as the model writes on
        self._shadow = DraftShadow(self._policy) if self._policy is not None else None
        self._cache = None
        self._fixed: fixed.FixedSequence | None = None  # decode on the fixed step when set
        self._prefix: prefix_cache.PrefixCache | None = None  # where its prompt is kept
        # where identical prompts are kept whole, and how this prompt is read (_recall_prompt)
        self._whole: tuple[prefix_cache.PrefixCache, tuple] | None = None
        # the prompt read, not yet kept (the arguments of _keep_prompt), until the first token
        self._unkept: tuple[torch.Tensor | None] | None = None
        repeat = config.repeat
        self._guard = (RepetitionGuard(repeat.stop_ngram, repeat.stop_count)
                       if repeat is not None and repeat.stop_ngram else None)
        self._stop_requested = False
        self._iter = self._run()

    def __iter__(self) -> Iterator[Span]:
        return self

    def __next__(self) -> Span:
        return next(self._iter)

    def stop(self) -> None:
        """Ask the generation to end at its next step, keeping what was written (stop_reason
        "stopped"). Safe to call from another thread, e.g. a UI's Stop button."""
        self._stop_requested = True

    @property
    def text(self) -> str:
        return self._text.text

    def result(self) -> GenerationResult:
        for _ in self:
            pass
        return GenerationResult(
            prompt_token_ids=list(self.prompt_ids),
            token_ids=list(self.token_ids),
            text=self.text,
            spans=list(self.spans),
            stats=self.stats,
        )

    # -- the loop -------------------------------------------------------------------------------

    def _run(self) -> Iterator[Span]:
        stats = self.stats
        clock = time.perf_counter()
        step = self._prefill()
        now = time.perf_counter()
        stats.prefill_seconds = stats.ttft_seconds = now - clock
        # engine time after the prefill; what the consumer does between spans is not counted
        busy, clock = 0.0, now
        while True:
            spans, done = self._commit(step)
            busy += time.perf_counter() - clock
            stats.decode_seconds = busy
            yield from spans
            self._settle()  # after the first token is out, before the next forward
            if done:
                self.gen.review_cost()
                return
            if self._stop_requested:
                yield from self._stopped()
                return
            clock = time.perf_counter()
            context = len(self._index) - 1  # cached positions before this step's forward
            match, draft = self._propose()
            logits = self._verify(draft)
            step = self._accept(logits, match, draft)
            seconds = time.perf_counter() - clock
            if self._policy is not None and self._fixed is None:  # as calibrate measures it
                self.gen.watch.observe(len(draft) + 1, seconds, context)
            if self._governor is not None:  # in measured time (policy.StepPace)
                self._governor.record(len(draft), step.accepted, context, seconds)

    def _prefill(self) -> Step:
        self._cache = new_cache(self.gen.model)
        logits = self._recall_prompt()
        if logits is None:
            start = self._reuse_prompt()
            logits = forward(self.gen.model, self.prompt_ids[start:], self._cache,
                             logits_to_keep=1)
            # kept whole too where it was one read, or a read after pages that reads as one;
            # copying it out waits until the first token is out (_run), the cache unchanged
            self._unkept = (logits if start == 0 or self._prefix is not None else None,)
        step, self.stats.step = self.gen.fixed_step()
        if step is not None:  # the prompt read filled the cache; the steps run on a static one
            self._settle()  # the static one is made from it: keep it first
            need = len(self.prompt_ids) + self.config.max_new_tokens
            self._fixed, self._cache = step.sequence(self._cache, need), None
        logits = self._penalised(logits, [])
        return Step([next_token(logits[-1], self.config.sampling, self._uniforms)])

    def _reuse_prompt(self) -> int:
        """Fill the fresh cache with the longest prefix of the prompt the generator's prompt
        cache holds; returns the positions it holds now (the read starts there)."""
        self._prefix, why = self.gen.prompt_cache()
        self.stats.prompt_cache_off = why
        if self._prefix is None:
            return 0
        self.stats.cached_prompt_tokens = self._prefix.restore(self.prompt_ids, self._cache)
        return self.stats.cached_prompt_tokens

    def _recall_prompt(self) -> torch.Tensor | None:
        """Where identical prompts are kept whole (Generator.whole_prompts) and this one is:
        fill the fresh cache with it and return its last token's logits; else None."""
        whole = self.gen.whole_prompts()
        if whole is None:
            return None
        self._whole = (whole, prefix_cache.read_mark(self.gen.model))
        pages = self.gen.prompt_cache()[0] is not None  # looked up next, on a miss
        logits = whole.recall(self.prompt_ids, self._cache, self._whole[1], count_miss=not pages)
        if logits is not None:
            self.stats.cached_prompt_tokens = len(self.prompt_ids)
            self.stats.prompt_cache_off = self.gen.prompt_cache()[1]  # why not by prefixes
        return logits

    def _settle(self) -> None:
        """Keep the prompt read (_unkept) if it is not yet: called once its first token is
        out, while the cache still holds the prompt alone."""
        if self._unkept is not None:
            unkept, self._unkept = self._unkept, None
            self._keep_prompt(*unkept)

    def _keep_prompt(self, whole_logits: torch.Tensor | None = None) -> None:
        """Once the cache holds the whole prompt: keep its pages for later reads where prefixes
        are reused, and, given its last token's logits from a read that reads as one forward
        (whole_logits), the whole prompt for an identical one."""
        if self._prefix is not None:
            self._prefix.store(self.prompt_ids, self._cache)
        if whole_logits is not None and self._whole is not None:
            whole, mark = self._whole
            whole.keep_whole(self.prompt_ids, self._cache, whole_logits, mark)

    def _propose(self) -> tuple[Match | None, list[int]]:
        """A match from the drafter (or the forced sequence) and the draft worth verifying."""
        cfg = self.config
        if not cfg.draft.enabled:
            return None, []
        remaining = cfg.max_new_tokens - self.stats.new_tokens
        longest = cfg.draft.max_draft if self._fixed is None else min(
            cfg.draft.max_draft, self._fixed.rows - 1)  # the fixed step's rows hold the rest
        if self.forced is not None:
            tokens = list(self.forced[len(self.token_ids) : len(self.token_ids) + longest])
            match = Match(n=0, extended=0, origin=len(self._index), tokens=tokens)
            return match, tokens[: max(0, remaining - 1)]
        context = len(self._index) - 1
        match = self._index.propose(longest)
        k = self._policy.choose(match, remaining, context) if self._policy else 0
        if self._governor is not None and k > 0:
            allowed = self._governor.limit(k, context)
            if not allowed:  # suspended: follow the proposal without verifying it
                self._governor.shadow(match.tokens[:k], context)
            k = allowed
        if k == 0 and self._shadow is not None:
            self._shadow.follow(match)
        return match, (match.tokens[:k] if k > 0 else [])

    def _verify(self, draft: list[int]) -> torch.Tensor:
        """One forward over [last token, *draft]: logits (len(draft)+1, vocab). The cache held
        every token but the last. A step forward however long the draft: packed layers run
        their row-invariant kernels (ragspec.decoding.packed)."""
        if self._fixed is not None:
            logits = self._fixed.step([self._index.tokens[-1], *draft])
        else:
            with step_forward():
                logits = forward(self.gen.model, [self._index.tokens[-1], *draft], self._cache)
        return self._penalised(logits, draft)

    def _penalised(self, logits: torch.Tensor, draft: list[int]) -> torch.Tensor:
        """The repetition penalty, if any, row by row: row j by the tokens before it."""
        repeat = self.config.repeat
        if repeat is None or repeat.penalty == 1.0:
            return logits
        windows = penalty_windows(self._index.tokens, draft, repeat.penalty_last_n)
        return apply_repeat_penalty(logits, windows, repeat.penalty)

    def _accept(self, logits: torch.Tensor, match: Match | None, draft: list[int]) -> Step:
        sampling = self.config.sampling
        if sampling.greedy:
            accepted, token = accept_greedy(logits, draft)
        else:
            # row i of the verify predicts output position len(token_ids) + i
            uniforms = self._uniforms.take(len(self.token_ids), len(draft) + 1)
            accepted, token = accept_sampled(logits, draft, sampling, uniforms)
        if accepted < len(draft):  # drop the rejected draft positions; keep the last token's
            if self._fixed is not None:
                self._fixed.crop(len(self._index) + accepted)
            else:
                crop_cache(self._cache, len(self._index) + accepted)
        if self._policy is not None and draft:
            self._policy.observe(match, len(draft), accepted)
        self.stats.forward_passes += 1
        origin = match.origin if draft and self.forced is None else None
        return Step([*draft[:accepted], token], accepted, len(draft), origin)

    def _commit(self, step: Step) -> tuple[list[Span], bool]:
        """Append a step's tokens (up to EOS, a stop string or the limit), count them, and
        return the spans ready to stream and whether generation is over."""
        stats, reason = self.stats, ""
        kept = 0
        for i, token in enumerate(step.tokens):
            kept += 1
            self.token_ids.append(token)
            self._index.append(token)
            if self._governor is not None:
                self._governor.push(token)
            if self._shadow is not None:
                self._shadow.push(token)
            drafted = i < step.accepted
            hit = self._text.push(token, drafted, step.origin if drafted else None)
            reason = ("eos" if token in self.gen.eos_token_ids else "stop_string" if hit
                      else "repetition" if self._guard is not None and self._guard.push(token)
                      else "max_new_tokens" if len(self.token_ids) >= self.config.max_new_tokens
                      else "")
            if reason:
                break
        stats.new_tokens += kept
        if step.drafted is not None:
            _count_step(stats, step, min(step.accepted, kept))
        stats.stop_reason = reason
        spans = self._text.flush(done=bool(reason))
        self.spans.extend(spans)
        return spans, bool(reason)


    def _stopped(self) -> list[Span]:
        """End on request: release any text still held back."""
        self.stats.stop_reason = "stopped"
        spans = self._text.flush(done=True)
        self.spans.extend(spans)
        return spans


def _count_step(stats: GenerationStats, step: Step, kept_drafts: int) -> None:
    """Record one decode forward; only accepted draft tokens that were kept (not cut by EOS, a
    stop string or the limit) count as accepted."""
    stats.accepted_per_step.append(kept_drafts)
    if step.drafted:
        stats.drafted_tokens += step.drafted
        stats.accepted_tokens += kept_drafts
        stats.accepted_lengths[kept_drafts] = stats.accepted_lengths.get(kept_drafts, 0) + 1


def _uniforms(sampling: SamplingConfig) -> Uniforms | None:
    """The sampling stream (None for greedy); without a seed, a fresh one per generation."""
    if sampling.greedy:
        return None
    return Uniforms(sampling.seed if sampling.seed is not None else time.time_ns())
