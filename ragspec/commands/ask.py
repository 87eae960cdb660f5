"""`ragspec ask`: answer a question from the index, accepted drafts highlighted, optionally
against the speculation-off baseline."""

from __future__ import annotations

from dataclasses import replace

import click

from ragspec.citations import Citer
from ragspec.commands.common import (
    build_config,
    draft_options,
    finish_measuring,
    generator_from_options,
    generator_option,
    index_option,
    measuring_later,
    min_score_option,
    model_options,
    open_store,
    readable_json,
    sampling_options,
    search_mode_option,
)
from ragspec.highlights import ShownStream, shown_spans
from ragspec.retrieval.errors import RetrievalError
from ragspec.retrieval.trim import DEFAULT_TRIM
from ragspec.terminal import legend, printable, render_spans, stats_line


@click.command()
@click.argument("question")
@click.option("-k", "k", default=4, show_default=True, type=click.IntRange(1, 50),
              help="Passages retrieved and put into the prompt.")
@click.option("--max-new-tokens", default=256, show_default=True, type=click.IntRange(min=1),
              help="Longest answer, in tokens.")
@click.option("--trim", default=DEFAULT_TRIM, show_default=True, type=click.IntRange(min=0),
              help="Prompt tokens each passage may take: a longer one is cut to its sentences "
                   "nearest the question (exact offsets kept); 0 shows passages whole.")
@click.option("--compare", is_flag=True,
              help="Also answer with speculation off first, and print both speeds.")
@search_mode_option
@min_score_option
@index_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@sampling_options
@draft_options
@model_options
@generator_option
def ask(question, k, max_new_tokens, trim, compare, search_mode, min_score, index, as_json,
        temperature, top_p, top_k, seed, no_spec, no_adaptive, max_ngram, max_draft, model_spec,
        device, exact, weights, generator_url):
    """Answer QUESTION from your indexed documents.

    The top-k passages go into the prompt, numbered; the answer streams with the spans that were
    copied from them (accepted drafts) highlighted, followed by the passages used. When no
    passage reaches --min-score, no answer is generated (the model is not even loaded): ask says
    that the documents do not appear to hold the answer and shows the closest passages.
    --json prints {"answer": {...as generate --json...}|null, "passages": [...],
    "baseline": {...}|null, "refused": true|false, "best_score": ..., ...}, indented, the
    answer's text first and the token ids last (the prompt's at the very end); every answer span
    copied from a passage carries its "page", and from a PDF its "page_size", "rotation" and
    "boxes" ([x0, y0, x1, y1] in PDF page coordinates; null for an index ingested before boxes
    were kept: ingest the files again). An answer that
    starts repeating itself ends there (answer.stats.stop_reason "repetition", and a note in
    the text output); drafts copied from a passage are highlighted, repeats of the answer's own
    text or of the question are underlined.

    \b
    Example:
      ragspec ask "Which port does the metrics endpoint use?" --compare
    """
    if not question.strip():
        raise click.UsageError("the question is empty")
    if compare and no_spec:
        raise click.UsageError("--compare already runs without speculation; drop --no-spec")
    if compare and generator_url:
        raise click.UsageError("--compare needs the model in this process; a --generator "
                               "server speculates (or not) by its own settings")
    config = build_config(max_new_tokens, temperature, top_p, top_k, seed, no_spec, no_adaptive,
                          max_ngram, max_draft)
    store = open_store(index, require_documents=True)
    from ragspec.search import retrieve

    try:
        retrieval = retrieve(store, question, k=k, search=search_mode, min_score=min_score)
    except (RetrievalError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    if retrieval.refused:
        _print_refusal(retrieval, as_json)
        return
    loaded, gen = generator_from_options(model_spec, device, exact, max_draft, quiet=as_json,
                                         weights=weights, generator_url=generator_url,
                                         measure_later=True)
    measure_after = measuring_later(gen)  # a first run: the answer first, the measurement after

    from ragspec.pipeline import PipelineConfig
    from ragspec.remote import pipeline_for

    pipeline = pipeline_for(store, gen, PipelineConfig(k=k, max_new_tokens=max_new_tokens,
                                                       search=search_mode, min_score=min_score,
                                                       trim=trim))
    remote = getattr(gen, "remote", False)
    if not remote:
        from ragspec.decoding.scheduler import scheduler_for

        # the same scheduler the chat and `ragspec serve` generate through; one answer at a
        # time here (--compare's two runs must not share steps), each prompt read in one piece
        scheduler = scheduler_for(gen, max_active=1)
    try:
        prepared = pipeline.prepare_retrieved(retrieval)
        streams = []
        runs = [("speculation on" if compare else "", config)]
        if compare:
            runs.insert(0, ("speculation off",
                            replace(config, draft=replace(config.draft, enabled=False))))
        for label, run_config in runs:
            if remote:
                streams.append((label, pipeline.stream(prepared, run_config)))
                continue
            run_config = pipeline.answer_config(run_config)
            gen.stream(prepared.prompt_ids, run_config)  # refuses what the engine refuses, now
            streams.append((label, scheduler.submit(prepared.prompt_ids, run_config,
                                                    sources=prepared.sources)))
    except (RetrievalError, ValueError) as exc:  # a missing embedder, a question too long...
        raise click.ClickException(str(exc)) from exc
    from ragspec.remote import RemoteGeneratorError

    try:
        _print(question, prepared, streams, loaded.name, retrieval, as_json,
               config.sampling.greedy, Citer(store))
    except RemoteGeneratorError as exc:
        raise click.ClickException(printable(str(exc))) from exc
    except RuntimeError as exc:  # a generation that failed in the scheduler
        raise click.ClickException(str(exc)) from exc
    if measure_after:
        finish_measuring(gen, scheduler, quiet=as_json)


def _print(question, prepared, streams, model_name, retrieval, as_json, greedy, citer) -> None:
    if as_json:
        _print_json(question, prepared, streams, model_name, retrieval, citer)
    else:
        _print_text(prepared, streams, greedy, citer)


def _print_refusal(retrieval, as_json: bool) -> None:
    """The "not in your documents" reply: the message and the closest passages."""
    from ragspec.search import hits_to_dicts, refusal_reason

    passages = hits_to_dicts(retrieval.hits)
    if as_json:
        click.echo(readable_json({
            "answer": None, "passages": passages, "baseline": None,
            "question": retrieval.question, "standalone_question": retrieval.standalone_question,
            "model": None, **retrieval.to_dict(),
        }))
        return
    from rich.console import Console
    from rich.markup import escape

    from ragspec.describe import passage_label

    console = Console(highlight=False, soft_wrap=True)
    console.print(f"[bold]{escape(retrieval.to_dict()['message'])}[/]")
    console.print(f"[dim]{escape(refusal_reason(retrieval))} (--min-score; 0 turns the checks "
                  f"off)[/]")
    for i, (hit, p) in enumerate(zip(retrieval.hits, passages, strict=True)):
        label = printable(passage_label(i, hit.passage))
        console.print(f" {escape(label)} (char {p['start']}) score {p['score']:.2f}")
        console.print(f"   {escape(printable(' '.join(hit.passage.text.split())[:300]))}")


def _print_json(question, prepared, streams, model_name: str, retrieval, citer) -> None:
    from ragspec.describe import toggle_speedup
    from ragspec.pipeline import passages_to_dicts

    results = [s.result() for _, s in streams]
    compare = len(results) > 1
    answer = results[-1].to_dict()
    # every span copied from a passage: its page, and on a PDF page its characters' boxes
    answer["spans"] = citer.span_dicts(results[-1].spans, prepared.passages)
    out = {
        "answer": answer,
        "passages": passages_to_dicts(prepared, results[-1].spans),
        "baseline": results[0].to_dict() if compare else None,
        "question": question,
        "standalone_question": prepared.standalone_question,
        "model": model_name,
        **retrieval.to_dict(),
    }
    if compare:
        out["speedup"], out["speedup_note"] = toggle_speedup(results[0].stats, results[1].stats)
        out["identical"] = results[0].token_ids == results[1].token_ids
    click.echo(readable_json(out))


def _print_text(prepared, streams, greedy: bool, citer) -> None:
    """Stream each answer to the terminal, then the comparison and the passages used."""
    from rich.console import Console
    from rich.markup import escape

    from ragspec.describe import identical_verdict, passage_label, stop_note, toggle_speedup
    from ragspec.pipeline import passages_to_dicts

    console = Console(highlight=False, soft_wrap=True)
    results = []
    for label, stream in streams:
        if label:
            console.print(f"[bold]── {label} ──[/]")
        if getattr(stream, "remote", False):
            # A server's final spans may differ from the live ones (ragspec serve reports its
            # drafts with the last chunk): print the answer once it is complete.
            render_spans(stream.result().spans, console)
        else:
            shown = ShownStream()  # a drafted run waits until the next text shows its end
            for span in stream:
                render_spans(shown.feed(span), console)
            render_spans(shown.finish(), console)
        console.print()
        results.append(stream.result())
        console.print(f"[dim]{stats_line(results[-1].stats)}[/]")
        note = stop_note(results[-1].stats.stop_reason)
        if note:
            console.print(f"[bold]{escape(note)}[/]")
    if len(results) > 1:
        base, spec = results
        _, verdict = identical_verdict(base.token_ids, spec.token_ids, greedy)
        speedup, note = toggle_speedup(base.stats, spec.stats)
        console.print(f"speedup {speedup:.2f}×{f' ({note})' if note else ''} · {verdict}")
    console.print(f"[dim]{legend(results[-1].spans)}[/]")
    console.print("[bold]Passages[/]")
    shown = shown_spans(results[-1].spans)  # the copies as marked above (--json keeps all)
    for i, p in enumerate(passages_to_dicts(prepared, shown)):
        copied = sum(e - s for s, e in p["copied"])
        score = f" score {p['score']:.2f}" if p["score"] is not None else ""
        label = printable(passage_label(i, prepared.passages[i]))
        console.print(f" {escape(label)} (char {p['start']}){score} · {copied} characters copied")
    _print_copied(console, prepared, shown, citer)


def _print_copied(console, prepared, spans, citer) -> None:
    """Each copied span with the passage and page it came from (and whether its place on the
    PDF page is known)."""
    from rich.markup import escape

    from ragspec.describe import passage_label

    cited = [s for s in citer.span_dicts(spans, prepared.passages) if "page" in s]
    if not cited:
        return
    console.print("[bold]Copied from[/]")
    for span in cited:
        n = span["origin"]["source"]
        where = printable(passage_label(n, prepared.passages[n]))
        if span.get("section"):
            where += f" ({printable(span['section'])})"
        if span.get("boxes"):
            where += f" · {len(span['boxes'])} box(es) on the page"
        text = printable(" ".join(span["text"].split()))
        console.print(f" \"{escape(text[:80])}\" ← {escape(where)}")


COMMANDS = [ask]
