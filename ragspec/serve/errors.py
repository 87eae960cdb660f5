"""Errors as the OpenAI API writes them: `{"error": {"message", "type", "param", "code"}}` with
the HTTP status that goes with them. Nothing else ever reaches a client: no traceback, no HTML,
no server path.

Statuses: 400 invalid request (bad JSON, wrong types, a prompt too long for the context), 401 not
authenticated, 404 unknown model or route, 405 wrong method, 413 request too large, 429 the queue is
full (try again), 500 an internal failure (the server's log has the details), 503 the server is
busy with too many connections or shutting down, 507 a file the server must write does not fit
on its disk (500 for another refusal of the filesystem: read-only, I/O error), with the cause
and what to do, code "storage_error".
"""

from __future__ import annotations

import errno
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ragspec.fileio import explain, is_disk_error

logger = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 405: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
          503: "server_error", 507: "server_error"}


class APIError(Exception):
    """An error to send as an OpenAI error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def disk_error(exc: OSError) -> tuple[int, str]:
    """(status, message) for a file the server could not write: 507 when the disk is full or the
    quota used up, 500 for any other refusal of the filesystem; the cause and what to do,
    never the path (ragspec.fileio.explain)."""
    status = 507 if exc.errno in (errno.ENOSPC, errno.EDQUOT) else 500
    return status, f"the server could not write a file: {explain(exc)}"


def error_body(status: int, message: str, *, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One line from pydantic's list of errors: where and what."""
    errors = exc.errors()
    if not errors:
        return "invalid request body", None
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    message = str(first.get("msg", "invalid value"))
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return (f"{where}: {message}{more}" if where else f"{message}{more}"), where or None


def install(app: FastAPI) -> None:
    """Make every error an OpenAI error object."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return JSONResponse(error_body(400, message, param=param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        status = exc.status_code
        message = {404: f"unknown route {request.method} {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(
            status, str(exc.detail))
        return JSONResponse(error_body(status, message), status_code=status,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        logger.exception("internal error on %s %s", request.method, request.url.path)
        if is_disk_error(exc):
            status, message = disk_error(exc)
            return JSONResponse(error_body(status, message, code="storage_error"),
                                status_code=status)
        return JSONResponse(error_body(500, f"internal error ({exc.__class__.__name__}); the "
                                            f"server's log has the details"), status_code=500)
