"""`ragspec ask`: answer a question from the index, accepted drafts highlighted, optionally
against the speculation-off baseline."""

from __future__ import annotations

import json
from dataclasses import replace

import click

from app import paths
from app.commands.generate import (
    build_config,
    draft_options,
    load_generator,
    model_options,
    render_spans_terminal,
    sampling_options,
    stats_line,
)


def open_store(index: str | None):
    """The index with the default embedder; errors become one clear ClickException."""
    from retrieval.embeddings import Embedder
    from retrieval.errors import RetrievalError
    from retrieval.store import PassageStore

    try:
        store = PassageStore.open(paths.index_dir(index), Embedder())
    except RetrievalError as exc:
        raise click.ClickException(str(exc)) from exc
    if store.passage_count() == 0:
        raise click.ClickException(
            f"no documents in the index at {store.index_dir}: add some with "
            f"`ragspec ingest PATH...` first"
        )
    return store


@click.command()
@click.argument("question")
@click.option("-k", "k", default=4, show_default=True, type=click.IntRange(1, 50),
              help="Passages retrieved and put into the prompt.")
@click.option("--max-new-tokens", default=256, show_default=True, type=click.IntRange(min=1),
              help="Longest answer, in tokens.")
@click.option("--compare", is_flag=True,
              help="Also answer with speculation off first, and print both speeds.")
@click.option("--index", default=None, metavar="DIR",
              help="Index directory (default: $RAGSPEC_HOME/index).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@sampling_options
@draft_options
@model_options
def ask(question, k, max_new_tokens, compare, index, as_json, temperature, top_p, top_k, seed,
        no_spec, no_adaptive, max_ngram, max_draft, model_spec, device, exact):
    """Answer QUESTION from your indexed documents.

    The top-k passages go into the prompt, numbered; the answer streams with the spans that were
    copied from them (accepted drafts) highlighted, followed by the passages used.
    --json prints {"answer": {...as generate --json...}, "passages": [...], "baseline": {...}|null}.

    \b
    Example:
      ragspec ask "Which port does the metrics endpoint use?" --compare
    """
    if not question.strip():
        raise click.UsageError("the question is empty")
    if compare and no_spec:
        raise click.UsageError("--compare already runs without speculation; drop --no-spec")
    config = build_config(max_new_tokens, temperature, top_p, top_k, seed, no_spec, no_adaptive,
                          max_ngram, max_draft)
    store = open_store(index)
    loaded, gen = load_generator(model_spec, device, exact, max_draft, quiet=as_json)

    from app.pipeline import Pipeline, PipelineConfig, passages_to_dicts
    from app.render import identical_verdict, speedup

    pipeline = Pipeline(store, gen, PipelineConfig(k=k, max_new_tokens=max_new_tokens))
    try:
        prepared = pipeline.prepare(question)
        streams = []
        if compare:
            off = replace(config, draft=replace(config.draft, enabled=False))
            streams.append(("speculation off", pipeline.stream(prepared, off)))
        streams.append(("speculation on" if compare else "", pipeline.stream(prepared, config)))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc

    if as_json:
        results = [s.result() for _, s in streams]
        out = {
            "answer": results[-1].to_dict(),
            "passages": passages_to_dicts(prepared, results[-1].spans),
            "baseline": results[0].to_dict() if compare else None,
            "question": question,
            "standalone_question": prepared.standalone_question,
            "model": loaded.name,
        }
        if compare:
            out["speedup"] = speedup(results[0].stats.seconds, results[1].stats.seconds)
            out["identical"] = results[0].token_ids == results[1].token_ids
        click.echo(json.dumps(out))
        return

    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False, soft_wrap=True)
    results = []
    for label, stream in streams:
        if label:
            console.print(f"[bold]── {label} ──[/]")
        for span in stream:
            render_spans_terminal([span], console)
        console.print()
        result = stream.result()
        results.append(result)
        console.print(f"[dim]{stats_line(result.stats)}[/]")
    if compare:
        base, spec = results
        _, verdict = identical_verdict(base.token_ids, spec.token_ids,
                                       config.sampling.greedy)
        console.print(f"speedup {speedup(base.stats.seconds, spec.stats.seconds):.2f}× · "
                      f"{verdict}")
    console.print("[dim][black on green]highlighted[/] = accepted drafts copied from the "
                  "passages[/]")
    console.print("[bold]Passages[/]")
    for p in passages_to_dicts(prepared, results[-1].spans):
        where = f", page {p['page']}" if p["page"] else ""
        copied = sum(e - s for s, e in p["copied"])
        score = f" score {p['score']:.2f}" if p["score"] is not None else ""
        console.print(f" [{p['n']}] {escape(p['source'])}{where} (char {p['start']}){score}"
                      f" · {copied} characters copied")


COMMANDS = [ask]
