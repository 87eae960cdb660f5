"""The chat's first question after its page opens, with the model's warm-up on and off.

`ragspec ui --no-auth` is started on a data folder whose model is converted and whose curve is
measured (what `make demo` leaves: `--home`), Chromium opens the page, a newcomer "reads" for
`--read` seconds, asks the port question and the time until "Passages used" shows (the answer
complete and saved) is taken; warm-up on (RAGSPEC_UI_WARM=1) and off alternate, `--reps` times
each, a fresh server every time. Writes {command, commit, machine, runs} to --out.

    python benchmarks/chat_first_question.py --home /tmp/home --out docs/results/chat-first-question-warm.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ragspec.bench.provenance import commit, machine, settings  # noqa: E402

QUESTION = "What is the default port of the Larkspur HTTP API?"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]


def first_question(home: str, warm: bool, port: int, read: float, chromium: str) -> dict:
    from playwright.sync_api import sync_playwright

    env = dict(os.environ, RAGSPEC_HOME=home, RAGSPEC_UI_WARM="1" if warm else "0")
    ragspec = str(Path(sys.executable).with_name("ragspec"))
    server = subprocess.Popen([ragspec, "ui", "--no-auth", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=FLAGS)
            page = browser.new_context(viewport={"width": 1400, "height": 1100}).new_page()
            page.set_default_timeout(600_000)
            for _ in range(240):
                try:
                    page.goto(f"http://127.0.0.1:{port}")
                    break
                except Exception:  # noqa: BLE001 - the server is still starting
                    time.sleep(0.5)
            box = page.get_by_placeholder("Ask a question about your documents")
            box.wait_for()
            page.wait_for_timeout(read * 1000)
            load = os.getloadavg()[0]
            box.fill(QUESTION)
            start = time.monotonic()
            box.press("Enter")
            page.get_by_text("Passages used").first.wait_for()
            took = time.monotonic() - start
            answer = page.locator("div.rs-answer").first.inner_text()
            browser.close()
    finally:
        server.terminate()
        server.wait(30)
    return {"warm": warm, "first_question_s": round(took, 2), "load_1min": round(load, 2),
            "answer": answer.strip()[:200]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", required=True, help="a RAGSPEC_HOME with an index and a "
                        "converted model (make demo's)")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--read", type=float, default=15.0,
                        help="seconds between the page opening and the question")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    chromium = os.environ.get("RAGSPEC_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    runs = []
    for _ in range(args.reps):
        for warm in (True, False):
            runs.append(first_question(args.home, warm, args.port + len(runs), args.read, chromium))
            print(runs[-1], flush=True)
    record = {"command": "python " + " ".join(sys.argv), "commit": commit(), "machine": machine(),
              "environment": settings(), "question": QUESTION, "read_seconds": args.read, "runs": runs}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
