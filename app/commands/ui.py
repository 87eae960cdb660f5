"""`ragspec ui`: start the Streamlit chat (app/ui.py) on this machine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

UI_SCRIPT = Path(__file__).resolve().parent.parent / "ui.py"
REPO_ROOT = UI_SCRIPT.parent.parent


def streamlit_argv(port: int, host: str) -> list[str]:
    """The command line that serves the app (headless: no browser is opened, no telemetry)."""
    return [
        sys.executable, "-m", "streamlit", "run", str(UI_SCRIPT),
        "--server.port", str(port),
        "--server.address", host,
        "--server.headless", "true",
        "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
        "--client.toolbarMode", "minimal",
    ]


def streamlit_env(index: str | None, model: str | None) -> dict[str, str]:
    env = dict(os.environ)
    # app/ui.py imports the ragspec packages; make them importable without an install.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    if index:
        env["RAGSPEC_UI_INDEX"] = index
    if model:
        env["RAGSPEC_UI_MODEL"] = model
    return env


@click.command()
@click.option("--port", default=8501, show_default=True, type=click.IntRange(1, 65535),
              help="Port to serve on.")
@click.option("--host", default="localhost", show_default=True,
              help="Address to bind (0.0.0.0 to accept other machines).")
@click.option("--index", default=None, metavar="DIR",
              help="Index directory (default: $RAGSPEC_HOME/index).")
@click.option("--model", "model_spec", default=None, metavar="M",
              help="Model folder or cached Hugging Face id preselected in the sidebar "
                   "(default: the bundled SmolLM2-135M-Instruct).")
def ui(port, host, index, model_spec):
    """Start the chat app in the browser: upload documents, ask, watch copied spans light up.

    Open the printed URL. The app shares its index with the CLI ($RAGSPEC_HOME or --index).
    """
    argv = streamlit_argv(port, host)
    click.echo(f"Starting ragspec on http://{host}:{port} (Ctrl-C to stop)", err=True)
    try:
        os.execve(sys.executable, argv, streamlit_env(index, model_spec))
    except OSError as exc:
        raise click.ClickException(f"could not start streamlit: {exc}") from exc


COMMANDS = [ui]
