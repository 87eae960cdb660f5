"""`ragspec bench`: time ragspec against greedy, transformers' prompt lookup and an oracle drafter.

The logic lives in ragspec.bench.runner (running), ragspec.bench.summary (aggregating) and ragspec.bench.plot
(the figure); this module parses options and reports. Progress goes to stderr, results to
stdout (a table, or the results object with --json). Exit status: 0 on success, 1 when some
input failed (the questions file, a corpus file, a question's prompt; each is named), 2 on bad
usage.
"""

from __future__ import annotations

import json
import sys

import click

from ragspec.bench import runner as core
from ragspec.bench import sessions as sessions_core
from ragspec.bench import summary as summary
from ragspec.bench.anchors.llama_server import SERVER_METHODS
from ragspec.bench.anchors.llamacpp import LLAMACPP_METHODS
from ragspec.commands.common import corpus_option, limit_option, prompt_cache_option
from ragspec.models.weights import WEIGHTS
from ragspec.retrieval.trim import DEFAULT_TRIM


def build_setup(model, corpus, index, questions, max_new_tokens, llamacpp=None, weights="auto",
                methods=None, llama_server=None, trim=None) -> core.Setup:
    """ragspec.bench.runner.build_setup with errors as one clear line (tests replace this)."""
    from ragspec.models.load import ModelNotFound
    from ragspec.retrieval.errors import RetrievalError

    try:
        return core.build_setup(model, corpus, index, questions, max_new_tokens,
                                log=lambda message: click.echo(message, err=True),
                                llamacpp=llamacpp, weights=weights, methods=methods,
                                llama_server=llama_server, trim=trim)
    except (ModelNotFound, RetrievalError, core.BenchInputError) as exc:
        raise click.ClickException(str(exc)) from exc


@click.command("bench")
@corpus_option
@click.option("--questions", "questions_file", required=True, metavar="FILE.jsonl",
              type=click.Path(exists=True, dir_okay=False),
              help='One {"id", "question", "kind": "copy"|"open"} object per line.')
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1),
              help="New tokens per answer (every method stops there or at EOS).")
@click.option("--model", default=None, metavar="M",
              help="Model folder, .gguf file or Hugging Face id in the local cache (default: "
                   "bundled).")
@limit_option
@click.option("--index", default=None, metavar="INDEX",
              help="Reuse this index (a folder, milvus:PATH.db or "
                   "milvus://HOST:PORT/COLLECTION; the corpus is ingested into it, unchanged "
                   "files are skipped) instead of a temporary one.")
@click.option("--out", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="Write results.json here.")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png",
              type=click.Path(dir_okay=False),
              help="Write a PNG: speedup per question per method, accepted-length histogram.")
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(min=1),
              metavar="N",
              help="Run every method N times per question and keep each one's fastest run "
                   "(steadier numbers on a shared machine; N times as long).")
@click.option("--llamacpp/--no-llamacpp", default=None,
              help="Also run llama.cpp on the same GGUF file (llamacpp, llamacpp_pld); default: "
                   "when llama-cpp-python is installed (`make bench-anchors`) and the model "
                   "comes from a GGUF file.")
@click.option("--llama-server/--no-llama-server", "llama_server", default=None,
              help="Also run llama-server (mainline llama.cpp, a native build) on the same GGUF "
                   "file and prompt ids: greedy and each n-gram speculation mode "
                   f"({', '.join(SERVER_METHODS)}); default: when `make bench-anchors` built it "
                   "and the model comes from a GGUF file.")
@click.option("--methods", default=None, metavar="M,M...",
              help="Run only these methods (and their baselines; greedy always). Without a "
                   "method's reference (hf_greedy for greedy) its identity is not checked.")
@click.option("--weights", type=click.Choice(WEIGHTS), default="auto", show_default=True,
              help="The engine's weights (see `ragspec ask --help`); with packed weights the "
                   "transformers baselines run the de-quantised fp32 model.")
@click.option("--json", "as_json", is_flag=True, help="Print the results object to stdout.")
@click.option("--sessions", "sessions", is_flag=True,
              help="Ask the questions as chat sessions instead, one per document (their "
                   '"source"), in order, each turn after the ones before it, every session with '
                   "the prompt cache off and then on; per turn: the first token's time, the "
                   "whole answer's, the share of the prompt the cache supplied and whether the "
                   "answer is identical to the cache-off one. --limit counts sessions. With "
                   "--llama-server, llama-server reads the same prompt ids of the same GGUF "
                   "file, every turn with its prompt cache on (its default) and then off, and "
                   "the summary says how many of its answers the cache changed.")
@click.option("--session-order", type=click.Choice(sessions_core.ORDERS), default="rank",
              show_default=True,
              help="With --sessions: rank (every turn in rank order, as the product builds "
                   "it) or keep (passages the previous turn had keep their places: "
                   "PipelineConfig.keep_places).")
@click.option("--no-cache-off", "cache_off", flag_value=False, default=True,
              help="With --sessions: skip the run with the prompt cache off (no identity "
                   "check; half the time, for comparing orders).")
@click.option("--trim", default=DEFAULT_TRIM, show_default=True, type=click.IntRange(min=0),
              help="Prompt tokens each passage may take, as `ragspec ask --trim` (0: whole "
                   "passages, the prompts of runs before trimming).")
@prompt_cache_option
def bench(corpus: str, questions_file: str, max_new_tokens: int, model: str | None,
          limit: int | None, index: str | None, out: str | None, plot_path: str | None,
          repeats: int, llamacpp: bool | None, llama_server: bool | None, methods: str | None,
          weights: str, as_json: bool, sessions: bool, session_order: str,
          cache_off: bool, trim: int) -> None:
    """Benchmark ragspec against greedy decoding, transformers' prompt lookup and an oracle.

    Ingests DIR, builds each question's prompt with the real pipeline, then runs on every
    question, interleaved and after a warm-up: greedy (the engine, no speculation), ragspec,
    hf_greedy (model.generate as transformers runs it: fp32, its own attention), hf_pld
    (model.generate with prompt_lookup_num_tokens=10), oracle (the engine drafting the true
    greedy continuation) and, with llama-cpp-python installed, llamacpp and llamacpp_pld (the
    same GGUF file), and with llama-server built, llama_server (greedy) and its n-gram modes
    (the same file, the same prompt ids, timed on this process's clock; each anchor's build
    flags are printed). Every question's time is split into the first token and the decode
    phase after it. Speedups are tokens/s (prefill included) over each tool's own greedy on the
    same question; the ratios compare ragspec with llama.cpp and transformers directly. Every
    method ends an answer where `ragspec ask` would (end of text, the length limit, or the
    answer starting to repeat itself), and every figure is also given over the answers that did
    not loop, with the number left out.
    """
    if sessions:
        _sessions(corpus, questions_file, max_new_tokens, model, limit, index, out, weights,
                  as_json, session_order, cache_off, trim, llama_server=bool(llama_server))
        return
    chosen = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
    try:
        if chosen is not None:  # unknown names fail before the model loads
            core.select_methods(chosen, core.METHODS + LLAMACPP_METHODS + SERVER_METHODS)
    except core.BenchInputError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        questions = core.load_questions(questions_file, limit)
    except core.BenchInputError as exc:
        raise click.ClickException(str(exc)) from exc
    if llamacpp is None and chosen is not None and not set(chosen) & set(LLAMACPP_METHODS):
        llamacpp = False  # none of its methods will run: do not load llama.cpp at all
    setup = build_setup(model, corpus, index, questions, max_new_tokens, llamacpp, weights,
                        chosen, llama_server, trim)
    try:
        for failure in setup.failures:
            click.echo(f"warning: {failure}", err=True)
        if not setup.prepared:
            raise click.ClickException("no question could be prepared; nothing to benchmark")
        try:
            runner = core.Runner(setup.generator, anchors=setup.anchors, methods=chosen,
                                 stock_model=setup.stock_model, servers=setup.servers)
        except core.BenchInputError as exc:
            raise click.UsageError(str(exc)) from exc
        entries = _run_with_progress(runner, setup, max_new_tokens, repeats)
    finally:
        setup.close()
    results = summary.build_results(
        setup.model_name, setup.device, max_new_tokens, entries, repeats,
        llamacpp_build=None if setup.anchors is None else setup.anchors.compiled_for,
        llama_server_build=None if setup.servers is None else setup.servers.build)
    _report(results, setup, out, plot_path, as_json)
    if setup.failures:
        click.echo(f"{len(setup.failures)} input(s) failed: "
                   + "; ".join(setup.failures), err=True)
        sys.exit(1)


def _sessions(corpus: str, questions_file: str, max_new_tokens: int, model: str | None,
              limit: int | None, index: str | None, out: str | None, weights: str,
              as_json: bool, order: str, compare: bool = True, trim: int = DEFAULT_TRIM,
              llama_server: bool = False) -> None:
    """`bench --sessions` (ragspec.bench.sessions): set up, run, write and print; with
    llama_server (`--llama-server`), llama-server on the same GGUF file and prompt ids too."""
    import os
    import tempfile
    import time

    from ragspec.bench import provenance
    from ragspec.bench.prepare import ingest_corpus, open_servers
    from ragspec.decoding.repetition import RepetitionGuard
    from ragspec.decoding.types import ANSWER_REPEAT, GenerationConfig
    from ragspec.loading import describe_device, load_generator, open_store
    from ragspec.models.load import ModelNotFound
    from ragspec.pipeline import PipelineConfig
    from ragspec.retrieval.errors import RetrievalError

    try:
        groups = sessions_core.group_sessions(core.load_questions(questions_file), limit)
    except core.BenchInputError as exc:
        raise click.ClickException(str(exc)) from exc
    if not groups:
        raise click.ClickException(f'no question of {questions_file} names its "source": '
                                   "nothing to group into sessions")
    log = lambda line: click.echo(line, err=True)  # noqa: E731
    load_before = sessions_core.load_now()
    try:
        loaded, generator = load_generator(model, weights=weights, on_note=log)
        with tempfile.TemporaryDirectory(prefix="ragspec-bench-") as scratch:
            store = open_store(index or scratch)
            log(f"Ingesting {corpus} ...")
            failures = ingest_corpus(store, corpus)
            config = GenerationConfig(max_new_tokens=max_new_tokens)
            servers = (open_servers(model, True, generator.context_length, ["llama_server"],
                                    log) if llama_server else None)
            try:
                ran = sessions_core.run_sessions(
                    store, generator, groups, config, order=order, compare=compare,
                    pipeline_config=PipelineConfig(max_new_tokens=max_new_tokens, trim=trim),
                    progress=lambda line: log(f"session {line}"), keep_prompts=bool(servers))
                if servers is not None:
                    sessions_core.run_llama_sessions(
                        servers, ran, max_new_tokens, set(generator.eos_token_ids),
                        lambda: RepetitionGuard(ANSWER_REPEAT.stop_ngram,
                                                ANSWER_REPEAT.stop_count).push,
                        progress=lambda line: log(f"session {line}"))
            finally:
                if servers is not None:
                    servers.close()
    except (ModelNotFound, RetrievalError, core.BenchInputError) as exc:
        raise click.ClickException(str(exc)) from exc
    run = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "load_before": load_before, "load_after": sessions_core.load_now(),
           "model": loaded.name, "device": describe_device(loaded),
           "environment": provenance.settings(),
           "prompt_read": sessions_core.prompt_read(generator.model), "order": order, "cache_off_run": compare,
           "trim": trim,
           "max_new_tokens": max_new_tokens, "questions": questions_file,
           "summary": sessions_core.summarize(ran), "sessions": ran, "failures": failures}
    if servers is not None:
        run["llama_server"] = {"build": servers.build, "argv": getattr(servers, "argv", None),
                               "summary": sessions_core.summarize_llama(ran)}
    machine = f"{provenance.machine()}; {describe_device(loaded)}"
    command = "ragspec " + " ".join(sys.argv[1:]) if sys.argv else "ragspec bench --sessions"
    previous = None
    if out and os.path.exists(out):
        try:
            with open(out, encoding="utf-8") as fh:
                previous = json.load(fh)
        except (OSError, ValueError):
            previous = None
    results = sessions_core.results(command, provenance.commit(), machine, run, previous)
    if out:
        _write(out, lambda path: open(path, "w", encoding="utf-8").write(
            json.dumps(results, indent=1, ensure_ascii=False) + "\n"))
    if as_json:
        click.echo(json.dumps(results, indent=1, ensure_ascii=False))
        return
    click.echo(sessions_core.format_summary(run))


def _run_with_progress(runner: core.Runner, setup: core.Setup, max_new_tokens: int,
                       repeats: int) -> list[dict]:
    total = len(setup.prepared) * len(runner.methods) * repeats
    with click.progressbar(length=total, label="Benchmarking", show_pos=True, show_eta=True,
                           item_show_func=lambda item: item,
                           file=click.get_text_stream("stderr")) as bar:
        bar.update(0, "warm-up")
        return core.run_bench(runner, setup.prepared, max_new_tokens,
                              progress=lambda q, m: bar.update(1, f"{q.id} {m}"),
                              repeats=repeats)


def _report(results: dict, setup: core.Setup, out: str | None, plot_path: str | None,
            as_json: bool) -> None:
    if out:
        _write(out, lambda path: open(path, "w", encoding="utf-8").write(
            json.dumps(results, indent=1, ensure_ascii=False) + "\n"))
    if plot_path:
        from ragspec.bench.plot import plot

        _write(plot_path, lambda path: plot(results, path))
    if as_json:
        click.echo(json.dumps(results, indent=1, ensure_ascii=False))
        return
    repeats = results["repeats"]
    click.echo(f"{setup.model_name} on {setup.device}, {results['max_new_tokens']} new tokens, "
               f"{len(results['questions'])} questions"
               + (f", fastest of {repeats} runs each" if repeats > 1 else ""))
    if "llamacpp_build" in results:
        click.echo(f"llama.cpp compiled for: {', '.join(results['llamacpp_build']) or '-'}")
    if "llama_server_build" in results:
        from ragspec.bench.anchors.build import describe

        click.echo(f"llama-server: {describe(results['llama_server_build'])}")
    click.echo(summary.format_table(results))
    click.echo(summary.format_questions(results))


def _write(path: str, writer) -> None:
    try:
        writer(path)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from exc
    click.echo(f"wrote {path}", err=True)


COMMANDS = [bench]
