"""The generator on another server: any OpenAI-compatible chat endpoint (`--generator URL`).

Contract:
  * `connect(url, model=None)` returns (RemoteModel, RemoteGenerator) for a server's
    `/v1` base URL (`http://host:port/v1`); `URL#MODEL` or `model` picks the model id, else the
    first id `/v1/models` lists that is not one of `ragspec serve`'s retrieving ids ("ragspec",
    "ragspec:NAME"): retrieval stays with this process's index, so every front end answers
    from the same passages whatever server writes. The API key comes from
    RAGSPEC_GENERATOR_KEY (never from a command line). A server that cannot be reached, or
    lists no model, is a RemoteGeneratorError with one clear line.
  * `pipeline_for(store, generator, config)` gives the local Pipeline or, for a remote
    generator, a `RemotePipeline`, which builds the same chat messages as the local pipeline (numbered passages, then the question) and streams the answer.
  * `RemoteStream` quacks like the engine's GenerationStream (iterate for spans; `spans`,
    `stats`, `text`, `stop()`, `result()`); the texts of its spans concatenate to the answer.
    While the answer arrives, spans are plain or *quoted* (ragspec.quoting: found word for word
    in a passage; never called drafts). When the response carries `ragspec serve`'s extension
    (a top-level `ragspec` object with `spans`, on the last chunk of a stream), the result's
    spans are the server's: accepted drafts as drafts, each placed in the passage it copies
    (the server's character range when it knew the passages, else located by text), and the
    stats take its drafted and accepted counts. Token ids are those the server reports (none
    for other servers).
  * Sampling settings go over as the OpenAI fields (max_tokens, temperature, top_p, seed,
    stop); `--no-spec` is sent as `ragspec serve`'s `"ragspec": {"speculation": false}` only,
    since other servers choose their own speculation.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from ragspec.decoding.types import (
    GenerationConfig,
    GenerationResult,
    GenerationStats,
    Span,
    SpanOrigin,
)
from ragspec.models.load import ModelNotFound
from ragspec.pipeline import Pipeline, PipelineConfig, PreparedPrompt
from ragspec.quoting import QuoteFinder, locate, span_from_dict

KEY_ENV = "RAGSPEC_GENERATOR_KEY"
TIMEOUT_SECONDS = 600.0
_FINISH = {"stop": "eos", "length": "max_new_tokens"}


class RemoteGeneratorError(ModelNotFound):
    """The server could not be used: unreachable, refused the request, or lists no model. A
    ModelNotFound, so the chat reports it as a model it cannot use (the detail, which names
    the server, goes to the log, not the page)."""


def is_url(spec: str | None) -> bool:
    return isinstance(spec, str) and spec.startswith(("http://", "https://"))


def _retrieving(model_id: str) -> bool:
    return model_id == "ragspec" or model_id.startswith("ragspec:")


@dataclass(frozen=True)
class RemoteModel:
    """What the CLI and the chat show of a remote model (LoadedModel's reporting fields)."""

    name: str
    url: str
    speculation_note: str | None = None
    speculation_off_reason: str | None = None
    device: str = "remote"


def connect(url: str, model: str | None = None) -> tuple[RemoteModel, RemoteGenerator]:
    """See the module docstring."""
    if not is_url(url):
        raise RemoteGeneratorError(f"--generator wants a server's http(s) URL, like "
                                   f"http://127.0.0.1:8000/v1; got {url!r}")
    base, _, fragment = url.partition("#")
    generator = RemoteGenerator(base, model or fragment or None)
    return RemoteModel(name=f"{generator.model} at {_host(base)}", url=base), generator


def _host(url: str) -> str:
    return urlsplit(url).netloc or url


class RemoteGenerator:
    """A chat endpoint and a model id on it. `remote` tells the pipeline to send messages."""

    remote = True

    def __init__(self, base_url: str, model: str | None = None) -> None:
        from openai import OpenAI

        self.base_url = base_url
        self.client = OpenAI(base_url=base_url, api_key=os.environ.get(KEY_ENV) or "unused",
                             timeout=TIMEOUT_SECONDS, max_retries=0)
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        import openai

        try:
            ids = [m.id for m in self.client.models.list()]
        except openai.OpenAIError as exc:
            raise RemoteGeneratorError(
                f"cannot list the models of {self.base_url} ({_reason(exc)}); is the server "
                "running, and is the URL its /v1 base?") from exc
        plain = [i for i in ids if not _retrieving(i)]
        if not plain:
            raise RemoteGeneratorError(f"{self.base_url} lists no model to generate with "
                                       f"(found {ids or 'none'}); name one with URL#MODEL")
        return plain[0]

    def stream_messages(self, messages: list[dict], config: GenerationConfig,
                        passages: Sequence[str] = ()) -> RemoteStream:
        return RemoteStream(self, messages, config, list(passages))


def _reason(exc: Exception) -> str:
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    status = getattr(exc, "status_code", None)
    return f"HTTP {status}: {message}" if status else message


class RemoteStream:
    """See the module docstring."""

    remote = True

    def __init__(self, gen: RemoteGenerator, messages: list[dict], config: GenerationConfig,
                 passages: list[str]) -> None:
        self.gen, self.messages, self.config, self.passages = gen, messages, config, passages
        self.prompt_ids: list[int] = []
        self.token_ids: list[int] = []
        self.spans: list[Span] = []
        self.stats = GenerationStats()
        self.extension: dict | None = None
        self._text = ""
        self._stop_requested = False
        self._spans = self._run()  # one pass over the server's answer, however it is iterated

    def __iter__(self) -> Iterator[Span]:
        return self._spans

    def stop(self) -> None:
        """End at the next chunk, keeping what arrived (stop_reason "stopped")."""
        self._stop_requested = True

    @property
    def text(self) -> str:
        return self._text

    def result(self) -> GenerationResult:
        for _ in self:
            pass
        return GenerationResult(prompt_token_ids=[], token_ids=list(self.token_ids),
                                text=self._text, spans=list(self.spans), stats=self.stats)

    def _request(self) -> dict:
        c, s = self.config, self.config.sampling
        body = {"model": self.gen.model, "messages": self.messages,
                "max_tokens": c.max_new_tokens, "temperature": s.temperature, "stream": True,
                "stream_options": {"include_usage": True}}
        if s.top_p < 1:
            body["top_p"] = s.top_p
        if s.seed is not None:
            body["seed"] = s.seed
        if c.stop_strings:
            body["stop"] = list(c.stop_strings)
        if not c.draft.enabled:
            body["extra_body"] = {"ragspec": {"speculation": False}}
        return body

    def _run(self) -> Iterator[Span]:
        import openai

        started = time.perf_counter()
        finder = QuoteFinder(self.passages)
        usage, finish = None, None
        try:
            chunks = self.gen.client.chat.completions.create(**self._request())
            for chunk in chunks:
                extra = chunk.model_extra or {}
                if isinstance(extra.get("ragspec"), dict):
                    self.extension = extra["ragspec"]
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
                    piece = choice.delta.content if choice.delta else None
                    if piece:
                        if not self._text:
                            self.stats.ttft_seconds = time.perf_counter() - started
                        self._text += piece
                        yield from self._keep(finder.feed(self._text))
                if self._stop_requested:
                    chunks.close()
                    finish = "stopped"
                    break
        except openai.OpenAIError as exc:
            raise RemoteGeneratorError(
                f"the generator at {self.gen.base_url} failed ({_reason(exc)})") from exc
        yield from self._keep(finder.finish(self._text))
        self._finish(started, usage, finish)

    def _keep(self, spans: list[Span]) -> Iterator[Span]:
        for span in spans:
            self.spans.append(span)
            yield span

    def _finish(self, started: float, usage, finish: str | None) -> None:
        stats = self.stats
        stats.decode_seconds = time.perf_counter() - started
        stats.stop_reason = "stopped" if finish == "stopped" else _FINISH.get(finish or "", "")
        if usage is not None:
            stats.prompt_tokens = usage.prompt_tokens or 0
            stats.new_tokens = usage.completion_tokens or 0
        server_spans = (self.extension or {}).get("spans")
        if server_spans:
            self.spans = [self._placed(span_from_dict(d)) for d in server_spans]
            self.token_ids = [t for s in self.spans for t in s.token_ids]
            served = (self.extension or {}).get("stats") or {}
            for field in ("drafted_tokens", "accepted_tokens", "forward_passes"):
                if isinstance(served.get(field), int):
                    setattr(stats, field, served[field])

    def _placed(self, span: Span) -> Span:
        """A server's drafted span with its passage: the server's when it had one, else
        found by its text in ours (it copied from our prompt, which holds them verbatim)."""
        if not span.drafted or (span.origin is not None and (
                span.origin.source is not None or not span.origin.in_prompt)):
            return span  # placed already, or copied from the answer's own earlier text
        found = locate(span.text, self.passages)
        if found is None:
            return span
        number, start, end = found
        position = span.origin.position if span.origin is not None else 0
        span.origin = SpanOrigin(position=position, in_prompt=True, source=number,
                                 char_start=start, char_end=end)
        return span


class RemotePipeline(Pipeline):
    """Retrieval and messages as the local pipeline builds them; generation on a server."""

    def __init__(self, store, generator: RemoteGenerator,
                 config: PipelineConfig | None = None) -> None:
        self.store, self.generator = store, generator
        self.config = config or PipelineConfig()
        self.tokenizer = None  # the server tokenizes; no token budget is computed here

    def _build(self, question: str, passages: list, scores: list[float]) -> PreparedPrompt:
        messages, _ = self._messages(question, passages)
        return PreparedPrompt(prompt_ids=[], sources=[], passages=list(passages),
                              standalone_question=question, prompt_text=messages[-1]["content"],
                              scores=scores[: len(passages)], messages=messages)

    def stream(self, prepared: PreparedPrompt, gen_config: GenerationConfig) -> RemoteStream:
        return self.generator.stream_messages(prepared.messages, gen_config,
                                              [p.text for p in prepared.passages])


def pipeline_for(store, generator, config: PipelineConfig | None = None) -> Pipeline:
    """The pipeline for a local Generator, or for a generator on a server. It lives here, not in
    ragspec.pipeline, so that the dependency points one way: remote builds on pipeline."""
    if getattr(generator, "remote", False):
        return RemotePipeline(store, generator, config)
    return Pipeline(store, generator, config)
