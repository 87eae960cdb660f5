"""`ragspec eval`: answer quality per model and setting — does the answer hold the question's
answer snippet, does it loop, does it refuse what the documents do not answer.

The logic lives in ragspec.eval.evaluate (answering) and ragspec.eval.quality (measures and
table); this module parses options and reports. Progress goes to stderr, results to stdout (a
table, or the results object with --json). Exit status: 0 on success, 1 when some input failed
(the questions file, a corpus file, a question; each is named), 2 on bad usage.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile

import click

from ragspec.commands.common import (
    corpus_option,
    generator_from_options,
    limit_option,
    min_score_option,
    prompt_cache_option,
    reuse_index_option,
)
from ragspec.loading import timing_prompt_cache


def _list(kind):
    """A click callback: "a,b,c" -> [kind(a), kind(b), kind(c)]."""

    def parse(ctx, param, value):
        if value is None:
            return None
        try:
            items = [kind(v.strip()) for v in value.split(",") if v.strip()]
        except ValueError as exc:
            raise click.BadParameter(f"{value!r}: {exc}") from exc
        if not items:
            raise click.BadParameter("give at least one value")
        return items

    return parse


def _stop(text: str) -> tuple[int, int]:
    """"8x2" -> (8, 2): stop at an 8-token run written twice; "off" -> (0, 2)."""
    if text == "off":
        return 0, 2
    ngram, sep, count = text.partition("x")
    if not sep:
        raise ValueError("write NxC (an N-token run written C times) or off")
    return int(ngram), int(count)


@click.command("eval")
@corpus_option
@click.option("--questions", "questions_file", required=True, metavar="FILE.jsonl",
              type=click.Path(exists=True, dir_okay=False),
              help='One {"id", "question", "kind", "answer": snippet or [snippets], '
                   '"unanswerable": bool} object per line.')
@click.option("--model", "models", multiple=True, metavar="M",
              help="Model folder, .gguf file or cached hub id; repeat for several "
                   "(default: the bundled model).")
@click.option("--prompt", "prompts", default=None, metavar="NAME,...", callback=_list(str),
              help="Instructions to compare (names in ragspec.prompts; default: the default).")
@click.option("-k", "ks", default=None, metavar="K,...", callback=_list(int),
              help="Passages per question (default: ask's).")
@click.option("--max-new-tokens", "lengths", default=None, metavar="N,...", callback=_list(int),
              help="Answer length limits (default: ask's).")
@click.option("--stop", "stops", default=None, metavar="NxC,...", callback=_list(_stop),
              help="Stop rules: end the answer when a run of N tokens has been written C times; "
                   "'off' for none (default: ask's).")
@click.option("--repeat-penalty", "penalties", default=None, metavar="P,...",
              callback=_list(float),
              help="Repetition penalties to compare (1.0 = off, llama.cpp's rule).")
@click.option("--trim", "trims", default=None, metavar="N,...", callback=_list(int),
              help="Prompt tokens each passage may take: longer ones are cut to their sentences "
                   "nearest the question; 0 = whole passages (default: ask's). The table's last "
                   "column pairs each row's recall with the first row's, question by question.")
@click.option("--penalty-last-n", default=64, show_default=True, type=click.IntRange(min=1),
              help="Tokens of context the repetition penalty looks at.")
@click.option("--speculation", type=click.Choice(["on", "off", "both"]), default="on",
              show_default=True,
              help="both: answer with speculation off and on and count identical answers.")
@min_score_option
@limit_option
@reuse_index_option
@click.option("--out", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="Write the results object (JSON) here.")
@click.option("--json", "as_json", is_flag=True, help="Print the results object to stdout.")
@prompt_cache_option
def eval_command(corpus, questions_file, models, prompts, ks, lengths, stops, penalties, trims,
                 penalty_last_n, speculation, min_score, limit, index, out, as_json):
    """Measure answer quality on a question set, per model and setting.

    Ingests DIR, then answers every question as `ragspec ask` does (relevance floor, prompt,
    greedy generation with the stop rule) under every combination of the listed settings, and
    measures each answer: snippet recall (the share of the answer snippet's content words in
    the answer; "present" at 0.6 or more), exact containment of the snippet, loops (a run of 8
    tokens written 3 or more times), answers the stop rule ended, refusals of unanswerable
    questions and false refusals of answerable ones (docs/answer-quality.md).

    \b
    Example:
      ragspec eval --corpus docs/ --questions q.jsonl -k 2,4 --max-new-tokens 96,256
    """
    from ragspec.bench.questions import BenchInputError, load_questions
    from ragspec.eval import evaluate as ev
    from ragspec.pipeline import PipelineConfig
    from ragspec.prompts import DEFAULT_PROMPT

    default = PipelineConfig()
    try:
        settings = ev.settings_grid(
            prompts or [DEFAULT_PROMPT], ks or [default.k], lengths or [default.max_new_tokens],
            stops or [(default.repeat.stop_ngram, default.repeat.stop_count)],
            penalties or [default.repeat.penalty], penalty_last_n, trims or [default.trim])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        questions = load_questions(questions_file, limit, unanswerable=True)
    except BenchInputError as exc:
        raise click.ClickException(str(exc)) from exc
    with _store(index, corpus) as (store, failures):
        runs = []
        for spec in models or (None,):
            loaded, gen = generator_from_options(spec, quiet=as_json,
                                                 prompt_cache_bytes=timing_prompt_cache())
            total = len(settings) * len(questions)
            with click.progressbar(length=total, label=f"Evaluating {loaded.name}",
                                   show_pos=True, show_eta=True, item_show_func=lambda i: i,
                                   file=click.get_text_stream("stderr")) as bar:
                results = ev.evaluate(store, [ev.Model(loaded.name, gen)], settings, questions,
                                      speculation=speculation, min_score=min_score,
                                      progress=lambda item: bar.update(1, item))
            runs += results["runs"]
    results["runs"] = runs
    failures += [f for run in runs for f in run["failures"]]
    _report(results, out, as_json)
    if failures:
        click.echo(f"{len(failures)} input(s) failed: " + "; ".join(failures), err=True)
        sys.exit(1)


@contextlib.contextmanager
def _store(index: str | None, corpus: str):
    """(store, failed corpus files) with `corpus` ingested into `index` or a temporary index."""
    from ragspec.bench.prepare import ingest_corpus
    from ragspec.commands.common import open_store

    with tempfile.TemporaryDirectory(prefix="ragspec-eval-") as scratch:
        store = open_store(index or scratch)
        click.echo(f"Ingesting {corpus} ...", err=True)
        try:
            failures = ingest_corpus(store, corpus)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        yield store, failures


def _report(results: dict, out: str | None, as_json: bool) -> None:
    from ragspec.eval import quality

    text = json.dumps(results, indent=1, ensure_ascii=False)
    if out:
        try:
            with open(out, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError as exc:
            raise click.ClickException(f"cannot write {out}: {exc.strerror or exc}") from exc
        click.echo(f"wrote {out}", err=True)
    if as_json:
        click.echo(text)
        return
    first = results["runs"][0]["summary"] if results["runs"] else {}
    click.echo(f"{first.get('questions', 0)} questions ({first.get('answerable', 0)} with an "
               f"answer in the documents), speculation {results['speculation']}")
    click.echo(quality.format_table(results))


COMMANDS = [eval_command]
