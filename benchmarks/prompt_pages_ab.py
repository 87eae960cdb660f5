"""A bf16 or fp32 prompt read of the bundled model, whole forward against pages, side by side in
one process: each round reads the first N tokens of two data/corpus files with
RAGSPEC_PROMPT_PAGES off, then on, then (pages on) the rest after every cached page but the last.
Usage: python benchmarks/prompt_pages_ab.py [N=800] [ROUNDS=3] (RAGSPEC_PREFILL_DTYPE=bf16|fp32)."""
import json
import os
import statistics
import sys
import time

import torch

from ragspec.decoding import packed
from ragspec.decoding.cache import new_cache
from ragspec.decoding.engine import forward
from ragspec.decoding.prefix_cache import PrefixCache
from ragspec.loading import load_generator

loaded, gen = load_generator(None, prompt_cache_bytes=0)
m = gen.model
text = open("data/corpus/faq.md").read() + open("data/corpus/larkspur-overview.md").read()
ids = gen.tokenizer(text)["input_ids"][:int(sys.argv[1]) if len(sys.argv) > 1 else 800]


def mode(pages):
    os.environ[packed.PAGES_ENV] = "1" if pages else "0"
    packed.reads_in_pages.cache_clear()


times = {"whole": [], "pages": [], "rest": []}
with torch.inference_mode():
    for r in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
        for pages in (False, True):
            mode(pages)
            c = new_cache(m)
            t = time.perf_counter()
            forward(m, ids, c, logits_to_keep=1)
            times["pages" if pages else "whole"].append(time.perf_counter() - t)
        pc = PrefixCache(1 << 30)
        pc.store(ids, c)
        c2 = new_cache(m)
        start = pc.restore(ids, c2)
        t = time.perf_counter()
        forward(m, ids[start:], c2, logits_to_keep=1)
        times["rest"].append(time.perf_counter() - t)
        print(r, {k: round(v[-1], 2) for k, v in times.items()}, "load", os.getloadavg()[0], flush=True)
med = {k: statistics.median(v) for k, v in times.items()}
print(json.dumps(dict(tokens=len(ids), runs=times, median=med, pages_over_whole=med["pages"] / med["whole"],
                      rest_over_whole=med["rest"] / med["whole"], threads=torch.get_num_threads())))
