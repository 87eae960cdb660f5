"""Who may call the API: API keys when the server has accounts.

`authenticate` is a FastAPI dependency of every /v1 route and returns the caller as a
`ragspec.accounts.policy.Principal`. The server's mode (`app.state.auth_mode`, decided at start
by ragspec.accounts.binding.auth_mode, the same rule as the chat's) says what it checks:
  * "accounts" — a key made with `ragspec users key NAME`, sent as `Authorization: Bearer
    KEY`; a missing, unknown or revoked key is a 401 OpenAI error object. The key is never
    logged; only its SHA-256 is stored.
  * "single-user" (loopback, no accounts) and "open" (--no-auth) — everyone may call.
`check_answer_length` applies the caller's answer-length quota to a prepared request.
"""

from __future__ import annotations

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from ragspec.accounts.api_keys import authenticate_api_key
from ragspec.accounts.policy import Principal, QuotaExceeded, check_answer_tokens
from ragspec.serve.errors import APIError


async def authenticate(request: Request) -> Principal:
    """The caller (see the module docstring); raises APIError(401) for a missing or bad key."""
    if getattr(request.app.state, "auth_mode", "single-user") != "accounts":
        principal = Principal.single_user()
    else:
        user = await run_in_threadpool(authenticate_api_key,
                                       request.headers.get("authorization"))
        if user is None:
            raise APIError(401, "this server needs an API key: send `Authorization: Bearer KEY` "
                                "(the owner makes one with `ragspec users key NAME`)",
                           code="invalid_api_key")
        principal = Principal.of(user)
    request.state.principal = principal
    return principal


def check_answer_length(request: Request, max_new_tokens: int) -> None:
    """The caller's answer-length quota (accounts mode), as a 400 naming max_tokens."""
    principal = getattr(request.state, "principal", None) or Principal.single_user()
    try:
        check_answer_tokens(principal, max_new_tokens)
    except QuotaExceeded as exc:
        raise APIError(400, str(exc), param="max_tokens", code="quota_exceeded") from exc
