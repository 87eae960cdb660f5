"""The OpenAI response objects: chat.completion, chat.completion.chunk, text_completion, usage,
and the server-sent-event framing (`data: {...}` lines, then `data: [DONE]`).

Contract: pure functions of plain values. The `ragspec` extension rides as one extra top-level
key of the whole response, and of the chunk of a stream that carries the finish_reason (the
last one with a choice; with stream_options.include_usage the usage chunk, no choices, follows
it and is last, as in OpenAI's API); clients that do not know it ignore it.
"""

from __future__ import annotations

import json
import secrets
import time

# the engine's stop reasons -> OpenAI's finish_reason
_FINISH = {"eos": "stop", "stop_string": "stop", "stopped": "stop", "max_new_tokens": "length"}


def new_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


def finish_reason(stop_reason: str | None) -> str:
    return _FINISH.get(stop_reason or "", "stop")


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(kind: str, rid: str, created: int, model: str, text: str, finish: str,
               use: dict, extension: dict) -> dict:
    """The whole (non-streamed) answer."""
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": use, "ragspec": extension}


def chunk(kind: str, rid: str, created: int, model: str, *, text: str | None = None,
          role: bool = False, finish: str | None = None, extension: dict | None = None,
          with_usage: bool = False) -> dict:
    """One streamed piece: new text (and the role in the first chunk of a chat), or the end."""
    if kind == "chat":
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    out = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
    if with_usage:
        out["usage"] = None  # stream_options.include_usage: null on all but the usage chunk
    if extension is not None:
        out["ragspec"] = extension
    return out


def usage_chunk(kind: str, rid: str, created: int, model: str, use: dict) -> dict:
    """The extra last chunk of stream_options.include_usage: no choices, the usage."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": use}


def sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")
