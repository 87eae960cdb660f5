"""A file the server cannot write (a full disk, a read-only filesystem) while it answers a
request: an OpenAI error object with 507 (full, quota) or 500 (other refusals), code
"storage_error", the cause and what to do in the message, never the server's path or a
traceback; any other failure stays a plain 500 that points to the log."""

from __future__ import annotations

import errno
import os

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ragspec.fileio import WriteFailed
from ragspec.serve import errors

SECRET_PATH = "/srv/ragspec-home/chats/abc.json"


def _client(exc: Exception) -> TestClient:
    app = FastAPI()
    errors.install(app)

    @app.post("/v1/chat/completions")
    def fail():
        raise exc

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize(("code", "status", "says"), [
    (errno.ENOSPC, 507, "the disk is full"),
    (errno.EDQUOT, 507, "the disk quota is used up"),
    (errno.EROFS, 500, "the filesystem is read-only"),
    (errno.EIO, 500, "input/output error"),
])
def test_a_write_that_fails_is_a_json_error_naming_the_cause(code, status, says):
    failed = WriteFailed(SECRET_PATH, OSError(code, os.strerror(code)))
    reply = _client(failed).post("/v1/chat/completions", json={})
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["code"] == "storage_error" and error["type"] == "server_error"
    assert error["message"].startswith("the server could not write a file: ")
    assert says in error["message"] and SECRET_PATH not in error["message"]


def test_a_bare_disk_error_of_a_library_is_reported_the_same_way():
    reply = _client(OSError(errno.ENOSPC, "No space left on device", SECRET_PATH)).post(
        "/v1/chat/completions", json={})
    assert reply.status_code == 507 and SECRET_PATH not in reply.text


def test_other_failures_stay_an_internal_error():
    reply = _client(RuntimeError("boom")).post("/v1/chat/completions", json={})
    assert reply.status_code == 500
    assert reply.json()["error"]["message"].startswith("internal error (RuntimeError)")
