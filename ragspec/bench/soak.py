"""A soak of `ragspec serve`: a real server process under a bounded mixed load for a given time,
and the checks that say it held.

Usage:
  PYTHONPATH=. .venv/bin/python -m ragspec.bench.soak [--minutes 30] [--clients 4]
      [--corpus data/corpus | --index DIR] [--questions data/questions.jsonl] [--limit 8]
      [--max-tokens 64] [--ingests 2] [--users 2] [--sessions 4] [--model M] [--seed 0]
      [--out report.json]

What it does (everything on 127.0.0.1; every loop ends at the deadline):
  1. ingests the corpus into a temporary index (or serves --index) and starts `ragspec serve`
     on a free loopback port, the model of --model or the bundled one. With --users N (default
     2) the server runs with accounts: a temporary RAGSPEC_HOME (the models folder stays where
     it is) holds N accounts made with `ragspec users add`, each with an API key from
     `ragspec users key`, and client i sends user i mod N's key;
  2. solo: one uncounted answer, then each question alone, streamed, and each of --sessions
     conversations (the follow-up pairs of --followups: a first question streamed, then the
     follow-up as a whole answer with the first turn as its history, as the chat and an OpenAI
     client send it): the reference answers;
  3. the soak: --clients threads, each drawing (from its own seeded random stream) one action
     at a time until the time is up: a streamed question, a whole (non-streamed) question, a
     two-turn conversation (its second turn's history is the first turn's answer of this run), a
     stream hung up at its first piece of text, a whole answer hung up on while it is being
     written (10-90% into a solo answer's time), a few malformed requests
     (ragspec/serve/malformed.py), or (with accounts) a request with no key and one with a
     wrong key. Meanwhile a sampler reads the server's RSS, and --ingests runs of `ragspec
     ingest` of the same corpus are spread over the time, each beside the load: the even ones
     into a new folder, the odd ones into the served index itself (nothing in it is new: the
     index must stay as it was and the answers with it);
  4. after the load: /health must show no request active (every hang-up freed its slot).

Checks (the report's "checks"; exit status 1 when one fails, the report says which):
  identical      every greedy answer the load finished equals its question's solo answer
                 (each turn of a conversation its solo conversation's turn)
  complete       every answer not hung up on ended properly (a finish reason; [DONE] when
                 streamed) with status 200
  no_5xx         no response had a status of 500 or more
  malformed_4xx  every malformed request got a 4xx with an OpenAI error object
  auth_401       (with accounts) every request with no key or a wrong one got a 401 with an
                 OpenAI error object
  slots_freed    nothing active once the load is over
  rss_bounded    the highest RSS after the warm-up (the first quarter of the soak) is within
                 15% of the highest RSS during it; first, last and max and a least-squares slope
                 (MiB per hour, after the warm-up) are reported beside it
  no_traceback   the server's log holds no Python traceback
  ingests_ok     every concurrent ingest exited 0 without a traceback, and the served index
                 stayed byte for byte as it was
  alive          the server process is still running and answers /health at the end
The report also gives requests per kind, statuses, and p50/p95 latency per third of the soak.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from ragspec import paths
from ragspec.bench.load_test import (
    HOST,
    RAGSPEC,
    Server,
    free_port,
    load_questions,
    percentile,
    tree_digest,
)
from ragspec.serve.malformed import CHAT, malformed_requests

REPO = Path(__file__).resolve().parents[2]
ACTIONS = {"stream": 4, "whole": 3, "session": 2, "hangup_stream": 1, "hangup_whole": 1,
           "malformed": 1, "bad_key": 1}
ANSWERS = ("stream", "whole", "session")  # the kinds whose text is compared with a solo answer
MALFORMED_PER_ACTION = 4
RSS_GROWTH_LIMIT = 1.15  # the bound: within 15% of the level after warm-up
WARMUP_SHARE = 0.25


@dataclass
class Call:
    """One request of the soak, as the client saw it."""
    kind: str
    start_s: float  # since the soak began
    latency_s: float
    status: int | None  # None: no HTTP status (the client hung up, or the connection failed)
    question: str | None = None
    text: str | None = None
    complete: bool = False
    error: str | None = None


# -- one request of each kind -----------------------------------------------------------------

def _body(question: str, max_tokens: int, stream: bool, history: tuple = ()) -> dict:
    return {"model": "ragspec", "stream": stream, "max_tokens": max_tokens,
            "messages": [*history, {"role": "user", "content": question}]}


def turns(first: str, answer: str) -> tuple[dict, dict]:
    """A conversation's first turn as the history of its second (what the chat sends)."""
    return {"role": "user", "content": first}, {"role": "assistant", "content": answer}


def streamed(http: httpx.Client, url: str, question: str, max_tokens: int,
             hang_up: bool = False) -> tuple[int, str, bool]:
    """(status, text, complete) of a streamed answer read as server-sent events; hang_up closes
    the connection at the first piece of text (complete is then False)."""
    parts, finish, done = [], None, False
    with http.stream("POST", url + CHAT, json=_body(question, max_tokens, True)) as reply:
        if reply.status_code != 200:
            reply.read()
            return reply.status_code, reply.text[:300], False
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            choices = json.loads(line[6:]).get("choices") or [{}]
            piece = (choices[0].get("delta") or {}).get("content")
            finish = choices[0].get("finish_reason") or finish
            if piece:
                parts.append(piece)
                if hang_up:
                    return 200, "".join(parts), False  # leaving the block drops the connection
    return 200, "".join(parts), bool(finish) and done


def whole(http: httpx.Client, url: str, question: str, max_tokens: int,
          timeout: float | None = None, history: tuple = ()) -> tuple[int, str, bool]:
    """(status, text, complete) of a non-streamed answer (after `history`, earlier turns as
    OpenAI messages); a timeout raises httpx.ReadTimeout, which closes the connection: the
    client hung up while the answer was being written."""
    reply = http.post(url + CHAT, json=_body(question, max_tokens, False, history),
                      timeout=timeout or http.timeout)
    if reply.status_code != 200:
        return reply.status_code, reply.text[:300], False
    choice = reply.json()["choices"][0]
    return 200, choice["message"]["content"], bool(choice.get("finish_reason"))


def conversation(http: httpx.Client, url: str, first: str, follow_up: str,
                 max_tokens: int) -> list[tuple[int, str, bool, float]]:
    """The two turns of a conversation, (status, text, complete, seconds) each: the first
    streamed, the follow-up whole with the first as its history (no second turn when the
    first failed)."""
    start = time.monotonic()
    one = (*streamed(http, url, first, max_tokens), time.monotonic() - start)
    if not (one[0] == 200 and one[2]):
        return [one]
    start = time.monotonic()
    two = whole(http, url, follow_up, max_tokens, history=turns(first, one[1]))
    return [one, (*two, time.monotonic() - start)]


def session_labels(j: int, first: str, follow_up: str) -> tuple[str, str]:
    """The names a conversation's two turns go by in the report (their solo answers' keys)."""
    return f"[session {j}, turn 1] {first}", f"[session {j}, turn 2] {follow_up}"


def bad_key_replies(url: str, question: str) -> list[tuple[int, bool, str]]:
    """(status, is an OpenAI error object, what was sent) of a request with no key and one
    with a wrong key, each on its own connection."""
    out = []
    for kind, headers in (("no key", {}), ("wrong key", {"Authorization": "Bearer rs_not_a_key"})):
        reply = httpx.post(url + CHAT, json=_body(question, 8, False), headers=headers,
                           timeout=120)
        out.append((reply.status_code, _is_error(reply), kind))
    return out


def _is_error(reply: httpx.Response) -> bool:
    try:
        error = reply.json().get("error") if reply.headers.get(
            "content-type", "").startswith("application/json") else None
    except (ValueError, AttributeError):
        error = None
    return bool(error and error.get("message"))


def malformed_batch(http: httpx.Client, url: str, batch) -> list[tuple[int, bool, str]]:
    """(status, is an OpenAI error object, kind) of each malformed request."""
    out = []
    for path, body, headers, kind in batch:
        reply = http.post(url + path, content=body, headers=headers)
        out.append((reply.status_code, _is_error(reply), kind))
    return out


# -- the load ---------------------------------------------------------------------------------

class Soak:
    """The client threads, the RSS sampler and the ingests, sharing one record of calls."""

    def __init__(self, server: Server, questions: list[str], args, work: Path,
                 solo_latency: float, sessions: list[tuple[str, str]] = (),
                 keys: list[str] = (), env: dict | None = None):
        self.server, self.questions, self.args, self.work = server, questions, args, work
        self.sessions, self.keys, self.env = list(sessions), list(keys), env
        # a whole answer is hung up on 10-90% of the way through a solo answer's time (under
        # load it takes longer: the client leaves while it is being written)
        self.solo_latency = solo_latency
        self.calls: list[Call] = []
        self.malformed_bad: list[dict] = []
        self.auth_bad: list[dict] = []
        self.rss: list[tuple[float, int]] = []  # (seconds since the start, bytes)
        self.prompt_cache: list[int | None] = []  # the prompt cache's bytes at each RSS sample
        self.ingests: list[dict] = []
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.end = self.t0 + args.minutes * 60
        self.malformed = malformed_requests(10**9, seed=args.seed)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)

    def client(self, i: int) -> None:
        rng = random.Random(self.args.seed * 1000 + i)
        actions = {k: w for k, w in ACTIONS.items() if (k != "session" or self.sessions)
                   and (k != "bad_key" or self.keys)}
        kinds, weights = list(actions), list(actions.values())
        url = self.server.url
        headers = {"Authorization": f"Bearer {self.keys[i % len(self.keys)]}"} if self.keys \
            else {}
        with httpx.Client(timeout=900, headers=headers) as http:
            while time.monotonic() < self.end:
                kind = rng.choices(kinds, weights)[0]
                if kind == "malformed":
                    with self.lock:
                        batch = [next(self.malformed) for _ in range(MALFORMED_PER_ACTION)]
                    self.send_malformed(http, url, batch)
                    continue
                if kind == "session":
                    j = rng.randrange(len(self.sessions))
                    self.converse(http, url, j)
                    continue
                if kind == "bad_key":
                    self.send_bad_keys(url, rng.choice(self.questions))
                    continue
                question = rng.choice(self.questions)
                start = self.now()
                call = Call(kind, start, 0.0, None, question)
                try:
                    if kind in ("stream", "hangup_stream"):
                        call.status, call.text, call.complete = streamed(
                            http, url, question, self.args.max_tokens, kind == "hangup_stream")
                    elif kind == "whole":
                        call.status, call.text, call.complete = whole(
                            http, url, question, self.args.max_tokens)
                    else:  # hang up on a whole answer a random moment into it
                        try:
                            call.status, call.text, call.complete = whole(
                                http, url, question, self.args.max_tokens,
                                timeout=rng.uniform(0.1, 0.9) * self.solo_latency)
                            call.kind = "whole"  # it came back in time: an answer to compare
                        except httpx.ReadTimeout:
                            pass
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    call.error = f"{exc.__class__.__name__}: {exc}"[:300]
                call.latency_s = self.now() - start
                self.record(call)

    def converse(self, http: httpx.Client, url: str, j: int) -> None:
        """Conversation j's two turns, each recorded as a "session" call under its label."""
        labels = session_labels(j, *self.sessions[j])
        start = self.now()
        try:
            replies = conversation(http, url, *self.sessions[j], self.args.max_tokens)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            self.record(Call("session", start, self.now() - start, None, labels[0],
                             error=f"{exc.__class__.__name__}: {exc}"[:300]))
            return
        for label, (status, text, complete, seconds) in zip(labels, replies, strict=False):
            self.record(Call("session", start, seconds, status, label, text, complete))
            start += seconds

    def send_bad_keys(self, url: str, question: str) -> None:
        self.expect_errors("bad_key", lambda: bad_key_replies(url, question),
                           lambda status: status == 401, self.auth_bad)

    def send_malformed(self, http: httpx.Client, url: str, batch) -> None:
        self.expect_errors("malformed", lambda: malformed_batch(http, url, batch),
                           lambda status: 400 <= status < 500, self.malformed_bad)

    def expect_errors(self, kind: str, send, status_ok, bad: list[dict]) -> None:
        """Requests that must each be refused: send() gives (status, is an OpenAI error object,
        what was sent) of each; each is recorded as a call of `kind`, and one with a status
        status_ok refuses, or without an error object, goes into `bad`."""
        start = self.now()
        try:
            results = send()
        except httpx.HTTPError as exc:
            with self.lock:
                bad.append({"error": f"{exc.__class__.__name__}: {exc}"[:300]})
            return
        for status, is_error, what in results:
            self.record(Call(kind, start, self.now() - start, status))
            if not (status_ok(status) and is_error):
                with self.lock:
                    bad.append({"kind": what, "status": status})

    def sample_rss(self, stop: threading.Event) -> None:
        """The server's RSS, and beside it the bytes its prompt cache holds (a bounded part of
        the RSS that grows as new prompts are read: ragspec.decoding.prefix_cache)."""
        pid = self.server.process.pid
        while not stop.is_set():
            rss = rss_bytes(pid)
            try:
                cache = self.server.health().get("prompt_cache", {}).get("bytes")
            except (httpx.HTTPError, ValueError, AttributeError):
                cache = None
            if rss is not None:
                with self.lock:
                    self.rss.append((round(self.now(), 2), rss))
                    self.prompt_cache.append(cache)
            stop.wait(self.args.sample_seconds)

    def run_ingests(self, stop: threading.Event) -> None:
        """--ingests runs of `ragspec ingest`, spread evenly over the soak."""
        n = self.args.ingests
        for i in range(n):
            if stop.wait(max(0.0, self.t0 + (i + 1) * (self.end - self.t0) / (n + 1)
                             - time.monotonic())):
                return
            start = self.now()
            served = i % 2 == 1 and self.args.index is None  # never into an index of --index
            into = self.server.index if served else self.work / f"ingest-{i}"
            argv = [RAGSPEC, "ingest", str(self.args.corpus), "--index", str(into)]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=1800,
                                  env=self.env)
            self.ingests.append({"into": "served index" if served else "new folder",
                                 "start_s": round(start, 1), "seconds": round(
                self.now() - start, 1), "status": done.returncode,
                "traceback": "Traceback" in done.stderr, "stderr_tail": done.stderr[-300:]})

    def run(self) -> None:
        stop = threading.Event()
        helpers = [threading.Thread(target=self.sample_rss, args=(stop,))]
        if self.args.ingests and self.args.corpus:
            helpers.append(threading.Thread(target=self.run_ingests, args=(stop,)))
        clients = [threading.Thread(target=self.client, args=(i,))
                   for i in range(self.args.clients)]
        for t in helpers + clients:
            t.start()
        for t in clients:
            t.join()
        stop.set()
        for t in helpers:
            t.join()


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a process from /proc (Linux); None where it cannot be read."""
    try:
        resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return resident * os.sysconf("SC_PAGE_SIZE")


# -- the report -------------------------------------------------------------------------------

def rss_summary(samples: list[tuple[float, int]], warmup_s: float) -> dict:
    """First, last and max RSS (MiB), the warm-up level (max during the warm-up), the highest
    after it over that level, and the slope after it (MiB per hour, least squares)."""
    mib = [(t, b / 2**20) for t, b in samples]
    during = [m for t, m in mib if t <= warmup_s]
    after = [(t, m) for t, m in mib if t > warmup_s]
    out = {"samples": len(mib), "first_mib": mib[0][1] if mib else None,
           "last_mib": mib[-1][1] if mib else None,
           "max_mib": max(m for _, m in mib) if mib else None,
           "warmup_level_mib": max(during) if during else None, "after_over_warmup": None,
           "slope_mib_per_hour": None}
    if during and after:
        out["after_over_warmup"] = max(m for _, m in after) / max(during)
    if len(after) >= 2:
        mean_t = sum(t for t, _ in after) / len(after)
        mean_m = sum(m for _, m in after) / len(after)
        var = sum((t - mean_t) ** 2 for t, _ in after)
        if var > 0:
            out["slope_mib_per_hour"] = 3600 * sum(
                (t - mean_t) * (m - mean_m) for t, m in after) / var
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def latency_by_third(calls: list[Call], duration: float) -> list[dict]:
    thirds = []
    for i in range(3):
        lo, hi = i * duration / 3, (i + 1) * duration / 3
        lat = [c.latency_s for c in calls if c.kind in ANSWERS and c.complete
               and lo <= c.start_s < hi]
        thirds.append({"from_s": round(lo, 1), "answers": len(lat),
                       "latency_p50_s": percentile(lat, 0.5),
                       "latency_p95_s": percentile(lat, 0.95)})
    return thirds


def report_of(soak: Soak, solo: dict[str, str], log: Path, index_same: bool | None,
              alive: bool, active_after: int | None) -> dict:
    calls, duration = soak.calls, soak.args.minutes * 60
    answers = [c for c in calls if c.kind in ANSWERS]
    differing = sorted({c.question for c in answers if c.complete and c.text != solo.get(
        c.question)})
    statuses: dict[str, int] = {}
    for c in calls:
        key = str(c.status) if c.status is not None else "none"
        statuses[key] = statuses.get(key, 0) + 1
    log_text = log.read_text(errors="replace") if log.exists() else ""
    rss = rss_summary(soak.rss, duration * WARMUP_SHARE)
    growth = rss["after_over_warmup"]
    checks = {
        "identical": not differing and any(c.complete for c in answers),
        "complete": all(c.complete and c.status == 200 for c in answers),
        "no_5xx": not any(c.status and c.status >= 500 for c in calls),
        "malformed_4xx": not soak.malformed_bad,
        "auth_401": not soak.auth_bad,
        "slots_freed": active_after == 0,
        "rss_bounded": growth is not None and growth <= RSS_GROWTH_LIMIT,
        "no_traceback": "Traceback" not in log_text,
        "ingests_ok": index_same is not False and all(
            i["status"] == 0 and not i["traceback"] for i in soak.ingests),
        "alive": alive,
    }
    kinds: dict[str, int] = {}
    for c in calls:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    return {
        "minutes": soak.args.minutes, "clients": soak.args.clients,
        "max_tokens": soak.args.max_tokens, "questions": len(soak.questions),
        "sessions": len(soak.sessions), "users": len(soak.keys), "solo_answers": len(solo),
        "requests": len(calls), "by_kind": kinds, "statuses": statuses,
        "answers_compared": sum(1 for c in answers if c.complete), "differing": differing,
        "incomplete": [asdict(c) for c in answers if not (c.complete and c.status == 200)][:20],
        "malformed_bad": soak.malformed_bad[:20], "auth_bad": soak.auth_bad[:20], "rss": rss,
        # (seconds, RSS MiB, prompt cache MiB)
        "rss_samples": [(t, round(b / 2**20, 1), round(c / 2**20, 1) if c is not None else None)
                        for (t, b), c in zip(soak.rss, soak.prompt_cache, strict=True)],
        "latency_by_third": latency_by_third(calls, duration), "ingests": soak.ingests,
        "tracebacks_in_log": log_text.count("Traceback"),
        "checks": checks, "failures": [k for k, ok in checks.items() if not ok],
    }


# -- setup ------------------------------------------------------------------------------------

def load_sessions(path: Path, limit: int) -> list[tuple[str, str]]:
    """The first `limit` follow-up pairs of a JSON-lines file: (first question, follow-up)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["previous"], r["question"]) for r in rows if r.get("followup", True)][:limit]


def make_accounts(home: Path, users: int) -> tuple[dict, list[str]]:
    """A server environment with `users` accounts in a new RAGSPEC_HOME (the models folder
    stays where this process finds it, so nothing is converted again), and an API key of each:
    (environment, keys). Made with the CLI, as an operator makes them."""
    env = {**os.environ, paths.ENV_VAR: str(home),
           paths.MODEL_CACHE_ENV: str(paths.models_dir())}
    keys = []
    for u in range(users):
        name = f"soak-user-{u + 1}"
        subprocess.run([RAGSPEC, "users", "add", name, "--role", "owner", "--password-stdin",
                        "--max-queued", "none", "--max-answer-tokens", "none"],
                       input=secrets.token_urlsafe(16) + "\n", env=env, check=True,
                       capture_output=True, text=True, timeout=300)
        made = subprocess.run([RAGSPEC, "users", "key", name, "--json"], env=env, check=True,
                              capture_output=True, text=True, timeout=300)
        keys.append(json.loads(made.stdout)["key"])
    return env, keys


# -- main -------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--corpus", type=Path, default=REPO / "data" / "corpus",
                        help="documents to ingest into a temporary index (default: the bundled "
                             "sample corpus)")
    parser.add_argument("--index", type=Path, help="serve this index instead of ingesting")
    parser.add_argument("--questions", type=Path, default=REPO / "data" / "questions.jsonl")
    parser.add_argument("--limit", type=int, default=8, help="questions used (default 8)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-active", type=int, default=8)
    parser.add_argument("--prefill-chunk", type=int, default=None)
    parser.add_argument("--model", default=None, help="default: the bundled model")
    parser.add_argument("--ingests", type=int, default=2,
                        help="runs of `ragspec ingest` beside the load (default 2)")
    parser.add_argument("--users", type=int, default=2,
                        help="accounts the server runs with, each client sending one's API key "
                             "(default 2; 0: the single-user mode, no keys)")
    parser.add_argument("--sessions", type=int, default=4,
                        help="two-turn conversations drawn from --followups (default 4; 0: none)")
    parser.add_argument("--followups", type=Path,
                        default=REPO / "data" / "followups" / "pairs.jsonl",
                        help="follow-up pairs (JSON lines with previous, question, followup)")
    parser.add_argument("--sample-seconds", type=float, default=None,
                        help="seconds between RSS samples (default: the soak over 120)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.minutes <= 0 or not 1 <= args.clients <= 64 or args.users < 0 or args.sessions < 0:
        parser.error("--minutes above 0, --clients from 1 to 64, --users and --sessions 0 or more")
    args.sample_seconds = args.sample_seconds or max(0.5, args.minutes * 60 / 120)
    questions = load_questions(args.questions, args.limit)
    sessions = load_sessions(args.followups, args.sessions) if args.sessions else []
    work = Path(tempfile.mkdtemp(prefix="ragspec-soak-"))
    env, keys = make_accounts(work / "home", args.users) if args.users else (None, [])
    index = args.index
    phases: dict[str, float] = {}  # wall seconds of each phase, where the run's time went
    mark = time.monotonic()

    def lap(name: str) -> None:
        nonlocal mark
        phases[name] = round(time.monotonic() - mark, 1)
        mark = time.monotonic()

    if index is None:
        index = work / "index"
        subprocess.run([RAGSPEC, "ingest", str(args.corpus), "--index",
                        str(index)], check=True, stdout=subprocess.DEVNULL, timeout=1800, env=env)
        lap("ingest_s")
    server = Server(index, free_port(), args, work / "server.log", env)
    machine = {"cpus": os.cpu_count(), "load_avg_before": os.getloadavg()}
    alive, active_after, index_same = False, None, None
    try:
        server.start()
        lap("start_s")
        headers = {"Authorization": f"Bearer {keys[0]}"} if keys else {}
        with httpx.Client(timeout=900, headers=headers) as http:
            streamed(http, server.url, questions[0], args.max_tokens)  # warms up; not counted
            solo, took = {}, []
            for q in questions:
                start = time.monotonic()
                solo[q] = streamed(http, server.url, q, args.max_tokens)[1]
                took.append(time.monotonic() - start)
            for j, pair in enumerate(sessions):
                replies = conversation(http, server.url, *pair, args.max_tokens)
                if len(replies) < 2:
                    raise RuntimeError(f"the solo run of conversation {j} failed: {replies[0]}")
                solo.update(zip(session_labels(j, *pair), (r[1] for r in replies), strict=True))
        lap("solo_s")
        before = tree_digest(index)
        soak = Soak(server, questions, args, work, statistics.median(took), sessions, keys, env)
        if keys:  # once before the load, whatever the clients draw
            soak.send_bad_keys(server.url, questions[0])
        soak.run()
        lap("soak_s")  # past --minutes by the answers running at the end, and the ingests
        index_same = tree_digest(index) == before
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # a hang-up's slot is freed within a step or two
            active_after = server.health().get("active")
            if active_after == 0:
                break
            time.sleep(0.1)
        alive = server.process.poll() is None
    finally:
        server.stop()
    lap("stop_s")
    machine["load_avg_after"] = os.getloadavg()
    report = {"host": HOST, "index": str(index), "machine": machine, "phases": phases,
              **report_of(soak, solo, server.log, index_same, alive, active_after)}
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)
    print(f"soak: {report['requests']} requests, {report['answers_compared']} answers compared, "
          f"RSS {report['rss']['first_mib']} -> {report['rss']['last_mib']} MiB "
          f"(max {report['rss']['max_mib']}): "
          + ("all checks passed" if not report["failures"] else
             f"FAILED {', '.join(report['failures'])}; the log is kept in {work}"),
          file=sys.stderr)
    if not report["failures"]:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
