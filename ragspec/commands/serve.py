"""`ragspec serve`: the OpenAI-compatible HTTP API (ragspec.serve) on one loaded model."""

from __future__ import annotations

import socket
import time

import click

from ragspec.commands.common import min_score_option, model_options, search_mode_option
from ragspec.terminal import printable


def parse_indexes(values: tuple[str, ...]) -> dict[str, str | None]:
    """Retrieval model id -> index folder: `ragspec` for the first (or only) unnamed one,
    `ragspec:NAME` for NAME=DIR. None means the default index."""
    from ragspec.serve.answers import RETRIEVAL_ID

    if not values:
        return {RETRIEVAL_ID: None}
    out: dict[str, str | None] = {}
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep:
            name, folder = "", value
        model_id = f"{RETRIEVAL_ID}:{name}" if name else RETRIEVAL_ID
        if not folder or model_id in out:
            raise click.UsageError(f"--index {value!r}: give DIR or NAME=DIR, each name once "
                                   f"(one unnamed index at most)")
        out[model_id] = folder
    return out


def _check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from exc


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. With accounts (`ragspec users add`) every request needs an "
                   "API key (`ragspec users key NAME`); another machine's address needs an "
                   "account, or --no-auth.")
@click.option("--no-auth", is_flag=True,
              help="Serve without API keys on any address (a warning is printed at every "
                   "start): anyone who can reach the port may use it.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--index", "indexes", multiple=True, metavar="[NAME=]DIR",
              help="Index answered by model id `ragspec` (NAME=DIR: by `ragspec:NAME`); "
                   "repeatable. Default: $RAGSPEC_HOME/index.")
@model_options
@click.option("--model-id", default=None, metavar="ID",
              help="The id clients use for the plain model (default: from --model).")
@click.option("-k", "k", default=4, show_default=True, type=click.IntRange(1, 50),
              help="Passages per question for the ragspec model ids.")
@search_mode_option
@min_score_option
@click.option("--max-tokens", default=256, show_default=True, type=click.IntRange(min=1),
              help="Answer length when a request gives no max_tokens.")
@click.option("--max-active", default=8, show_default=True, type=click.IntRange(1, 256),
              help="Requests generated together (batched into one forward per step).")
@click.option("--max-waiting", default=64, show_default=True, type=click.IntRange(0, 100000),
              help="Requests that may wait for a slot; beyond that the API answers 429.")
@click.option("--prefill-chunk", default=None, type=click.IntRange(1), metavar="N",
              help="Read newcomers' prompts N tokens per step. Where the native step reads "
                   "prompts (int8 prompt reads), the pieces go into the running answers' own "
                   "forward, exactly, and the default is 256 (the whole prompt while nothing "
                   "else runs). Elsewhere the default is each prompt whole in a forward of its "
                   "own, one newcomer per step, exactly as `ragspec ask` reads it; with N the "
                   "running answers pause less, but a chunked prompt may round differently.")
@click.option("--max-body-kb", default=1024, show_default=True, type=click.IntRange(1),
              help="Largest request body accepted (413 beyond).")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve(host, port, no_auth, indexes, model_spec, device, exact, weights, model_id, k,
          search_mode, min_score, max_tokens, max_active, max_waiting, prefill_chunk,
          max_body_kb, log_level):
    """Serve the model over an OpenAI-compatible HTTP API.

    Endpoints: GET /v1/models, POST /v1/chat/completions, /v1/completions (streamed or not)
    and /v1/embeddings. Model id `ragspec` answers from your documents: it retrieves passages,
    builds the prompt and adds a top-level `ragspec` object to the response (the passages used,
    and the answer's spans with the passage and characters each accepted draft was copied
    from). The plain model id answers the messages as they are. Concurrent requests are
    generated together, one forward per step for all of them.

    \b
    Example:
      ragspec serve --port 8000
      curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "ragspec", "messages": [{"role": "user", "content": "What is X?"}]}'
    """
    from ragspec.commands.ui import sign_in_mode

    auth_mode = sign_in_mode(host, no_auth)  # exits 2 on another machine's address w/o account
    index_dirs = parse_indexes(indexes)
    _check_port(host, port)
    from ragspec.commands.common import generator_from_options, open_store
    from ragspec.pipeline import PipelineConfig

    stores = {model: open_store(folder) for model, folder in index_dirs.items()}
    for model, store in stores.items():
        if store.passage_count() == 0:
            click.echo(f"note: the index for {model} ({printable(str(store.index_dir))}) is "
                       f"empty; add documents with `ragspec ingest`", err=True)
    loaded, gen = generator_from_options(model_spec, device, exact, weights=weights)
    embedder = next(iter(stores.values())).embedder
    try:
        pipeline_config = PipelineConfig(k=k, max_new_tokens=max_tokens, search=search_mode,
                                         min_score=min_score)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    _run(host, port, gen, stores, pipeline_config, embedder, model_id or _default_id(model_spec),
         max_active, max_waiting, prefill_chunk, max_body_kb * 1024, log_level, auth_mode)


def _default_id(spec: str | None) -> str:
    from ragspec.serve.answers import model_id_for

    return model_id_for(spec)


def _run(host, port, gen, stores, pipeline_config, embedder, model_id, max_active, max_waiting,
         prefill_chunk, max_body_bytes, log_level, auth_mode: str = "single-user") -> None:
    import uvicorn

    from ragspec.decoding.scheduler import Scheduler
    from ragspec.serve.answers import Service
    from ragspec.serve.app import create_app

    scheduler = Scheduler(gen, max_active=max_active, max_waiting=max_waiting,
                          prefill_chunk=prefill_chunk)
    service = Service(scheduler, model_id=model_id, stores=stores,
                      pipeline_config=pipeline_config, embedder=embedder, created=int(time.time()))
    app = create_app(service, max_body_bytes=max_body_bytes,
                     max_in_flight=max(64, 4 * (max_active + max_waiting)), auth_mode=auth_mode)
    ids = ", ".join(m["id"] for m in service.models())
    click.echo(f"Serving on http://{host}:{port}/v1 (models: {printable(ids)}); Ctrl-C to stop",
               err=True)
    if scheduler.packing_problem:
        click.echo(f"note: requests are interleaved, one forward each per step: "
                   f"{scheduler.packing_problem}", err=True)
    if auth_mode == "open":
        from ragspec.accounts.binding import NO_AUTH_WARNING

        click.secho(NO_AUTH_WARNING.format(where=f"{host}:{port}"), err=True, fg="yellow")
    elif auth_mode == "accounts":
        click.echo("API keys required (ragspec users key NAME)", err=True)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=5, lifespan="off")
    try:
        uvicorn.Server(config).run()
    finally:
        scheduler.close()


COMMANDS = [serve]
