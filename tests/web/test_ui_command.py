"""`ragspec ui` starts Streamlit with its upload limit tied to RAGSPEC_MAX_FILE_MB, so an upload
over ragspec's own limit is refused by Streamlit before it is buffered in memory."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from servers import free_port
from ui_support import wait_healthy

from ragspec.cli import main
from ragspec.commands.ui import streamlit_argv, streamlit_env


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_ui_command_serves_the_app_headless(tmp_path):
    """`ragspec ui` itself, on a free loopback port: the server answers its health check and
    serves the page, without a browser or a terminal attached."""
    port = free_port()
    env = {**os.environ, "RAGSPEC_HOME": str(tmp_path / "home")}
    ragspec = str(Path(sys.executable).with_name("ragspec"))
    with open(tmp_path / "ui.log", "w") as log:
        proc = subprocess.Popen([ragspec, "ui", "--port", str(port), "--host", "127.0.0.1",
                                 "--index", str(tmp_path / "index")], env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, proc, timeout=90)
            with urllib.request.urlopen(url, timeout=10) as page:
                html = page.read().decode()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert '<div id="root">' in html, html[:400]
    env = streamlit_env(str(tmp_path), ("some/model",))
    assert env["RAGSPEC_UI_INDEX"] == str(tmp_path)
    assert env["RAGSPEC_UI_MODELS"] == '[["some/model", "some/model"]]'


@pytest.mark.parametrize("megabytes, expected", [
    (None, "50"), ("50", "50"), ("120.5", "121"), ("0.002", "1"), ("1", "1"),
])
def test_streamlit_upload_limit_follows_ragspec_max_file_mb(monkeypatch, megabytes, expected):
    if megabytes is None:
        monkeypatch.delenv("RAGSPEC_MAX_FILE_MB", raising=False)
    else:
        monkeypatch.setenv("RAGSPEC_MAX_FILE_MB", megabytes)
    assert option(streamlit_argv(8501, "localhost"), "--server.maxUploadSize") == expected


def test_the_server_runs_no_full_garbage_collection_after_every_rerun():
    """Streamlit's default gc.collect() after every script run (the live answer reruns twice a
    second per open page) held the GIL over the loaded model's objects while the scheduler
    thread waited: in the walk-through a chat answer took 4.9-5.5 s against 1.6-2.8 s
    without it, side by side. The test above starts a server with these options (an unknown
    one would stop it)."""
    assert option(streamlit_argv(8501, "localhost"), "--runner.postScriptGC") == "false"


@pytest.fixture
def started(monkeypatch):
    """Records the command `ragspec ui` would replace itself with, instead of running it."""
    calls = []
    monkeypatch.setattr("ragspec.commands.ui.os.execve", lambda *args: calls.append(args))
    return calls


def test_ui_passes_the_limit_and_the_offered_models_to_streamlit(monkeypatch, started):
    monkeypatch.setenv("RAGSPEC_MAX_FILE_MB", "3")
    result = CliRunner().invoke(main, ["ui", "--port", "8600", "--model", "a=/models/a"])
    assert result.exit_code == 0, result.output
    (_, argv, env), = started
    assert option(argv, "--server.maxUploadSize") == "3" and option(argv, "--server.port") == "8600"
    assert env["RAGSPEC_UI_MODELS"] == '[["a", "/models/a"]]'


def test_a_bad_limit_is_a_usage_error_not_a_traceback(monkeypatch, started):
    monkeypatch.setenv("RAGSPEC_MAX_FILE_MB", "lots")
    result = CliRunner().invoke(main, ["ui"])
    assert not started and result.exit_code == 2
    assert "RAGSPEC_MAX_FILE_MB='lots' is not a number" in result.output
    assert "Traceback" not in result.output
