"""Question to answer: rewrite a follow-up, retrieve passages, build the prompt, generate.

Contract:
  * `Pipeline.prepare(question, history)` returns a PreparedPrompt: the prompt's token ids in the
    model's chat template (system instruction, numbered passages [1]..[n] with their source, then
    the question), the passages actually used, and one SourceRegion per passage telling the
    engine which prompt tokens hold it and, per token, which characters of the passage text it
    covers. So every accepted draft copied from a passage carries `origin.source` (the passage's
    0-based index in `PreparedPrompt.passages`, i.e. citation number - 1) and a character range
    of `passages[source].text`.
  * The prompt fits the model's context with room for `max_new_tokens`: the lowest-ranked
    passages are dropped first, the last one kept may be cut short at a word boundary; the
    question is never cut (a question that alone does not fit is a ValueError).
  * With `trim` set, each passage longer than that many prompt tokens is first cut to its
    sentences nearest the question (ragspec.retrieval.trim): still a Passage whose `start` and
    `text` are exact characters of its document, so everything above holds for the cut text.
  * Retrieval and the relevance floor: see ragspec.search (`Pipeline.retrieve` applies this
    pipeline's settings). `ask` refuses without calling the model when the floor says so;
    `prepare` builds a prompt whatever the verdict (benchmarks measure generation on every
    question).
  * `stream` / `ask`: generation through decoding.Generator; `ask` is the collected stream.
  * A turn after another (`prepare_retrieved(retrieval, previous=...)`, with `keep_places`,
    off by default):
    each passage the previous prompt showed that this turn retrieved again keeps its place; the
    new ones take the places of those not retrieved again, then follow, in the usual order;
    with best_last this turn's best passage goes last, next to the question, as in a prompt of
    its own (a 135M model quotes that one most). Labels go by place, so the places kept from
    the start on render the same text as before and the prompt shares that prefix with the
    previous one (what the engine's prompt cache reuses). Without a previous turn, or with
    keep_places off, the order is the rank order. E.g. previous shown [4] A, [3] B, [2] C,
    [1] D; now retrieved, in rank order, D, A, E, B: shown [4] A, [3] B, [2] E, [1] D — the
    same text as before up to [2].
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ragspec.decoding.engine import GenerationStream, Generator
from ragspec.decoding.types import (
    ANSWER_REPEAT,
    GenerationConfig,
    GenerationResult,
    RepeatConfig,
    SourceRegion,
)
from ragspec.describe import copied_ranges, source_label
from ragspec.models.load import chat_prompt_text
from ragspec.prompts import DEFAULT_PROMPT, PROMPTS
from ragspec.retrieval.faiss.store import SEARCH_MODES, Passage
from ragspec.retrieval.trim import DEFAULT_TRIM, trim_passage
from ragspec.search import (
    DEFAULT_MIN_SCORE,
    DEFAULT_SEARCH,
    NoDocumentsError,
    Retrieval,
    check_question,
    hits_to_dicts,
    is_followup,
    passage_json,
    retrieve,
    standalone_question,
)

# Callers import these from here too (they were defined here before ragspec.search existed).
__all__ = ["Pipeline", "PipelineConfig", "PreparedPrompt", "Answer", "NoDocumentsError",
           "Retrieval", "is_followup", "standalone_question", "passages_to_dicts",
           "hits_to_dicts", "DEFAULT_SEARCH", "DEFAULT_MIN_SCORE", "SYSTEM_PROMPT",
           "ANSWER_REPEAT"]

# The instruction (ragspec.prompts): passages in the user turn, the question last.
SYSTEM_PROMPT = PROMPTS[DEFAULT_PROMPT].system
QUESTION_SUFFIX = PROMPTS[DEFAULT_PROMPT].after_question


@dataclass
class PipelineConfig:
    """k: passages retrieved per question.
    max_new_tokens: the answer's length limit, and the room kept free for it in the context.
    max_prompt_tokens: cap on the prompt's length (None: the model's context minus
        max_new_tokens); a smaller cap means a faster prefill on a CPU.
    min_passage_chars: a passage that would have to be cut shorter than this is dropped instead.
    rewrite_followups: make follow-up questions standalone using the chat history.
    best_last: list the passages in reverse rank order, so the best one ([1]) sits right before
        the question; a 135M model quotes the passage nearest the question most (see docs/answer-quality.md).
    system_prompt: the instruction given to the model.
    question_suffix: text put after the question in the user turn (a closing instruction).
    repeat: the stop rule and penalty for repetition that `stream` applies when the caller's
        GenerationConfig leaves `repeat` unset (ragspec.decoding.types.RepeatConfig).
    keep_places: in a turn after another, passages the previous prompt showed keep their
        places (see the module docstring); off (the default: on the dev set it lowered snippet
        recall a little for little reuse, docs/answer-quality.md): every turn in rank order.
    trim: the most prompt tokens each passage may take: a longer one is cut to its sentences
        nearest the question, with exact offsets (ragspec.retrieval.trim); 0 shows passages
        whole. The default (128) read 30% fewer prompt tokens than whole passages on the dev
        set at no loss of snippet recall (docs/answer-quality.md).
    search: "dense" (embedding similarity) or "hybrid" (fused with BM25 keyword ranking).
    min_score: the relevance floor: below this best cosine the question is not answered
        (0 disables it).
    """

    k: int = 4
    max_new_tokens: int = 256
    max_prompt_tokens: int | None = None
    min_passage_chars: int = 200
    rewrite_followups: bool = True
    best_last: bool = True
    system_prompt: str = SYSTEM_PROMPT
    question_suffix: str = QUESTION_SUFFIX
    search: str = DEFAULT_SEARCH
    min_score: float = DEFAULT_MIN_SCORE
    repeat: RepeatConfig = ANSWER_REPEAT
    keep_places: bool = False
    trim: int = DEFAULT_TRIM

    def __post_init__(self) -> None:
        if not 1 <= self.k <= 50:
            raise ValueError(f"k (passages per question) must be between 1 and 50, got {self.k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 16:
            raise ValueError(
                f"max_prompt_tokens must be >= 16 (or None for the model's context), "
                f"got {self.max_prompt_tokens}"
            )
        if self.min_passage_chars < 0:
            raise ValueError(f"min_passage_chars must be >= 0, got {self.min_passage_chars}")
        if not self.system_prompt.strip():
            raise ValueError("system_prompt must not be empty")
        if self.search not in SEARCH_MODES:
            raise ValueError(f"search must be one of {', '.join(SEARCH_MODES)}, "
                             f"got {self.search!r}")
        if self.trim < 0:
            raise ValueError(f"trim (prompt tokens per passage) must be >= 0 (0 = off), "
                             f"got {self.trim}")
        if not 0 <= self.min_score <= 1:
            raise ValueError(f"min_score (the relevance floor, a cosine similarity) must be "
                             f"between 0 and 1 (0 = off), got {self.min_score}")


@dataclass
class PreparedPrompt:
    """A prompt ready for the engine.

    sources[i] is the SourceRegion of passages[i] (label i). scores[i] is its retrieval score
    (empty when passages were given directly). dropped: retrieved passages left out to fit the
    context. truncated: True when the last passage kept was cut short. messages: the chat
    messages the prompt renders (what a remote generator is sent).
    """

    prompt_ids: list[int]
    sources: list[SourceRegion]
    passages: list[Passage]
    standalone_question: str
    prompt_text: str
    scores: list[float] = field(default_factory=list)
    dropped: list[Passage] = field(default_factory=list)
    truncated: bool = False
    messages: list[dict] = field(default_factory=list)
    best_last: bool = True

    @property
    def shown(self) -> list[Passage]:
        """The passages in the order the prompt shows them (best_last: from [n] down to [1])."""
        return list(reversed(self.passages)) if self.best_last else list(self.passages)


@dataclass
class Answer:
    """An answer, or a refusal (`refused`): then result and prepared are None and passages are
    the closest ones found."""

    result: GenerationResult | None
    passages: list[Passage]
    prepared: PreparedPrompt | None
    retrieval: Retrieval | None = None

    @property
    def refused(self) -> bool:
        return self.retrieval is not None and self.retrieval.refused

    def to_dict(self) -> dict:
        """{"answer": <generate --json object>|null, "passages": [...], "refused": bool}: the
        `ask --json` shapes."""
        if self.refused:
            return {"answer": None, "passages": hits_to_dicts(self.retrieval.hits),
                    "refused": True}
        return {
            "answer": self.result.to_dict(),
            "passages": passages_to_dicts(self.prepared, self.result.spans),
            "refused": False,
        }


def passages_to_dicts(prepared: PreparedPrompt, spans: Sequence = ()) -> list[dict]:
    """The cited passages as JSON: number, provenance, score and the char ranges copied."""
    copied = copied_ranges(spans)
    return [passage_json(i + 1, p, prepared.scores[i] if i < len(prepared.scores) else None,
                         copied.get(i, []))
            for i, p in enumerate(prepared.passages)]


# -- the pipeline -------------------------------------------------------------------------------

class Pipeline:
    """Retrieval + prompt building + generation for one store and one generator."""

    def __init__(self, store, generator: Generator, config: PipelineConfig | None = None):
        self.store = store
        self.generator = generator
        self.config = config or PipelineConfig()
        self.tokenizer = generator.tokenizer
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(
                "the pipeline needs a fast (Rust) tokenizer: it maps prompt tokens back to "
                "passage characters with the offset mapping only fast tokenizers provide"
            )

    @property
    def prompt_budget(self) -> int:
        budget = self.generator.context_length - self.config.max_new_tokens
        if self.config.max_prompt_tokens is not None:
            budget = min(budget, self.config.max_prompt_tokens)
        if budget < 16:
            raise ValueError(
                f"max_new_tokens ({self.config.max_new_tokens}) leaves no room for a prompt in "
                f"the model's context of {self.generator.context_length} tokens; lower it"
            )
        return budget

    def prepare(self, question: str, history: Sequence[dict] = ()) -> PreparedPrompt:
        """Rewrite a follow-up, retrieve the top-k passages and build the prompt (whatever the
        relevance floor says: see `retrieve`)."""
        return self.prepare_retrieved(self.retrieve(question, history))

    def retrieve(self, question: str, history: Sequence[dict] = ()) -> Retrieval:
        """ragspec.search.retrieve with this pipeline's store and settings."""
        c = self.config
        return retrieve(self.store, question, history, k=c.k, search=c.search,
                        min_score=c.min_score, rewrite_followups=c.rewrite_followups)

    def prepare_retrieved(self, retrieval: Retrieval,
                          previous: PreparedPrompt | None = None) -> PreparedPrompt:
        """The prompt for what `retrieve` found; `previous`: the prompt of the turn before in
        the same chat, whose passages keep their places (config.keep_places; module docstring)."""
        hits = list(retrieval.hits)
        if previous is not None and self.config.keep_places:
            hits = keep_places(previous.shown, hits, self.config.best_last)
        return self._build(retrieval.standalone_question, [h.passage for h in hits],
                           [h.score for h in hits])

    def prepare_with_passages(self, question: str, passages: Sequence[Passage]) -> PreparedPrompt:
        """Build the prompt from given passages (no retrieval, no rewriting)."""
        return self._build(check_question(question), list(passages), [])

    def answer_config(self, gen_config: GenerationConfig) -> GenerationConfig:
        """gen_config for an answer: a config without `repeat` gets this pipeline's stop rule
        (every path that answers a question — stream, the scheduler's callers — uses this)."""
        if gen_config.repeat is None:
            gen_config = replace(gen_config, repeat=self.config.repeat)
        return gen_config

    def stream(self, prepared: PreparedPrompt, gen_config: GenerationConfig) -> GenerationStream:
        """Generate the answer, with the stop rule of `answer_config`."""
        return self.generator.stream(prepared.prompt_ids, self.answer_config(gen_config),
                                     sources=prepared.sources)

    def ask(self, question: str, history: Sequence[dict] = (),
            gen_config: GenerationConfig | None = None) -> Answer:
        """Answer, or refuse without calling the model when the floor says so."""
        retrieval = self.retrieve(question, history)
        if retrieval.refused:
            return Answer(result=None, passages=[h.passage for h in retrieval.hits],
                          prepared=None, retrieval=retrieval)
        prepared = self.prepare_retrieved(retrieval)
        config = gen_config or GenerationConfig(max_new_tokens=self.config.max_new_tokens)
        result = self.stream(prepared, config).result()
        return Answer(result=result, passages=list(prepared.passages), prepared=prepared,
                      retrieval=retrieval)

    # -- prompt building ------------------------------------------------------------------

    def _build(self, question: str, passages: list[Passage], scores: list[float]) -> PreparedPrompt:
        budget = self.prompt_budget
        if self.config.trim:
            passages = [trim_passage(p, question, self.config.trim, self._count) for p in passages]
        rendered = self._render(question, [])
        if len(rendered[1]) > budget:
            raise ValueError(
                f"the question alone takes {len(rendered[1])} prompt tokens, more than the "
                f"{budget} available (context {self.generator.context_length} minus "
                f"max_new_tokens {self.config.max_new_tokens}); ask a shorter question"
            )
        # Longest prefix of the ranked passages that fits whole (each render is ~1 ms).
        kept = 0
        for n in range(len(passages), 0, -1):
            rendered_n = self._render(question, passages[:n])
            if len(rendered_n[1]) <= budget:
                kept, rendered = n, rendered_n
                break
        used = passages[:kept]
        truncated = False
        if kept < len(passages):
            cut = self._fit_cut(question, used, passages[kept], budget)
            if cut is not None:
                used = [*used, cut]
                rendered = self._render(question, used)
                truncated = True
        text, ids, offsets, spans = rendered
        sources = [_region(i, ids, offsets, start, end) for i, (start, end) in enumerate(spans)]
        return PreparedPrompt(
            prompt_ids=ids, sources=sources, passages=used, standalone_question=question,
            prompt_text=text, scores=scores[: len(used)], dropped=passages[len(used):],
            truncated=truncated, best_last=self.config.best_last,
        )

    def _count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _fit_cut(self, question: str, used: list[Passage], passage: Passage,
                 budget: int) -> Passage | None:
        """The longest word-boundary prefix of `passage` that still fits after `used`, or None
        when that would be shorter than min_passage_chars (and other passages are kept)."""
        floor = self.config.min_passage_chars if used else 1
        cuts = [m.start() for m in re.finditer(r"\s+", passage.text)] + [len(passage.text)]
        cuts = [c for c in cuts if c >= floor]
        lo, hi, best = 0, len(cuts) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            candidate = replace(passage, text=passage.text[: cuts[mid]])
            if len(self._render(question, [*used, candidate])[1]) <= budget:
                best, lo = candidate, mid + 1
            else:
                hi = mid - 1
        return best

    def _messages(self, question: str, passages: list[Passage]) -> tuple[list[dict], list[tuple[int, int]]]:
        """Chat messages, and where each passage's text lies in the user message."""
        parts, spans, pos = [], {}, 0
        if passages:
            parts.append("Passages:\n\n")
            pos += len(parts[-1])
            order = range(len(passages))
            for i in reversed(order) if self.config.best_last else order:
                p = passages[i]
                header = f"[{i + 1}] (from {source_label(p)})\n"
                parts.append(header)
                pos += len(header)
                spans[i] = (pos, pos + len(p.text))
                parts.append(p.text + "\n\n")
                pos += len(parts[-1])
        parts.append(f"Question: {question}{self.config.question_suffix}")
        messages = [
            {"role": "system", "content": self.config.system_prompt},
            {"role": "user", "content": "".join(parts)},
        ]
        return messages, [spans[i] for i in range(len(passages))]

    def _render(self, question: str, passages: list[Passage]):
        """(prompt text, token ids, per-token char offsets, passage char spans in the text)."""
        messages, spans = self._messages(question, passages)
        text, special = chat_prompt_text(self.tokenizer, messages)
        enc = self.tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
        user = messages[-1]["content"]
        base = text.rfind(user)
        if base < 0:
            raise ValueError(
                "the model's chat template changes the message text; the pipeline cannot "
                "locate the passages in the prompt"
            )
        located = [(base + s, base + e) for s, e in spans]
        return text, list(enc["input_ids"]), list(enc["offset_mapping"]), located


def keep_places(shown: Sequence[Passage], hits: Sequence, best_last: bool = True) -> list:
    """`hits` (rank order) reordered for a prompt after one that showed `shown` (see the module
    docstring): in the places of `shown`, those retrieved again; in the places left empty, then
    after them, the new ones in the order a prompt of their own would show them; with best_last
    the best hit last whatever its place before. Returned in label order ([1] first), the
    order `_build` takes. A passage is the same when its id and text are."""
    best = list(hits[:1]) if best_last else []
    rest = hits[len(best):]
    now = {(h.passage.id, h.passage.text): h for h in rest}
    places = [now.pop((p.id, p.text), None) for p in shown]
    new = [h for h in rest if (h.passage.id, h.passage.text) in now]
    new = iter(new[::-1] if best_last else new)
    display = [h if h is not None else next(new, None) for h in places]
    display = [h for h in display if h is not None] + list(new) + best
    return display[::-1] if best_last else display


def _region(label: int, ids: list[int], offsets: list, start: int, end: int) -> SourceRegion:
    """The prompt tokens overlapping text[start:end], with char offsets relative to start.

    A token straddling the passage edge (e.g. " The" when the passage starts at "The") is
    included and its range clipped to the passage.
    """
    inside = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
    if not inside:
        return SourceRegion(0, 0, label, ())
    first, last = inside[0], inside[-1]
    chars = tuple(
        (max(a, start) - start, max(min(b, end), a, start) - start)
        for a, b in offsets[first : last + 1]
    )
    return SourceRegion(first, last + 1, label, chars)
