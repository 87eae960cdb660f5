"""Real OpenAI-compatible servers on loopback for the generator-backend tests: each starts as
its own process on a free port, is waited for (GET /v1/models), and is stopped after the
tests. A server that is not installed is skipped with the reason and how to install it."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

START_SECONDS = 240  # loading a model on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


@contextmanager
def serving(argv: list[str], port: int, log: Path, env: dict | None = None):
    """Run `argv` until it answers GET /v1/models on `port`; yield the /v1 URL; stop it."""
    url = f"http://127.0.0.1:{port}/v1"
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE",
                                        **(env or {})})
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            if process.poll() is not None:
                raise AssertionError(f"{argv[:3]} exited ({process.returncode}): "
                                     f"{log.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=5) as reply:
                    json.load(reply)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{argv[:3]} did not answer in {START_SECONDS} s") \
                        from None
                time.sleep(1)
        yield url
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    """Terminate, and kill what does not end within 30 s."""
    process.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)
        return
    process.kill()
    process.wait()


def transformers_serve(model_dir: Path, log: Path):
    """Hugging Face's `transformers serve` (third party; reports no drafts)."""
    missing = _missing("fastapi", "uvicorn", "openai")
    if missing:
        pytest.skip(f"transformers serve needs {', '.join(missing)}: pip install -r "
                    "requirements.txt")
    port = free_port()
    cli = Path(sys.executable).parent / "transformers"
    return serving([str(cli), "serve", str(model_dir), "--host", "127.0.0.1", "--port",
                    str(port)], port, log, {"HF_HUB_OFFLINE": "1"})


def llama_cpp_server(gguf: Path, log: Path):
    """llama-cpp-python's OpenAI-compatible server (third party; reports no drafts)."""
    missing = _missing("llama_cpp", "sse_starlette", "starlette_context", "fastapi", "uvicorn")
    if missing:
        pytest.skip("llama-cpp-python's server is not installed (missing "
                    f"{', '.join(missing)}): `make bench-anchors`, then pip install "
                    "'llama-cpp-python[server]==0.3.36'")
    port = free_port()
    return serving([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
                    "--host", "127.0.0.1", "--port", str(port), "--n_threads", "2",
                    "--n_ctx", "2048"], port, log)


def ragspec_serve(index: Path, log: Path, env: dict):
    """`ragspec serve` (reports its accepted drafts in the `ragspec` extension)."""
    if importlib.util.find_spec("ragspec.serve") is None:
        pytest.skip("`ragspec serve` is not part of this checkout yet")
    port = free_port()
    return serving([str(Path(sys.executable).parent / "ragspec"), "serve", "--host", "127.0.0.1",
                    "--port", str(port), "--index", str(index)], port, log, env)
