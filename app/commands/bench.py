"""`ragspec bench`: time ragspec against greedy, transformers' prompt lookup and an oracle drafter.

The logic lives in app.bench; this module loads the model, ingests the corpus, builds each
question's prompt with the real pipeline, and reports. Progress goes to stderr, results to
stdout (a table, or the results object with --json). Exit status: 0 on success, 1 when some
input failed (the questions file, a corpus file, a question's prompt; each is named), 2 on bad
usage.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field

import click

from app import paths

EMBEDDER_ENV = "RAGSPEC_EMBEDDER"  # = retrieval.embeddings.ENV_VAR, without importing it


@dataclass
class Setup:
    """What the benchmark needs, built by load_generator and prepare_prompts (tests inject it)."""

    model_name: str
    device: str
    generator: object  # decoding.engine.Generator
    prepared: list = field(default_factory=list)  # app.bench.Prepared
    failures: list[str] = field(default_factory=list)


def load_generator(model: str | None) -> tuple[object, str, str]:
    """(Generator with this machine's measured forward cost, model name, device description)."""
    from app.commands.common import generator_from_options
    from app.loading import describe_device

    lm, generator = generator_from_options(model, quiet=True)
    return generator, lm.name, describe_device(lm)


def prepare_prompts(generator, corpus: str, index: str | None, questions, max_new_tokens: int,
                    failures: list[str]) -> list:
    """Ingest the corpus (into a temporary index, or into --index where unchanged files are
    skipped by hash) and build each question's prompt with the real pipeline."""
    from app.bench import Prepared
    from app.pipeline import NoDocumentsError, Pipeline, PipelineConfig
    from decoding.types import SourceRegion
    from retrieval.embeddings import Embedder
    from retrieval.errors import RetrievalError
    from retrieval.ingest import ingest_paths
    from retrieval.store import PassageStore

    with ExitStack() as stack:
        if index is None:
            index = stack.enter_context(tempfile.TemporaryDirectory(prefix="ragspec-bench-"))
        try:
            store = PassageStore.open(paths.index_dir(index),
                                      Embedder(os.environ.get(EMBEDDER_ENV) or None))
            click.echo(f"Ingesting {corpus} ...", err=True)
            report = ingest_paths([corpus], store)
        except (RetrievalError, ValueError, RuntimeError) as exc:
            raise click.ClickException(str(exc)) from exc
        failures.extend(f"corpus file {p}: {why}" for p, why in report.failed)
        if store.passage_count() == 0:
            raise click.ClickException(f"no passages could be made from {corpus}: nothing to "
                                       "retrieve (give a folder of .md/.txt/.pdf/.html/.docx)")
        pipe = Pipeline(store, generator, PipelineConfig(k=4, max_new_tokens=max_new_tokens))
        prepared = []
        limit = generator.context_length
        for q in questions:
            try:
                p = pipe.prepare(q.question)
            except (RetrievalError, NoDocumentsError, ValueError) as exc:
                failures.append(f"question {q.id}: {exc}")
                continue
            if len(p.prompt_ids) + max_new_tokens > limit:
                failures.append(f"question {q.id}: prompt of {len(p.prompt_ids)} tokens + "
                                f"{max_new_tokens} new tokens exceeds the model's {limit}")
                continue
            regions = tuple(s for s in (p.sources or ()) if isinstance(s, SourceRegion))
            prepared.append(Prepared(q, list(p.prompt_ids), regions))
    return prepared


@click.command("bench")
@click.option("--corpus", required=True, metavar="DIR",
              type=click.Path(exists=True, file_okay=False, dir_okay=True),
              help="Folder of documents to ingest and answer from.")
@click.option("--questions", "questions_file", required=True, metavar="FILE.jsonl",
              type=click.Path(exists=True, dir_okay=False),
              help='One {"id", "question", "kind": "copy"|"open"} object per line.')
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1),
              help="New tokens per answer (every method stops there or at EOS).")
@click.option("--model", default=None, metavar="M",
              help="Model folder or Hugging Face id in the local cache (default: bundled).")
@click.option("--limit", default=None, type=click.IntRange(min=1), metavar="N",
              help="Only the first N questions.")
@click.option("--index", default=None, metavar="DIR",
              type=click.Path(file_okay=False, dir_okay=True),
              help="Reuse this index (the corpus is ingested into it; unchanged files are "
                   "skipped) instead of a temporary one.")
@click.option("--out", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="Write results.json here.")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png",
              type=click.Path(dir_okay=False),
              help="Write a PNG: speedup per question per method, accepted-length histogram.")
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(min=1),
              metavar="N",
              help="Run every method N times per question and keep each one's fastest run "
                   "(steadier numbers on a shared machine; N times as long).")
@click.option("--json", "as_json", is_flag=True, help="Print the results object to stdout.")
def bench(corpus: str, questions_file: str, max_new_tokens: int, model: str | None,
          limit: int | None, index: str | None, out: str | None, plot_path: str | None,
          repeats: int, as_json: bool) -> None:
    """Benchmark ragspec against greedy decoding, transformers' prompt lookup and an oracle.

    Ingests DIR, builds each question's prompt with the real pipeline, then runs on every
    question, interleaved and after a warm-up: greedy (the engine, no speculation), ragspec,
    hf_greedy (model.generate), hf_pld (model.generate with prompt_lookup_num_tokens=10) and
    oracle (the engine drafting the true greedy continuation). Speedups are tokens/s (prefill
    included) over greedy's on the same question; hf_pld's is over hf_greedy's.
    """
    from app import bench as core

    try:
        questions = core.load_questions(questions_file, limit)
    except core.BenchInputError as exc:
        raise click.ClickException(str(exc)) from exc
    setup = build_setup(model, corpus, index, questions, max_new_tokens)
    for failure in setup.failures:
        click.echo(f"warning: {failure}", err=True)
    if not setup.prepared:
        raise click.ClickException("no question could be prepared; nothing to benchmark")

    runner = core.Runner(setup.generator)
    total = len(setup.prepared) * len(core.METHODS) * repeats
    with click.progressbar(length=total, label="Benchmarking", show_pos=True, show_eta=True,
                           item_show_func=lambda item: item,
                           file=click.get_text_stream("stderr")) as bar:
        bar.update(0, "warm-up")
        entries = core.run_bench(runner, setup.prepared, max_new_tokens,
                                 progress=lambda q, m: bar.update(1, f"{q.id} {m}"),
                                 repeats=repeats)
    results = core.build_results(setup.model_name, setup.device, max_new_tokens, entries,
                                 repeats)

    if out:
        _write(out, lambda path: open(path, "w", encoding="utf-8").write(
            json.dumps(results, indent=1, ensure_ascii=False) + "\n"))
    if plot_path:
        _write(plot_path, lambda path: core.plot(results, path))
    if as_json:
        click.echo(json.dumps(results, indent=1, ensure_ascii=False))
    else:
        click.echo(f"{setup.model_name} on {setup.device}, {max_new_tokens} new tokens, "
                   f"{len(entries)} questions"
                   + (f", fastest of {repeats} runs each" if repeats > 1 else ""))
        click.echo(core.format_table(results))
        click.echo(core.format_targets(results))
    if setup.failures:
        click.echo(f"{len(setup.failures)} input(s) failed: "
                   + "; ".join(setup.failures), err=True)
        sys.exit(1)


def build_setup(model, corpus, index, questions, max_new_tokens) -> Setup:
    generator, name, device = load_generator(model)
    failures: list[str] = []
    prepared = prepare_prompts(generator, corpus, index, questions, max_new_tokens, failures)
    return Setup(name, device, generator, prepared, failures)


def _write(path: str, writer) -> None:
    try:
        writer(path)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from exc
    click.echo(f"wrote {path}", err=True)


COMMANDS = [bench]
