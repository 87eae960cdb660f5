"""`ragspec ui`: start the Streamlit chat (ragspec/web/page.py) on this machine."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import click

from ragspec.commands.common import prompt_cache_option

UI_SCRIPT = Path(__file__).resolve().parents[1] / "web" / "page.py"
# The folder that holds the ragspec package (the checkout, or site-packages when installed).
REPO_ROOT = UI_SCRIPT.parents[2]


def upload_limit_mb(max_file_bytes: int) -> int:
    """Streamlit's upload limit (whole MB) for ragspec's per-file limit: the smallest that
    lets every allowed file through, so a bigger upload is refused before it is buffered."""
    return max(1, math.ceil(max_file_bytes / 2**20))


def streamlit_argv(port: int, host: str, max_file_bytes: int | None = None) -> list[str]:
    """The command line that serves the app (headless: no browser is opened, no telemetry).
    max_file_bytes: ragspec's per-file limit (default: RAGSPEC_MAX_FILE_MB or 50 MiB)."""
    if max_file_bytes is None:
        from ragspec.retrieval.ingest import default_max_file_bytes

        max_file_bytes = default_max_file_bytes()
    return [
        sys.executable, "-m", "streamlit", "run", str(UI_SCRIPT),
        "--server.port", str(port),
        "--server.address", host,
        "--server.headless", "true",
        "--server.maxUploadSize", str(upload_limit_mb(max_file_bytes)),
        "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
        # Streamlit runs a full gc.collect() after every script run, and the live answer's
        # fragment reruns twice a second per open page: each collection walks the loaded
        # model's objects holding the GIL, and the scheduler thread waits for it between its
        # ops (measured: a chat's prompt read 3-4x slower than `ragspec serve`'s, 10-100x at
        # load 8-15 on 2 cores). Python's own generational GC still runs.
        "--runner.postScriptGC", "false",
        "--client.toolbarMode", "minimal",
    ]


def streamlit_env(index: str | None, models: tuple[str, ...] = (),
                  max_loaded: int | None = None, auth: str | None = None) -> dict[str, str]:
    """The server's environment: the index, the offered models (names and specs) and the
    sign-in mode (see ragspec.accounts.binding; None: the page decides from the accounts)."""
    from ragspec.accounts.binding import MODE_ENV
    from ragspec.web import model_choice as ui_models

    env = dict(os.environ)
    # the page imports the ragspec package; make them importable without an install.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    if index:
        env["RAGSPEC_UI_INDEX"] = index
    env[ui_models.MODELS_ENV] = ui_models.to_env(ui_models.parse_choices(models or ()))
    if max_loaded is not None:
        env[ui_models.MAX_LOADED_ENV] = str(max_loaded)
    if auth is not None:
        env[MODE_ENV] = auth
    else:
        env.pop(MODE_ENV, None)
    return env


def sign_in_mode(host: str, no_auth: bool) -> str:
    """The chat's sign-in mode for this address (ragspec.accounts.binding); refusals and a
    damaged accounts file are usage errors (exit 2)."""
    from ragspec.accounts.binding import BindingRefused, auth_mode
    from ragspec.accounts.files import AccountError
    from ragspec.accounts.users import AccountStore

    try:
        return auth_mode(host, no_auth, not no_auth and AccountStore().has_accounts())
    except (BindingRefused, AccountError) as exc:
        raise click.UsageError(str(exc)) from exc


@click.command()
@click.option("--port", default=8501, show_default=True, type=click.IntRange(1, 65535),
              help="Port to serve on.")
@click.option("--host", default="localhost", show_default=True,
              help="Address to bind (0.0.0.0 to accept other machines).")
@click.option("--index", default=None, metavar="INDEX",
              help="Index: a folder (default: $RAGSPEC_HOME/index), milvus:PATH.db or "
                   "milvus://HOST:PORT/COLLECTION.")
@click.option("--model", "models", multiple=True, metavar="[NAME=]M",
              help="A model the chat offers (repeat for several; the browser picks among their "
                   "names and cannot name another): a model folder, a cached Hugging Face id, "
                   "'bundled', or an OpenAI-compatible server's URL (http://host:port/v1, "
                   "URL#MODEL for a model id; answers are generated there). Default: the "
                   "bundled SmolLM2-135M-Instruct.")
@click.option("--max-loaded", default=None, type=click.IntRange(min=1), metavar="N",
              help="Keep at most N of the offered models in memory (default: all of them).")
@click.option("--no-auth", is_flag=True,
              help="Serve without sign-in even on a network address (prints a warning on "
                   "every start). Without it, another address than loopback needs an account.")
@prompt_cache_option  # read by the server's generators through the environment it inherits
def ui(port, host, index, models, max_loaded, no_auth):
    """Start the chat app in the browser: upload documents, ask, watch copied spans light up.

    Open the printed URL. The app shares its index with the CLI ($RAGSPEC_HOME or --index),
    keeps its chats in $RAGSPEC_HOME/chats (see `ragspec chats`), and refuses uploads over
    RAGSPEC_MAX_FILE_MB before they are buffered.

    Sign-in: once `ragspec users add` has made an account, everyone signs in and sees only
    their own chats. Without accounts the chat is single-user and serves only this machine
    (localhost); on another address it refuses to start unless --no-auth is given.
    """
    from ragspec.accounts.binding import NO_AUTH_WARNING
    from ragspec.accounts.sessions import lifetime_seconds

    mode = sign_in_mode(host, no_auth)
    try:
        lifetime_seconds()  # a bad RAGSPEC_SESSION_HOURS is a usage error now, not at sign-in
        env = streamlit_env(index, models, max_loaded, auth=mode)
        argv = streamlit_argv(port, host)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if mode == "open":
        click.secho(NO_AUTH_WARNING.format(where=f"{host}:{port}"), err=True, fg="yellow")
    click.echo(f"Starting ragspec on http://{host}:{port} (Ctrl-C to stop)"
               + ("; everyone signs in" if mode == "accounts" else ""), err=True)
    try:
        os.execve(sys.executable, argv, env)
    except OSError as exc:
        raise click.ClickException(f"could not start streamlit: {exc}") from exc


COMMANDS = [ui]
