"""`ragspec serve`'s API with real clients: the `openai` package, LangChain's ChatOpenAI and raw
HTTP, against a real uvicorn server on a free loopback port (tiny random model, hashed
embeddings)."""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import serve_support

from ragspec.decoding.engine import Generator
from ragspec.decoding.types import GenerationConfig
from ragspec.models.load import chat_prompt_ids
from ragspec.search import NOT_IN_DOCUMENTS
from ragspec.serve.malformed import malformed_requests

REPO = Path(__file__).resolve().parents[2]
QUESTION = "Which port does the metrics endpoint listen on?"


@pytest.fixture(scope="module")
def server(tiny_model, tiny_tokenizer, tmp_path_factory):
    running = serve_support.start(tiny_model, tiny_tokenizer,
                                  serve_support.tiny_store(tmp_path_factory.mktemp("serve")))
    yield running
    running.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


def _solo(model, tokenizer, prompt_ids, max_new_tokens):
    """The same request run alone by the single-sequence engine."""
    gen = Generator(model, tokenizer, eos_token_ids=[2])
    return gen.generate(prompt_ids, GenerationConfig(max_new_tokens=max_new_tokens))


def test_models_lists_the_plain_retrieval_and_embedding_ids(client, server):
    ids = [m.id for m in client.models.list()]
    assert ids == ["tiny", "ragspec", server.service.embedding_id]
    assert client.models.retrieve("ragspec").id == "ragspec"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_plain_model_answers_as_the_engine_alone_streamed_or_not(client, tiny_model,
                                                                 tiny_tokenizer):
    messages = [{"role": "user", "content": "abc abc abc abc"}]
    want = _solo(tiny_model, tiny_tokenizer, chat_prompt_ids(tiny_tokenizer, messages), 30)
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=30)
    assert whole.object == "chat.completion" and whole.model == "tiny"
    assert whole.choices[0].message.content == want.text
    assert whole.choices[0].finish_reason == ("length" if len(want.token_ids) == 30 else "stop")
    assert whole.usage.completion_tokens == len(want.token_ids)
    assert whole.usage.prompt_tokens == len(want.prompt_token_ids)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=30,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and "ragspec" in finals[0].model_extra


def test_ragspec_model_answers_with_passages_and_spans(client, server):
    whole = client.chat.completions.create(
        model="ragspec", messages=[{"role": "user", "content": QUESTION}], max_tokens=40)
    ext = whole.model_extra["ragspec"]
    text = whole.choices[0].message.content
    assert ext["refused"] is False and ext["passages"]
    assert ext["passages"][0]["source"].endswith("daemon.txt")
    assert "".join(s["text"] for s in ext["spans"]) == text
    assert sum(len(s["token_ids"]) for s in ext["spans"]) == whole.usage.completion_tokens
    assert ext["stats"]["new_tokens"] == whole.usage.completion_tokens
    stream = client.chat.completions.create(
        model="ragspec", messages=[{"role": "user", "content": QUESTION}], max_tokens=40,
        stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    last = chunks[-1]
    assert last.choices[0].finish_reason and last.model_extra["ragspec"]["spans"] == ext["spans"]
    assert last.model_extra["ragspec"]["passages"] == ext["passages"]


def test_raw_http_reads_the_ragspec_extension_whole_and_streamed(server, tiny_tokenizer):
    """Raw HTTP, no client library: the extension as JSON. A question that is a sentence of the
    document makes the tiny model's drafts copy from the passage."""
    body = {"model": "ragspec", "max_tokens": 60, "ragspec": {"k": 1},
            "messages": [{"role": "user", "content": serve_support.DOC.split(".")[0]}]}
    reply = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200
    ext = reply.json()["ragspec"]
    passages = ext["passages"]
    for span in ext["spans"]:
        origin = span["origin"]
        if span["drafted"] and origin["source"] is not None:
            passage = passages[origin["source"]]["text"]
            copied = passage[origin["char_start"]:origin["char_end"]]
            assert tiny_tokenizer.decode(span["token_ids"]).startswith(copied[:1])
            assert [origin["char_start"], origin["char_end"]] in [
                r for p in passages for r in p["copied"]] or copied in passage
    with httpx.stream("POST", f"{server.base_url}/chat/completions",
                      json={**body, "stream": True}, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert [e for e in events if "ragspec" in e][-1]["ragspec"]["spans"] == ext["spans"]


def test_api_docs_name_the_chunk_that_carries_the_ragspec_object(server):
    """With stream_options.include_usage the usage chunk is last (empty choices, as OpenAI's
    API sends it); the `ragspec` object rides on the chunk with the finish_reason before it,
    and docs/api.md says exactly that."""
    body = {"model": "ragspec", "max_tokens": 20, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": QUESTION}]}
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body,
                      timeout=60) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines()
                  if line and line != "data: [DONE]"]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] >= 1
    (carrier,) = [e for e in events if "ragspec" in e]
    assert carrier is events[-2] and carrier["choices"][0]["finish_reason"]
    api = " ".join((REPO / "docs" / "api.md").read_text().split())
    said = api[api.index("adds a top-level `ragspec` object"):][:400]
    assert "the chunk whose choice carries the `finish_reason`" in said, said
    assert "usage chunk, with empty `choices`, comes after it and last" in said, said


def test_below_the_relevance_floor_the_answer_is_a_refusal(client):
    whole = client.chat.completions.create(
        model="ragspec", messages=[{"role": "user", "content": "capital of australia"}],
        extra_body={"ragspec": {"min_score": 0.99}})
    ext = whole.model_extra["ragspec"]
    assert ext["refused"] is True and ext["message"] == NOT_IN_DOCUMENTS
    assert ext["passages"] and ext["spans"] == [] and whole.usage.completion_tokens == 0
    assert ext["absent_words"] == []  # the floor refused it, not a missing word
    # The message ends "the closest passages found:", so it lists them: a client that shows
    # only the content (Open WebUI, an editor) reads what it names and why, no server path.
    lines = whole.choices[0].message.content.split("\n")
    assert lines[0] == NOT_IN_DOCUMENTS and len(lines) == len(ext["passages"]) + 2
    for n, (line, passage) in enumerate(zip(lines[1:], ext["passages"], strict=False), 1):
        assert line.startswith(f"[{n}] {Path(passage['source']).name}") and "similarity" in line
        assert str(Path(passage["source"]).parent) not in line
    assert lines[-1].startswith("(best similarity") and "below the floor 0.99" in lines[-1]


def test_completions_endpoint_streamed_or_not(client, tiny_model, tiny_tokenizer):
    prompt = "xyz xyz xyz xyz"
    want = _solo(tiny_model, tiny_tokenizer, tiny_tokenizer(prompt)["input_ids"], 20)
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=20)
    assert whole.object == "text_completion" and whole.choices[0].text == want.text
    streamed = "".join(c.choices[0].text for c in
                       client.completions.create(model="tiny", prompt=prompt, max_tokens=20,
                                                 stream=True))
    assert streamed == want.text


def test_langchain_chat_openai_invoke_and_stream(server, client):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server.base_url, api_key="unused", model="tiny", max_tokens=25,
                     temperature=0, max_retries=0)
    want = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello hello"}], max_tokens=25,
        temperature=0).choices[0].message.content
    assert llm.invoke("hello hello").content == want
    assert "".join(chunk.content for chunk in llm.stream("hello hello")) == want


def test_embeddings_as_floats_and_base64(client, server):
    texts = ["the metrics port", "nightly backups"]
    want = server.service.embedder.embed_array(texts)
    floats = client.embeddings.create(model=server.service.embedding_id, input=texts,
                                      encoding_format="float")
    assert np.allclose([d.embedding for d in floats.data], want, atol=1e-6)
    raw = httpx.post(f"{server.base_url}/embeddings", timeout=30,
                     json={"model": server.service.embedding_id, "input": texts,
                           "encoding_format": "base64"}).json()
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw["data"]]
    assert np.allclose(decoded, want, atol=1e-6) and raw["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize("method,path,body,status", [
    ("POST", "/v1/chat/completions", b"{", 400),
    ("POST", "/v1/chat/completions", b"[1, 2]", 400),
    ("POST", "/v1/chat/completions", b'{"model": "tiny", "messages": "hi"}', 400),
    ("POST", "/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}', 400),
    ("POST", "/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 2}', 400),
    ("POST", "/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}',
     400),
    ("POST", "/v1/chat/completions",
     b'{"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}', 404),
    ("POST", "/v1/nothing", b"{}", 404),
    ("GET", "/v1/chat/completions", b"", 405),
    ("POST", "/v1/chat/completions", b"x" * 70000, 413),
])
def test_errors_are_openai_error_objects_with_their_status(server, method, path, body, status):
    reply = httpx.request(method, server.url + path, content=body, timeout=30,
                          headers={"content-type": "application/json"})
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["message"] and error["type"] and "Traceback" not in reply.text


def test_a_chunked_body_over_the_limit_is_refused_before_it_is_read_whole(server):
    def chunks():
        for _ in range(100):
            yield b"x" * 4096

    reply = httpx.post(f"{server.base_url}/chat/completions", content=chunks(), timeout=30)
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"


def test_malformed_requests_each_get_a_4xx_json_error(server):
    seen = set()
    with httpx.Client(timeout=60) as http:
        for path, body, headers, kind in malformed_requests(120, seed=1, model="ragspec",
                                                            body_limit=1 << 16):
            reply = http.post(server.url + path, content=body, headers=headers)
            assert 400 <= reply.status_code < 500, (kind, body[:200], reply.text[:200])
            assert reply.json()["error"]["message"], kind
            seen.add(kind)
    assert len(seen) == 12


def test_with_accounts_every_request_needs_a_valid_api_key(tiny_model, tiny_tokenizer, tmp_path,
                                                            monkeypatch):
    """A server whose machine has accounts answers a key made by `ragspec users key`, refuses
    a missing, wrong or revoked one with a 401 error object, and applies the user's answer
    length quota; /health stays open."""
    from ragspec.accounts.users import AccountStore, Quotas

    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path))
    accounts = AccountStore()
    accounts.add("olive", "a long enough password")
    accounts.add("max", "another long password", quotas=Quotas(answer_tokens=8))
    key, short = accounts.create_key("olive"), accounts.create_key("max")
    running = serve_support.start(tiny_model, tiny_tokenizer, auth_mode="accounts")
    try:
        def models(headers):
            return httpx.get(f"{running.base_url}/models", headers=headers, timeout=10)

        for headers in ({}, {"Authorization": "Bearer rsk_nothing_like_a_key"},
                        {"Authorization": f"Basic {key}"}):
            reply = models(headers)
            assert reply.status_code == 401, headers
            assert reply.json()["error"]["code"] == "invalid_api_key"
            assert key not in reply.text
        assert models({"Authorization": f"Bearer {key}"}).status_code == 200
        client = openai.OpenAI(base_url=running.base_url, api_key=key, max_retries=0, timeout=60)
        assert client.completions.create(model="tiny", prompt="abcabc", max_tokens=4).choices
        quota = httpx.post(f"{running.base_url}/completions", timeout=30,
                           headers={"Authorization": f"Bearer {short}"},
                           json={"model": "tiny", "prompt": "abcabc", "max_tokens": 9})
        assert quota.status_code == 400 and quota.json()["error"]["param"] == "max_tokens"
        accounts.revoke_keys("olive")
        assert models({"Authorization": f"Bearer {key}"}).status_code == 401
        assert httpx.get(f"{running.url}/health", timeout=10).status_code == 200
    finally:
        running.stop()


def _long_stream(base_url: str, opened: threading.Event, release: threading.Event):
    body = {"model": "tiny", "max_tokens": 900, "stream": True,
            "messages": [{"role": "user", "content": "go"}]}
    with httpx.stream("POST", f"{base_url}/chat/completions", json=body, timeout=60) as reply:
        for _ in reply.iter_lines():
            opened.set()
            if release.is_set():
                return


def test_a_client_that_disconnects_mid_stream_frees_its_slot(tiny_model, tiny_tokenizer):
    # never ends by itself: EOS is an id the model cannot write
    running = serve_support.start(tiny_model, tiny_tokenizer, eos=10**6)
    try:
        opened, release = threading.Event(), threading.Event()
        reader = threading.Thread(target=_long_stream, args=(running.base_url, opened, release))
        reader.start()
        assert opened.wait(30)
        scheduler = running.service.scheduler
        # the first line (a chat's role) is sent before the request is admitted
        deadline = time.monotonic() + 10
        while scheduler.load()["active"] != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert scheduler.load()["active"] == 1
        release.set()  # the reader leaves the stream and closes the connection
        reader.join(30)
        at = scheduler.steps
        deadline = time.monotonic() + 10
        while scheduler.load()["active"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert scheduler.load()["active"] == 0
        # freed at once, not after writing the rest of its 900 tokens (each step ~ms here: the
        # margin covers noticing the closed connection)
        assert scheduler.steps - at < 100
    finally:
        running.stop()


@pytest.mark.parametrize("where", ["running", "queued"])
def test_a_client_that_hangs_up_on_a_whole_answer_cancels_it_without_an_error(
        tiny_model, tiny_tokenizer, caplog, where):
    # Answers never end by themselves (EOS is an id the model cannot write) and each step takes
    # at least 0.1 s: 900 tokens last far longer than the second the client waits, on any
    # machine. "queued": another answer holds the only slot meanwhile.
    running = serve_support.start(tiny_model, tiny_tokenizer, eos=10**6, max_active=1)
    service, submitted = running.service, []
    submit = service.submit

    def slow_submit(job, listener=None):
        def slow_listener():
            time.sleep(0.1)
            listener()

        generation = submit(job, listener=slow_listener)
        submitted.append(generation)
        return generation

    service.submit = slow_submit
    body = {"model": "tiny", "max_tokens": 900,
            "messages": [{"role": "user", "content": "go"}]}
    opened, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_long_stream, args=(running.base_url, opened, release))
    others = 1 if where == "queued" else 0  # requests in flight beside the one hung up on
    try:
        if others:
            holder.start()
            assert opened.wait(30)
            deadline = time.monotonic() + 30
            while service.scheduler.load()["active"] != 1 and time.monotonic() < deadline:
                time.sleep(0.01)
        with caplog.at_level("ERROR"), pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{running.base_url}/chat/completions", json=body, timeout=1.0)
        deadline = time.monotonic() + 30
        while running.asgi.in_flight > others and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running.asgi.in_flight == others  # its handler has returned
        release.set()  # the holder leaves too
        assert submitted[-1].done.wait(120)
        # cancelled when its client left, not written to its end; before, a running answer's
        # steps woke the handler more often than its 0.5 s look for the client, so it never
        # looked, and a queued one, never admitted, had no stats to reply with (a 500 and a
        # traceback in the log)
        assert submitted[-1].error_kind == "cancelled"
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
    finally:
        release.set()
        if holder.is_alive():
            holder.join(30)
        running.stop()


def test_a_full_queue_answers_429_and_too_many_connections_503(tiny_model, tiny_tokenizer):
    running = serve_support.start(tiny_model, tiny_tokenizer, eos=10**6, max_active=1,
                                  max_waiting=0, max_in_flight=2)
    release = threading.Event()
    try:
        opened = threading.Event()
        reader = threading.Thread(target=_long_stream, args=(running.base_url, opened, release))
        reader.start()
        assert opened.wait(30)
        client = openai.OpenAI(base_url=running.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="tiny", max_tokens=5,
                                           messages=[{"role": "user", "content": "x"}])
        assert caught.value.response.headers["retry-after"] == "1"
        assert caught.value.body["code"] == "queue_full"
        second_opened = threading.Event()
        holder = threading.Thread(target=_hold_open, args=(running.url, second_opened, release))
        holder.start()
        assert second_opened.wait(10)
        reply = httpx.get(f"{running.base_url}/models", timeout=10)
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "too_many_connections"
    finally:
        release.set()
        running.stop()


def _hold_open(url: str, opened: threading.Event, release: threading.Event) -> None:
    """A request whose body never finishes arriving: it counts as in flight until released."""
    def slow_body():
        yield b'{"model": "tiny",'
        opened.set()
        release.wait(30)
        yield b'"messages": []}'

    try:
        httpx.post(f"{url}/v1/chat/completions", content=slow_body(), timeout=60)
    except httpx.HTTPError:
        pass


@pytest.mark.parametrize("content,extra,code", [
    ("word " * 2000, {}, "context_length_exceeded"),
    ("short", {"max_tokens": 10**7}, "context_length_exceeded"),
    ("short", {"stop": [""]}, None),
    ("short", {"stop": ["a", "b", "c", "d", "e"]}, None),
])
def test_bad_retrieval_requests_are_400_even_below_the_floor(server, content, extra, code):
    body = {"model": "ragspec", "max_tokens": 10, "ragspec": {"min_score": 0.99},
            "messages": [{"role": "user", "content": content}], **extra}
    reply = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == code


def test_a_client_that_hangs_up_before_its_body_arrived_gets_a_400_and_no_traceback(server):
    """What the soak's hang-ups met once: a POST whose client disconnects while the body is read
    (starlette's ClientDisconnect) was a 500 with a traceback in the log; it is a 400."""
    import asyncio

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2), "headers": [(b"content-type", b"application/json"),
                                                      (b"content-length", b"400")]}
    incoming = [{"type": "http.request", "body": b'{"model": "tiny", "mess', "more_body": True},
                {"type": "http.disconnect"}]
    sent = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(server.asgi(scope, receive, send))  # raised ClientDisconnect before the fix
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert start["status"] == 400, (start, body)
    assert json.loads(body)["error"]["code"] == "client_disconnected"
