"""`ragspec bench-engine`: forward costs of ragspec and llama.cpp on the same GGUF files at real
model shapes, against this machine's physical bound.

The logic lives in ragspec.bench.engine (measuring) and ragspec.bench.shapes (the files); this
module parses options and reports. Progress goes to stderr, the table (or --json) to stdout.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import click

from ragspec.terminal import printable


def _names(value: str, known, what: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise click.UsageError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


@click.command("bench-engine")
@click.option("--shapes", "shape_names", default="smollm2-135m,smollm2-360m,smollm2-1.7b",
              show_default=True, metavar="S,S...",
              help="Model shapes (random weights at published configs): see --list.")
@click.option("--mixes", default="Q4_0,Q4_K_M", show_default=True, metavar="M,M...",
              help="llama.cpp quantisation mixes of the files: Q4_0, Q4_K_M, Q8_0.")
@click.option("--engines", default="ragspec,llama.cpp,ik_llama.cpp,llamacpp", show_default=True,
              metavar="E,E...",
              help="ragspec (packed weights, its kernels); llama.cpp and ik_llama.cpp (native "
                   "builds of mainline llama.cpp and of ik_llama.cpp with run-time repacking: "
                   "`make bench-anchors`); llamacpp (llama-cpp-python); each one that is not "
                   "built or installed is left out, said once.")
@click.option("--context", default=800, show_default=True, type=click.IntRange(16, 4000),
              help="Cached tokens before each measured forward, and the prefill's length.")
@click.option("--max-tokens", default=16, show_default=True, type=click.IntRange(1, 64),
              help="Measure forwards over 1..N new tokens.")
@click.option("--rounds", default=5, show_default=True, type=click.IntRange(1, 50),
              help="Times each size is measured (a low quantile is kept).")
@click.option("--dir", "folder", default=None, type=click.Path(file_okay=False),
              help="Keep the GGUF files here (default: a temporary folder, removed after).")
@click.option("--list", "list_only", is_flag=True, help="List the shapes and exit.")
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Write the JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def bench_engine(shape_names, mixes, engines, context, max_tokens, rounds, folder, list_only,
                 out, as_json):
    """Per-token cost of ragspec against llama.cpp and against this machine's physical bound.

    Writes a GGUF file of random weights for each shape and quantisation mix, then measures
    each engine on it in a subprocess of its own: resident memory, prefill of --context tokens,
    and c(k), a forward over k new tokens after --context cached ones with logits for each of
    them (what a speculative verify needs). The bound of each forward is max(weight bytes /
    read bandwidth, 2 x multiply-accumulates x k / peak fp32 GEMM FLOP/s), both measured here.
    Random weights measure cost only: acceptance comes from the bundled model (benchmarks/replay.py).

    Every engine is measured the same way: the faster of two prefills of --context tokens, and
    c(k) as one forward (one llama_decode for the llama.cpp family, through its anchor-probe,
    linked against that engine's own library) over k new tokens at --context cached ones with
    logits for all k positions read back, timed in interleaved rounds (low quantile kept).
    ik_llama.cpp runs with its run-time repacking (-rtr 1), as its users run it on a CPU.
    """
    from ragspec.bench import engine as eng
    from ragspec.bench import shapes

    if list_only:
        for name, (kind, values) in shapes.SHAPES.items():
            click.echo(f"{name:16} {kind:12} {values.get('hidden_size', values.get('n_embd'))} hidden, "
                       f"{values.get('num_hidden_layers', values.get('n_layer'))} layers")
        return
    chosen = _names(shape_names, shapes.SHAPES, "shape(s)")
    mix_list = _names(mixes, shapes.FORMATS, "mix(es)")
    engine_list = _names(engines, eng.ENGINES, "engine(s)")
    builds = _drop_missing(engine_list)
    threads = len(os.sched_getaffinity(0))
    click.echo("Measuring this machine's limits...", err=True)
    results = {"limits": eng.machine_limits(), "context": context, "threads": threads,
               "builds": builds, "files": []}
    with tempfile.TemporaryDirectory(prefix="ragspec-shapes-") as scratch:
        where = Path(folder) if folder else Path(scratch)
        where.mkdir(parents=True, exist_ok=True)
        for name in chosen:
            for mix in mix_list:
                results["files"].append(_one(eng, shapes, name, mix, where, engine_list, context,
                                             max_tokens, rounds, threads, results["limits"]))
                if not folder:
                    (where / f"{name}-{mix}.gguf").unlink(missing_ok=True)
    if out:
        Path(out).write_text(json.dumps(results, indent=1))
    if as_json:
        click.echo(json.dumps(results))
    else:
        _table(results)


def _drop_missing(engine_list: list[str]) -> dict:
    """Leave out the anchors this machine has not built or installed, saying so; the build line
    of each native one that stays."""
    from ragspec.bench.anchors import build as anchor_build
    from ragspec.bench.anchors.llamacpp import available

    if "llamacpp" in engine_list and not available():
        click.echo("llama-cpp-python is not installed (`make bench-anchors`): llamacpp left out",
                   err=True)
        engine_list.remove("llamacpp")
    builds = {}
    for name in ("llama.cpp", "ik_llama.cpp"):
        if name in engine_list:
            manifest = anchor_build.load(name)
            if manifest is None:
                click.echo(f"{name} is {anchor_build.MISSING.format(name=name)}: left out",
                           err=True)
                engine_list.remove(name)
            else:
                builds[name] = f"{name}: {anchor_build.describe(manifest)}"
                click.echo(builds[name], err=True)
    return builds


def _one(eng, shapes, name, mix, where, engine_list, context, max_tokens, rounds, threads,
         limits) -> dict:
    path = where / f"{name}-{mix}.gguf"
    if not path.is_file():
        click.echo(f"Writing {path.name}...", err=True)
        shapes.write_gguf(name, mix, path)
    macs = shapes.multiply_accumulates(name)
    entry = {"shape": name, "mix": mix, "file_mb": path.stat().st_size / 1e6, "macs": macs}
    for engine in engine_list:
        click.echo(f"{engine} on {path.name}...", err=True)
        try:
            entry[engine] = eng.measure_file(engine, path, name, mix, context, max_tokens,
                                             rounds, threads)
        except RuntimeError as exc:
            entry[engine] = {"error": str(exc)}
            click.echo(f"  failed: {printable(str(exc))}", err=True)
    weight_bytes = entry.get("ragspec", {}).get("packed_bytes") or path.stat().st_size
    entry["bound"] = [eng.roofline(weight_bytes, macs, k, limits) for k in range(1, max_tokens + 1)]
    return entry


def _table(results: dict) -> None:
    limits = results["limits"]
    best = limits[f"t{limits['cores']}"]
    click.echo(f"{limits['cpu']}, {limits['cores']} cores: read {best['read_gb_s']:.1f} GB/s, "
               f"fp32 GEMM {best['gemm_gflop_s']:.0f} GFLOP/s (1 core: "
               f"{limits['t1']['read_gb_s']:.1f} GB/s, {limits['t1']['gemm_gflop_s']:.0f} GFLOP/s)")
    click.echo(f"c(k): ms per forward over k new tokens after {results['context']} cached ones")
    click.echo("RSS/file: resident memory the loaded model added (after a first forward), over "
               "the file's size")
    for line in results.get("builds", {}).values():
        click.echo(line)
    head = (f"{'shape':15} {'mix':7} {'MB':>6} | {'engine':12} {'RSS/file':>8} {'prefill s':>9} "
            f"{'c(1)':>7} {'c(4)':>7} {'c(16)':>7} | {'bound c(1)':>10} {'c(16)':>7} {'worst c/bound':>13}")
    click.echo(head)
    for f in results["files"]:
        bound = f["bound"]
        for engine in ENGINE_ORDER:
            r = f.get(engine)
            if r is None:
                continue
            if "error" in r:
                click.echo(f"{f['shape']:15} {f['mix']:7} {f['file_mb']:>6.0f} | {engine:12} failed: "
                           f"{printable(r['error'])[:80]}")
                continue
            c = r["c"]
            worst = max(ci / bi for ci, bi in zip(c, bound, strict=False))
            cells = " ".join(f"{1000 * c[k - 1]:>7.1f}" if len(c) >= k else f"{'-':>7}"
                             for k in (1, 4, 16))
            click.echo(f"{f['shape']:15} {f['mix']:7} {f['file_mb']:>6.0f} | {engine:12} "
                       f"{r['rss_mb'] / f['file_mb']:>8.2f} {r['prefill_s']:>9.2f} {cells} | "
                       f"{1000 * bound[0]:>10.1f} {1000 * bound[-1]:>7.1f} {worst:>13.2f}")


ENGINE_ORDER = ("ragspec", "llama.cpp", "ik_llama.cpp", "llamacpp")
COMMANDS = [bench_engine]
