"""End to end in a real browser: `ragspec ui`'s Streamlit server, headless Chromium driven by
Playwright (pointed at Debian's /usr/bin/chromium), upload a document, ask, see highlighted
accepted drafts, take a screenshot (into the test's temporary folder; `make screenshot` sets
RAGSPEC_SCREENSHOT to refresh docs/screenshot.png on purpose).

Needs: `apt-get install chromium` and `pip install playwright` (no Playwright browser download).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from app.commands.ui import streamlit_argv, streamlit_env
from tests.conftest import MODEL_CACHE

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
SCREENSHOT_ENV = "RAGSPEC_SCREENSHOT"
CHROMIUM = os.environ.get("RAGSPEC_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-dev-shm-usage"]

DOC = """# Larkspur metrics

The metrics endpoint of the Larkspur daemon listens on port 7432 and serves /metrics only. It is
always on the port right after api_port, so it moves when api_port moves.

Job logs are kept for 14 days by default; logs larger than max_log_size are truncated from the
start, keeping the newest output.
"""
QUESTION = "On which port does the metrics endpoint listen, and what does it serve?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"streamlit did not become healthy at {url} in {timeout:.0f} s")


@pytest.fixture
def server(tmp_path):
    port = free_port()
    env = streamlit_env(None, None)
    env.update(RAGSPEC_HOME=str(tmp_path / "home"), RAGSPEC_MODEL_CACHE=str(MODEL_CACHE))
    log = open(tmp_path / "streamlit.log", "w")
    proc = subprocess.Popen(streamlit_argv(port, "127.0.0.1"), env=env, cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_browser_upload_ask_and_see_highlighted_spans(server, tmp_path):
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: `apt-get install chromium` (Debian) to run this")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="`pip install playwright` to run the browser test")
    doc = tmp_path / "larkspur metrics.md"
    doc.write_text(DOC)

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            # Playwright gives launch() a fresh temporary profile (--user-data-dir) itself.
            args=CHROMIUM_FLAGS,
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1250})
            page.set_default_timeout(120_000)
            page.goto(server)
            page.get_by_text("No documents yet").first.wait_for()

            page.locator('section[data-testid="stSidebar"] input[type="file"]').set_input_files(doc)
            page.get_by_text("larkspur metrics.md: added").wait_for()

            tokens = page.get_by_label("Maximum answer tokens")
            tokens.fill("32")
            tokens.press("Enter")
            page.wait_for_timeout(1000)  # let the rerun triggered by the setting finish

            box = page.get_by_placeholder("Ask a question about your documents")
            box.fill(QUESTION)
            box.press("Enter")
            # "Passages used" appears once the answer is complete
            page.get_by_text("Passages used").first.wait_for(timeout=420_000)

            marks = page.locator("div.rs-answer mark.rs-draft")
            assert marks.count() > 0, "expected highlighted accepted drafts in the answer"
            title = marks.first.get_attribute("title")
            assert "copied from [1] larkspur metrics.md" in title
            assert page.locator("div.rs-answer script").count() == 0

            page.get_by_text("Passages used").first.click()
            page.locator("div.rs-passage mark.rs-draft").first.wait_for()
            shot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "screenshot.png")
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
