"""Malformed requests for the OpenAI-compatible API: every one is invalid by construction, so a
correct server answers each with a 4xx status and an OpenAI error object (never a 2xx, a 5xx,
a traceback or a dropped connection).

`malformed_requests(n, seed, model, body_limit)` yields (path, body bytes, headers, why) tuples
drawn from these kinds: JSON cut short at a random point (a proper prefix of a JSON object is
never JSON), bytes that are not UTF-8, JSON that is not an object, a required field missing, a
field of the wrong type, a value out of range, an unknown model, text content of an unknown
kind, a prompt longer than any context, a body over the server's size limit, and arrays nested
too deep to parse. Used by ragspec/bench/load_test.py (1000 of them) and the test suite.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
JSON_HEADERS = {"content-type": "application/json"}

# (field, values of a wrong type or out of range) for the chat body
_BAD_FIELDS = [
    ("model", [3, None, [], {}, True, ""]),
    ("messages", ["hi", 3, None, {}, [], [3], [{"role": "user"}, "x"], [{"content": "x"}],
                  [{"role": "wizard", "content": "x"}], [{"role": "user", "content": 5}]]),
    ("max_tokens", ["5", -1, 0, 2.5, True, [], {}]),
    ("temperature", ["0", -0.5, 3, [], {}]),
    ("top_p", [0, -1, 1.5, "x", []]),
    ("stream", ["yes", 1, [], {}]),
    ("stop", [3, [1, 2], ["a", "b", "c", "d", "e"], [""], {}]),
    ("seed", ["1", 1.5, []]),
    ("n", [2, 0, "1"]),
    ("stream_options", ["x", 1, {"include_usage": "yes"}]),
    ("ragspec", [{"k": 0}, {"k": "4"}, {"search": "fuzzy"}, {"min_score": 2}, "x"]),
]


def _valid_chat(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "What does it do?"}],
            "max_tokens": 8}


def _dump(obj) -> bytes:
    return json.dumps(obj).encode()


def malformed_requests(n: int, seed: int = 0, *, model: str = "ragspec",
                       body_limit: int = 1 << 20) -> Iterator[tuple[str, bytes, dict, str]]:
    rng = random.Random(seed)
    kinds = ["truncated", "not_utf8", "not_object", "missing", "wrong_type", "unknown_model",
             "bad_part", "huge_prompt", "too_large", "deep", "embed_wrong", "completion_wrong"]
    for i in range(n):
        kind = kinds[i % len(kinds)] if i < len(kinds) else rng.choice(kinds)
        body = _valid_chat(model)
        path = CHAT
        if kind == "truncated":
            raw = _dump(body)
            yield path, raw[: rng.randrange(0, len(raw))], JSON_HEADERS, kind
            continue
        if kind == "not_utf8":
            raw = _dump(body)
            cut = rng.randrange(1, len(raw))
            yield path, raw[:cut] + b"\xff\xfe" + raw[cut:], JSON_HEADERS, kind
            continue
        if kind == "not_object":
            other = rng.choice([[], [body], "text", 3, None, True])
            yield path, _dump(other), JSON_HEADERS, kind
            continue
        if kind == "missing":
            del body[rng.choice(["model", "messages"])]
        elif kind == "wrong_type":
            field, values = rng.choice(_BAD_FIELDS)
            body[field] = rng.choice(values)
        elif kind == "unknown_model":
            body["model"] = f"no-such-model-{rng.randrange(10**6)}"
        elif kind == "bad_part":
            body["messages"] = [{"role": "user", "content": [
                {"type": rng.choice(["image_url", "input_audio", "file"]), "text": None}]}]
        elif kind == "huge_prompt":
            # under the body limit, over any context: a 400 (context_length_exceeded), not a 5xx
            body["model"] = model
            words = max(1000, body_limit // 8)
            body["messages"][0]["content"] = "word " * words
            body["max_tokens"] = 10**7
        elif kind == "too_large":
            body["messages"][0]["content"] = "x" * (body_limit + rng.randrange(1, 4096))
        elif kind == "deep":
            depth = rng.choice([5000, 50000])
            yield path, b"[" * depth + b"]" * depth, JSON_HEADERS, kind
            continue
        elif kind == "embed_wrong":
            path = EMBEDDINGS
            body = {"model": rng.choice([model, "x"]),
                    "input": rng.choice([3, [1, 2, 3], [[1]], None, "", [""], {"a": 1}])}
        elif kind == "completion_wrong":
            path = COMPLETIONS
            body = {"model": model, "prompt": rng.choice([3, None, ["a", "b"], {"p": 1}]),
                    "max_tokens": 8}
        yield path, _dump(body), JSON_HEADERS, kind
