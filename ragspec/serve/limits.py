"""Bounds on what one client can make the server hold: request body size and requests in flight.

Contract: `Limits` is an ASGI middleware around the app.
  * A request body over `max_body_bytes` gets a 413 OpenAI error: refused from its
    Content-Length before anything is read, or as soon as a chunked body passes the limit
    (so a huge upload is never buffered whole).
  * More than `max_in_flight` HTTP requests at once (streams count until they end) get a 503
    with Retry-After: the scheduler's own queue (429 when full) stays the normal back-pressure,
    this only stops a flood of connections from holding memory and threads.
"""

from __future__ import annotations

import json

from ragspec.serve.errors import APIError, error_body


class BodyTooLarge(APIError):
    """Raised while the body is read: the app's APIError handler answers 413."""

    def __init__(self, limit: int):
        super().__init__(413, f"the request body is over the limit of {limit} bytes",
                         code="request_too_large")


async def _send_error(send, status: int, message: str, headers: dict | None = None,
                      code: str | None = None) -> None:
    body = json.dumps(error_body(status, message, code=code)).encode()
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


class Limits:
    def __init__(self, app, *, max_body_bytes: int, max_in_flight: int):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_in_flight = max_in_flight
        self.in_flight = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = BodyTooLarge(self.max_body_bytes).message
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return await _send_error(send, 413, too_big, code="request_too_large")
        if self.in_flight >= self.max_in_flight:
            return await _send_error(send, 503, f"the server has {self.in_flight} requests in "
                                                f"flight, its limit; try again shortly",
                                     {"Retry-After": "1"}, code="too_many_connections")
        self.in_flight += 1
        received = 0
        started = False

        async def counted_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await _send_error(send, 413, too_big, code="request_too_large")
        finally:
            self.in_flight -= 1
