"""The one-shot GPU check: everything ragspec claims on CUDA, measured in one command.

    python -m ragspec.bench.gpu_check [--out docs/results/gpu-check.json]   # on a CUDA machine
    python -m ragspec.bench.gpu_check --device cpu                           # tiny limits, in the tests

Prints one JSON object (progress goes to stderr). Sections, each reporting its own error
instead of aborting the others:

  environment     torch / transformers / faiss versions, the device, faiss GPU support;
  identity_exact  the bundled model in fp32 (--exact): engine greedy with speculation off, on,
                  and on without the adaptive policy, each against model.generate(do_sample=False),
                  on the bundled sets' prompts (data/ and data/bench/, built by the real pipeline);
  divergence      the bundled model in the device's fast dtype (bf16 on CUDA): the share of
                  prompts where ragspec's greedy output differs from model.generate's and from the
                  engine's own output without speculation (all 26 prompts of both sets on CUDA),
                  and which step ran them (on CUDA the fixed-shape step,
                  ragspec.decoding.fixed.step: speculation on == off by construction);
  steps           ms per decode step of 1 and 17 rows on each path (transformers' modules, the
                  fixed step eager and compiled + CUDA graph; ragspec.bench.step_speed) for the
                  bundled model and for random weights at a 1.7B published shape;
  speed           ragspec.bench.runner's methods (greedy, ragspec, hf_greedy, hf_pld, oracle)
                  and hf_static (generate with transformers' static cache, compiled on CUDA) per
                  prompt: median tokens/s end to end, median ms per token after the first, and
                  speedup (hf_pld and hf_static over hf_greedy, the rest over greedy), for the
                  bundled model, the random 1.7B shape (named so: its answers mean nothing, its
                  costs are the size's; no stop rule, as it repeats itself) and every larger
                  instruct model found in the local Hugging Face cache;
  sampling        temperature sampling with speculation runs on the device, repeats for a seed
                  and stays in the vocabulary;
  faiss           a GPU FAISS index returns the same top-k as the CPU index; without GPU
                  support, which faiss package is installed and the command that swaps in
                  requirements-gpu.txt's faiss-gpu.

A GPU machine that cannot hold the embedder or the retrieval stack (a machine lent for minutes,
with little room for files) takes the prompts from a file: `--save-prompts FILE` (here, where the
embedder is) builds them with the real pipeline and the device's limits and stops;
`--prompts FILE` (there) uses them instead of ingesting. The file records the tokenizer it was
built with, and a different one is refused.
data/prompts/gpu-check-cuda.json is that file for the bundled model with the CUDA limits (26
prompts of data/ and data/bench/, 4 passages each), so a GPU machine runs

    python -m ragspec.bench.gpu_check --prompts data/prompts/gpu-check-cuda.json --out FILE

A time budget (--budget-s, default 360 s of generation; loading and the first conversion of the
bundled model come on top) keeps the whole run under 8 minutes: identity may use a quarter of it,
divergence three tenths, the speed table what is left; a section that runs out stops starting
prompts and says how many it covered ("prompts" of "of_prompts").
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SETS = (("data", REPO / "data" / "corpus", REPO / "data" / "questions.jsonl"),
        ("data/bench", REPO / "data" / "bench" / "corpus", REPO / "data" / "bench" / "questions.jsonl"))
# Per device: new tokens per answer, questions per set in each section (None: all), passages per
# prompt and a prompt length cap (as `ragspec ask` on CUDA; short prompts on the CPU, where the
# check only proves the script runs), extra cached models for the speed table.
# shape: the random-weight model of bench.shapes the steps and speed sections add; step_paths:
# the step_speed paths timed (inductor's C++ build of the compiled path takes minutes on a CPU).
LIMITS = {"cuda": dict(new_tokens=128, prompts=None, speed_prompts=None, passages=4,
                       max_prompt_tokens=None, extra_models=2, shape="smollm2-1.7b",
                       step_paths=("modules", "fixed_eager", "fixed_compiled"), step_repeats=20,
                       step_context=1200),
          "cpu": dict(new_tokens=8, prompts=1, speed_prompts=1, passages=1,
                      max_prompt_tokens=256, extra_models=0, shape="smollm2-135m",
                      step_paths=("modules", "fixed_eager"), step_repeats=2, step_context=200)}
SHAPE = "shape:"  # a model spec naming a bench.shapes shape: random weights built on the device


STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[gpu_check {time.monotonic() - STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


class Check:
    """Shared state: the device, limits, the deadline, loaded models and prepared prompts."""

    def __init__(self, device: str, budget_s: float, limits: dict, models: list[str] | None,
                 saved_prompts: dict | None = None):
        self.device, self.limits, self.models = device, limits, models
        self.saved_prompts = saved_prompts  # a --prompts file's contents (bundled model only)
        self.budget_s = budget_s
        self.deadline = self.section_deadline = time.monotonic() + budget_s
        self._loaded: dict = {}
        self._prompts: dict = {}
        self._stores: dict = {}
        self._embedder = None
        self.index_dir = tempfile.mkdtemp(prefix="ragspec-gpu-check-")

    def close(self) -> None:
        """Remove the temporary indexes the sets were ingested into."""
        shutil.rmtree(self.index_dir, ignore_errors=True)

    def restart_clock(self) -> None:
        """The budget counts from now: loading and converting models come on top of it."""
        self.deadline = self.section_deadline = time.monotonic() + self.budget_s

    def start_section(self, share: float | None) -> None:
        """The next section may use `share` of the whole budget (None: what is left)."""
        left = self.deadline - time.monotonic()
        self.section_deadline = self.deadline if share is None else (
            time.monotonic() + min(left, share * self.budget_s))

    def out_of_time(self) -> bool:
        return time.monotonic() > min(self.deadline, self.section_deadline)

    def generator(self, spec: str | None, exact: bool):
        """(LoadedModel, Generator), loaded once per (model, dtype)."""
        from ragspec.loading import load_generator
        from ragspec.models.load import pick_device, pick_dtype

        key = (spec, pick_dtype(pick_device(self.device), exact))
        if key not in self._loaded:
            log(f"loading {spec or 'the bundled model'} ({key[1]})")
            if spec is not None and spec.startswith(SHAPE):
                self._loaded[key] = self.shape_generator(spec[len(SHAPE):], key[1])
            else:
                self._loaded[key] = load_generator(spec, None, 16, device=self.device,
                                                   exact=exact)
        return self._loaded[key]

    def shape_generator(self, name: str, dtype):
        """(LoadedModel, Generator) of random weights at a published shape, with the bundled
        model's tokenizer (the SmolLM2 shapes share its vocabulary)."""
        from ragspec.bench.step_speed import shape_model
        from ragspec.decoding.engine import Generator
        from ragspec.models.load import LoadedModel

        bundled, _gen = self.generator(None, exact=False)
        start = time.monotonic()
        model = shape_model(name, bundled.device, dtype)
        loaded = LoadedModel(model, bundled.tokenizer, f"random weights at {name}'s published "
                             f"shape", bundled.device, dtype, time.monotonic() - start,
                             weights=str(dtype).replace("torch.", ""))
        return loaded, Generator.from_loaded(loaded)

    def store(self, name: str, corpus: Path):
        """The set's passage index (ingested once, with the bundled embedder)."""
        import os

        from ragspec.retrieval.embeddings.embedder import Embedder
        from ragspec.retrieval.faiss.store import PassageStore
        from ragspec.retrieval.ingest import ingest_paths

        if name not in self._stores:
            if self._embedder is None:
                self._embedder = Embedder(os.environ.get("RAGSPEC_EMBEDDER") or None)
            folder = Path(self.index_dir) / name.replace("/", "-")
            store = PassageStore.open(folder, self._embedder)
            report = ingest_paths([str(corpus)], store)
            for path, why in report.failed:
                log(f"warning: corpus file {path}: {why}")
            self._stores[name] = store
        return self._stores[name]

    def prompts(self, spec: str | None, generator, limit: int | None,
                sets: tuple[str, ...] = ("data", "data/bench")) -> list:
        """ragspec.bench.runner.Prepared prompts of the bundled sets (`limit` questions per set), built by
        the real pipeline with this model's tokenizer."""
        if spec is not None and spec.startswith(SHAPE):
            spec = None  # the bundled tokenizer's prompts
        key = (spec, limit, sets)
        if key not in self._prompts and spec is None and self.saved_prompts is not None:
            self._prompts[key] = prompts_from_file(self.saved_prompts, generator, limit, sets)
            log(f"{len(self._prompts[key])} prompts read from the prompt file")
        if key not in self._prompts:
            from ragspec.bench.runner import Prepared, load_questions
            from ragspec.pipeline import Pipeline, PipelineConfig

            limits = self.limits
            config = PipelineConfig(k=limits["passages"], max_new_tokens=limits["new_tokens"],
                                    max_prompt_tokens=limits["max_prompt_tokens"])
            prepared = []
            for name, corpus, questions in SETS:
                if name not in sets:
                    continue
                pipeline = Pipeline(self.store(name, corpus), generator, config)
                for q in load_questions(questions, limit):
                    p = pipeline.prepare(q.question)
                    prepared.append(Prepared(q, list(p.prompt_ids), tuple(p.sources)))
            log(f"{len(prepared)} prompts ready")
            self._prompts[key] = prepared
        return self._prompts[key]


def tokenizer_fingerprint(generator) -> str:
    """What a prompt file's ids depend on: the tokenizer's vocabulary and chat template."""
    import hashlib

    tok = generator.tokenizer
    vocab = sorted(tok.get_vocab().items())
    text = json.dumps([vocab, getattr(tok, "chat_template", None)], ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prompts_to_file(by_set: dict[str, list], generator, limits: dict) -> dict:
    """What --save-prompts writes: {set name: [Prepared]} with the tokenizer's fingerprint."""
    from dataclasses import asdict

    items = [{"set": name, "question": asdict(item.question), "prompt_ids": item.prompt_ids,
              "sources": [asdict(s) for s in item.sources]}
             for name, prepared in by_set.items() for item in prepared]
    return {"tokenizer": tokenizer_fingerprint(generator), "limits": limits, "prompts": items}


def save_prompts(check: Check, path: Path) -> int:
    """Write the bundled model's prompts of both sets, built by the real pipeline with the
    check's limits, to `path`; returns how many."""
    _loaded, gen = check.generator(None, exact=False)
    by_set = {name: check.prompts(None, gen, None, sets=(name,)) for name, _c, _q in SETS}
    path.write_text(json.dumps(prompts_to_file(by_set, gen, check.limits)) + "\n")
    return sum(map(len, by_set.values()))


def prompts_from_file(saved: dict, generator, limit: int | None, sets: tuple[str, ...]) -> list:
    """The Prepared prompts of a --save-prompts file (the first `limit` per set)."""
    from ragspec.bench.runner import Prepared, Question
    from ragspec.decoding.types import SourceRegion

    if saved["tokenizer"] != tokenizer_fingerprint(generator):
        raise SystemExit("the prompt file was built with another tokenizer than this model's: "
                         "build it again with --save-prompts for this model")
    out, per_set = [], {}
    for item in saved["prompts"]:
        if item["set"] not in sets or (limit is not None and per_set.get(item["set"], 0) >= limit):
            continue
        per_set[item["set"]] = per_set.get(item["set"], 0) + 1
        q = dict(item["question"], answers=tuple(item["question"]["answers"]))
        sources = tuple(SourceRegion(**dict(s, char_offsets=tuple(map(tuple, s["char_offsets"]))))
                        for s in item["sources"])
        out.append(Prepared(Question(**q), list(item["prompt_ids"]), sources))
    return out


def hf_greedy(generator, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """model.generate(do_sample=False) on the generator's model exactly as the engine runs it:
    the oracle of every identity."""
    from ragspec.bench.runner import Runner
    from ragspec.decoding.types import RepeatConfig

    plain = RepeatConfig()  # no stop rule: the engine's runs here have none either
    return Runner(generator, stock=False, repeat=plain).run("hf_greedy", prompt_ids,
                                                            new_tokens).token_ids


def engine_ids(generator, prompt_ids, new_tokens: int, draft) -> list[int]:
    from ragspec.decoding.types import GenerationConfig

    return generator.generate(prompt_ids, GenerationConfig(new_tokens, draft=draft)).token_ids


def section_environment(check: Check) -> dict:
    import torch
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "device": check.device, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    try:
        import faiss

        info["faiss"] = faiss.__version__
        info["faiss_gpus"] = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    except ImportError as exc:
        info["faiss"] = f"not importable: {exc}"
    return info


def section_identity_exact(check: Check) -> dict:
    from ragspec.decoding.types import DraftConfig

    loaded, gen = check.generator(None, exact=True)
    prompts = check.prompts(None, gen, check.limits["prompts"], sets=("data",))
    n = check.limits["new_tokens"]
    configs = {"off": DraftConfig(enabled=False), "ragspec": DraftConfig(),
               "non_adaptive": DraftConfig(adaptive=False)}
    identical = dict.fromkeys(configs, 0)
    differing: list[dict] = []
    done = 0
    for item in prompts:
        if check.out_of_time():
            break
        log(f"identity: {item.question.id} ({len(item.prompt_ids)} prompt tokens)")
        want = hf_greedy(gen, item.prompt_ids, n)
        for name, draft in configs.items():
            got = engine_ids(gen, item.prompt_ids, n, draft)
            identical[name] += got == want
            if got != want:
                differing.append({"question": item.question.id, "config": name})
        done += 1
    return {"model": loaded.name, "dtype": str(loaded.dtype), "new_tokens": n, "prompts": done,
            "of_prompts": len(prompts), "identical": identical, "differing": differing,
            "all_identical": done > 0 and not differing}


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def section_divergence(check: Check) -> dict:
    from ragspec.decoding.types import DraftConfig

    loaded, gen = check.generator(None, exact=False)
    prompts = check.prompts(None, gen, check.limits["prompts"])
    n = check.limits["new_tokens"]
    rows, step = [], None
    for item in prompts:
        if check.out_of_time():
            break
        hf = hf_greedy(gen, item.prompt_ids, n)
        off = engine_ids(gen, item.prompt_ids, n, DraftConfig(enabled=False))
        on = engine_ids(gen, item.prompt_ids, n, DraftConfig())
        step = gen.fixed_step()[1]
        rows.append({"question": item.question.id, "vs_generate_at": _first_difference(on, hf),
                     "vs_no_speculation_at": _first_difference(on, off),
                     "no_speculation_vs_generate_at": _first_difference(off, hf)})

    def rate(key):
        return sum(r[key] is not None for r in rows) / len(rows) if rows else None

    return {"model": loaded.name, "dtype": str(loaded.dtype), "step": step, "new_tokens": n,
            "prompts": len(rows), "of_prompts": len(prompts),
            "rate_vs_generate": rate("vs_generate_at"),
            "rate_vs_no_speculation": rate("vs_no_speculation_at"),
            "rate_no_speculation_vs_generate": rate("no_speculation_vs_generate_at"),
            "differing": [r for r in rows if any(v is not None for k, v in r.items()
                                                 if k != "question")]}


SPEEDUP_BASE = {"greedy": "greedy", "ragspec": "greedy", "oracle": "greedy",
                "hf_greedy": "greedy", "hf_pld": "hf_greedy", "hf_static": "hf_greedy"}


def speed_table(check: Check, spec: str | None) -> dict:
    """Every method on every prompt (after one warm-up run each): median tokens/s, speedups."""
    from ragspec.bench.runner import METHODS, Runner
    from ragspec.decoding.types import RepeatConfig
    from ragspec.loading import describe_device

    methods = (*METHODS, "hf_static")
    loaded, gen = check.generator(spec, exact=False)
    prompts = check.prompts(spec, gen, check.limits["speed_prompts"])
    shape = spec is not None and spec.startswith(SHAPE)  # random weights repeat: no stop rule
    n, runner = check.limits["new_tokens"], Runner(gen, repeat=RepeatConfig() if shape else None)
    tps: dict[str, list[float]] = {m: [] for m in methods}
    per_token: dict[str, list[float]] = {m: [] for m in methods}
    speedups: dict[str, list[float]] = {m: [] for m in methods}
    for i, item in enumerate(prompts):
        if check.out_of_time():
            break
        runs = {}
        for _round in range(2 if i == 0 else 1):  # the first prompt once untimed: warm-up
            runs["greedy"] = runner.run("greedy", item.prompt_ids, n, sources=item.sources)
            ref = runs["greedy"].token_ids
            for method in methods:
                if method != "greedy":
                    runs[method] = runner.run(method, item.prompt_ids, n, sources=item.sources,
                                              reference=ref)
        rate = {m: r.new_tokens / r.seconds for m, r in runs.items() if r.seconds > 0}
        for m, r in runs.items():
            if r.new_tokens > 1:
                per_token[m].append(1000 * (r.seconds - r.ttft_seconds) / (r.new_tokens - 1))
        for m in methods:
            tps[m].append(rate.get(m, 0.0))
            base = rate.get(SPEEDUP_BASE[m])
            if base:
                speedups[m].append(rate.get(m, 0.0) / base)
    return {"model": loaded.name, "device": describe_device(loaded), "new_tokens": n,
            "step": gen.fixed_step()[1], "prompts": len(tps["greedy"]), "of_prompts": len(prompts),
            "methods": {m: {"median_tokens_per_s": _median(tps[m]),
                            "median_ms_per_token": _median(per_token[m]),
                            "median_speedup": _median(speedups[m]),
                            "min_speedup": min(speedups[m]) if speedups[m] else None}
                        for m in methods}}


def _median(values):
    return statistics.median(values) if values else None


def cached_instruct_models(limit: int) -> list[str]:
    """Hub ids in the local Hugging Face cache that look like instruct causal LMs with
    safetensors weights, largest first (at most `limit`)."""
    if limit <= 0:
        return []
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    found = []
    try:
        repos = scan_cache_dir().repos
    except CacheNotFound:  # no Hugging Face cache on this machine: the bundled model alone
        return []
    for repo in repos:
        if repo.repo_type != "model":
            continue
        for rev in repo.revisions:
            names = {f.file_name for f in rev.files}
            chat = "chat_template.jinja" in names or "instruct" in repo.repo_id.lower()
            if "config.json" in names and chat and any(n.endswith(".safetensors") for n in names):
                found.append((rev.size_on_disk, repo.repo_id))
                break
    return [rid for _, rid in sorted(found, reverse=True)[:limit]]


def section_speed(check: Check) -> dict:
    models = [None, SHAPE + check.limits["shape"],
              *(check.models if check.models is not None
                else cached_instruct_models(check.limits["extra_models"]))]
    table = {}
    for spec in models:
        name = "bundled" if spec is None else spec.replace(SHAPE, "random ")
        if check.out_of_time():
            table[name] = {"skipped": "out of time budget"}
            continue
        table[name] = run_section(lambda s=spec: speed_table(check, s))
    return table


def section_sampling(check: Check) -> dict:
    from ragspec.decoding.types import DraftConfig, GenerationConfig, SamplingConfig

    loaded, gen = check.generator(None, exact=False)
    item = check.prompts(None, gen, check.limits["prompts"])[0]
    cfg = GenerationConfig(check.limits["new_tokens"] * 2, draft=DraftConfig(adaptive=False),
                           sampling=SamplingConfig(temperature=0.8, top_p=0.95, seed=1234))
    first, again = gen.generate(item.prompt_ids, cfg), gen.generate(item.prompt_ids, cfg)
    vocab = loaded.model.config.vocab_size
    return {"device": str(gen.device), "new_tokens": len(first.token_ids),
            "drafted": first.stats.drafted_tokens, "accepted": first.stats.accepted_tokens,
            "same_seed_same_output": first.token_ids == again.token_ids,
            "in_vocabulary": all(0 <= t < vocab for t in first.token_ids)}


def section_steps(check: Check) -> dict:
    """ms per step of 1 and 17 rows on each path, at a context as long as a real-document
    prompt's (so the static cache is the size the generations used, whose compiled step
    inductor's cache then gives back), for the bundled model and the random shape."""
    from ragspec.bench.step_speed import step_times

    out = {}
    for spec in (None, SHAPE + check.limits["shape"]):
        loaded, gen = check.generator(spec, exact=False)
        vocab = loaded.model.config.vocab_size
        length = min(check.limits["step_context"], gen.context_length // 2)
        prompt = [(7 * i + 11) % vocab for i in range(length)]
        times = step_times(loaded.model, prompt, paths=check.limits["step_paths"],
                           repeats=check.limits["step_repeats"])
        out["bundled" if spec is None else "random " + check.limits["shape"]] = {
            "model": loaded.name, "dtype": str(loaded.dtype), **times}
    return out


def faiss_gpu_problem() -> str | None:
    """Why this machine's faiss cannot build a GPU index (None: it can): which package is
    missing, and how requirements-gpu.txt's swap installs it."""
    import importlib.metadata

    pin = next((line.strip() for line in (REPO / "requirements-gpu.txt").read_text().splitlines()
                if line.startswith("faiss-gpu")), "faiss-gpu")
    swap = (f"`pip uninstall -y faiss-cpu && pip install {pin}` (requirements-gpu.txt's pin; "
            f"docs/install.md)")
    try:
        import faiss
    except ImportError as exc:
        return f"no faiss module ({exc}): install {pin} with {swap}"
    installed = sorted(f"{d.metadata['Name']} {d.version}" for d in importlib.metadata.distributions()
                       if (d.metadata["Name"] or "").lower().startswith("faiss"))
    if not hasattr(faiss, "StandardGpuResources"):
        return (f"the faiss module here is a CPU-only build ({', '.join(installed) or 'faiss'}): "
                f"{pin} is missing; swap it in with {swap}")
    if faiss.get_num_gpus() < 1:
        return f"{', '.join(installed)} has GPU support but sees no GPU (faiss.get_num_gpus() = 0)"
    return None


def section_faiss(check: Check) -> dict:
    import numpy as np

    problem = faiss_gpu_problem()
    if problem is not None:
        return {"skipped": problem}
    import faiss

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((20000, 384)).astype("float32")
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[rng.choice(len(vectors), 64, replace=False)] + 0.05 * rng.standard_normal(
        (64, 384)).astype("float32")
    cpu = faiss.IndexFlatIP(384)
    cpu.add(vectors)
    gpu = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, cpu)
    k = 10
    d_cpu, i_cpu = cpu.search(queries, k)
    d_gpu, i_gpu = gpu.search(queries, k)
    same = int((i_cpu == i_gpu).all(axis=1).sum())
    return {"queries": len(queries), "k": k, "same_top_k": same,
            "max_score_difference": float(np.abs(d_cpu - d_gpu).max()), "all_same": same == 64}


def run_section(fn) -> dict:
    start = time.monotonic()
    try:
        result = fn()
    # A failing section is that section's result: the JSON still reports every other section.
    except Exception as exc:
        result = {"error": f"{exc.__class__.__name__}: {exc}",
                  "traceback": traceback.format_exc(limit=-4)}
    result["seconds"] = round(time.monotonic() - start, 2)
    return result


# name -> (function, share of the time budget it may use; None: whatever is left)
SECTIONS = {"environment": (section_environment, None),
            "identity_exact": (section_identity_exact, 0.25),
            "divergence": (section_divergence, 0.3),
            "steps": (section_steps, 0.15),
            "sampling": (section_sampling, None), "faiss": (section_faiss, None),
            "speed": (section_speed, None)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (tiny limits)")
    parser.add_argument("--budget-s", type=float, default=360.0,
                        help="stop starting new prompts after this many seconds")
    parser.add_argument("--model", action="append", dest="models", default=None,
                        help="extra model for the speed table (repeatable; default: larger "
                             "instruct models found in the local Hugging Face cache)")
    parser.add_argument("--out", default=None, help="also write the JSON to this file")
    parser.add_argument("--save-prompts", type=Path, default=None, metavar="FILE",
                        help="build the bundled model's prompts for --device's limits here "
                             "(with the embedder), write them to FILE and stop")
    parser.add_argument("--prompts", type=Path, default=None, metavar="FILE",
                        help="take the bundled model's prompts from a --save-prompts FILE "
                             "instead of ingesting the sets")
    parser.add_argument("--sections", default=None,
                        help="run only these sections (comma-separated names)")
    args = parser.parse_args(argv)
    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    saved = json.loads(args.prompts.read_text()) if args.prompts else None
    if args.save_prompts:
        # built on this machine's device, with the limits of the device named
        check = Check("cpu", args.budget_s, LIMITS[kind], args.models)
        try:
            log(f"{save_prompts(check, args.save_prompts)} prompts written to {args.save_prompts}")
        finally:
            check.close()
        return 0
    check = Check(args.device, args.budget_s, LIMITS[kind], args.models, saved)
    report = {"check": "ragspec gpu_check", "device": args.device, "limits": check.limits}
    try:
        for exact in (True, False):  # loaded (and the GGUF converted) before the budget starts
            report.setdefault("load_errors", [])
            result = run_section(lambda exact=exact: {"loaded": check.generator(None, exact)[0].name})
            if "error" in result:
                report["load_errors"].append(result["error"])
        check.restart_clock()
        for name, (fn, share) in SECTIONS.items():
            if args.sections and name not in args.sections.split(","):
                continue
            log(f"section {name}")
            check.start_section(share)
            report[name] = run_section(lambda fn=fn: fn(check))
    finally:
        check.close()
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
