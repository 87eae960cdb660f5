"""`make demo` and `make test` as a newcomer runs them (make -n: nothing runs): the first step,
a quiet pip install of a few minutes, is announced before it starts, so a fresh clone does
not sit silent for minutes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("goal", ["demo", "install"])
def test_the_quiet_install_is_announced_before_it_starts(tmp_path, goal):
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    # a venv folder that does not exist yet: make plans the whole first-run install
    out = subprocess.run(["make", "-n", goal, f"VENV={tmp_path / 'venv'}"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    first_pip = next(i for i, line in enumerate(out) if "pip install" in line)
    said = [line for line in out[:first_pip] if line.lstrip().startswith("echo")]
    assert said and "minutes" in said[0], out[: first_pip + 1]


def test_the_demo_gets_the_model_ready_before_the_chat_opens(tmp_path):
    """The slow first steps (kernels, conversion, the cost measurement) run in the terminal,
    each with a line, before the chat: its first question then waits for its answer only."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    out = subprocess.run(["make", "-n", "demo", f"VENV={tmp_path / 'venv'}"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    steps = [line.split("/bin/ragspec ", 1)[1] for line in out if "/bin/ragspec " in line]
    assert steps == ["ingest data/corpus", "calibrate --if-missing", "ui"], out
