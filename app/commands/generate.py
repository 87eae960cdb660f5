"""`ragspec generate`: run the speculative generator on a prompt, show which spans were drafts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from app import paths

MAX_PROMPT_FILE_BYTES = 4 * 1024 * 1024


def model_options(f):
    """--model/--device/--exact, shared by the commands that load the generator."""
    f = click.option("--exact", is_flag=True,
                     help="Keep fp32 on a GPU so greedy output matches model.generate exactly "
                          "(the CPU always runs fp32).")(f)
    f = click.option("--device", default=None, metavar="DEV",
                     help="torch device (default: cuda if available, else cpu).")(f)
    f = click.option("--model", "model_spec", default=None, metavar="M",
                     help="Hugging Face model folder or cached id (default: the bundled "
                          "SmolLM2-135M-Instruct).")(f)
    return f


def draft_options(f):
    f = click.option("--max-draft", default=16, show_default=True, type=click.IntRange(1, 64),
                     help="Most draft tokens verified in one forward.")(f)
    f = click.option("--max-ngram", default=4, show_default=True, type=click.IntRange(1, 16),
                     help="Longest suffix looked up in the context.")(f)
    f = click.option("--no-adaptive", is_flag=True,
                     help="Always draft the whole match instead of choosing the length from "
                          "acceptance and measured forward cost.")(f)
    f = click.option("--no-spec", is_flag=True,
                     help="Plain decoding (the same loop with no drafts): the baseline.")(f)
    return f


def sampling_options(f):
    f = click.option("--seed", default=None, type=int, help="Random seed for sampling.")(f)
    f = click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0),
                     help="Keep the k most likely tokens (0 = off).")(f)
    f = click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True),
                     help="Nucleus sampling mass (1 = off).")(f)
    f = click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0),
                     help="0 = greedy (identical to the model alone); > 0 samples.")(f)
    return f


def load_generator(model_spec: str | None, device: str | None = None, exact: bool = False,
                   max_draft: int = 16, quiet: bool = False):
    """The pipeline's loader, with progress notes on stderr and errors as one clear line."""
    from app.pipeline import load_generator as load
    from decoding.calibrate import COSTS_FILE
    from decoding.model import BUNDLED, ModelNotFound, is_converted

    cache = paths.models_dir()
    if not quiet and model_spec in (None, "", BUNDLED) and not is_converted(cache):
        click.echo("Converting the bundled model once (about 30 s)...", err=True)
    if not quiet and not (cache / COSTS_FILE).is_file():
        click.echo("Measuring this machine's forward cost once (a few seconds)...", err=True)
    try:
        return load(model_spec, cache, max_draft, device=device, exact=exact)
    except ModelNotFound as exc:
        raise click.ClickException(str(exc)) from exc


def build_config(max_new_tokens, temperature, top_p, top_k, seed, no_spec, no_adaptive,
                 max_ngram, max_draft, stop=()):
    from decoding.types import DraftConfig, GenerationConfig, SamplingConfig

    try:
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            stop_strings=tuple(stop),
            sampling=SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
            draft=DraftConfig(enabled=not no_spec, max_ngram=max_ngram,
                              min_ngram=min(1, max_ngram), max_draft=max_draft,
                              adaptive=not no_adaptive),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def render_spans_terminal(spans, console) -> None:
    """Print spans with accepted drafts highlighted (reverse-video green)."""
    from rich.text import Text

    text = Text()
    for span in spans:
        text.append(span.text, style="black on green" if span.drafted else "")
    console.print(text, end="")


def stats_line(stats) -> str:
    return (
        f"{stats.new_tokens} tokens in {stats.seconds:.2f} s ({stats.tokens_per_s:.1f} tok/s, "
        f"first token {stats.ttft_seconds:.2f} s) · {stats.forward_passes} forwards · drafted "
        f"{stats.drafted_tokens}, accepted {stats.accepted_tokens} "
        f"({100 * stats.accept_rate:.0f}%)"
    )


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
def generate(prompt, prompt_file, max_new_tokens, raw, stop, as_json, temperature, top_p, top_k,
             seed, no_spec, no_adaptive, max_ngram, max_draft, model_spec, device, exact):
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
    loaded, gen = load_generator(model_spec, device, exact, max_draft, quiet=as_json)

    from decoding.model import chat_prompt_ids

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
    for span in stream:
        render_spans_terminal([span], console)
    console.print()
    err = Console(stderr=True, highlight=False)
    err.print(f"[dim]{stats_line(stream.stats)} · [black on green]highlighted[/] = accepted drafts[/]")
    sys.stdout.flush()


COMMANDS = [generate]
