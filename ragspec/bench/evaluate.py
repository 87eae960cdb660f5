"""The answer-quality evaluation behind `ragspec eval`: every question of a set, answered as
`ragspec ask` answers it, under each model and setting, measured by ragspec.bench.quality.

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
from dataclasses import asdict, dataclass, field

from ragspec.bench import quality
from ragspec.bench.questions import Question
from ragspec.decoding.types import DraftConfig, GenerationConfig, RepeatConfig
from ragspec.describe import ANSWER, PASSAGE, draft_source
from ragspec.prompts import DEFAULT_PROMPT, PROMPTS
from ragspec.search import DEFAULT_MIN_SCORE

SPECULATION = ("on", "off", "both")


@dataclass(frozen=True)
class Setting:
    """One way of answering: the instruction (a name in ragspec.prompts.PROMPTS), passages per
    question, the answer's length limit and the repetition rule."""

    prompt: str = DEFAULT_PROMPT
    k: int = 4
    max_new_tokens: int = 256
    repeat: RepeatConfig = field(default_factory=RepeatConfig)

    def __post_init__(self) -> None:
        if self.prompt not in PROMPTS:
            raise ValueError(f"unknown prompt {self.prompt!r}; choose from {', '.join(PROMPTS)}")
        if not 1 <= self.k <= 50:
            raise ValueError(f"k (passages per question) must be between 1 and 50, got {self.k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def label(self) -> str:
        r = self.repeat
        stop = f"stop {r.stop_ngram}x{r.stop_count}" if r.stop_ngram else "no stop"
        penalty = f", penalty {r.penalty:g}/{r.penalty_last_n}" if r.penalty != 1.0 else ""
        return f"{self.prompt}, k={self.k}, {self.max_new_tokens} tokens, {stop}{penalty}"

    def to_dict(self) -> dict:
        return {"prompt": self.prompt, "k": self.k, "max_new_tokens": self.max_new_tokens,
                "repeat": asdict(self.repeat), "label": self.label}


def settings_grid(prompts: Sequence[str], ks: Sequence[int], lengths: Sequence[int],
                  stops: Sequence[tuple[int, int]], penalties: Sequence[float],
                  penalty_last_n: int = 64) -> list[Setting]:
    """Every combination, in option order (the first option varies slowest)."""
    return [Setting(p, k, n, RepeatConfig(stop_ngram=ngram, stop_count=count, penalty=penalty,
                                          penalty_last_n=penalty_last_n))
            for p, k, n, (ngram, count), penalty
            in itertools.product(prompts, ks, lengths, stops, penalties)]


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
    "summary", "questions": [record, ...], "failures": [...]}, ...]}."""
    if speculation not in SPECULATION:
        raise ValueError(f"speculation must be one of {', '.join(SPECULATION)}, got {speculation!r}")
    runs = []
    for model in models:
        for setting in settings:
            records, failures = [], []
            for q in questions:
                try:
                    records.append(answer_question(store, model.generator, setting, q,
                                                   speculation, min_score))
                except ValueError as exc:  # e.g. a question too long for the context
                    failures.append(f"question {q.id}: {exc}")
                if progress:
                    progress(f"{model.name} · {setting.label} · {q.id}")
            runs.append({"model": model.name, "setting": setting.to_dict(),
                         "summary": quality.summarize(records), "questions": records,
                         "failures": failures})
    return {"speculation": speculation, "min_score": min_score, "runs": runs,
            "measures": {"present_recall": quality.PRESENT_RECALL,
                         "loop": f"a run of {quality.LOOP_NGRAM} tokens written "
                                 f"{quality.LOOP_TIMES} or more times"}}


def answer_question(store, generator, setting: Setting, q: Question, speculation: str,
                    min_score: float) -> dict:
    """One question's record: its answer (as `ragspec ask` would give it) and its measures."""
    from ragspec.pipeline import Pipeline, PipelineConfig

    prompt = PROMPTS[setting.prompt]
    pipeline = Pipeline(store, generator, PipelineConfig(
        k=setting.k, max_new_tokens=setting.max_new_tokens, system_prompt=prompt.system,
        question_suffix=prompt.after_question, min_score=min_score, repeat=setting.repeat))
    retrieval = pipeline.retrieve(q.question)
    record = {"id": q.id, "kind": q.kind, "unanswerable": q.unanswerable,
              "floor_refused": retrieval.refused, "best_score": retrieval.best_score,
              "text": "", "token_ids": [], "new_tokens": 0, "stop_reason": "",
              "accepted_tokens": 0, "from_passages": 0, "from_answer": 0, "seconds": 0.0,
              "identical": None}
    if not retrieval.refused:
        prepared = pipeline.prepare_retrieved(retrieval)
        results = []
        for enabled in {"on": [True], "off": [False], "both": [False, True]}[speculation]:
            config = GenerationConfig(setting.max_new_tokens, repeat=setting.repeat,
                                      draft=DraftConfig(enabled=enabled))
            start = time.perf_counter()
            results.append((pipeline.stream(prepared, config).result(),
                            time.perf_counter() - start))
        result, seconds = results[-1]
        record.update(
            text=result.text, token_ids=list(result.token_ids),
            new_tokens=result.stats.new_tokens, stop_reason=result.stats.stop_reason,
            accepted_tokens=result.stats.accepted_tokens, seconds=seconds,
            from_passages=_drafted(result.spans, PASSAGE),
            from_answer=_drafted(result.spans, ANSWER),
            identical=(results[0][0].token_ids == result.token_ids if len(results) > 1
                       else None))
    record.update(quality.measure(answers=q.answers, unanswerable=q.unanswerable,
                                  floor_refused=retrieval.refused, text=record["text"],
                                  token_ids=record["token_ids"],
                                  stop_reason=record["stop_reason"]))
    return record


def _drafted(spans, source: str) -> int:
    """Output tokens in accepted drafts copied from `source` (ragspec.describe.draft_source)."""
    return sum(len(s.token_ids) for s in spans if draft_source(s) == source)
