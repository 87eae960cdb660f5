"""Load and fault test of `ragspec serve` on loopback, with real `openai` clients.

Usage:
  PYTHONPATH=. .venv/bin/python -m ragspec.bench.load_test --corpus /work/corpora/dev \\
      --questions data/realdocs/dev/questions.jsonl [--clients 1,2,4,8,16] [--limit 16] \\
      [--max-tokens 128] [--prefill-chunk N] [--prompt-cache-mb MB] [--faults]
      [--malformed 1000] [--anchor 4] [--out results.json]
  ... --sessions [--clients 1,8] [--limit SESSIONS]

What it does (everything on 127.0.0.1, every loop bounded in count and time, --max-seconds
for the whole run):
  1. ingests the corpus into a temporary index (or uses --index) and starts `ragspec serve` on
     a free loopback port (the model cache of $RAGSPEC_HOME is reused);
  2. solo (after one uncounted answer that warms the server up): each question alone,
     streamed — the reference answers, and the N = 1 numbers;
  3. for each N in --clients: N client threads take the questions from one queue, streamed
     with usage (client i starts i x --stagger seconds after the first: by default arrivals
     spread over one solo answer, as clients in a steady state; --stagger 0 is a burst); aggregate tokens/s (all completion tokens over the level's wall time),
     per-request tokens/s (completion tokens over its end-to-end latency), p50/p95 time to
     first token and latency, p50/p95 of each answer's longest pause between two streamed
     pieces (how long a reader watched a running answer stand still), and whether every
     answer was complete (a finish_reason and
     [DONE]) and identical to its solo run;
  4. --anchor K: the first K questions through `ragspec ask --json` (the same pipeline in its
     own process) against the solo API runs: identical text, and tokens/s of each;
  5. --faults: a client that disconnects mid-stream (the slot must be free within a second and
     the next answer unchanged); the server killed (-9) mid-answer and started again (the index
     files and $RAGSPEC_HOME/chats byte for byte as before, the answer unchanged); --malformed
     malformed requests (ragspec/serve/malformed.py), each of which must get a 4xx JSON error, and the
     server still answering correctly after them.
With --sessions the questions are asked as chat sessions instead (ragspec.bench.sessions
.group_sessions: one session per document, its questions in file order; --limit counts
sessions, default all): a client takes a whole session and asks its turns in order, each with
the turns before it as the messages' history (user question, assistant answer), as a chat
client does. The server keeps its default prompt cache (unless --prompt-cache-mb says
otherwise), and every level runs on a freshly started server, warmed up by one uncounted
question that is none of the sessions', so that a level reuses only the prompts it read itself
(the instruction, a follow-up's passages, another client's). Each level reports the prompt
tokens the cache supplied; an answer is identical when it equals the solo level's answer to the
same turn of the same session. --faults and --anchor are for the question mode.
The report is one JSON object (--out) and a table on stderr. Exit status 0 when every check
passed, 1 when one failed (the report says which).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai

from ragspec.bench import provenance
from ragspec.search import NOT_IN_DOCUMENTS
from ragspec.serve.malformed import malformed_requests

HOST = "127.0.0.1"  # loopback only: this script never sends traffic anywhere else
RAGSPEC = str(Path(sys.executable).with_name("ragspec"))


def load_questions(path: Path, limit: int) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["question"] for r in rows if r.get("kind") != "unanswerable"][:limit]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- the server -------------------------------------------------------------------------------

def wait_healthy(url: str, process: subprocess.Popen, timeout: float, where: str = "") -> None:
    """Until GET /health answers 200; RuntimeError when the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ragspec serve exited with status {process.returncode} {where}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"ragspec serve did not come up in {timeout:.0f} s {where}")


class Server:
    def __init__(self, index: Path, port: int, args, log: Path, env: dict | None = None):
        self.index, self.port, self.args, self.log = index, port, args, log
        self.env = env  # the server's environment (None: this process's)
        self.url = f"http://{HOST}:{port}"
        self.process: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        """The `ragspec serve` command line."""
        argv = [RAGSPEC, "serve", "--host", HOST, "--port", str(self.port), "--index",
                str(self.index), "--max-active", str(self.args.max_active),
                "--max-tokens", str(self.args.max_tokens)]
        if self.args.model:
            argv += ["--model", self.args.model]
        if self.args.prefill_chunk:
            argv += ["--prefill-chunk", str(self.args.prefill_chunk)]
        cache_mb = getattr(self.args, "prompt_cache_mb", None)
        if cache_mb is None and not getattr(self.args, "sessions", False):
            cache_mb = 0  # the question mode: see --prompt-cache-mb
        if cache_mb is not None:
            argv += ["--prompt-cache-mb", str(cache_mb)]
        return argv

    def start(self, timeout: float | None = None) -> None:
        timeout = timeout or self.args.start_timeout
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env)
        wait_healthy(self.url, self.process, timeout, f"see {self.log}")

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


# -- one streamed request ---------------------------------------------------------------------

def ask_streamed(client: openai.OpenAI, question: str, max_tokens: int,
                 history: list[dict] | None = None) -> dict:
    """One streamed chat answer; `history`: the messages before the question (a session's
    earlier turns)."""
    start = time.perf_counter()
    first = last = None
    pause = 0.0  # the longest wait between two pieces of text, once the first came
    parts, finish, usage, done = [], None, None, False
    stream = client.chat.completions.create(
        model="ragspec", stream=True, max_tokens=max_tokens, stream_options={"include_usage": True},
        messages=[*(history or []), {"role": "user", "content": question}])
    for chunk in stream:
        if chunk.choices:
            text = chunk.choices[0].delta.content
            if text:
                now = time.perf_counter()
                first = first or now
                pause = max(pause, now - last) if last is not None else pause
                last = now
                parts.append(text)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
            done = True  # the usage chunk comes last, right before [DONE]
    end = time.perf_counter()
    tokens = usage.completion_tokens if usage else 0
    latency = end - start
    return {"question": question, "text": "".join(parts), "finish_reason": finish,
            "complete": bool(finish) and done, "completion_tokens": tokens,
            "ttft_s": (first or end) - start, "latency_s": latency, "longest_pause_s": pause,
            "tokens_per_s": tokens / latency if latency > 0 else 0.0}


def client_for(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                         timeout=900)


def run_clients(server: Server, clients: int, stagger: float, deadline: float, items,
                handle) -> float:
    """`clients` client threads, client i starting i * stagger seconds after the first, taking
    the items from one queue until none is left or the deadline passes and calling
    handle(client, item) for each; the wall seconds."""
    work: queue.Queue = queue.Queue()
    for item in items:
        work.put(item)

    def worker(i: int):
        client = client_for(server)
        time.sleep(i * stagger)
        while time.monotonic() < deadline:
            try:
                item = work.get_nowait()
            except queue.Empty:
                return
            handle(client, item)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def run_level(server: Server, questions: list[str], clients: int, max_tokens: int,
              deadline: float, stagger: float = 0.0) -> tuple[list[dict], float]:
    """All questions through `clients` concurrent streaming clients; (results, wall seconds).
    Client i sends its first request i * stagger seconds after the first client (0: all at
    once, a burst)."""
    results: list[dict | None] = [None] * len(questions)

    def ask(client, item):
        i, q = item
        try:
            results[i] = ask_streamed(client, q, max_tokens)
        except (openai.APIError, httpx.HTTPError) as exc:
            results[i] = {"question": q, "error": f"{exc.__class__.__name__}: {exc}",
                          "complete": False}

    wall = run_clients(server, clients, stagger, deadline, enumerate(questions), ask)
    return [r or {"question": q, "error": "not run (time limit)", "complete": False}
            for r, q in zip(results, questions, strict=True)], wall


def load_sessions(path: Path) -> list[list[str]]:
    """The questions of each session (ragspec.bench.sessions.group_sessions), in its order."""
    from ragspec.bench.questions import load_questions as load_question_set
    from ragspec.bench.sessions import group_sessions

    return [[q.question for q in session.questions]
            for session in group_sessions(load_question_set(path))]


def run_sessions_level(server: Server, sessions: list[list[str]], clients: int, max_tokens: int,
                       deadline: float, stagger: float = 0.0) -> tuple[list[dict], float]:
    """Every session through `clients` concurrent streaming clients, a client taking a whole
    session and asking its turns in order with the earlier turns as history; (results in
    session and turn order, each with its "key" "session/turn", wall seconds)."""
    results: dict[str, dict] = {}

    def ask_session(client, s):
        history: list[dict] = []
        for t, q in enumerate(sessions[s]):
            key = f"{s}/{t}"
            if time.monotonic() > deadline:
                return
            try:
                answer = ask_streamed(client, q, max_tokens, history)
            except (openai.APIError, httpx.HTTPError) as exc:
                results[key] = {"question": q, "key": key, "complete": False,
                                "error": f"{exc.__class__.__name__}: {exc}"}
                return  # the later turns would have no answer to follow
            results[key] = {**answer, "key": key}
            history += [{"role": "user", "content": q},
                        {"role": "assistant", "content": answer["text"]}]

    wall = run_clients(server, clients, stagger, deadline, range(len(sessions)), ask_session)
    return [results.get(f"{s}/{t}") or {"question": q, "key": f"{s}/{t}", "complete": False,
                                        "error": "not run (time limit or an earlier turn failed)"}
            for s, qs in enumerate(sessions) for t, q in enumerate(qs)], wall


def cache_delta(before: dict | None, after: dict | None) -> dict | None:
    """The prompt cache's counters over one level (prompt tokens looked up, those it supplied,
    their share), or why it was off."""
    if not before or not after or "lookups" not in after:
        return {"off": after.get("off")} if after else None
    d = {k: after[k] - before.get(k, 0) for k in ("lookups", "hits", "prompt_tokens",
                                                   "cached_tokens", "recalled", "evicted_pages")}
    d["cached_share"] = round(d["cached_tokens"] / d["prompt_tokens"], 4) if d["prompt_tokens"] else None
    d["bytes"], d["budget_bytes"] = after["bytes"], after["budget_bytes"]
    return d


def summarize(results: list[dict], wall: float, solo: dict[str, str] | None) -> dict:
    ok = [r for r in results if "error" not in r]
    tokens = sum(r["completion_tokens"] for r in ok)
    out = {
        "requests": len(results), "failed": len(results) - len(ok),
        "aggregate_tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "per_request_tokens_per_s_median": statistics.median(
            [r["tokens_per_s"] for r in ok]) if ok else None,
        "ttft_p50_s": percentile([r["ttft_s"] for r in ok], 0.5),
        "ttft_p95_s": percentile([r["ttft_s"] for r in ok], 0.95),
        "latency_p50_s": percentile([r["latency_s"] for r in ok], 0.5),
        "latency_p95_s": percentile([r["latency_s"] for r in ok], 0.95),
        # each answer's longest wait between two streamed pieces, over the answers
        "longest_pause_p50_s": percentile([r["longest_pause_s"] for r in ok], 0.5),
        "longest_pause_p95_s": percentile([r["longest_pause_s"] for r in ok], 0.95),
        "wall_s": wall, "completion_tokens": tokens,
        # answered below the relevance floor: the model never ran
        "refused": sum(r["text"].startswith(NOT_IN_DOCUMENTS) for r in ok),
        "all_complete": all(r.get("complete") for r in results),
    }
    if solo is not None:
        differ = [r.get("key", r["question"]) for r in ok
                  if r["text"] != solo.get(r.get("key", r["question"]))]
        out["identical_to_solo"] = not differ and len(ok) == len(results)
        out["differing"] = differ
    return out


# -- faults -----------------------------------------------------------------------------------

def disconnect_case(server: Server, question: str, max_tokens: int, solo: str) -> dict:
    body = {"model": "ragspec", "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": question}]}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body,
                      timeout=300) as reply:
        for n, _ in enumerate(reply.iter_lines()):
            if n >= 3:
                break  # leaving the block closes the connection mid-stream
    left = time.perf_counter()
    freed = None
    while time.perf_counter() - left < 10:
        if server.health()["active"] == 0:
            freed = time.perf_counter() - left
            break
        time.sleep(0.02)
    after = ask_streamed(client_for(server), question, max_tokens)
    return {"slot_freed_s": freed, "ok": freed is not None and freed < 1.0
            and after["text"] == solo, "answer_unchanged": after["text"] == solo}


def stream_in_background(client: openai.OpenAI, question: str, max_tokens: int
                         ) -> tuple[threading.Thread, threading.Event]:
    """A streamed answer read by a thread; the event is set at its first text. A connection the
    server drops (it was killed) ends the thread quietly."""
    streaming = threading.Event()

    def reader():
        try:
            for chunk in client.chat.completions.create(
                    model="ragspec", stream=True, max_tokens=max_tokens,
                    messages=[{"role": "user", "content": question}]):
                if chunk.choices and chunk.choices[0].delta.content:
                    streaming.set()
        except (openai.APIError, httpx.HTTPError):
            pass

    thread = threading.Thread(target=reader)
    thread.start()
    return thread, streaming


def tree_digest(folder: Path) -> dict[str, str]:
    if not folder.is_dir():
        return {}
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


def step_times(server: Server) -> dict | None:
    """The scheduler's step timings from /health (None from a server that reports none)."""
    return server.health().get("steps")


def step_delta(before: dict | None, after: dict | None) -> dict | None:
    """Where one level's steps spent their time: the difference of two step_times, with the
    shares of the scheduler's busy time spent reading prompts alone and in shared steps (prompt
    pieces beside decoding rows, ragspec.decoding.batch), and the mean sequences per decode
    step."""
    if before is None or after is None:
        return None
    d = {k: round(after[k] - before[k], 4) for k in after}
    busy = d["prefill_seconds"] + d["decode_seconds"] + d.get("shared_seconds", 0.0)
    d["prefill_share"] = round(d["prefill_seconds"] / busy, 3) if busy else None
    d["shared_share"] = round(d.get("shared_seconds", 0.0) / busy, 3) if busy else None
    d["sequences_per_decode_step"] = (round(d["decode_sequences"] / d["decode_steps"], 2)
                                      if d["decode_steps"] else None)
    return d


def kill_case(server: Server, question: str, max_tokens: int, solo: str, chats: Path) -> dict:
    before = (tree_digest(server.index), tree_digest(chats))
    thread, streaming = stream_in_background(client_for(server), question, max_tokens)
    killed_mid_answer = streaming.wait(300)
    server.kill()
    thread.join(60)
    after_kill = (tree_digest(server.index), tree_digest(chats))
    server.start()
    again = ask_streamed(client_for(server), question, max_tokens)
    return {"killed_mid_answer": killed_mid_answer, "index_intact": before[0] == after_kill[0],
            "chats_intact": before[1] == after_kill[1], "answer_unchanged": again["text"] == solo,
            "ok": killed_mid_answer and before == after_kill and again["text"] == solo}


def malformed_case(server: Server, count: int, question: str, max_tokens: int, solo: str,
                   deadline: float) -> dict:
    bad: list[dict] = []
    kinds: dict[str, int] = {}
    sent = 0
    with httpx.Client(timeout=120) as http:
        for path, body, headers, kind in malformed_requests(count, seed=7):
            if time.monotonic() > deadline:
                break
            sent += 1
            kinds[kind] = kinds.get(kind, 0) + 1
            try:
                reply = http.post(server.url + path, content=body, headers=headers)
                error = reply.json().get("error") if reply.headers.get(
                    "content-type", "").startswith("application/json") else None
                if not (400 <= reply.status_code < 500 and error and error.get("message")):
                    bad.append({"kind": kind, "status": reply.status_code,
                                "body": reply.text[:200]})
            except httpx.HTTPError as exc:
                bad.append({"kind": kind, "error": f"{exc.__class__.__name__}: {exc}"})
    after = ask_streamed(client_for(server), question, max_tokens)
    return {"sent": sent, "kinds": kinds, "not_4xx_json": bad[:20], "bad_count": len(bad),
            "answer_unchanged": after["text"] == solo,
            "ok": sent == count and not bad and after["text"] == solo}


def anchor_case(index: Path, questions: list[str], solo: dict[str, dict], max_tokens: int,
                model: str | None) -> list[dict]:
    out = []
    for q in questions:
        argv = [RAGSPEC, "ask", q, "--json", "--index", str(index), "--max-new-tokens",
                str(max_tokens)] + (["--model", model] if model else [])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            out.append({"question": q, "error": done.stderr.strip()[-300:]})
            continue
        answer = json.loads(done.stdout)["answer"]
        api = solo[q]
        if answer is None:  # below the relevance floor: both must refuse
            out.append({"question": q, "refused": True,
                        "identical": api["text"].startswith(NOT_IN_DOCUMENTS)})
            continue
        out.append({"question": q, "identical": answer["text"] == api["text"],
                    "ask_tokens_per_s": answer["stats"]["tokens_per_s"],
                    "api_tokens_per_s": api["tokens_per_s"],
                    "api_over_ask": api["tokens_per_s"] / answer["stats"]["tokens_per_s"]
                    if answer["stats"]["tokens_per_s"] else None})
    return out


# -- main -------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, help="documents to ingest into a temporary index")
    parser.add_argument("--index", type=Path, help="an index already built (instead of --corpus)")
    parser.add_argument("--questions", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=None,
                        help="questions used (default 16); with --sessions, sessions (default all)")
    parser.add_argument("--sessions", action="store_true",
                        help="ask the questions as chat sessions, one per document, with history "
                             "and the server's prompt cache on (module docstring)")
    parser.add_argument("--clients", default="1,2,4,8,16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-active", type=int, default=16)
    parser.add_argument("--prefill-chunk", type=int, default=None,
                        help="the server's --prefill-chunk (default: the server's own)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompt-cache-mb", type=int, default=None, metavar="MB",
                        help="the server's prompt cache (default 0: off, as `bench` and `eval` "
                             "time; on, every level after the solo one would reuse the solo "
                             "level's prompts of the same questions); with --sessions the "
                             "server's own default (each level on a fresh server)")
    parser.add_argument("--faults", action="store_true")
    parser.add_argument("--malformed", type=int, default=1000)
    parser.add_argument("--anchor", type=int, default=0,
                        help="compare the first K questions with `ragspec ask` (default 0)")
    parser.add_argument("--stagger", type=float, default=None,
                        help="seconds between the clients' first requests (default: the median "
                             "solo latency / N, arrivals spread over one answer; 0: a burst)")
    parser.add_argument("--max-seconds", type=float, default=3600)
    parser.add_argument("--start-timeout", type=float, default=600,
                        help="seconds the server may take to come up (a first start builds the "
                             "kernels and measures the forward cost; default 600)")
    parser.add_argument("--out", type=Path)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.corpus is None) == (args.index is None):
        parser.error("give --corpus or --index")
    levels = sorted({int(n) for n in args.clients.split(",")})
    if not levels or min(levels) < 1 or max(levels) > 64:
        parser.error("--clients: numbers from 1 to 64")
    if args.sessions and (args.faults or args.anchor):
        parser.error("--faults and --anchor run in the question mode, not with --sessions")
    deadline = time.monotonic() + args.max_seconds
    questions = [] if args.sessions else load_questions(args.questions, args.limit or 16)
    work = Path(tempfile.mkdtemp(prefix="ragspec-load-"))
    index = args.index
    if index is None:
        index = work / "index"
        subprocess.run([RAGSPEC, "ingest", str(args.corpus), "--index", str(index)], check=True,
                       stdout=subprocess.DEVNULL, timeout=1800)
    report: dict = {"questions": len(questions), "max_tokens": args.max_tokens,
                    "set": str(args.questions), "index": str(index),
                    "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()},
                    "environment": provenance.settings(dict(os.environ))}  # the servers' own
    if args.sessions:
        session_levels(args, sorted(set(levels) | {1}), index, work, report, deadline)
        return finish(args, report, work)
    server = Server(index, free_port(), args, work / "server.log")
    try:
        server.start()
        # One answer first, not counted: the first forwards of a fresh process pay one-off costs
        # (page faults on the mapped weights, allocator growth) that no later request pays.
        run_level(server, questions[:1], 1, args.max_tokens, deadline)
        before = step_times(server)
        solo_results, _ = run_level(server, questions, 1, args.max_tokens, deadline)
        solo_steps = step_delta(before, step_times(server))
        solo = {r["question"]: r for r in solo_results if "error" not in r}
        texts = {q: r["text"] for q, r in solo.items()}
        report["levels"] = {"1": {**summarize(solo_results, sum(
            r.get("latency_s", 0) for r in solo_results), None), "steps": solo_steps}}
        for n in levels:
            if n == 1 or time.monotonic() > deadline:
                continue
            stagger = (args.stagger if args.stagger is not None else statistics.median(
                [r["latency_s"] for r in solo.values()]) / n if solo else 0.0)
            before = step_times(server)
            results, wall = run_level(server, questions, n, args.max_tokens, deadline, stagger)
            report["levels"][str(n)] = {**summarize(results, wall, texts), "stagger_s": stagger,
                                        "steps": step_delta(before, step_times(server))}
        q0 = questions[0]
        if args.faults and q0 in texts:
            report["disconnect"] = disconnect_case(server, q0, args.max_tokens, texts[q0])
            report["malformed"] = malformed_case(server, args.malformed, q0, args.max_tokens,
                                                 texts[q0], deadline)
            chats = Path(os.environ.get("RAGSPEC_HOME", Path.home() / ".ragspec")) / "chats"
            report["kill_restart"] = kill_case(server, q0, args.max_tokens, texts[q0], chats)
        report["load_avg_after"] = os.getloadavg()
    finally:
        server.stop()
    if args.anchor:
        report["anchor"] = anchor_case(index, [q for q in questions[: args.anchor] if q in solo],
                                       solo, args.max_tokens, args.model)
    return finish(args, report, work)


WARM_UP = "What options does it take?"  # the sessions' warm-up when every question is asked


def session_levels(args, levels: list[int], index: Path, work: Path, report: dict,
                   deadline: float) -> None:
    """--sessions: each level on a fresh server (module docstring), into report["levels"]."""
    every = load_sessions(args.questions)
    sessions = every[:args.limit] if args.limit else every
    asked = {q for session in sessions for q in session}
    spare = [q for session in every for q in session if q not in asked]
    warm = spare[0] if spare else WARM_UP
    report.update(sessions=len(sessions), questions=len(asked), warm_up=warm, levels={})
    texts: dict[str, str] | None = None
    solo_latency = 0.0
    for n in levels:  # 1 first: the reference answers
        if time.monotonic() > deadline:
            break
        server = Server(index, free_port(), args, work / f"server-{n}.log")
        try:
            server.start()
            run_level(server, [warm], 1, args.max_tokens, deadline)  # uncounted (see main)
            before = server.health()
            stagger = 0.0 if n == 1 else (args.stagger if args.stagger is not None
                                          else solo_latency / n)
            results, wall = run_sessions_level(server, sessions, n, args.max_tokens, deadline,
                                               stagger)
            after = server.health()
        finally:
            server.stop()
        ok = [r for r in results if "error" not in r]
        if n == 1:
            texts = {r["key"]: r["text"] for r in ok}
            solo_latency = statistics.median([r["latency_s"] for r in ok]) if ok else 0.0
            wall = sum(r["latency_s"] for r in ok)  # as the question mode's solo level
        report["levels"][str(n)] = {
            **summarize(results, wall, None if n == 1 else texts), "stagger_s": stagger,
            "steps": step_delta(before.get("steps"), after.get("steps")),
            "prompt_cache": cache_delta(before.get("prompt_cache"), after.get("prompt_cache"))}
    report["load_avg_after"] = os.getloadavg()


def finish(args, report: dict, work: Path) -> int:
    """The ratios to one client, the failures, the report written and printed; the exit
    status."""
    one = report["levels"].get("1", {}).get("aggregate_tokens_per_s")
    for level in report["levels"].values():
        level["aggregate_over_one_client"] = level["aggregate_tokens_per_s"] / one if one else None
    failures = [f"N={n}: " + ", ".join(k for k in ("all_complete", "identical_to_solo")
                                        if level.get(k) is False)
                for n, level in report["levels"].items()
                if level.get("all_complete") is False or level.get("identical_to_solo") is False]
    failures += [case for case in ("disconnect", "malformed", "kill_restart")
                 if case in report and not report[case]["ok"]]
    report["failures"] = failures
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text)
    print(text)
    _table(report)
    if failures:
        print(f"the server's log and any index built are kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


def _table(report: dict) -> None:
    print(f"{'N':>3} {'agg tok/s':>9} {'x one':>6} {'req tok/s':>9} {'TTFT p50':>8} "
          f"{'TTFT p95':>8} {'lat p50':>8} {'lat p95':>8} {'pause p95':>9} complete identical",
          file=sys.stderr)
    for n, lv in report["levels"].items():
        print(f"{n:>3} {lv['aggregate_tokens_per_s']:9.1f} {lv['aggregate_over_one_client'] or 0:6.2f} "
              f"{lv['per_request_tokens_per_s_median'] or 0:9.1f} {lv['ttft_p50_s'] or 0:8.2f} "
              f"{lv['ttft_p95_s'] or 0:8.2f} {lv['latency_p50_s'] or 0:8.2f} "
              f"{lv['latency_p95_s'] or 0:8.2f} {lv.get('longest_pause_p95_s') or 0:9.2f} "
              f"{lv['all_complete']!s:>8} "
              f"{lv.get('identical_to_solo', '-')!s:>9}", file=sys.stderr)
    for case in ("disconnect", "malformed", "kill_restart"):
        if case in report:
            print(f"{case}: {'ok' if report[case]['ok'] else 'FAILED'}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
