"""Aggregating `ragspec bench` results: speedups per question, medians per kind of question,
and the summary as a text table. Plain dicts in (the results object's "questions" entries),
plain dicts and text out.

speedup = a method's tokens_per_s over its baseline's on the same question (BASELINE: the engine
methods over greedy, hf_pld over hf_greedy, llamacpp_pld over llamacpp: each tool against its
own plain decoding). The ratios compare ragspec with what users would otherwise run, question by
question, end to end: ragspec's tokens/s over llama.cpp's greedy and over transformers' generate.

Speed counts on answers worth reading: every median and minimum speedup and every ratio is
given over all questions and over those whose answer did not loop (an entry's "looping", see
ragspec.bench.runner; keys ending in "_non_looping"), and each kind says how many looping
answers were left out ("looping", "looping_share"). A looping answer is mostly the model
copying its own earlier text: it drafts well and reads badly.

Where a ratio comes from: every method's median time to first token (prefill and one step) and
median decode milliseconds per token after it are summarised, and `format_questions` lists
both per question for every method. With llama-server's n-gram modes in the run, "best_ngram"
is, per question, the fastest of them (the mode a user would pick with hindsight), and the
summary names the mode with the best median ("llama_server_best_mode").
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ragspec.bench.anchors.llama_server import NGRAM_METHODS
from ragspec.bench.runner import BASELINE, KINDS, METHODS


def entry_speedup(entry: dict, method: str, metric: str = "tokens_per_s") -> float | None:
    base = entry["results"][BASELINE[method]][metric]
    mine = entry["results"][method][metric]
    return mine / base if base else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def is_looping(entry: dict) -> bool:
    """Entries from before loops were recorded count as not looping."""
    return bool(entry.get("looping", False))


def _speedups(entries: list[dict], method: str) -> list[float]:
    return [s for s in (entry_speedup(e, method) for e in entries) if s is not None]


def _method_summary(entries: list[dict], method: str) -> dict:
    runs = [e["results"][method] for e in entries]
    speedups = _speedups(entries, method)
    clean = _speedups([e for e in entries if not is_looping(e)], method)
    decode = [s for s in (entry_speedup(e, method, "decode_tokens_per_s") for e in entries)
              if s is not None]
    drafted = [r["drafted_tokens"] for r in runs]
    accept_rate = None
    if runs and None not in drafted and sum(drafted) > 0:
        accept_rate = sum(r["accepted_tokens"] for r in runs) / sum(drafted)
    histogram: dict[int, int] = {}
    for r in runs:
        for length, count in r.get("accepted_lengths", {}).items():
            histogram[int(length)] = histogram.get(int(length), 0) + count
    steps = sum(histogram.values())
    return {
        "median_speedup": _median(speedups),
        "min_speedup": min(speedups) if speedups else None,
        "median_speedup_non_looping": _median(clean),
        "min_speedup_non_looping": min(clean) if clean else None,
        "median_decode_speedup": _median(decode),
        "median_tokens_per_s": _median([r["tokens_per_s"] for r in runs]),
        "median_ttft_seconds": _median([r["ttft_seconds"] for r in runs]),
        "median_decode_ms_per_token": _median([1000 * _decode_seconds(r) / (r["new_tokens"] - 1)
                                               for r in runs if r["new_tokens"] > 1]),
        "accept_rate": accept_rate,
        "mean_accepted_length": sum(a * n for a, n in histogram.items()) / steps if steps else None,
        "all_identical": _all_identical([r["identical_to_greedy"] for r in runs]),
    }


def _decode_seconds(run: dict) -> float:
    """Results from before the split was recorded carry seconds and ttft_seconds only."""
    return run.get("decode_seconds", run["seconds"] - run["ttft_seconds"])


def _all_identical(flags: list[bool | None]) -> bool | None:
    """None when nothing was compared (no runs, or the reference method did not run)."""
    return None if not flags or None in flags else all(flags)


RATIOS = (("ragspec", "llamacpp"), ("ragspec", "hf_greedy"), ("greedy", "llamacpp"),
          ("ragspec", "llama_server"), ("greedy", "llama_server"), ("ragspec", "best_ngram"))
BEST_NGRAM = "best_ngram"


def _tokens_per_s(entry: dict, method: str) -> float | None:
    """A method's tokens/s on one entry; for best_ngram the fastest llama-server n-gram mode's."""
    if method == BEST_NGRAM:
        modes = [entry["results"][m]["tokens_per_s"] for m in NGRAM_METHODS
                 if m in entry["results"]]
        return max(modes) if modes else None
    run = entry["results"].get(method)
    return None if run is None else run["tokens_per_s"]


def best_mode(entries: list[dict]) -> str | None:
    """The llama-server n-gram mode with the best median tokens/s over these entries."""
    modes = {m: _median([e["results"][m]["tokens_per_s"] for e in entries])
             for m in NGRAM_METHODS if entries and m in entries[0]["results"]}
    return max(modes, key=lambda m: modes[m]) if modes else None


def summarize(entries: list[dict], methods: Sequence[str] = METHODS) -> dict:
    """{KIND: {METHOD: stats}} for "copy", "open" and "all" (stats are null for an empty kind)."""
    summary = {}
    for kind in (*KINDS, "all"):
        chosen = [e for e in entries if kind == "all" or e["kind"] == kind]
        summary[kind] = {m: _method_summary(chosen, m) for m in methods}
    return summary


def looping_counts(entries: list[dict]) -> dict:
    """{KIND: {"questions", "looping", "looping_share"}}: the answers the non-looping figures
    leave out."""
    out = {}
    for kind in (*KINDS, "all"):
        chosen = [e for e in entries if kind == "all" or e["kind"] == kind]
        looping = sum(is_looping(e) for e in chosen)
        out[kind] = {"questions": len(chosen), "looping": looping,
                     "looping_share": looping / len(chosen) if chosen else None}
    return out


def ratios(entries: list[dict], methods: Sequence[str]) -> dict:
    """{KIND: {"A/B": {"median", "min", "median_non_looping", "min_non_looping"}}}: A's
    end-to-end tokens/s over B's, per question."""
    out = {}
    for kind in (*KINDS, "all"):
        chosen = [e for e in entries if kind == "all" or e["kind"] == kind]
        out[kind] = {}
        for a, b in RATIOS:
            present = (set(methods) & set(NGRAM_METHODS)) if b == BEST_NGRAM else b in methods
            if a in methods and present:
                values = [(_tokens_per_s(e, a) / _tokens_per_s(e, b), is_looping(e))
                          for e in chosen if _tokens_per_s(e, b)]
                every = [v for v, _ in values]
                clean = [v for v, loops in values if not loops]
                out[kind][f"{a}/{b}"] = {
                    "median": _median(every), "min": min(every) if every else None,
                    "median_non_looping": _median(clean),
                    "min_non_looping": min(clean) if clean else None}
    return out


def build_results(model: str, device: str, max_new_tokens: int, entries: list[dict],
                  repeats: int = 1, llamacpp_build: list[str] | None = None,
                  llama_server_build: dict | None = None) -> dict:
    """The results file's object. llamacpp_build: the instruction sets the llama.cpp methods'
    library was compiled for; llama_server_build: the llama-server build's record
    (ragspec.bench.anchors.build); each recorded when those methods ran."""
    methods = list(entries[0]["results"]) if entries else list(METHODS)
    results = {"model": model, "device": device, "max_new_tokens": max_new_tokens,
               "repeats": repeats, "methods": methods, "questions": entries,
               "summary": summarize(entries, methods), "ratios": ratios(entries, methods),
               "looping": looping_counts(entries)}
    if llamacpp_build is not None:
        results["llamacpp_build"] = llamacpp_build
    if llama_server_build is not None:
        results["llama_server_build"] = {k: v for k, v in llama_server_build.items()
                                         if k != "bin"}
    mode = best_mode(entries)
    if mode is not None:
        results["llama_server_best_mode"] = mode
    return results


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def format_table(results: dict) -> str:
    """The summary as a fixed-width text table (Markdown-compatible)."""
    counts = {k: sum(1 for e in results["questions"] if k == "all" or e["kind"] == k)
              for k in (*KINDS, "all")}
    header = ("| kind | method | median speedup, non-looping (min) | median speedup, all (min) "
              "| median decode speedup "
              "| median tok/s | median first token | median decode ms/token | accept rate "
              "| mean accepted | identical |")
    lines = [header, "|" + "---|" * 11]
    loops = results.get("looping") or looping_counts(results["questions"])
    for kind, methods in results["summary"].items():
        if not counts[kind]:
            continue
        for method, s in methods.items():
            ident = {True: "yes", False: "NO", None: "-"}[s["all_identical"]]
            lines.append(
                f"| {kind} (n={counts[kind]}, {loops[kind]['looping']} looping) | {method} "
                f"| {_fmt(s.get('median_speedup_non_looping'), '.2f', '×')} "
                f"({_fmt(s.get('min_speedup_non_looping'), '.2f', '×')}) "
                f"| {_fmt(s['median_speedup'], '.2f', '×')} "
                f"({_fmt(s['min_speedup'], '.2f', '×')}) "
                f"| {_fmt(s['median_decode_speedup'], '.2f', '×')} "
                f"| {_fmt(s['median_tokens_per_s'], '.1f')} "
                f"| {_fmt(s['median_ttft_seconds'], '.2f', ' s')} "
                f"| {_fmt(s.get('median_decode_ms_per_token'), '.1f')} "
                f"| {_fmt(s['accept_rate'], '.0%')} "
                f"| {_fmt(s['mean_accepted_length'], '.2f')} | {ident} |")
    for kind, pairs in results.get("ratios", {}).items():
        for name, r in pairs.items():
            if counts[kind] and r["median"] is not None:
                lines.append(f"{kind}: {name} tokens/s median "
                             f"{_fmt(r.get('median_non_looping'), '.2f', '×')} non-looping "
                             f"(min {_fmt(r.get('min_non_looping'), '.2f', '×')}), "
                             f"{r['median']:.2f}× all (min {r['min']:.2f}×)")
    for kind, c in loops.items():
        if c["questions"]:
            lines.append(f"{kind}: {c['looping']} of {c['questions']} answers looped "
                         f"({c['looping_share']:.0%}); the non-looping figures leave them out")
    return "\n".join(lines)


def format_questions(results: dict) -> str:
    """Per question and method: time to first token + decode phase = seconds, and new tokens;
    where llama-server ran, its own timings against the client's clock (clock_ratio)."""
    lines = ["| question | prompt | method | first token | decode | total | tokens "
             "| decode ms/token | identical |", "|" + "---|" * 9]
    for e in results["questions"]:
        for method, r in e["results"].items():
            decode = _decode_seconds(r)
            per = 1000 * decode / (r["new_tokens"] - 1) if r["new_tokens"] > 1 else None
            ident = {True: "yes", False: "NO", None: "-"}[r["identical_to_greedy"]]
            lines.append(f"| {e['id']}{' (loops)' if is_looping(e) else ''} "
                         f"| {e['prompt_tokens']} | {method} | {r['ttft_seconds']:.3f} s "
                         f"| {decode:.3f} s | {r['seconds']:.3f} s | {r['new_tokens']} "
                         f"| {_fmt(per, '.1f')} | {ident} |")
    ratios = [r["anchor"]["clock_ratio"] for e in results["questions"]
              for r in e["results"].values() if (r.get("anchor") or {}).get("clock_ratio")]
    if ratios:
        lines.append(f"llama-server: client clock / its own timings, whole stream: median "
                     f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max "
                     f"{max(ratios):.3f}, {len(ratios)} runs)")
    if results.get("llama_server_best_mode"):
        lines.append(f"llama-server's best n-gram mode by median tokens/s: "
                     f"{results['llama_server_best_mode']}")
    return "\n".join(lines)
