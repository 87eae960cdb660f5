"""End to end in a real browser: `ragspec ui`'s Streamlit server, headless Chromium driven by
Playwright (pointed at Debian's /usr/bin/chromium).

  * upload a document, ask, see highlighted accepted drafts and the chat in the sidebar's list,
    take a screenshot (into the test's temporary folder; `make screenshot` sets
    RAGSPEC_SCREENSHOT to refresh docs/screenshot.png on purpose);
  * files named like Markdown links and images, HTML and `javascript:` URLs show as text: no
    link, image, script, dialog or request to their hosts appears, tooltips hold no server
    path; a file over RAGSPEC_MAX_FILE_MB is refused by Streamlit itself;
  * two users of a chat that writes one answer at a time (RAGSPEC_UI_BATCH=1): the second sees
    "Waiting for 1 answer ahead" while the first answer is written; the first user's Stop ends
    it and keeps what was written; then the second answer arrives.

Needs: `apt-get install chromium` and `pip install playwright` (no Playwright browser download).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from servers import free_port
from ui_support import wait_healthy

from ragspec.commands.ui import streamlit_argv, streamlit_env
from tests.conftest import MODEL_CACHE, make_char_tokenizer, make_tiny_model

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT_ENV = "RAGSPEC_SCREENSHOT"
CHROMIUM = os.environ.get("RAGSPEC_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-dev-shm-usage"]
SIDEBAR = 'section[data-testid="stSidebar"]'

DOC = """# Larkspur metrics

The metrics endpoint of the Larkspur daemon listens on port 7432 and serves /metrics only. It is
always on the port right after api_port, so it moves when api_port moves.

Job logs are kept for 14 days by default; logs larger than max_log_size are truncated from the
start, keeping the newest output.
"""
QUESTION = "On which port does the metrics endpoint listen, and what does it serve?"


@contextlib.contextmanager
def serving(tmp_path: Path, models: tuple[str, ...] = (), **extra_env):
    """`ragspec ui`'s command line and environment, on a free port, with a temporary home."""
    port = free_port()
    env = streamlit_env(None, models)
    env.update({"RAGSPEC_HOME": str(tmp_path / "home"), "RAGSPEC_MODEL_CACHE": str(MODEL_CACHE),
                **extra_env})
    log = open(tmp_path / "streamlit.log", "w")
    limit = int(float(extra_env.get("RAGSPEC_MAX_FILE_MB", 50)) * 2**20)
    argv = streamlit_argv(port, "127.0.0.1", limit)
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
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


@pytest.fixture
def chromium():
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: `apt-get install chromium` (Debian) to run this")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="`pip install playwright` to run the browser test")
    with sync_api.sync_playwright() as pw:
        # Playwright gives launch() a fresh temporary profile (--user-data-dir) itself.
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser, url: str):
    page = browser.new_context(viewport={"width": 1400, "height": 1250}).new_page()
    page.set_default_timeout(120_000)
    page.goto(url)
    page.get_by_placeholder("Ask a question about your documents").wait_for()
    return page


def open_advanced(page, inside) -> None:
    """Open the sidebar's "Advanced" expander until `inside` (a locator of something in it) is
    visible. A rerun still under way (after an upload, on a slow machine) can redraw the
    expander closed, take the click, or show its old and new copies at once for a moment: so
    the first copy is clicked, and again until what it holds is there."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(4):
        if inside.is_visible():
            return
        page.locator(SIDEBAR).get_by_text("Advanced", exact=True).first.click()
        try:
            inside.wait_for(timeout=20_000)
        except PlaywrightTimeout:
            continue
        return
    inside.wait_for()


def set_toggle(page, label: str, on: bool) -> None:
    """Switch the sidebar toggle `label` on or off, clicking the first copy of its label until
    its box says so (a rerun can show two copies for a moment, or take a click)."""
    box = page.locator(SIDEBAR).get_by_label(label, exact=True)
    for _ in range(4):
        if box.first.is_checked() == on:
            break
        page.locator(SIDEBAR).get_by_text(label, exact=True).first.click()
        page.wait_for_timeout(1000)  # let the rerun the click triggered finish
    assert box.first.is_checked() == on, f"{label} did not switch {'on' if on else 'off'}"


def set_number(page, label: str, value: int) -> None:
    box = page.get_by_label(label)
    open_advanced(page, box)  # the engine's settings sit in the sidebar's "Advanced" expander
    box.wait_for()
    box.fill(str(value))
    box.press("Enter")
    page.wait_for_timeout(1000)  # let the rerun triggered by the setting finish


def ask(page, question: str) -> None:
    box = page.get_by_placeholder("Ask a question about your documents")
    box.fill(question)
    box.press("Enter")


def test_browser_upload_ask_and_see_highlighted_spans(chromium, tmp_path):
    doc = tmp_path / "larkspur metrics.md"
    doc.write_text(DOC)
    with serving(tmp_path) as url:
        page = open_page(chromium, url)
        page.get_by_text("No documents yet").first.wait_for()
        page.locator(f'{SIDEBAR} input[type="file"]').set_input_files(doc)
        page.get_by_text("larkspur metrics.md: added").wait_for()
        set_number(page, "Maximum answer tokens", 32)
        ask(page, QUESTION)
        # "Passages used" appears once the answer is complete and saved
        page.get_by_text("Passages used").first.wait_for(timeout=800_000)

        marks = page.locator("div.rs-answer mark.rs-draft")
        assert marks.count() > 0, "expected highlighted accepted drafts in the answer"
        assert "copied from [1] larkspur metrics.md" in marks.first.get_attribute("title")
        assert page.locator("div.rs-answer script").count() == 0
        assert page.locator(SIDEBAR).get_by_text("On which port does the metrics").count() == 1
        assert "chat=" in page.url

        page.get_by_text("Passages used").first.click()
        page.locator("div.rs-passage mark.rs-draft").first.wait_for()
        shot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "screenshot.png")
        page.screenshot(path=str(shot), full_page=True)

        page.reload()  # a new session: the chat reopens from the address, highlights and all
        page.locator("div.rs-answer mark.rs-draft").first.wait_for()
        assert page.locator("div.rs-answer mark.rs-draft").count() == marks.count()
    assert shot.stat().st_size > 10_000


HOSTILE = {
    "[click me](javascript:alert(1)).md": "javascript",
    "![pixel](http://evil.example/p.png).md": "image",
    "<img src=x onerror=alert(2)>.txt": "html",
    "see http://evil.example/x and www.evil.example.md": "autolink",
    "<script>alert(3)</script>.exe": "unsupported",
    "[broken](http://evil.example/).pdf": "broken",
}


def test_browser_hostile_file_names_stay_text(chromium, tmp_path):
    requests, dialogs = [], []
    with serving(tmp_path, RAGSPEC_MAX_FILE_MB="1") as url:
        page = open_page(chromium, url)
        page.on("request", lambda r: requests.append(r.url))
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        files = [{"name": name, "mimeType": "text/plain",
                  "buffer": (DOC + f"\nVariant {kind}.\n").encode()}
                 for name, kind in HOSTILE.items()]
        page.locator(f'{SIDEBAR} input[type="file"]').set_input_files(files)
        for expected in ("click me](javascript:alert(1)).md: added",
                         "<img src=x onerror=alert(2)>.txt: added",
                         "<script>alert(3)<_script>.exe: unsupported type",
                         "[broken](http:__evil.example_).pdf:"):
            page.get_by_text(expected).first.wait_for()
        open_advanced(page, page.get_by_label("Maximum answer tokens"))  # its tooltips too
        remove = page.locator(f'{SIDEBAR} [data-testid="stTooltipHoverTarget"]')
        tooltips = []
        for i in range(remove.count()):
            remove.nth(i).hover()
            tip = page.locator('[data-testid="stTooltipContent"]').last
            tip.wait_for()
            tooltips.append(tip.inner_text())
        page.wait_for_timeout(1000)

        live = page.evaluate("""() => ({
            links: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
            images: [...document.querySelectorAll('img[src]')].map(i => i.getAttribute('src')),
            scripts: [...document.querySelectorAll('script')].map(s => s.textContent)
                       .filter(t => t.includes('alert')),
            handlers: [...document.querySelectorAll('*')].filter(
                e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
        })""")
        assert not [h for h in live["links"] if "evil" in h or h.startswith("javascript")], live
        assert not [s for s in live["images"] if "evil" in s or s == "x"], live
        assert not live["scripts"] and live["handlers"] == 0, live
        assert not dialogs and not [r for r in requests if "evil.example" in r]
        assert tooltips and not [t for t in tooltips if str(tmp_path) in t], tooltips

        big = tmp_path / "big.txt"
        big.write_bytes(b"word " * (2**20 // 5 * 2))  # 2 MiB, over the 1 MiB limit
        page.locator(f'{SIDEBAR} input[type="file"]').set_input_files(big)
        page.get_by_text("File must be 1.0MB or smaller").wait_for()
    assert not (tmp_path / "home" / "uploads").exists() or not [
        p for p in (tmp_path / "home" / "uploads").rglob("big.txt")]


def slow_model_folder(path: Path) -> Path:
    """A randomly initialised model big enough to write about 100 tokens a second on a CPU,
    without an end-of-sequence token: every answer runs to its limit unless stopped."""
    tok = make_char_tokenizer()
    tok.eos_token = None
    model = make_tiny_model(len(tok), hidden_size=512, intermediate_size=1536,
                            num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                            max_position_embeddings=4096, eos_token_id=None)
    model.generation_config.eos_token_id = None
    tok.save_pretrained(path)
    model.save_pretrained(path)
    return path


def test_browser_two_users_queue_and_stop(chromium, tmp_path):
    folder = slow_model_folder(tmp_path / "slow-model")
    doc = tmp_path / "larkspur metrics.md"
    doc.write_text(DOC)
    # one answer at a time, so that the second user waits (answers are batched otherwise)
    with serving(tmp_path, (f"slow={folder}",), RAGSPEC_MODEL_CACHE=str(tmp_path / "cache"),
                 RAGSPEC_UI_BATCH="1") as url:
        first, second = open_page(chromium, url), open_page(chromium, url)
        first.locator(f'{SIDEBAR} input[type="file"]').set_input_files(doc)
        first.get_by_text("larkspur metrics.md: added").wait_for()
        for page, tokens in ((first, 1024), (second, 16)):
            set_toggle(page, "Speculation", False)  # off: one token per forward
            set_number(page, "Maximum answer tokens", tokens)

        ask(first, QUESTION)
        first.locator("div.rs-answer").first.wait_for(timeout=600_000)  # being written
        ask(second, "How long are job logs kept?")
        second.get_by_text("Waiting for 1 answer ahead").wait_for()

        first.get_by_role("button", name="Stop").click()
        first.get_by_text("Stopped: the answer ends where Stop was pressed").wait_for()
        kept = first.locator("div.rs-answer").first.inner_text()
        assert kept.strip()
        second.get_by_text("Passages used").first.wait_for(timeout=600_000)
        assert second.get_by_text("Waiting for").count() == 0
        first.reload()
        first.get_by_text("Stopped: the answer ends where Stop was pressed").wait_for()
        assert first.locator("div.rs-answer").first.inner_text() == kept
