"""The HTTP routes of `ragspec serve` (FastAPI), in the OpenAI schema.

Contract:
  * GET /v1/models, GET /v1/models/{id}; POST /v1/chat/completions and /v1/completions,
    streamed (server-sent events ending with `data: [DONE]`; stream_options.include_usage adds
    the usage chunk) or not; POST /v1/embeddings (float or base64 vectors); GET /health (no
    authentication: for load balancers and scripts waiting for the server).
  * Every /v1 route depends on ragspec.serve.auth.authenticate. Every error is an OpenAI error
    object (ragspec.serve.errors); bodies and connections are bounded (ragspec.serve.limits).
  * The handler never calls the model: retrieval and prompt building run in a worker thread,
    generation in the scheduler's thread; the handler waits on an asyncio event the scheduler
    sets after each step, so a thousand idle streams cost no threads.
  * A client that disconnects — mid-stream, or while waiting for a whole answer — cancels its
    request, and the scheduler frees its slot before its next step.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from ragspec.decoding.scheduler import Request as Generation
from ragspec.serve import errors, responses
from ragspec.serve.answers import Job, Service
from ragspec.serve.auth import authenticate, check_answer_length
from ragspec.serve.errors import APIError
from ragspec.serve.limits import Limits
from ragspec.serve.requests import ChatRequest, CompletionRequest, EmbeddingRequest

MAX_BODY_BYTES = 1 << 20
MAX_IN_FLIGHT = 256
_DISCONNECT_POLL_S = 0.5  # how often a non-streamed answer checks that its client is still there
CLIENT_LEFT = 499  # the status logged for a request whose client went away (nginx's use)


def create_app(service: Service, *, max_body_bytes: int = MAX_BODY_BYTES,
               max_in_flight: int = MAX_IN_FLIGHT, auth_mode: str = "single-user"):
    """The ASGI application: the routes inside the size and in-flight limits. auth_mode: what
    the API checks (ragspec.serve.auth)."""
    app = FastAPI(title="ragspec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    app.state.auth_mode = auth_mode
    errors.install(app)
    auth = [Depends(authenticate)]

    @app.get("/health")
    async def health():
        return {"status": "ok", **service.scheduler.load()}

    @app.get("/v1/models", dependencies=auth)
    async def models():
        return {"object": "list", "data": service.models()}

    @app.get("/v1/models/{model_id:path}", dependencies=auth)
    async def model(model_id: str):
        for entry in service.models():
            if entry["id"] == model_id:
                return entry
        raise APIError(404, f"the model {model_id!r} does not exist here", param="model",
                       code="model_not_found")

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat(request: Request):
        body = await _parse(request, ChatRequest)
        job = await run_in_threadpool(service.prepare_chat, body)
        return await _answer(service, "chat", body, job, request)

    @app.post("/v1/completions", dependencies=auth)
    async def completions(request: Request):
        body = await _parse(request, CompletionRequest)
        job = await run_in_threadpool(service.prepare_completion, body)
        return await _answer(service, "text", body, job, request)

    @app.post("/v1/embeddings", dependencies=auth)
    async def embeddings(request: Request):
        body = await _parse(request, EmbeddingRequest)
        return await run_in_threadpool(_embed, service, body)

    return Limits(app, max_body_bytes=max_body_bytes, max_in_flight=max_in_flight)


async def _parse(request: Request, model: type[BaseModel]):
    """The body as `model`, or a 400 that says what is wrong (also to a client that hung up
    before its body arrived: nobody reads that answer, but nothing fails in the server)."""
    try:
        raw = await request.body()
    except ClientDisconnect as exc:
        raise APIError(400, "the client closed the connection before its request body "
                            "arrived", code="client_disconnected") from exc
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise APIError(400, "the request body is not valid JSON", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise APIError(400, f"{where}: {first.get('msg', 'invalid value')}{more}",
                       param=where or None) from exc


# -- answers --------------------------------------------------------------------------------------

async def _answer(service: Service, kind: str, body, job: Job, request: Request):
    rid, created = responses.new_id(kind), responses.now()
    if job.refusal is not None:
        text, generation = service.refusal_text(job), None
        if body.stream:
            return await _sse(_refusal_events(service, kind, rid, created, body, job, text))
        use = responses.usage(len(job.prompt_ids), 0)
        return responses.completion(kind, rid, created, job.model, text, "stop", use,
                                    service.extension(job, generation))
    check_answer_length(request, job.config.max_new_tokens)
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    generation = service.submit(job, listener=lambda: loop.call_soon_threadsafe(wake.set))
    if body.stream:
        return await _sse(_stream(service, kind, rid, created, body, job, generation, wake))
    try:
        left = await _wait(generation, wake, request)
    finally:
        if not generation.done.is_set():
            generation.cancel()
    if left:  # nobody reads a reply now, and the cancelled generation has no stats to report
        return Response(status_code=CLIENT_LEFT)
    _raise_failure(generation)
    use = responses.usage(len(job.prompt_ids), len(generation.token_ids))
    return responses.completion(kind, rid, created, job.model, generation.text,
                                responses.finish_reason(generation.stats.stop_reason), use,
                                service.extension(job, generation))


async def _wait(generation: Generation, wake: asyncio.Event, request: Request) -> bool:
    """Until the generation ends (False) or the client goes away meanwhile (True: the
    generation is cancelled). The client is looked for every _DISCONNECT_POLL_S seconds
    however often steps wake this up (looking only when no step came for that long missed
    every client that left a running answer)."""
    loop = asyncio.get_running_loop()
    look_at = loop.time() + _DISCONNECT_POLL_S
    while True:
        wake.clear()
        _, ended = generation.drain()
        if ended:
            return False
        with contextlib.suppress(asyncio.TimeoutError):  # TimeoutError's alias from 3.11 on
            await asyncio.wait_for(wake.wait(), max(0.0, look_at - loop.time()))
        if loop.time() >= look_at:
            look_at = loop.time() + _DISCONNECT_POLL_S
            if await request.is_disconnected():
                generation.cancel()
                return True


_STATUS = {"invalid": 400, "unavailable": 503}


def _raise_failure(generation: Generation) -> None:
    if generation.error is not None:
        raise APIError(_STATUS.get(generation.error_kind, 500), generation.error)


async def _stream(service: Service, kind: str, rid: str, created: int, body, job: Job,
                  generation: Generation, wake: asyncio.Event) -> AsyncIterator[bytes]:
    usage_on = body.include_usage

    def piece(**kw) -> bytes:
        return responses.sse(responses.chunk(kind, rid, created, job.model, with_usage=usage_on,
                                             **kw))

    try:
        if kind == "chat":
            yield piece(role=True, text="")
        while True:
            wake.clear()
            spans, ended = generation.drain()
            text = "".join(s.text for s in spans)
            if text:
                yield piece(text=text)
            if ended:
                break
            await wake.wait()
        if generation.error is not None:
            yield responses.sse(errors.error_body(_STATUS.get(generation.error_kind, 500),
                                                  generation.error))
            return
        yield piece(finish=responses.finish_reason(generation.stats.stop_reason),
                    extension=service.extension(job, generation))
        if usage_on:
            use = responses.usage(len(job.prompt_ids), len(generation.token_ids))
            yield responses.sse(responses.usage_chunk(kind, rid, created, job.model, use))
        yield responses.DONE
    finally:  # the client went away (the response task is cancelled) or the stream ended
        if not generation.done.is_set():
            generation.cancel()


async def _refusal_events(service: Service, kind: str, rid: str, created: int, body, job: Job,
                          text: str) -> AsyncIterator[bytes]:
    usage_on = body.include_usage

    def piece(**kw) -> bytes:
        return responses.sse(responses.chunk(kind, rid, created, job.model, with_usage=usage_on,
                                             **kw))

    if kind == "chat":
        yield piece(role=True, text="")
    yield piece(text=text)
    yield piece(finish="stop", extension=service.extension(job, None))
    if usage_on:
        yield responses.sse(responses.usage_chunk(kind, rid, created, job.model,
                                                  responses.usage(0, 0)))
    yield responses.DONE


async def _sse(events) -> StreamingResponse:
    """The event stream as a response. Its first event is produced here, so the generator has
    entered its `try` before the response starts: a client gone before the first byte still
    closes it (and so cancels the generation) when the response is dropped."""
    first = await events.__anext__()

    async def chained():
        yield first
        async for event in events:
            yield event

    return StreamingResponse(chained(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# -- embeddings -----------------------------------------------------------------------------------

def _embed(service: Service, body: EmbeddingRequest) -> JSONResponse:
    if service.embedder is None or body.model != service.embedding_id:
        raise APIError(404, f"the embedding model {body.model!r} does not exist here"
                            + (f"; use {service.embedding_id}" if service.embedding_id else ""),
                       param="model", code="model_not_found")
    texts = body.texts()
    embedder = service.embedder
    if body.dimensions is not None and body.dimensions != embedder.dim:
        raise APIError(400, f"dimensions: this model's vectors have {embedder.dim}",
                       param="dimensions")
    with service._prepare_lock:
        vectors = np.asarray(embedder.embed_array(texts), dtype=np.float32)
        tokens = sum(embedder.count_tokens(t) for t in texts)
    data = []
    for i, vector in enumerate(vectors):
        value = (base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                 if body.encoding_format == "base64" else vector.tolist())
        data.append({"object": "embedding", "index": i, "embedding": value})
    return JSONResponse({"object": "list", "data": data, "model": body.model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
