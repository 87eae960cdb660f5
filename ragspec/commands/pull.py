"""`ragspec pull ID`: download a Hugging Face hub model into the local cache, for --model ID.

Only safetensors weights, config, tokenizer and chat-template files are fetched (never pickled
.bin weights); progress bars go to stderr. Every failure is one line, exit status 1.
"""

from __future__ import annotations

import json

import click

from ragspec.commands.common import json_option
from ragspec.terminal import printable


@click.command()
@click.argument("model_id", metavar="ID")
@click.option("--revision", default=None, metavar="REV",
              help="Branch, tag or commit to download (default: main).")
@json_option
def pull(model_id: str, revision: str | None, as_json: bool) -> None:
    """Download the hub model ID (e.g. HuggingFaceTB/SmolLM2-360M-Instruct) into the local
    Hugging Face cache; afterwards `--model ID` works offline.

    Fetches safetensors weights, config, tokenizer and chat-template files only: pickled .bin
    weights are never downloaded, and a model that has no safetensors is refused. An interrupted
    download resumes when pulled again.
    """
    from ragspec.models.hub import HubError
    from ragspec.models.hub import pull as download

    try:
        folder, files = download(model_id, revision)
    except HubError as exc:
        raise click.ClickException(printable(str(exc))) from exc
    if as_json:
        click.echo(json.dumps({"id": model_id, "folder": str(folder), "files": files}))
        return
    click.echo(f"{printable(model_id)}: {len(files)} files in {printable(str(folder))}")
    click.echo(f"use it with: ragspec ask QUESTION --model {printable(model_id)}")


COMMANDS = [pull]
