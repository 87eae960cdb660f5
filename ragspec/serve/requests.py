"""The request bodies the API accepts, checked strictly (a string where a number belongs is a 400,
not a guess), and their translation into the engine's GenerationConfig.

Fields of the OpenAI schema that ragspec does not act on (presence_penalty, user, logprobs, ...)
are accepted and ignored, so existing clients work; ones whose meaning it cannot honour (n > 1,
image content, token-id inputs) are refused with a 400 that says so. Extensions:
`top_k`, and a `ragspec` object for the retrieval model ids ({"k", "search", "min_score",
"speculation"}). temperature defaults to 0: greedy, the model's own answer token for token.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ragspec.decoding.types import DraftConfig, GenerationConfig, SamplingConfig
from ragspec.retrieval.records import SEARCH_MODES
from ragspec.serve.errors import APIError

MAX_MESSAGES = 512
MAX_STOP = 4
MAX_EMBED_INPUTS = 256


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Strict):
    type: str
    text: str | None = None


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise APIError(400, f"content of type {part.type!r} is not supported: ragspec "
                                    f"reads text only", param="messages")
            parts.append(part.text)
        return "".join(parts)


class StreamOptions(_Strict):
    include_usage: bool = False


class RagspecOptions(_Strict):
    """Retrieval settings for the `ragspec` model ids; absent fields keep the server's."""

    k: int | None = Field(default=None, ge=1, le=50)
    search: Literal[SEARCH_MODES] | None = None  # type: ignore[valid-type]
    min_score: float | None = Field(default=None, ge=0, le=1)
    speculation: bool = True


class _Generation(_Strict):
    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=None, ge=1)
    ragspec: RagspecOptions | None = None

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP:
            raise APIError(400, f"stop: at most {MAX_STOP} stop sequences", param="stop")
        if any(not s for s in stops):
            raise APIError(400, "stop: stop sequences must not be empty", param="stop")
        return tuple(stops)

    def check(self) -> None:
        """What the schema cannot say; before anything runs (a refusal too must not pass a bad
        request)."""
        if self.n not in (None, 1):
            raise APIError(400, "n: ragspec writes one choice per request (n = 1)", param="n")
        self.stops()

    def generation_config(self, default_max_tokens: int) -> GenerationConfig:
        """The engine's config for this request; max_tokens defaults to `default_max_tokens`."""
        options = self.ragspec or RagspecOptions()
        try:
            return GenerationConfig(
                max_new_tokens=self.max_tokens or default_max_tokens,
                stop_strings=self.stops(),
                sampling=SamplingConfig(temperature=self.temperature or 0.0,
                                        top_p=self.top_p or 1.0, top_k=self.top_k or 0,
                                        seed=self.seed),
                draft=DraftConfig(enabled=options.speculation),
            )
        except ValueError as exc:
            raise APIError(400, str(exc)) from exc

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(_Generation):
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def check(self) -> None:
        super().check()
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens

    def plain_messages(self) -> list[dict[str, str]]:
        """{"role", "content"} dicts for the chat template ("developer" is the new "system")."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in self.messages]


class CompletionRequest(_Generation):
    prompt: str | list[str]
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=1)

    def check(self) -> None:
        super().check()
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise APIError(400, "prompt: give one prompt per request", param="prompt")
        if self.echo:
            raise APIError(400, "echo is not supported", param="echo")

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else "".join(self.prompt)


class EmbeddingRequest(_Strict):
    model: str = Field(min_length=1, max_length=256)
    input: str | list[str] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)

    def texts(self) -> list[str]:
        texts = [self.input] if isinstance(self.input, str) else list(self.input)
        if len(texts) > MAX_EMBED_INPUTS:
            raise APIError(400, f"input: at most {MAX_EMBED_INPUTS} texts per request",
                           param="input")
        if any(not t for t in texts):
            raise APIError(400, "input: texts must not be empty", param="input")
        return texts
