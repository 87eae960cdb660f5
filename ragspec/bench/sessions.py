"""`ragspec bench --sessions`: questions asked as chat sessions, each twice, prompt cache off and on.

Contract: `group_sessions` makes one session per document of a question set (its questions that
name that `source`, in file order; questions naming none are left out). `run_sessions` asks
every session's questions in order, the way the chat asks a turn after another: the follow-up
rewrite over the session's history (Pipeline.retrieve, ragspec.search), then the prompt built
after the previous turn's (Pipeline.prepare_retrieved with `previous`: with keep_places its
passages keep their places), then one greedy generation. Each session runs twice on the same
model object: first on a generator whose prompt cache is off, then on the generator given
(whose cache is on and shared by all sessions, as a chat server's is). Per turn and per run it
records the time to the first token and the whole answer (time.perf_counter around the
stream: the first span, the last), the prompt tokens, those the prompt cache supplied
(GenerationStats.cached_prompt_tokens) and the cache's own line when it was off, how many
prompt tokens the previous turn's prompt began with (the prefix any cache could reuse), the
snippet recall of the answer (ragspec.eval.quality), and whether the cache-on answer's token
ids equal the cache-off one's. `summarize` gives medians for turn 1 and for turns 2 and later.
`run_llama_sessions` gives llama-server the very prompts ragspec read (its cache on, session
after session on one slot, then off) and `summarize_llama` its medians, how many of its answers
its cache changed, and ragspec's times over its. Knows nothing of click.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ragspec.bench.questions import Question
from ragspec.decoding.detokenize import common_prefix
from ragspec.eval.quality import snippet_recall

ORDERS = ("keep", "rank")  # keep_places on, off (ragspec.pipeline)


@dataclass(frozen=True)
class Session:
    """The questions about one document, asked in this order in one chat."""

    source: str
    questions: tuple[Question, ...]


def group_sessions(questions: Sequence[Question], limit: int | None = None) -> list[Session]:
    """One session per `source`, in the order of each source's first question; the first
    `limit` sessions (None: all)."""
    groups: dict[str, list[Question]] = {}
    for q in questions:
        if q.source is not None:
            groups.setdefault(q.source, []).append(q)
    sessions = [Session(source, tuple(qs)) for source, qs in groups.items()]
    return sessions[:limit] if limit else sessions


def without_prompt_cache(generator):
    """A generator over the same model object with its prompt cache off (greedy answers are
    those of `generator`: the cache is exact or off, ragspec.decoding.prefix_cache)."""
    from ragspec.decoding.engine import Generator

    return Generator(generator.model, generator.tokenizer,
                     eos_token_ids=sorted(generator.eos_token_ids), cost=generator.cost,
                     speculation_off_reason=generator.speculation_off_reason,
                     prompt_cache_bytes=0)


def run_sessions(store, generator, sessions: Sequence[Session], config, *,
                 pipeline_config=None, order: str = "rank", cold=None, compare: bool = True,
                 progress: Callable[[str], None] = lambda line: None,
                 keep_prompts: bool = False) -> list[dict]:
    """Every session asked with the prompt cache off (`cold`, default without_prompt_cache) then
    on (`generator`); one dict per session: {"source", "turns": [...]} (module docstring).
    config: the GenerationConfig of every answer (greedy); pipeline_config: the prompt's
    settings (ragspec.pipeline.PipelineConfig), keep_places set from `order`. compare=False:
    the cache-on run alone (no identity check, "identical" None; half the time, for comparing
    orders). keep_prompts: each turn keeps its prompt's token ids ("prompt_ids"), for
    run_llama_sessions."""
    from ragspec.pipeline import Pipeline, PipelineConfig

    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    if config.sampling.temperature != 0:
        raise ValueError("sessions compare answers token for token: use greedy decoding")
    pipe_config = replace(pipeline_config or PipelineConfig(max_new_tokens=config.max_new_tokens),
                          keep_places=order == "keep")
    pipes = {"on": Pipeline(store, generator, pipe_config)}
    if compare:
        cold = cold if cold is not None else without_prompt_cache(generator)
        pipes = {"off": Pipeline(store, cold, pipe_config), **pipes}
    out = []
    for session in sessions:
        runs = {}
        for cache, pipe in pipes.items():
            progress(f"{session.source} (prompt cache {cache})")
            runs[cache] = ask_session(pipe, session, config)
        turns = []
        for i, on in enumerate(runs["on"]):
            off = runs["off"][i] if compare else None
            turn = {"id": on.pop("id"), "turn": on.pop("turn"), "on": on, "identical": None}
            ids = on.pop("token_ids")
            prompt = on.pop("prompt_ids")
            if keep_prompts:
                turn["prompt_ids"] = prompt
            if off is not None:
                off.pop("id"), off.pop("turn"), off.pop("prompt_ids")
                turn.update(off=off, identical=off.pop("token_ids") == ids)
            turns.append(turn)
        out.append({"source": session.source, "turns": turns})
    return out


def ask_session(pipeline, session: Session, config) -> list[dict]:
    """The session's questions in order, each after the ones before it (module docstring)."""
    history: list[dict] = []
    previous = None
    turns = []
    for n, q in enumerate(session.questions, 1):
        retrieval = pipeline.retrieve(q.question, history)
        prepared = pipeline.prepare_retrieved(retrieval, previous)
        start = time.perf_counter()
        first = None
        stream = pipeline.stream(prepared, config)
        for _span in stream:
            first = first if first is not None else time.perf_counter()
        result = stream.result()
        end = time.perf_counter()
        stats = result.stats
        prompt = prepared.prompt_ids
        shared = 0 if previous is None else common_prefix(previous.prompt_ids, prompt)
        turns.append({
            "id": q.id, "turn": n, "token_ids": list(result.token_ids),
            "prompt_ids": list(prompt),
            "ttft_seconds": (first if first is not None else end) - start,
            "seconds": end - start, "new_tokens": len(result.token_ids),
            "stop_reason": stats.stop_reason, "prompt_tokens": len(prompt),
            "cached_prompt_tokens": stats.cached_prompt_tokens,
            "cached_share": stats.cached_prompt_tokens / len(prompt),
            "prompt_cache_off": stats.prompt_cache_off,
            "shared_prefix_tokens": shared, "floor_refused": retrieval.refused,
            "passages": [p.id for p in prepared.shown],
            "recall": snippet_recall(result.text, q.answers) if q.answers else None,
            "text": result.text,
        })
        history += [{"role": "user", "content": q.question,
                     "standalone": prepared.standalone_question},
                    {"role": "assistant", "content": result.text}]
        previous = prepared
    return turns


def run_llama_sessions(servers, sessions: Sequence[dict], max_new_tokens: int,
                       eos_ids: set[int], stop_factory: Callable[[], Callable[[int], bool]],
                       method: str = "llama_server",
                       progress: Callable[[str], None] = lambda line: None) -> None:
    """llama-server on the very prompts ragspec's sessions read (run_sessions(keep_prompts=
    True)): every session in order with its prompt cache on, on its one slot (the previous
    turn's prompt stays there, so a turn reuses the prefix it shares with it, as llama-server's
    users run it; its memory cache of earlier prompts too), then every turn again with the cache
    off (`cache_prompt` false: the whole prompt read, checked). On first, so that nothing the
    server read for the cache-off run is there to be reused. Adds to each turn
    "llama_server": {"off": {...}, "on": {...}, "identical": on's tokens == off's}, and drops
    "prompt_ids". The answer ends where ragspec's would (stop_factory: a fresh stop rule)."""
    def run(prompt, cache):
        r = servers.generate(method, prompt, max_new_tokens, eos_ids, stop=stop_factory(),
                             cache_prompt=cache)
        reused = int(r.server.get("cache_n", 0) or 0)
        return r, {"ttft_seconds": r.ttft_seconds, "seconds": r.seconds,
                   "new_tokens": len(r.token_ids), "prompt_tokens": len(prompt),
                   "cached_prompt_tokens": reused, "cached_share": reused / len(prompt)}

    tokens = {}
    for cache in (True, False):  # on first: a prompt it read with the cache off would be reused
        for session in sessions:
            progress(f"{session['source']} (llama-server, prompt cache {'on' if cache else 'off'})")
            for turn in session["turns"]:
                r, row = run(turn["prompt_ids"], cache)
                entry = turn.setdefault("llama_server", {})
                entry["on" if cache else "off"] = row
                if cache:
                    tokens[turn["id"], turn["turn"]] = r.token_ids
                else:
                    entry["identical"] = r.token_ids == tokens[turn["id"], turn["turn"]]
    for session in sessions:
        for turn in session["turns"]:
            turn.pop("prompt_ids", None)


def summarize_llama(sessions: Sequence[dict]) -> dict | None:
    """Medians of llama-server's turns (first, later; cache off, on), how many of its answers
    changed with its cache on, and ragspec's (cache on) over llama-server's (cache on)."""
    turns = [t for s in sessions for t in s["turns"] if "llama_server" in t]
    if not turns:
        return None
    out: dict = {"turns": len(turns),
                 "changed_with_cache": [t["id"] for t in turns
                                        if t["llama_server"]["identical"] is False]}
    for part, chosen in _parts(turns):
        row: dict = {"turns": len(chosen)}
        for cache in ("off", "on"):
            row[cache] = {key: _median([t["llama_server"][cache][key] for t in chosen])
                          for key in ("ttft_seconds", "seconds", "cached_share", "new_tokens")}
        for key in ("ttft_seconds", "seconds"):
            ours = _median([t["on"][key] for t in chosen])
            theirs = row["on"][key]
            row[f"ragspec_over_llama_{key}"] = ours / theirs if ours and theirs else None
        out[part] = row
    return out


def summarize(sessions: Sequence[dict]) -> dict:
    """Medians per run (cache off, on) for turn 1 ("first") and turns 2+ ("later"), the on/off
    ratios of the medians, the mean snippet recall, and whether every answer was identical."""
    turns = [t for s in sessions for t in s["turns"]]
    compared = all(t["identical"] is not None for t in turns)
    out: dict = {"sessions": len(sessions), "turns": len(turns),
                 "all_identical": all(t["identical"] for t in turns) if compared else None,
                 "not_identical": [t["id"] for t in turns if t["identical"] is False]}
    caches = ("off", "on") if compared else ("on",)
    for part, chosen in _parts(turns):
        row: dict = {"turns": len(chosen)}
        for cache in caches:
            runs = [t[cache] for t in chosen]
            recalls = [r["recall"] for r in runs if r["recall"] is not None]
            row[cache] = {key: _median([r[key] for r in runs]) for key in
                          ("ttft_seconds", "seconds", "cached_share", "shared_prefix_tokens",
                           "prompt_tokens", "new_tokens")}
            row[cache]["mean_recall"] = sum(recalls) / len(recalls) if recalls else None
        for key in ("ttft_seconds", "seconds"):
            off, on = row["off"][key] if compared else None, row["on"][key]
            row[f"{key}_on_over_off"] = on / off if off and on is not None else None
        out[part] = row
    return out


def _parts(turns: Sequence[dict]) -> tuple[tuple[str, list[dict]], ...]:
    """("first", turn 1 of every session), ("later", the turns after it)."""
    return (("first", [t for t in turns if t["turn"] == 1]),
            ("later", [t for t in turns if t["turn"] > 1]))


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def results(command: str, commit: str, machine: str, run: dict, previous: dict | None = None) -> dict:
    """The results file: {"command", "commit", "machine", "runs"}, `run` appended to `previous`
    (a file of the same command) when given."""
    if previous and previous.get("command") == command and isinstance(previous.get("runs"), list):
        return {**previous, "commit": commit, "runs": [*previous["runs"], run]}
    return {"command": command, "commit": commit, "machine": machine, "runs": [run]}


def prompt_read(model) -> str:
    """How `model` reads prompts in this process, the fact the cache's exactness rests on."""
    from ragspec.decoding.native_step import prompt_precision
    from ragspec.decoding.packed import PAGES_ENV, reads_in_pages

    pages = f", {PAGES_ENV}=1" if reads_in_pages() else ""
    return f"{prompt_precision(model)}{pages}"


def load_now() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def format_summary(run: dict) -> str:
    """A few lines for a terminal: medians per part and cache, identity."""
    s = run["summary"]
    lines = [f"{run['model']} on {run['device']}, prompt read {run['prompt_read']}, order "
             f"{run['order']}: {s['sessions']} sessions, {s['turns']} turns, "
             f"{run['max_new_tokens']} new tokens at most, load {run['load_before']}"]
    for part, name in (("first", "turn 1"), ("later", "turns 2+")):
        row = s[part]
        for cache in ("off", "on"):
            r = row.get(cache)
            if r is None or r["ttft_seconds"] is None:
                continue
            recall = "-" if r["mean_recall"] is None else f"{r['mean_recall']:.3f}"
            lines.append(f"  {name:8} cache {cache:3}  first token {r['ttft_seconds']:.3f} s  "
                         f"answer {r['seconds']:.3f} s  cached {r['cached_share']:.0%}  "
                         f"recall {recall}")
    llama = (run.get("llama_server") or {}).get("summary")
    for part, name in (("first", "turn 1"), ("later", "turns 2+")) if llama else ():
        row = llama[part]
        for cache in ("off", "on"):
            r = row[cache]
            if r["ttft_seconds"] is None:
                continue
            lines.append(f"  {name:8} llama-server, cache {cache:3}  first token "
                         f"{r['ttft_seconds']:.3f} s  answer {r['seconds']:.3f} s  cached "
                         f"{r['cached_share']:.0%}")
    if llama:
        changed = llama["changed_with_cache"]
        lines.append(f"llama-server: {len(changed)} of {llama['turns']} answers changed with its "
                     f"prompt cache on" + (f" ({', '.join(changed)})" if changed else ""))
    if s["all_identical"] is None:
        lines.append("no run without the cache: identity not checked")
    else:
        lines.append("every answer identical to its run without the cache" if s["all_identical"]
                     else f"answers that differ without the cache: {', '.join(s['not_identical'])}")
    return "\n".join(lines)
