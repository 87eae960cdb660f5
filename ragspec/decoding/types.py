"""The engine's contracts: configs in, spans and stats out.

Everything here is plain data. The UI, the CLI and the benchmark render and aggregate these
objects; none of them re-derives which tokens were drafted or where they came from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class SourceRegion:
    """A stretch of the prompt's token ids that came from a known passage.

    The pipeline registers one per passage so that drafts copied from the prompt can say which
    passage and which characters of it they reproduce.

    token_start/token_end: half-open range of prompt token positions.
    source: the caller's label for the passage (an index into its passage list, an id, ...).
    char_offsets: for each token in the range, its (start, end) character range inside the
        passage text; len(char_offsets) == token_end - token_start.
    """

    token_start: int
    token_end: int
    source: int | str
    char_offsets: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not 0 <= self.token_start <= self.token_end:
            raise ValueError(
                f"SourceRegion needs 0 <= token_start <= token_end, got "
                f"{self.token_start}..{self.token_end}"
            )
        if len(self.char_offsets) != self.token_end - self.token_start:
            raise ValueError(
                f"SourceRegion has {len(self.char_offsets)} char offsets for "
                f"{self.token_end - self.token_start} tokens; give one (start, end) per token"
            )


@dataclass(frozen=True)
class SpanOrigin:
    """Where an accepted draft was copied from.

    position: index, in the whole sequence (prompt followed by output), of the first copied token.
    in_prompt: True when that position lies in the prompt, False when in the model's own output.
    source/char_start/char_end: set when the copied tokens lie inside a registered SourceRegion:
        the region's label and the character range of the passage they reproduce.
    """

    position: int
    in_prompt: bool
    source: int | str | None = None
    char_start: int | None = None
    char_end: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Span:
    """A run of output tokens streamed together.

    drafted is True when the tokens were an accepted draft (copied, then verified by the model),
    False for tokens the model produced itself. origin is set for drafted spans only.
    text is the newly decodable text these tokens completed; a multi-byte character split across
    tokens appears in the span whose token completes it.
    """

    text: str
    token_ids: list[int]
    drafted: bool
    origin: SpanOrigin | None = None

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "drafted": self.drafted,
            "origin": self.origin.to_dict() if self.origin else None,
        }


@dataclass
class GenerationStats:
    """What one generation cost and how speculation fared.

    forward_passes counts decode forwards after the prefill (prefill is one more forward).
    accepted_lengths[a] counts verify steps that accepted exactly a draft tokens (steps with
    a draft only). accepted_per_step lists, for every decode forward in order, the draft tokens
    it accepted (0 for a step with no draft or a rejected one). cached_prompt_tokens: prompt
    positions that came from the prompt cache instead of being read (ragspec.decoding.prefix_cache);
    prompt_cache_off: why the prompt cache was not used ("" when it was). step: how decode and
    verify forwards ran: "modules" (transformers' modules, or the native step where the model
    has it installed), "fixed (...)" (ragspec.decoding.fixed.step), or "modules (why the
    fixed step asked for does not run)".
    seconds = prefill_seconds + decode_seconds. tokens_per_s is over the whole time;
    decode_tokens_per_s counts tokens after the first over the time after the first.
    """

    prompt_tokens: int = 0
    new_tokens: int = 0
    forward_passes: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_lengths: dict[int, int] = field(default_factory=dict)
    accepted_per_step: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    ttft_seconds: float = 0.0
    stop_reason: str = ""
    cached_prompt_tokens: int = 0
    prompt_cache_off: str = ""
    step: str = ""

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        after_first = self.seconds - self.ttft_seconds
        if self.new_tokens <= 1 or after_first <= 0:
            return 0.0
        return (self.new_tokens - 1) / after_first

    @property
    def accept_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        steps = sum(self.accepted_lengths.values())
        if not steps:
            return 0.0
        return sum(a * n for a, n in self.accepted_lengths.items()) / steps

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "forward_passes": self.forward_passes,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_lengths": {str(k): v for k, v in sorted(self.accepted_lengths.items())},
            "accept_rate": self.accept_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "ttft_seconds": self.ttft_seconds,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "stop_reason": self.stop_reason,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "prompt_cache_off": self.prompt_cache_off,
            "step": self.step,
        }


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy (argmax); top_k 0 and top_p 1.0 mean no truncation."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class DraftConfig:
    """How the n-gram drafter and the draft-length policy behave.

    enabled: False runs the same loop with no drafts (the baseline).
    min_ngram/max_ngram: suffix lengths tried when looking up the context, longest first.
    max_draft: the most draft tokens verified in one forward.
    adaptive: choose each draft's length from acceptance so far and the measured forward cost;
        when False, always draft as many tokens as the match offers (up to max_draft).
    occurrences: how many of the latest earlier occurrences of the matched suffix the drafter
        compares, copying from the one whose history agrees furthest back (1: the latest).
    follow: keep following the place a draft was copied from (ragspec.decoding.ngram): the
        copy under way proposes its next tokens, and just after the model replaced a word of
        it, the copy from one word on.
    variants: match drafts across word variants too (" the" / "The": ragspec.decoding.ngram),
        so a quotation that starts on another form of the passage's word is still found.
    governed: bound what drafts may lose to plain decoding in one generation (with adaptive;
        ragspec.decoding.policy.DraftGovernor): a generation that drafts badly falls back to
        plain steps.
    """

    enabled: bool = True
    min_ngram: int = 1
    max_ngram: int = 4
    max_draft: int = 16
    adaptive: bool = True
    occurrences: int = 8
    governed: bool = True
    follow: bool = True
    variants: bool = True

    def __post_init__(self) -> None:
        if self.min_ngram < 1:
            raise ValueError(f"min_ngram must be >= 1, got {self.min_ngram}")
        if self.max_ngram < self.min_ngram:
            raise ValueError(
                f"max_ngram ({self.max_ngram}) must be >= min_ngram ({self.min_ngram})"
            )
        if not 1 <= self.max_draft <= 64:
            raise ValueError(f"max_draft must be between 1 and 64, got {self.max_draft}")
        if not 1 <= self.occurrences <= 64:
            raise ValueError(f"occurrences must be between 1 and 64, got {self.occurrences}")


@dataclass(frozen=True)
class RepeatConfig:
    """What to do about an answer that repeats itself (ragspec.decoding.repetition).

    stop_ngram/stop_count: end generation (stop_reason "repetition") at the token that completes
        an n-gram of stop_ngram output tokens written stop_count times; stop_ngram 0 = no rule.
        The output is then a prefix of the output without the rule, so speculation stays exact.
    penalty/penalty_last_n: the repetition penalty llama.cpp and Ollama apply (1.0 = off):
        logits of the tokens among the last penalty_last_n of the sequence (prompt and output)
        are divided by penalty when positive, multiplied when negative; in a verify forward
        each draft position is penalised by the tokens before it.
    """

    stop_ngram: int = 0
    stop_count: int = 2
    penalty: float = 1.0
    penalty_last_n: int = 64

    def __post_init__(self) -> None:
        if self.stop_ngram < 0:
            raise ValueError(f"stop_ngram must be >= 0 (0 = no stop rule), got {self.stop_ngram}")
        if self.stop_count < 2:
            raise ValueError(f"stop_count must be >= 2 (an n-gram written that many times ends "
                             f"the answer), got {self.stop_count}")
        if not 1.0 <= self.penalty <= 10.0:
            raise ValueError(f"the repetition penalty must be between 1.0 (off) and 10, "
                             f"got {self.penalty}")
        if self.penalty_last_n < 1:
            raise ValueError(f"penalty_last_n must be >= 1, got {self.penalty_last_n}")


# The product's stop rule: how answers end when they start repeating themselves (chosen with
# `ragspec eval` on data/realdocs/dev; docs/answer-quality.md). The pipeline, the chat, the
# server and the benchmark all apply it.
ANSWER_REPEAT = RepeatConfig(stop_ngram=8, stop_count=2)


@dataclass(frozen=True)
class GenerationConfig:
    """repeat: the stop rule and penalty for repetition; None = not set: the engine then uses
    neither (its output equals model.generate's), and ragspec.pipeline fills in its own."""

    max_new_tokens: int = 128
    stop_strings: tuple[str, ...] = ()
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    repeat: RepeatConfig | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(not s for s in self.stop_strings):
            raise ValueError("stop strings must be non-empty")


@dataclass
class GenerationResult:
    """The collected stream: what the non-streaming call returns."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    spans: list[Span]
    stats: GenerationStats

    def to_dict(self) -> dict:
        s = self.stats
        # The text first and the prompt's token ids (often a thousand) last: read from the top,
        # a --json answer shows what it says before the numbers.
        return {
            "text": self.text,
            "stats": s.to_dict(),
            "spans": [sp.to_dict() for sp in self.spans],
            "token_ids": list(self.token_ids),
            "prompt_token_ids": list(self.prompt_token_ids),
        }
