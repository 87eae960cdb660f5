"""The speculative generator: prefill once, then propose ► verify ► accept until done.

Contract: works on token ids in, Spans and GenerationStats out; batch size 1. With greedy
sampling the token ids equal `model.generate(do_sample=False)` for the same model and prompt,
speculation on or off (up to fp32 rounding of a k-token forward against k one-token forwards;
see README "Exactness"). With sampling, drafts are accepted by the point-mass rule in
decoding.sampling, which leaves the output distribution unchanged.

One step, with the KV cache holding every token but the last:
    propose  the n-gram index suggests k draft tokens copied from earlier in the sequence;
             the policy decides how many of them are worth a forward (0 = plain decoding).
    verify   one forward over [last, d1..dk] (shape (1, k+1)) gives logits for k+1 positions.
    accept   the longest agreeing draft prefix plus one token of the model's own; the cache is
             cropped back to drop the rejected positions.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Iterator, Sequence

import torch

from decoding.cache import crop_cache, new_cache
from decoding.detok import IncrementalDecoder
from decoding.ngram import Match, NgramIndex
from decoding.policy import DraftPolicy, ForwardCost
from decoding.sampling import accept_greedy, accept_sampled, next_token
from decoding.types import (
    GenerationConfig,
    GenerationResult,
    GenerationStats,
    SourceRegion,
    Span,
    SpanOrigin,
)


class Generator:
    """Speculative n-gram generation over one loaded causal LM (not thread-safe: one at a time)."""

    def __init__(self, model, tokenizer, *, eos_token_ids: Sequence[int] = (),
                 cost: ForwardCost | None = None, speculation_off_reason: str | None = None):
        self.model = model
        # Set for models whose cache cannot be rolled back (decoding.model): every stream then
        # decodes without drafts, whatever its DraftConfig says.
        self.speculation_off_reason = speculation_off_reason
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.eos_token_ids = set(int(t) for t in eos_token_ids)
        if not self.eos_token_ids and tokenizer.eos_token_id is not None:
            self.eos_token_ids = {int(tokenizer.eos_token_id)}
        self.cost = cost
        self._policies: dict = {}  # DraftConfig -> DraftPolicy; learning persists across calls

    @classmethod
    def from_loaded(cls, loaded, cost: ForwardCost | None = None) -> Generator:
        return cls(loaded.model, loaded.tokenizer, eos_token_ids=sorted(loaded.eos_token_ids),
                   cost=cost, speculation_off_reason=loaded.speculation_off_reason)

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
            config = dataclasses.replace(
                config, draft=dataclasses.replace(config.draft, enabled=False))
            forced_drafts = None
        return GenerationStream(self, prompt, config, tuple(sources), forced_drafts)

    def generate(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None,
                 **kwargs) -> GenerationResult:
        return self.stream(prompt_ids, config, **kwargs).result()

    def policy_for(self, config: GenerationConfig) -> DraftPolicy:
        key = config.draft
        if key not in self._policies:
            self._policies[key] = DraftPolicy(key, self.cost or ForwardCost.flat(key.max_draft + 1))
        return self._policies[key]

    def policy_state(self) -> dict:
        """A copy of what the draft policies have learned so far (for restore_policy_state)."""
        return copy.deepcopy(self._policies)

    def restore_policy_state(self, state: dict) -> None:
        """Forget what was learned since policy_state() returned `state`."""
        self._policies = copy.deepcopy(state)

    @torch.inference_mode()
    def _forward(self, ids: list[int], cache, logits_to_keep: int = 0) -> torch.Tensor:
        """ids: n new tokens -> logits (n or logits_to_keep, vocab) in fp32 on the CPU side."""
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=logits_to_keep)
        return out.logits[0].float()

    def _propose(self, index: NgramIndex, out_len: int, config: GenerationConfig,
                 forced: Sequence[int] | None) -> Match | None:
        if not config.draft.enabled:
            return None
        if forced is not None:
            tokens = list(forced[out_len : out_len + config.draft.max_draft])
            return Match(n=0, extended=0, origin=len(index), tokens=tokens) if tokens else None
        return index.propose(config.draft.max_draft)


class GenerationStream:
    """Iterate for Spans; `.stats`, `.token_ids` and `.text` are final once iteration ends."""

    def __init__(self, gen: Generator, prompt: list[int], config: GenerationConfig,
                 sources: tuple[SourceRegion, ...], forced: Sequence[int] | None):
        self.gen = gen
        self.prompt_ids = prompt
        self.config = config
        self.sources = sources
        self.forced = forced
        self.token_ids: list[int] = []
        self.spans: list[Span] = []
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self._decoder = IncrementalDecoder(gen.tokenizer)
        self._stop_cut: int | None = None  # where a stop string starts in the decoded text
        self._held = ""  # decoded text not yet streamed (a possible stop-string prefix)
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
        return self._decoder.text if self._stop_cut is None else self._decoder.text[: self._stop_cut]


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

    # -- internals ----------------------------------------------------------------------------

    def _run(self) -> Iterator[Span]:
        gen, cfg, stats = self.gen, self.config, self.stats
        sampling = cfg.sampling
        rng = None
        if not sampling.greedy:
            rng = torch.Generator(device=gen.device)  # draws happen where the logits are
            rng.manual_seed(sampling.seed if sampling.seed is not None else int(time.time_ns()))
        policy = gen.policy_for(cfg) if cfg.draft.enabled and self.forced is None else None

        clock = time.perf_counter()
        cache = new_cache(gen.model)
        logits = gen._forward(self.prompt_ids, cache, logits_to_keep=1)  # (1, vocab)
        first = next_token(logits[-1], sampling, rng)
        index = NgramIndex(self.prompt_ids, min_n=cfg.draft.min_ngram, max_n=cfg.draft.max_ngram)
        stats.prefill_seconds = stats.ttft_seconds = time.perf_counter() - clock
        clock = time.perf_counter()

        # tokens of the last step: drafted ones first (copied from `origin`), then the model's
        step_tokens, n_drafted, origin = [first], 0, None
        engine_seconds = stats.prefill_seconds
        while True:
            # -- emit what the last step produced; stop on EOS, stop strings or the limit
            spans, done = self._commit(step_tokens, n_drafted, origin, index)
            engine_seconds += time.perf_counter() - clock
            stats.decode_seconds = engine_seconds - stats.prefill_seconds
            yield from spans
            if done:
                return
            if self._stop_requested:
                stats.stop_reason = "stopped"
                return
            clock = time.perf_counter()  # time spent by the consumer between spans does not count

            # -- propose
            remaining = cfg.max_new_tokens - stats.new_tokens
            match = gen._propose(index, len(self.token_ids), cfg, self.forced)
            if policy is not None:
                k = policy.choose(match, remaining)
            else:
                k = min(len(match.tokens), remaining - 1) if match else 0
            draft = match.tokens[:k] if k > 0 else []

            # -- verify: the cache holds all but the last token
            past = len(index) - 1
            logits = gen._forward([index.tokens[-1], *draft], cache)  # (k+1, vocab)

            # -- accept
            if sampling.greedy:
                accepted, token = accept_greedy(logits, draft)
            else:
                accepted, token = accept_sampled(logits, draft, sampling, rng)
            if accepted < len(draft):  # only a rejection leaves positions to drop
                crop_cache(cache, past + 1 + accepted)
            if policy is not None and draft:
                policy.observe(match, len(draft), accepted)

            stats.forward_passes += 1
            stats.accepted_per_step.append(accepted)
            if draft:
                stats.drafted_tokens += len(draft)
                stats.accepted_tokens += accepted
                stats.accepted_lengths[accepted] = stats.accepted_lengths.get(accepted, 0) + 1
            step_tokens, n_drafted = [*draft[:accepted], token], accepted
            origin = match.origin if (draft and self.forced is None) else None

    def _commit(self, tokens: list[int], n_drafted: int, origin: int | None,
                index: NgramIndex) -> tuple[list[Span], bool]:
        """Append one step's tokens (n_drafted accepted drafts, then the model's token) as at
        most two spans, and decide whether to stop."""
        cfg, stats = self.config, self.stats
        spans: list[Span] = []
        done = False
        for i, token in enumerate(tokens):
            drafted = i < n_drafted
            self.token_ids.append(token)
            index.append(token)
            stats.new_tokens += 1
            delta = self._decoder.push([token])
            if spans and spans[-1].drafted == drafted:
                spans[-1].token_ids.append(token)
                spans[-1].text += delta
            else:
                span_origin = None
                if drafted and origin is not None:
                    span_origin = SpanOrigin(position=origin,
                                             in_prompt=origin < len(self.prompt_ids))
                spans.append(Span(text=delta, token_ids=[token], drafted=drafted,
                                  origin=span_origin))
            if token in self.gen.eos_token_ids:
                stats.stop_reason, done = "eos", True
            elif self._hit_stop_string():
                stats.stop_reason, done = "stop_string", True
            elif stats.new_tokens >= cfg.max_new_tokens:
                stats.stop_reason, done = "max_new_tokens", True
            if done:
                break
        if spans and self._held:
            spans[0].text = self._held + spans[0].text
            self._held = ""
        if done and self._stop_cut is not None:
            self._trim_spans_to(self._stop_cut, spans)
        elif not done:
            self._hold_back_stop_prefix(spans)
        spans = [self._with_source(s) for s in spans]
        self.spans.extend(spans)
        return spans, done

    def _hit_stop_string(self) -> bool:
        if not self.config.stop_strings:
            return False
        text = self._decoder.text
        cuts = [i for i in (text.find(s) for s in self.config.stop_strings) if i >= 0]
        if cuts:
            self._stop_cut = min(cuts)
            return True
        return False

    def _hold_back_stop_prefix(self, spans: list[Span]) -> None:
        """Keep back text that may be the start of a stop string: streamed text is final."""
        text, hold = self._decoder.text, 0
        for stop in self.config.stop_strings:
            for n in range(min(len(stop) - 1, len(text)), hold, -1):
                if text.endswith(stop[:n]):
                    hold = n
                    break
        for span in reversed(spans):
            if hold <= 0:
                break
            take = min(hold, len(span.text))
            if take:
                self._held = span.text[len(span.text) - take :] + self._held
                span.text = span.text[: len(span.text) - take]
                hold -= take

    def _trim_spans_to(self, cut: int, new_spans: list[Span]) -> None:
        """Drop text at and after the stop string from the spans (tokens stay, as in HF)."""
        emitted = sum(len(s.text) for s in self.spans)
        for span in new_spans:
            keep = max(0, cut - emitted)
            emitted += len(span.text)
            span.text = span.text[:keep]

    def _with_source(self, span: Span) -> Span:
        o = span.origin
        if o is None or not o.in_prompt:
            return span
        first, last = o.position, o.position + len(span.token_ids) - 1
        for region in self.sources:
            if region.token_start <= first < region.token_end:
                last = min(last, region.token_end - 1)
                span.origin = SpanOrigin(
                    position=o.position,
                    in_prompt=True,
                    source=region.source,
                    char_start=region.char_offsets[first - region.token_start][0],
                    char_end=region.char_offsets[last - region.token_start][1],
                )
                break
        return span
