"""llama-server (mainline llama.cpp, built natively by `make bench-anchors`) as a benchmark anchor.

Methods, each a llama-server process of its own on the same GGUF file, started as its users
start it (`llama-server -m FILE -t THREADS -c CTX -np 1`, its defaults otherwise;
RAGSPEC_LLAMA_FA=on|off|auto sets its flash attention, `-fa`) on a loopback port:
    llama_server                 greedy;
    llama_server_ngram_simple    the same with `--spec-type ngram-simple` (its defaults), and
    llama_server_ngram_map_k / _ngram_mod / _ngram_cache   with the other draft-free n-gram modes.

Each generation posts the prompt's token ids (never text) to /completion: temperature 0 (its
greedy sampler), n_predict = the answer limit, `cache_prompt` off (every question pays its
whole prefill; the response's `timings.cache_n` = 0 and `prompt_n` = the prompt's length are
checked), streamed, with the token ids returned. The client's clock (time.perf_counter, the
bench's clock) times it from the request to each token's arrival: time to first token, and the
answer's end where the bench's stop rule (or an end-of-text token) ends it. The server may write
past that point; it finishes its stream untimed so that its own `timings` (prompt_ms +
predicted_ms, for everything it wrote) can be set against the client's clock over the same span
(`clock_ratio`: client seconds / server seconds, ~1 when both clocks agree).

`ragspec bench --sessions --llama-server` posts each chat turn's prompt ids twice more:
session after session on the one slot with `cache_prompt` on (its default: the slot keeps the
previous prompt and reuses the prefix the next one shares, and its memory cache of earlier
prompts too), then with it off.

Contract: `LlamaServers.open(...)` returns None when llama-server is not built; `generate` returns
ServerRun. Knows nothing of ragspec's engine. Standard library only.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SERVER_MODES = {  # method -> --spec-type (None: plain greedy)
    "llama_server": None,
    "llama_server_ngram_simple": "ngram-simple",
    "llama_server_ngram_map_k": "ngram-map-k",
    "llama_server_ngram_mod": "ngram-mod",
    "llama_server_ngram_cache": "ngram-cache",
}
SERVER_METHODS = tuple(SERVER_MODES)
NGRAM_METHODS = tuple(m for m, mode in SERVER_MODES.items() if mode)
START_TIMEOUT = 180.0
REQUEST_TIMEOUT = 600.0


class ServerError(RuntimeError):
    """llama-server did not start, or answered what a completion cannot be."""


@dataclass
class ServerRun:
    """One generation as the client saw it, and the server's own account of it."""

    token_ids: list[int]
    seconds: float          # request -> the token that ended the answer (client's clock)
    ttft_seconds: float     # request -> the first token
    stream_seconds: float   # request -> the end of the stream (everything the server wrote)
    server: dict = field(default_factory=dict)  # the response's `timings`, as it gave them
    written: int = 0        # tokens the server wrote (>= len(token_ids))

    @property
    def server_seconds(self) -> float | None:
        t = self.server
        if "prompt_ms" not in t or "predicted_ms" not in t:
            return None
        return (t["prompt_ms"] + t["predicted_ms"]) / 1000

    def summary(self) -> dict:
        """What results.json records of the server's side."""
        server_s = self.server_seconds
        return {"timings": self.server, "written_tokens": self.written,
                "stream_seconds": self.stream_seconds, "server_seconds": server_s,
                "clock_ratio": self.stream_seconds / server_s if server_s else None}


def completion_request(prompt_ids: Sequence[int], max_new_tokens: int,
                       cache_prompt: bool = False) -> dict:
    """The body posted to /completion for one greedy generation of the bench (cache_prompt: the
    slot reuses the prefix its previous prompt shares with this one, llama-server's default)."""
    return {"prompt": [int(t) for t in prompt_ids], "n_predict": int(max_new_tokens),
            "temperature": 0.0, "top_k": 1, "cache_prompt": bool(cache_prompt), "stream": True,
            "return_tokens": True, "n_probs": 0}


def parse_event(line: bytes) -> dict | None:
    """One server-sent event line ("data: {...}") as a dict; None for blank lines and others."""
    text = line.decode("utf-8", errors="replace").strip()
    if not text.startswith("data:"):
        return None
    payload = text[len("data:"):].strip()
    if not payload or payload == "[DONE]":
        return None
    event = json.loads(payload)
    if "error" in event:
        raise ServerError(f"llama-server: {event['error']}")
    return event


def stream_completion(host: str, port: int, body: dict, eos_ids: set[int],
                      stop: Callable[[int], bool] | None = None,
                      clock: Callable[[], float] = time.perf_counter) -> ServerRun:
    """POST `body` to /completion and read the stream to its end; the answer ends at the first
    end-of-text token or where `stop` (token -> bool) returns True, whichever comes first."""
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT)
    payload = json.dumps(body).encode()
    tokens: list[int] = []
    ended_at = ttft = None
    written = 0
    timings: dict = {}
    start = clock()
    try:
        conn.request("POST", "/completion", payload, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise ServerError(f"llama-server answered {response.status}: "
                              f"{response.read()[:300].decode(errors='replace')}")
        for line in response:
            event = parse_event(line)
            if event is None:
                continue
            now = clock()
            new = [int(t) for t in event.get("tokens") or ()]
            if new and ttft is None:
                ttft = now - start
            written += len(new)
            for token in new:
                if ended_at is not None:
                    break
                tokens.append(token)
                if token in eos_ids or (stop is not None and stop(token)) \
                        or len(tokens) >= body["n_predict"]:
                    ended_at = now - start
            if event.get("stop"):
                timings = dict(event.get("timings") or {})
                break
        stream = clock() - start
    finally:
        conn.close()
    if ttft is None:
        ttft = stream
    return ServerRun(tokens, ended_at if ended_at is not None else stream, ttft, stream, timings,
                     written)


def check_no_reuse(run: ServerRun, prompt_length: int) -> None:
    """The server read the whole prompt (no prefix taken from a cache)."""
    t = run.server
    if t.get("cache_n", 0) or ("prompt_n" in t and t["prompt_n"] != prompt_length):
        raise ServerError(f"llama-server reused a cached prefix (cache_n={t.get('cache_n')}, "
                          f"prompt_n={t.get('prompt_n')} of {prompt_length}): the timing would "
                          "skip part of the prefill")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FLASH_ENV = "RAGSPEC_LLAMA_FA"  # on|off|auto: llama-server's -fa (unset: its own default)


def server_argv(binary: str, gguf: Path, port: int, n_ctx: int, threads: int,
                mode: str | None) -> list[str]:
    argv = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), "-np", "1"]
    flash = os.environ.get(FLASH_ENV, "").strip().lower()
    if flash in ("on", "off", "auto"):
        argv += ["-fa", flash]
    return argv + (["--spec-type", mode] if mode else [])


class LlamaServers:
    """One llama-server per method over one GGUF file; `close()` (or `with`) stops them all."""

    def __init__(self, processes: dict, ports: dict, build: dict, logs: Path, threads: int):
        self._processes = processes
        self.ports = ports
        self.build = build
        self.logs = logs
        self.threads = threads
        self.methods = tuple(processes)

    @classmethod
    def open(cls, gguf: str | os.PathLike, n_ctx: int, methods: Sequence[str] = SERVER_METHODS,
             threads: int | None = None, manifest: dict | None = None) -> LlamaServers | None:
        from ragspec.bench.anchors import build as anchor_build

        manifest = manifest or anchor_build.load("llama.cpp")
        if manifest is None:
            return None
        binary = str(Path(manifest["bin"]) / "llama-server")
        threads = threads or len(os.sched_getaffinity(0))
        logs = Path(tempfile.mkdtemp(prefix="ragspec-llama-server-"))
        processes, ports, argv = {}, {}, {}
        try:
            for method in methods:
                port = free_port()
                log = open(logs / f"{method}.log", "wb")
                argv[method] = server_argv(binary, Path(gguf), port, n_ctx, threads,
                                           SERVER_MODES[method])
                processes[method] = subprocess.Popen(
                    argv[method], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                ports[method] = port
                log.close()
            for method in methods:
                _wait_healthy(processes[method], ports[method], logs / f"{method}.log")
        except BaseException:
            for proc in processes.values():
                proc.kill()
            shutil.rmtree(logs, ignore_errors=True)  # the error carries the log's last lines
            raise
        servers = cls(processes, ports, manifest, logs, threads)
        servers.argv = argv  # each method's command line, for the results
        return servers

    def generate(self, method: str, prompt_ids: Sequence[int], max_new_tokens: int,
                 eos_ids: set[int], stop=None, cache_prompt: bool = False) -> ServerRun:
        """One generation; cache_prompt=False (the bench's) checks that the whole prompt was
        read, True (chat sessions, as its users run it) lets the slot reuse a prefix
        (`timings.cache_n` says how much)."""
        run = stream_completion("127.0.0.1", self.ports[method],
                                completion_request(prompt_ids, max_new_tokens, cache_prompt),
                                eos_ids, stop)
        if not cache_prompt:
            check_no_reuse(run, len(prompt_ids))
        return run

    def close(self) -> None:
        for proc in self._processes.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self._processes.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self.logs, ignore_errors=True)

    def __enter__(self) -> LlamaServers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _wait_healthy(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT

    def tail() -> str:
        return " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:])

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"llama-server exited ({proc.returncode}): {tail()}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.2)
    proc.kill()
    raise ServerError(f"llama-server did not become ready on port {port} in "
                      f"{START_TIMEOUT:.0f} s; its log ended: {tail()}")
