"""Who may call the API: the one place where authentication plugs in.

`authenticate` is a FastAPI dependency of every /v1 route. Today the server has no accounts:
it lets every request through (bind it to loopback, the default, or put it behind something
that checks). A key check replaces this function's body: read `request.headers["authorization"]`
("Bearer KEY") and raise `APIError(401, ...)` when it is missing or wrong; the error reaches the
client as an OpenAI error object with status 401. The return value is the caller's identity
(None: anonymous), available to routes that need it.
"""

from __future__ import annotations

from fastapi import Request


async def authenticate(request: Request) -> str | None:
    """Today: everyone may call (see the module docstring); returns the caller's identity."""
    return None
