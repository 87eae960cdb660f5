"""4-bit decode weights against fp32 weights, side by side in one process (CPU).

Usage:  PYTHONPATH=. python scripts/bench_weights.py --corpus DIR --questions FILE.jsonl
            [--limit N] [--max-new-tokens 128] [--json]

Loads the model twice (fp32 weights everywhere, as `--exact` runs it; and the default, whose
decode and verify steps run 4-bit linears), each with its own forward-cost curve, builds every
question's prompt with the real pipeline, then runs greedy and ragspec on both, question by
question in a rotated order. Prints the median end-to-end tokens/s of each, the per-question
ratio 4-bit / fp32 (median and minimum), whether speculation kept each variant's greedy output,
and how far 4-bit greedy output agrees with fp32 greedy output (the 4-bit weights are another
model: an answer may differ from the fp32 one after some tokens).
This is the measurement behind the CPU default (ragspec.decoding.model.wants_int4).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile

import click

VARIANTS = ("fp32", "int4")
METHODS = ("greedy", "ragspec")


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def measure(corpus: str, questions_file: str, limit: int | None, max_new_tokens: int) -> dict:
    from ragspec.bench.runner import Runner, load_questions, prepare_prompts, warm_up
    from ragspec.decoding.model import load_model
    from ragspec.loading import generator_for, model_cache_dir, open_store
    from ragspec.retrieval.ingest import ingest_paths

    cache = model_cache_dir()
    runners = {}
    for variant in VARIANTS:
        loaded = load_model(None, cache, int4=variant == "int4")
        runners[variant] = Runner(generator_for(loaded, cache))
    questions = load_questions(questions_file, limit)
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ragspec-weights-") as scratch:
        store = open_store(scratch)
        ingest_paths([corpus], store)
        prepared = prepare_prompts(runners["fp32"].gen, store, questions, max_new_tokens, failures)
    for runner in runners.values():
        warm_up(runner, prepared[0])
    order = [(v, m) for v in VARIANTS for m in METHODS]
    rows = []
    for i, item in enumerate(prepared):
        runs = {}
        for v, m in order[i % len(order):] + order[:i % len(order)]:
            runs[(v, m)] = runners[v].run(m, item.prompt_ids, max_new_tokens, sources=item.sources)
            click.echo(f"{item.question.id} {v} {m} {len(runs[(v, m)].token_ids) / runs[(v, m)].seconds:.1f} tok/s",
                       err=True)
        rows.append({
            "id": item.question.id, "kind": item.question.kind,
            "tok_s": {f"{v}_{m}": len(r.token_ids) / r.seconds for (v, m), r in runs.items()},
            "identical": {v: runs[(v, "ragspec")].token_ids == runs[(v, "greedy")].token_ids
                          for v in VARIANTS},
            "agree_tokens": _common_prefix(runs[("int4", "greedy")].token_ids,
                                           runs[("fp32", "greedy")].token_ids),
            "tokens": len(runs[("fp32", "greedy")].token_ids),
        })
    return {"rows": rows, "failures": failures, "summary": summarize(rows)}


def summarize(rows: list[dict]) -> dict:
    def med(key, kind=None):
        vals = [r["tok_s"][key] for r in rows if kind in (None, r["kind"])]
        return statistics.median(vals) if vals else None

    out = {}
    for kind in (None, "copy", "open"):
        label = kind or "all"
        out[label] = {key: med(key, kind) for key in rows[0]["tok_s"]}
    ratios = {m: [r["tok_s"][f"int4_{m}"] / r["tok_s"][f"fp32_{m}"] for r in rows] for m in METHODS}
    out["int4_over_fp32"] = {m: {"median": statistics.median(v), "min": min(v)}
                             for m, v in ratios.items()}
    out["speculation_over_greedy_min"] = {
        v: min(r["tok_s"][f"{v}_ragspec"] / r["tok_s"][f"{v}_greedy"] for r in rows)
        for v in VARIANTS}
    out["identical"] = {v: sum(r["identical"][v] for r in rows) for v in VARIANTS}
    out["same_answer_int4_fp32"] = sum(r["agree_tokens"] == r["tokens"] for r in rows)
    out["median_agreeing_prefix"] = statistics.median(r["agree_tokens"] for r in rows)
    out["questions"] = len(rows)
    return out


@click.command()
@click.option("--corpus", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--questions", "questions_file", required=True, type=click.Path(exists=True))
@click.option("--limit", type=click.IntRange(min=1), default=None)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the whole result as JSON.")
def main(corpus: str, questions_file: str, limit: int | None, max_new_tokens: int,
         as_json: bool) -> None:
    """4-bit decode weights vs fp32 weights, greedy and ragspec, side by side."""
    result = measure(corpus, questions_file, limit, max_new_tokens)
    if as_json:
        json.dump(result, sys.stdout, indent=1)
        return
    s = result["summary"]
    for label in ("all", "copy", "open"):
        cells = "  ".join(f"{k} {v:.1f}" for k, v in s[label].items() if v is not None)
        click.echo(f"median tok/s ({label}): {cells}")
    for m, r in s["int4_over_fp32"].items():
        click.echo(f"int4/fp32 {m}: median {r['median']:.2f}x, min {r['min']:.2f}x")
    click.echo("ragspec/greedy minimum per question: "
               + ", ".join(f"{v} {x:.2f}x" for v, x in s["speculation_over_greedy_min"].items()))
    click.echo(f"speculation kept greedy output: {s['identical']} of {s['questions']}")
    click.echo(f"int4 greedy == fp32 greedy on {s['same_answer_int4_fp32']} of {s['questions']}; "
               f"median agreeing prefix {s['median_agreeing_prefix']} tokens")
    for f in result["failures"]:
        click.echo(f"failed: {f}", err=True)


if __name__ == "__main__":
    main()
