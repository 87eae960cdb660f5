"""TTFT of a first read, an identical repeat and the chat's toggle (scheduler: spec off, then on),
medians over the first N questions of data/questions.jsonl (RAGSPEC_HOME must hold an index of
data/corpus). Usage: python benchmarks/prompt_cache_ttft.py [N]; RAGSPEC_PREFILL_DTYPE and
RAGSPEC_PROMPT_PAGES=1 choose the prompt read (default: the model's on this machine). Beside the engine's own ttft_seconds, the *_wall
figures are the caller's clock: from submitting (or starting the stream) to holding the first
span."""
import json
import os
import resource
import statistics
import sys
import time
from dataclasses import replace

from ragspec.bench.sessions import without_prompt_cache
from ragspec.decoding.native_step import prompt_precision
from ragspec.decoding.packed import reads_in_pages
from ragspec.decoding.scheduler import scheduler_for
from ragspec.decoding.types import DraftConfig, GenerationConfig
from ragspec.loading import load_generator, open_store
from ragspec.pipeline import Pipeline

n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
loaded, gen = load_generator(None)
cold = without_prompt_cache(gen)  # the answers every cached run must equal
store = open_store(os.environ["RAGSPEC_HOME"] + "/index")
pipe = Pipeline(store, gen)
qs = [json.loads(line) for line in open("data/questions.jsonl")][:n]
base = GenerationConfig(max_new_tokens=32)
off = pipe.answer_config(replace(base, draft=DraftConfig(enabled=False)))
on = pipe.answer_config(base)
rows = []
for q in qs:
    p = pipe.prepare(q["question"])
    # the toggle, through the scheduler as the chat does: speculation off, then on
    sched = scheduler_for(gen)
    walls = []
    for config in (off, on):
        clock = time.perf_counter()
        request = sched.submit(p.prompt_ids, config, sources=p.sources)
        next(iter(request))
        walls.append(time.perf_counter() - clock)
        if config is off:
            a = request.result()
        else:
            b = request.result()
    # an identical repeat through the engine ("ask again")
    clock = time.perf_counter()
    stream = gen.stream(p.prompt_ids, on, sources=p.sources)
    next(stream)
    walls.append(time.perf_counter() - clock)
    c = stream.result()
    rows.append(dict(id=q["id"], prompt=len(p.prompt_ids), first=a.stats.ttft_seconds,
                     toggle=b.stats.ttft_seconds, repeat=c.stats.ttft_seconds,
                     first_wall=walls[0], toggle_wall=walls[1], repeat_wall=walls[2],
                     cached_toggle=b.stats.cached_prompt_tokens, cached_repeat=c.stats.cached_prompt_tokens,
                     off=a.stats.prompt_cache_off,
                     same=b.token_ids == c.token_ids == cold.generate(p.prompt_ids, on).token_ids
                     and a.token_ids == cold.generate(p.prompt_ids, off).token_ids))
    print(rows[-1], flush=True)


def med(k):
    return statistics.median(r[k] for r in rows)


print(json.dumps(dict(precision=prompt_precision(gen.model), pages=reads_in_pages(), n=len(rows), prompt_tokens=med("prompt"),
      first_ttft=med("first"), toggle_ttft=med("toggle"), repeat_ttft=med("repeat"),
      toggle_ratio=statistics.median(r["toggle"] / r["first"] for r in rows),
      repeat_ratio=statistics.median(r["repeat"] / r["first"] for r in rows),
      first_wall=med("first_wall"), toggle_wall=med("toggle_wall"), repeat_wall=med("repeat_wall"),
      toggle_wall_ratio=statistics.median(r["toggle_wall"] / r["first_wall"] for r in rows),
      answers_same=all(r["same"] for r in rows),
      maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      cache=gen.prompt_cache_stats())))
