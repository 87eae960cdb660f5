"""The answer-quality evaluation behind `ragspec eval`: every question of a set, answered as
`ragspec ask` answers it, under each model and setting, measured by ragspec.eval.quality.

Contract: given an open store, loaded generators and a list of Settings, `evaluate` answers every
question under every (model, setting) and returns the results object (JSON-ready: per-question
records and a summary per run). Knows nothing of click. A question is answered like `ask`:
retrieval with the relevance floor (a refused question generates nothing), the prompt built by
ragspec.pipeline with the setting's instruction and passage count, greedy generation with the
setting's repetition rule. Speculation does not change greedy text; speculation="both" answers
with it off and on and records whether the token ids were identical (the exactness check),
"off" skips the drafts (the same text, a baseline), "on" is what users run.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

from ragspec.bench.questions import Question
from ragspec.decoding.repetition import stop_point
from ragspec.decoding.types import DraftConfig, GenerationConfig, RepeatConfig
from ragspec.describe import ANSWER, PASSAGE, draft_source
from ragspec.eval import quality
from ragspec.prompts import DEFAULT_PROMPT, PROMPTS
from ragspec.retrieval.trim import DEFAULT_TRIM
from ragspec.search import DEFAULT_MIN_SCORE

SPECULATION = ("on", "off", "both")


@dataclass(frozen=True)
class Setting:
    """One way of answering: the instruction (a name in ragspec.prompts.PROMPTS), passages per
    question, the answer's length limit, the repetition rule and the prompt tokens each passage
    may take (trim; 0: whole passages; ragspec.retrieval.trim)."""

    prompt: str = DEFAULT_PROMPT
    k: int = 4
    max_new_tokens: int = 256
    repeat: RepeatConfig = field(default_factory=RepeatConfig)
    trim: int = DEFAULT_TRIM

    def __post_init__(self) -> None:
        if self.prompt not in PROMPTS:
            raise ValueError(f"unknown prompt {self.prompt!r}; choose from {', '.join(PROMPTS)}")
        if not 1 <= self.k <= 50:
            raise ValueError(f"k (passages per question) must be between 1 and 50, got {self.k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.trim < 0:
            raise ValueError(f"trim (prompt tokens per passage) must be >= 0 (0 = off), "
                             f"got {self.trim}")

    @property
    def label(self) -> str:
        r = self.repeat
        stop = f"stop {r.stop_ngram}x{r.stop_count}" if r.stop_ngram else "no stop"
        penalty = f", penalty {r.penalty:g}/{r.penalty_last_n}" if r.penalty != 1.0 else ""
        trim = f", trim {self.trim}" if self.trim else ""
        return f"{self.prompt}, k={self.k}, {self.max_new_tokens} tokens, {stop}{penalty}{trim}"

    def to_dict(self) -> dict:
        return {"prompt": self.prompt, "k": self.k, "max_new_tokens": self.max_new_tokens,
                "repeat": asdict(self.repeat), "trim": self.trim, "label": self.label}


def settings_grid(prompts: Sequence[str], ks: Sequence[int], lengths: Sequence[int],
                  stops: Sequence[tuple[int, int]], penalties: Sequence[float],
                  penalty_last_n: int = 64,
                  trims: Sequence[int] = (DEFAULT_TRIM,)) -> list[Setting]:
    """Every combination, in option order (the first option varies slowest)."""
    return [Setting(p, k, n, RepeatConfig(stop_ngram=ngram, stop_count=count, penalty=penalty,
                                          penalty_last_n=penalty_last_n), trim)
            for p, k, n, (ngram, count), penalty, trim
            in itertools.product(prompts, ks, lengths, stops, penalties, trims)]


ProgressFn = Callable[[str], None]


@dataclass
class Model:
    """A loaded model to evaluate: its name in reports and its ragspec.decoding Generator."""

    name: str
    generator: object


def evaluate(store, models: Sequence[Model], settings: Sequence[Setting],
             questions: Sequence[Question], *, speculation: str = "on",
             min_score: float = DEFAULT_MIN_SCORE, progress: ProgressFn | None = None) -> dict:
    """The results object: {"speculation", "min_score", "runs": [{"model", "setting",
    "summary", "versus_first", "questions": [record, ...], "failures": [...]}, ...]}, one run
    per model and setting, in the order given; versus_first: the per-question recall
    differences from the model's first setting (quality.paired; None for the first)."""
    if speculation not in SPECULATION:
        raise ValueError(f"speculation must be one of {', '.join(SPECULATION)}, got {speculation!r}")
    runs = []
    for model in models:
        records: dict[Setting, list[dict]] = {s: [] for s in settings}
        failures: dict[Setting, list[str]] = {s: [] for s in settings}
        for group in _groups(settings):
            for q in questions:
                try:
                    answers = answer_question(store, model.generator, group, q, speculation,
                                              min_score)
                except ValueError as exc:  # e.g. a question too long for the context
                    answers = {}
                    for setting in group:
                        failures[setting].append(f"question {q.id}: {exc}")
                for setting in group:
                    if setting in answers:
                        records[setting].append(answers[setting])
                    if progress:
                        progress(f"{model.name} · {setting.label} · {q.id}")
        first = records[settings[0]]
        runs += [{"model": model.name, "setting": s.to_dict(),
                  "summary": quality.summarize(records[s]),
                  "versus_first": quality.paired(first, records[s]) if i else None,
                  "questions": records[s], "failures": failures[s]}
                 for i, s in enumerate(settings)]
    return {"speculation": speculation, "min_score": min_score, "runs": runs,
            "measures": {"present_recall": quality.PRESENT_RECALL,
                         "loop": f"a run of {quality.LOOP_NGRAM} tokens written "
                                 f"{quality.LOOP_TIMES} or more times"}}


def _groups(settings: Sequence[Setting]) -> list[list[Setting]]:
    """Settings that differ only in answer length and stop rule: one greedy generation, at the
    longest length without the rule, answers them all (see `answer_question`)."""
    groups: dict[tuple, list[Setting]] = {}
    for s in dict.fromkeys(settings):
        key = (s.prompt, s.k, s.repeat.penalty, s.repeat.penalty_last_n)
        groups.setdefault(key, []).append(s)
    return list(groups.values())


def answer_question(store, generator, group: Sequence[Setting], q: Question, speculation: str,
                    min_score: float) -> dict[Setting, dict]:
    """One question's record for every setting of a group (`_groups`): its answer as `ragspec
    ask` would give it, and its measures.

    Greedy output under a stop rule or a shorter length limit is a prefix of the output without
    them, so when several settings share a prompt one generation at the longest limit without
    the rule answers them all, each cut where its own limit or rule ends it ("derived": true).
    speculation="both" generates every setting itself, rule on, to check exactness."""
    from ragspec.pipeline import Pipeline, PipelineConfig

    prompt = PROMPTS[group[0].prompt]
    pipelines = {s: Pipeline(store, generator, PipelineConfig(
        k=s.k, max_new_tokens=s.max_new_tokens, system_prompt=prompt.system,
        question_suffix=prompt.after_question, min_score=min_score, repeat=s.repeat,
        trim=s.trim))
        for s in group}
    retrieval = pipelines[group[0]].retrieve(q.question)
    out = {}
    if retrieval.refused:
        return {s: _record(q, retrieval, None) for s in group}
    prepared = {s: pipelines[s].prepare_retrieved(retrieval) for s in group}
    shared: dict[tuple, list[Setting]] = {}
    for s in group:  # a longer limit can leave less room for passages: only equal prompts share
        shared.setdefault(tuple(prepared[s].prompt_ids), []).append(s)
    for same in shared.values():
        if len(same) == 1 or speculation == "both":
            for s in same:
                out[s] = _record(q, retrieval, _generate(pipelines[s], prepared[s], s.repeat,
                                                         s.max_new_tokens, speculation),
                                 prepared[s])
            continue
        longest = max(s.max_new_tokens for s in same)
        free = replace(same[0].repeat, stop_ngram=0)
        run = _generate(pipelines[same[0]], prepared[same[0]], free, longest, speculation)
        for s in same:
            out[s] = _record(q, retrieval, _cut(run, s, generator), prepared[s])
    return out


@dataclass
class _Run:
    """An answer as a record needs it; `drafted_from` is one source (or None) per token."""

    token_ids: list[int]
    text: str
    stop_reason: str
    drafted_from: list[str | None]
    prompt_tokens: int
    seconds: float | None = None
    ttft_seconds: float | None = None
    identical: bool | None = None
    derived: bool = False


def _generate(pipeline, prepared, repeat: RepeatConfig, max_new_tokens: int,
              speculation: str) -> _Run:
    results = []
    for enabled in {"on": [True], "off": [False], "both": [False, True]}[speculation]:
        config = GenerationConfig(max_new_tokens, repeat=repeat, draft=DraftConfig(enabled=enabled))
        start = time.perf_counter()
        results.append((pipeline.stream(prepared, config).result(), time.perf_counter() - start))
    result, seconds = results[-1]
    drafted_from = [draft_source(span) for span in result.spans for _ in span.token_ids]
    return _Run(list(result.token_ids), result.text, result.stats.stop_reason, drafted_from,
                len(prepared.prompt_ids), seconds, result.stats.ttft_seconds,
                results[0][0].token_ids == result.token_ids if len(results) > 1 else None)


def _cut(run: _Run, setting: Setting, generator) -> _Run:
    """The answer `setting` gets: `run` (generated without a stop rule, at least as long)
    cut at the setting's length limit or stop rule, the reason as the engine would give it."""
    limit, rule = setting.max_new_tokens, setting.repeat
    tokens = run.token_ids[:limit]
    stop = stop_point(tokens, rule.stop_ngram, rule.stop_count) if rule.stop_ngram else None
    if stop is not None:
        tokens = tokens[:stop]
    if tokens and tokens[-1] in generator.eos_token_ids:
        reason = "eos"  # the engine checks for the end of text first
    elif stop is not None:
        reason = "repetition"
    elif len(run.token_ids) > limit:
        reason = "max_new_tokens"
    else:
        reason = run.stop_reason
    text = generator.tokenizer.decode(tokens, skip_special_tokens=True)
    return _Run(tokens, text, reason, run.drafted_from[: len(tokens)], run.prompt_tokens,
                derived=True)


def _record(q: Question, retrieval, run: _Run | None, prepared=None) -> dict:
    record = {"id": q.id, "kind": q.kind, "unanswerable": q.unanswerable,
              "floor_refused": retrieval.refused, "best_score": retrieval.best_score,
              "text": "", "token_ids": [], "new_tokens": 0, "stop_reason": "",
              "accepted_tokens": 0, "from_passages": 0, "from_answer": 0, "prompt_tokens": 0,
              "seconds": None, "ttft_seconds": None, "identical": None, "derived": False,
              "snippet_shown": None}
    if run is not None:
        record.update(
            text=run.text, token_ids=run.token_ids, new_tokens=len(run.token_ids),
            stop_reason=run.stop_reason, prompt_tokens=run.prompt_tokens, seconds=run.seconds,
            ttft_seconds=run.ttft_seconds, identical=run.identical,
            derived=run.derived,
            accepted_tokens=sum(source is not None for source in run.drafted_from),
            from_passages=run.drafted_from.count(PASSAGE),
            from_answer=run.drafted_from.count(ANSWER))
    if prepared is not None and q.answers:
        record["snippet_shown"] = quality.shown(q.answers, [p.text for p in prepared.passages])
    record.update(quality.measure(answers=q.answers, unanswerable=q.unanswerable,
                                  floor_refused=retrieval.refused, text=record["text"],
                                  token_ids=record["token_ids"],
                                  stop_reason=record["stop_reason"]))
    return record
