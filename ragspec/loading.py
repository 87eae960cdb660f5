"""Opening what the app works with: the generator and the passage store.

`load_generator` is the one place that turns `--model` (None for the bundled SmolLM2, a folder, a
cached hub id) into a loaded model and a Generator that knows this machine's forward-cost curve
(measured once per model, device and dtype, and cached next to the converted models).
`open_store` is the one place that opens the index with the embedder RAGSPEC_EMBEDDER names
(default: the bundled all-MiniLM-L6-v2), loaded once per process. The CLI, the chat page and the
benchmark all open through here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

PROMPT_CACHE_ENV = "RAGSPEC_PROMPT_CACHE_MB"  # = ragspec.decoding.prefix_cache.ENV, without torch
EMBEDDER_ENV = "RAGSPEC_EMBEDDER"  # = ragspec.retrieval.embeddings.embedder.ENV_VAR, without importing it


def model_cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Where converted models and forward costs live (see ragspec.paths.models_dir)."""
    from ragspec import paths

    return paths.models_dir(override)


def load_generator(model: str | None = None, cache_dir: str | os.PathLike | None = None,
                   max_draft: int = 16, *, device: str | None = None, exact: bool = False,
                   weights: str = "auto", on_note: Callable[[str], None] | None = None,
                   prompt_cache_bytes: int | None = None):
    """(LoadedModel, Generator) for a model spec (None: the bundled SmolLM2); weights as for
    ragspec.models.load.load_model; on_note and prompt_cache_bytes as for generator_for."""
    from ragspec.models.load import load_model

    cache = model_cache_dir(cache_dir)
    loaded = load_model(model, cache, device=device, exact=exact, weights=weights)
    return loaded, generator_for(loaded, cache, max_draft, on_note=on_note,
                                 prompt_cache_bytes=prompt_cache_bytes)


def timing_prompt_cache() -> int | None:
    """The prompt cache's budget for commands that time repeated prompts (bench, eval): off
    (0), so a second method or repeat does not read its prompt from the first one's pages,
    unless RAGSPEC_PROMPT_CACHE_MB (--prompt-cache-mb) asks for it (None: that budget)."""
    return None if os.environ.get(PROMPT_CACHE_ENV, "").strip() else 0


def generator_for(loaded, cache_dir: str | os.PathLike | None = None, max_draft: int = 16,
                  on_note: Callable[[str], None] | None = None, *,
                  prompt_cache_bytes: int | None = None, measure_later: bool = False):
    """The Generator for a LoadedModel, with this machine's forward-cost curve (measured on the
    first use of this model, device and dtype, within calibrate.MEASURE_SECONDS; cached in the
    model cache once trusted, measured again when live step times disagree with it). Until a
    trusted curve exists the generator works with calibrate.conservative_cost and measures again
    between generations. on_note(line): progress lines (measuring, and which curve is in use).
    prompt_cache_bytes: its prompt cache's budget (None: ragspec.decoding.prefix_cache
    .budget_bytes, 0: off). measure_later: with no curve cached, answer first with the
    conservative curve and measure after the first generation (its owner's
    recalibrate_if_due, within the same bound) instead of before it: what a user's first
    question should wait for is its answer."""
    from ragspec.decoding import calibrate
    from ragspec.decoding.engine import Generator

    if loaded.speculation_off_reason is not None:
        # a model that cannot speculate never uses the curve (nor could measure it)
        return Generator.from_loaded(loaded, prompt_cache_bytes=prompt_cache_bytes)
    cache = model_cache_dir(cache_dir)
    sizes = max_draft + 1

    def measuring(seconds: float | None) -> None:
        if on_note is not None:
            bound = f"at most {seconds:.0f} s" if seconds is not None else "no time limit"
            on_note(f"Measuring this machine's forward cost once ({bound})...")

    def recalibrate():
        fresh = calibrate.measure_and_save(loaded.model, loaded.device, loaded.dtype, sizes,
                                           cache, seconds=calibrate.MEASURE_SECONDS)
        return fresh.cost if fresh is not None and fresh.trusted else None

    if measure_later and calibrate.cached(loaded.model, loaded.device, loaded.dtype, cache,
                                          sizes) is None:
        if on_note is not None:
            on_note("This machine's forward cost is not measured yet: this answer drafts "
                    "little (a conservative curve); it is measured after the answer.")
        gen = Generator.from_loaded(loaded, cost=calibrate.conservative_cost(sizes),
                                    recalibrate=recalibrate, provisional=True,
                                    prompt_cache_bytes=prompt_cache_bytes)
        gen.measure_after_first()
        return gen
    curve = calibrate.load_or_measure(loaded.model, loaded.device, loaded.dtype, sizes, cache,
                                      seconds=calibrate.MEASURE_SECONDS, on_measure=measuring)
    if curve is None:  # a benchmark that switched the measurement off (benchmarks/replay.py)
        return Generator.from_loaded(loaded, prompt_cache_bytes=prompt_cache_bytes)
    if curve.note and on_note is not None:
        on_note(curve.note)
    return Generator.from_loaded(loaded, cost=curve.cost, recalibrate=recalibrate,
                                 provisional=not curve.trusted,
                                 prompt_cache_bytes=prompt_cache_bytes)


def describe_device(loaded) -> str:
    """'cpu (2 threads, float32)' or 'cuda (NVIDIA ..., bfloat16)' for reports."""
    import torch

    dtype = str(loaded.dtype).replace("torch.", "")
    if loaded.device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(loaded.device)}, {dtype})"
    note = getattr(loaded, "weights_note", "")
    weights = f"{loaded.weights} weights: {note}" if note else dtype
    return f"{loaded.device.type} ({torch.get_num_threads()} threads, {weights})"


@functools.lru_cache(maxsize=2)
def cached_embedder(name: str | None):
    """The embedder `name` (None: RAGSPEC_EMBEDDER or the bundled one), loaded once per process
    (the chat serves many sessions, tests run many commands)."""
    from ragspec.retrieval.embeddings.embedder import Embedder

    return Embedder(name)


def index_location(index: str | os.PathLike | None = None):
    """What `--index` names: a Milvus location as given, else the folder (default
    $RAGSPEC_HOME/index)."""
    from ragspec import paths
    from ragspec.retrieval.backends import is_milvus

    return index if is_milvus(index) else paths.index_dir(index)


def open_store(index: str | os.PathLike | None = None, *, with_embedder: bool = True):
    """The store at `index` (a folder, default $RAGSPEC_HOME/index, or a Milvus location: see
    ragspec.retrieval.backends); with_embedder=False is enough to list and remove documents (no
    model is loaded). Raises retrieval's RetrievalError, or ValueError for a malformed Milvus
    location."""
    from ragspec.retrieval.backends import open_index

    embedder = cached_embedder(os.environ.get(EMBEDDER_ENV) or None) if with_embedder else None
    return open_index(index_location(index), embedder)
