"""What several commands share: click options, the model loader with progress notes, the
store opener, and the generation config built from options. Errors become one clear line
(click.ClickException, exit status 1; click.UsageError, exit status 2)."""

from __future__ import annotations

import click

from ragspec import paths

# Only dependency-free modules at import time: LangChain, FAISS and torch load when a command
# runs, so `ragspec --help` stays fast.
from ragspec.retrieval.errors import RetrievalError
from ragspec.retrieval.records import SEARCH_MODES
from ragspec.search import DEFAULT_MIN_SCORE, DEFAULT_SEARCH
from ragspec.terminal import printable

index_option = click.option(
    "--index", "index", metavar="DIR", default=None,
    type=click.Path(file_okay=False, dir_okay=True),
    help="Index directory (default: $RAGSPEC_HOME/index).",
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


def model_options(f):
    """--model/--device/--exact, shared by the commands that load the generator."""
    f = click.option("--exact", is_flag=True,
                     help="fp32 weights everywhere: no bf16 on a GPU, no 4-bit decode steps on "
                          "a CPU even with RAGSPEC_INT4=1 (greedy output then matches "
                          "model.generate token for token).")(f)
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
                           max_draft: int = 16, quiet: bool = False):
    """Load as ragspec.loading.load_generator does, with progress notes on stderr and errors as one
    clear line.
    A model that cannot speculate (its layers cannot be rolled back) is said so once."""
    from ragspec.decoding.calibrate import COSTS_FILE
    from ragspec.decoding.model import BUNDLED, ModelNotFound, load_model
    from ragspec.loading import generator_for

    cache = paths.models_dir()

    def converting(gguf) -> None:
        if not quiet:
            what = "the bundled model" if model_spec in (None, "", BUNDLED) else str(gguf)
            click.echo(f"Converting {printable(what)} once (tens of seconds, longer for large "
                       f"files)...", err=True)

    try:
        loaded = load_model(model_spec, cache, device=device, exact=exact, on_convert=converting)
    except ModelNotFound as exc:
        raise click.ClickException(printable(str(exc))) from exc
    if not quiet and loaded.speculation_note:
        click.echo(loaded.speculation_note, err=True)
    elif not quiet and not (cache / COSTS_FILE).is_file():
        click.echo("Measuring this machine's forward cost once (a few seconds)...", err=True)
    return loaded, generator_for(loaded, cache, max_draft)


def open_store(index: str | None, *, with_embedder: bool = True,
               require_documents: bool = False):
    """ragspec.loading.open_store with problems as one clear line; require_documents refuses an
    empty index (commands that answer from it)."""
    from ragspec import loading

    try:
        store = loading.open_store(index, with_embedder=with_embedder)
    except RetrievalError as exc:
        raise click.ClickException(str(exc)) from exc
    if require_documents and store.passage_count() == 0:
        raise click.ClickException(
            f"no documents in the index at {store.index_dir}: add some with "
            f"`ragspec ingest PATH...` first"
        )
    return store
