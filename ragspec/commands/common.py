"""What several commands share: click options, the model loader with progress notes, the
store opener, and the generation config built from options. Errors become one clear line
(click.ClickException, exit status 1; click.UsageError, exit status 2)."""

from __future__ import annotations

import json
import os

import click

from ragspec import paths

# Only dependency-free modules at import time: LangChain, FAISS and torch load when a command
# runs, so `ragspec --help` stays fast.
from ragspec.retrieval.errors import RetrievalError
from ragspec.retrieval.records import SEARCH_MODES
from ragspec.search import DEFAULT_MIN_SCORE, DEFAULT_SEARCH
from ragspec.terminal import printable

index_option = click.option(
    "--index", "index", metavar="INDEX", default=None,
    help="Index: a folder (default: $RAGSPEC_HOME/index), milvus:PATH.db (Milvus Lite) or "
         "milvus://HOST:PORT/COLLECTION (a Milvus server; token in RAGSPEC_MILVUS_TOKEN).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON to stdout.")
# For the commands that ingest a corpus into a scratch index (bench, eval).
corpus_option = click.option(
    "--corpus", required=True, metavar="DIR",
    type=click.Path(exists=True, file_okay=False, dir_okay=True),
    help="Folder of documents to ingest and answer from.")
limit_option = click.option("--limit", default=None, type=click.IntRange(min=1), metavar="N",
                            help="Only the first N questions.")
reuse_index_option = click.option(
    "--index", default=None, metavar="DIR", type=click.Path(file_okay=False, dir_okay=True),
    help="Reuse this index (the corpus is ingested into it; unchanged files are skipped) "
         "instead of a temporary one.")
search_mode_option = click.option(
    "--search-mode", "search_mode", type=click.Choice(SEARCH_MODES), default=DEFAULT_SEARCH,
    show_default=True,
    help="dense: embedding similarity only; hybrid: fused with BM25 keyword ranking, which "
         "finds exact names, codes and numbers.",
)
min_score_option = click.option(
    "--min-score", type=click.FloatRange(0, 1), default=DEFAULT_MIN_SCORE, show_default=True,
    help="Relevance floor: when no passage reaches this cosine similarity, say that the "
         "documents do not appear to hold the answer and show the closest passages instead of "
         "generating (0 = off).",
)


PROMPT_CACHE_ENV = "RAGSPEC_PROMPT_CACHE_MB"  # = ragspec.decoding.prefix_cache.ENV, without torch


def _set_prompt_cache(ctx, param, value):
    if value is not None:  # read where the generator is made (prefix_cache.budget_bytes)
        os.environ[PROMPT_CACHE_ENV] = str(value)
    return value


def prompt_cache_option(f):
    """--prompt-cache-mb N: the prompt cache's budget for the generators this command makes."""
    return click.option(
        "--prompt-cache-mb", type=click.IntRange(min=0), default=None, metavar="MB",
        expose_value=False, is_eager=True, callback=_set_prompt_cache,
        help="Memory for the keys and values of prompts already read, so a prompt that starts "
             "like an earlier one reads only the rest (exact: used only where a prompt read "
             "in pieces equals one read whole). 0 turns it off; default: min(RAM/16, 8 "
             "contexts of the model).")(f)


def model_options(f):
    """--model/--weights/--device/--exact/--prompt-cache-mb, shared by the commands that load
    the generator."""
    from ragspec.models.weights import WEIGHTS

    f = prompt_cache_option(f)
    f = click.option("--exact", is_flag=True,
                     help="On a GPU: fp32 instead of bf16, so greedy output matches "
                          "model.generate token for token (on a CPU it always does).")(f)
    f = click.option("--weights", type=click.Choice(WEIGHTS), default="auto", show_default=True,
                     help="What the model's layers compute with. gguf: a GGUF file's own "
                          "quantisation, kept packed; int8/int4/bf16: the model quantised once "
                          "into the model cache; fp32: de-quantised weights in transformers' "
                          "layers. auto: gguf for a .gguf file and int8 for a model folder on a "
                          "CPU, fp32 (bf16) on a GPU.")(f)
    f = click.option("--device", default=None, metavar="DEV",
                     help="torch device (default: cuda if available, else cpu).")(f)
    f = click.option("--model", "model_spec", default=None, metavar="M",
                     help="Hugging Face model folder or cached id (default: the bundled "
                          "SmolLM2-135M-Instruct).")(f)
    return f


def _check_url(ctx, param, value):
    if value is not None and not value.startswith(("http://", "https://")):
        raise click.BadParameter(f"want a server's http(s) URL, like http://127.0.0.1:8000/v1; "
                                 f"got {value!r}")
    return value


def generator_option(f):
    """--generator URL: generate on an OpenAI-compatible server instead of in this process."""
    return click.option(
        "--generator", "generator_url", default=None, metavar="URL", callback=_check_url,
        help="Generate on an OpenAI-compatible server (vLLM, llama.cpp's server, ragspec "
             "serve, ...): its /v1 base URL, e.g. http://127.0.0.1:8000/v1, or URL#MODEL to "
             "pick a model id. API key from RAGSPEC_GENERATOR_KEY. Retrieval stays here.")(f)


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
    f = click.option("--top-p", default=1.0, show_default=True,
                     type=click.FloatRange(0, 1, min_open=True),
                     help="Nucleus sampling mass (1 = off).")(f)
    f = click.option("--temperature", default=0.0, show_default=True,
                     type=click.FloatRange(min=0),
                     help="0 = greedy (identical to the model alone); > 0 samples.")(f)
    return f


def build_config(max_new_tokens, temperature, top_p, top_k, seed, no_spec, no_adaptive,
                 max_ngram, max_draft, stop=()):
    from ragspec.decoding.types import DraftConfig, GenerationConfig, SamplingConfig

    try:
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            stop_strings=tuple(stop),
            sampling=SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
            draft=DraftConfig(enabled=not no_spec, max_ngram=max_ngram, min_ngram=1,
                              max_draft=max_draft, adaptive=not no_adaptive),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def generator_from_options(model_spec: str | None, device: str | None = None, exact: bool = False,
                           max_draft: int = 16, quiet: bool = False, weights: str = "auto",
                           generator_url: str | None = None,
                           prompt_cache_bytes: int | None = None, measure_later: bool = False):
    """Load as ragspec.loading.load_generator does, with progress notes on stderr and errors as one
    clear line.
    A model that cannot speculate (its layers cannot be rolled back) is said so once.
    generator_url: connect to that server instead (ragspec.remote); --model must be unset.
    measure_later: as for ragspec.loading.generator_for (the caller then runs
    `finish_measuring` after its answer)."""
    if generator_url is not None:
        from ragspec.remote import RemoteGeneratorError, connect

        if model_spec is not None:
            raise click.UsageError("--model and --generator exclude each other: the server "
                                   "has its model (pick one with URL#MODEL)")
        try:
            return connect(generator_url)
        except RemoteGeneratorError as exc:
            raise click.ClickException(printable(str(exc))) from exc
    from ragspec.decoding import native
    from ragspec.loading import generator_for
    from ragspec.models.load import BUNDLED, ModelNotFound, load_model

    cache = paths.models_dir()

    def converting(gguf) -> None:
        if not quiet:
            what = "the bundled model" if model_spec in (None, "", BUNDLED) else str(gguf)
            click.echo(f"Converting {printable(what)} once (tens of seconds, longer for large "
                       f"files)...", err=True)

    if not quiet and weights != "fp32" and native.needs_build(cache):
        click.echo(f"Building ragspec's CPU kernels for this machine once, into "
                   f"{native.build_folder().parent} (1-2 minutes on an idle 2-core machine, "
                   f"several when it is busy)...", err=True)
    try:
        loaded = load_model(model_spec, cache, device=device, exact=exact, weights=weights,
                            on_convert=converting)
    except ModelNotFound as exc:
        raise click.ClickException(printable(str(exc))) from exc
    if not quiet and loaded.speculation_note:
        click.echo(loaded.speculation_note, err=True)
    note = None if quiet else (lambda line: click.echo(line, err=True))
    return loaded, generator_for(loaded, cache, max_draft, on_note=note,
                                 prompt_cache_bytes=prompt_cache_bytes,
                                 measure_later=measure_later)


def measuring_later(gen) -> bool:
    """True when `gen` (from a measure_later load) has no measured curve yet: the caller runs
    `finish_measuring` after its answer. Ask before the first generation (the scheduler may
    begin the measurement itself right after it)."""
    return bool(getattr(gen, "provisional", False) and getattr(gen, "recalibration_due", False))


def finish_measuring(gen, scheduler=None, quiet: bool = False) -> None:
    """After a command's answer is out: measure the forward-cost curve that `measuring_later`
    said is missing (within calibrate.MEASURE_SECONDS, overrun by at most one forward), so
    the next run has it; a line before and one after. The scheduler the answer ran on closes
    first: it begins the measurement itself between generations, and it is waited for."""
    from ragspec.decoding import calibrate

    if not quiet:
        click.echo(f"Measuring this machine's forward cost for the next runs (at most "
                   f"{calibrate.MEASURE_SECONDS:.0f} s)...", err=True)
    if scheduler is not None:
        scheduler.close(timeout=4 * calibrate.MEASURE_SECONDS)
    gen.recalibrate_if_due()  # nothing to do when the scheduler measured, trusted or not
    if quiet:
        return
    if gen.provisional:
        click.echo("The machine was too busy to measure it: the next run tries again (or run "
                   "`ragspec calibrate` when the machine is idle).", err=True)
    else:
        click.echo(f"Measured; cached in {paths.models_dir() / calibrate.COSTS_FILE}.", err=True)


def open_store(index: str | None, *, with_embedder: bool = True,
               require_documents: bool = False):
    """ragspec.loading.open_store with problems as one clear line; require_documents refuses an
    empty index (commands that answer from it)."""
    from ragspec import loading

    try:
        store = loading.open_store(index, with_embedder=with_embedder)
    except RetrievalError as exc:
        raise click.ClickException(str(exc)) from exc
    except ValueError as exc:  # a malformed Milvus location
        raise click.UsageError(str(exc)) from exc
    if require_documents and store.passage_count() == 0:
        raise click.ClickException(
            f"no documents in the index at {store.index_dir}: add some with "
            f"`ragspec ingest PATH...` first"
        )
    return store


def readable_json(value) -> str:
    """`value` as JSON for a person at a terminal as much as for a program: objects indented,
    one key a line, so `| head` shows the first keys (the answer); lists of plain values
    (token ids, boxes' coordinates, ranges) kept on one line each."""

    def encode(v, depth: int) -> str:
        pad = "  " * depth
        if isinstance(v, dict) and v:
            items = [f'{pad}  {json.dumps(str(k), ensure_ascii=False)}: {encode(x, depth + 1)}'
                     for k, x in v.items()]
            return "{\n" + ",\n".join(items) + f"\n{pad}}}"
        if isinstance(v, list) and any(isinstance(x, dict | list) for x in v):
            items = [f"{pad}  {encode(x, depth + 1)}" for x in v]
            return "[\n" + ",\n".join(items) + f"\n{pad}]"
        return json.dumps(v, ensure_ascii=False)

    return encode(value, 0)
