"""Stands in for llama-server in the bench's tests: the same command line, /health, and a
streamed /completion that writes the prompt's token ids again (cycled), with `timings` from its
own clock. With `--spec-type ngram-simple` it sends 3 tokens per event and changes the third
token it writes (so that the mode's output differs from greedy); other modes stay identical.
Each request's body is appended to $FAKE_SERVER_LOG as one JSON line."""

from __future__ import annotations

import argparse
import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFILL_S, TOKEN_S = 0.02, 0.002

parser = argparse.ArgumentParser()
for flag in ("-m", "--host", "--port", "-t", "-tb", "-c", "-np", "--spec-type"):
    parser.add_argument(flag)
args = parser.parse_args()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b'{"status":"ok"}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if os.environ.get("FAKE_SERVER_LOG"):
            with open(os.environ["FAKE_SERVER_LOG"], "a") as log:
                log.write(json.dumps({"spec_type": args.spec_type, **body}) + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        start = time.perf_counter()
        time.sleep(PREFILL_S)
        prompt_ms = 1000 * (time.perf_counter() - start)
        prompt = body["prompt"]
        tokens = [prompt[i % len(prompt)] for i in range(body["n_predict"])]
        if args.spec_type == "ngram-simple" and len(tokens) > 2:
            tokens[2] += 1
        per_event = 3 if args.spec_type else 1
        for i in range(0, len(tokens), per_event):
            time.sleep(TOKEN_S * per_event)
            self._event({"tokens": tokens[i:i + per_event], "stop": False})
        timings = {"cache_n": 0, "prompt_n": len(prompt), "prompt_ms": prompt_ms,
                   "predicted_n": len(tokens),
                   "predicted_ms": 1000 * (time.perf_counter() - start) - prompt_ms}
        if args.spec_type:
            timings.update(draft_n=len(tokens), draft_n_accepted=len(tokens) - 1)
        self._event({"tokens": [], "stop": True, "timings": timings})

    def _event(self, data):
        self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
        self.wfile.flush()


ThreadingHTTPServer((args.host, int(args.port)), Handler).serve_forever()
