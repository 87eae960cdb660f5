"""`ragspec generate`: run the speculative generator on a prompt, show which spans were drafts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ragspec.commands.common import (
    build_config,
    draft_options,
    generator_from_options,
    generator_option,
    model_options,
    sampling_options,
)
from ragspec.highlights import ShownStream
from ragspec.terminal import legend, printable, render_spans, stats_line

MAX_PROMPT_FILE_BYTES = 4 * 1024 * 1024


def read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    if (prompt is None) == (prompt_file is None):
        raise click.UsageError("give exactly one of --prompt TEXT or --prompt-file FILE")
    if prompt_file is not None:
        path = Path(prompt_file)
        try:
            if path.stat().st_size > MAX_PROMPT_FILE_BYTES:
                raise click.ClickException(f"{prompt_file}: larger than 4 MiB; not a prompt")
            prompt = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise click.ClickException(f"{prompt_file}: not UTF-8 text") from exc
        except OSError as exc:
            raise click.ClickException(f"cannot read {prompt_file}: {exc.strerror}") from exc
    if not prompt.strip():
        raise click.UsageError("the prompt is empty")
    return prompt


@click.command()
@click.option("--prompt", default=None, metavar="TEXT", help="The prompt text.")
@click.option("--prompt-file", default=None, metavar="FILE", help="Read the prompt from a file.")
@click.option("--max-new-tokens", default=128, show_default=True, type=int,
              help="Stop after this many new tokens (never more).")
@click.option("--raw", is_flag=True, help="Use the prompt as is, without the chat template.")
@click.option("--stop", multiple=True, metavar="STR", help="Stop when this string appears (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@sampling_options
@draft_options
@model_options
@generator_option
def generate(prompt, prompt_file, max_new_tokens, raw, stop, as_json, temperature, top_p, top_k,
             seed, no_spec, no_adaptive, max_ngram, max_draft, model_spec, device, exact,
             weights, generator_url):
    """Generate a continuation of a prompt with n-gram speculation.

    Drafts are copied from the prompt and the output so far and verified by the model in one
    forward; with greedy decoding (the default) the output is token-for-token what the model
    alone writes. Accepted drafts are highlighted; a stats line follows on stderr.

    \b
    Example:
      ragspec generate --prompt-file data/prompts/library.txt --max-new-tokens 96
    """
    if max_new_tokens < 1:
        raise click.UsageError("--max-new-tokens must be at least 1")
    text = read_prompt(prompt, prompt_file)
    config = build_config(max_new_tokens, temperature, top_p, top_k, seed, no_spec, no_adaptive,
                          max_ngram, max_draft, stop)
    loaded, gen = generator_from_options(model_spec, device, exact, max_draft, quiet=as_json,
                                         weights=weights, generator_url=generator_url)
    if generator_url is not None:
        if raw:
            raise click.UsageError("--raw needs the model's tokenizer here; a --generator "
                                   "server applies its own chat template")
        _remote(gen, text, config, loaded.name, as_json)
        return

    from ragspec.models.load import chat_prompt_ids

    if raw:
        prompt_ids = loaded.tokenizer(text)["input_ids"]
    else:
        prompt_ids = chat_prompt_ids(loaded.tokenizer, [{"role": "user", "content": text}])
    try:
        stream = gen.stream(prompt_ids, config)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc

    if as_json:
        result = stream.result()
        out = result.to_dict()
        out["model"] = loaded.name
        out["device"] = str(loaded.device)
        click.echo(json.dumps(out))
        return

    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    shown = ShownStream()  # a drafted run waits until the next text shows where it ends
    for span in stream:
        render_spans(shown.feed(span), console)
    render_spans(shown.finish(), console)
    console.print()
    err = Console(stderr=True, highlight=False)
    err.print(f"[dim]{stats_line(stream.stats)} · {legend(stream.result().spans)}[/]")
    sys.stdout.flush()


def _remote(gen, text: str, config, model_name: str, as_json: bool) -> None:
    """Generate on a server; spans copied word for word from the prompt are shown as quoted."""
    from rich.console import Console

    from ragspec.remote import RemoteGeneratorError

    stream = gen.stream_messages([{"role": "user", "content": text}], config, [text])
    try:
        result = stream.result()
    except RemoteGeneratorError as exc:
        raise click.ClickException(printable(str(exc))) from exc
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "model": model_name, "device": "remote"}))
        return
    render_spans(result.spans, Console(highlight=False, soft_wrap=True))
    click.echo()
    Console(stderr=True, highlight=False).print(
        f"[dim]{stats_line(result.stats)} · {legend(result.spans)}[/]")


COMMANDS = [generate]
