"""Loading the generator: a model spec in, (LoadedModel, Generator) out.

The one place that turns `--model` (None for the bundled SmolLM2, a folder, a cached hub id) into
a loaded model and a Generator that knows this machine's forward-cost curve (measured once per
model, device and dtype, and cached next to the converted models). The CLI, the chat page and
the benchmark all load through here.
"""

from __future__ import annotations

import os
from pathlib import Path


def model_cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Where converted models and forward costs live (see app.paths.models_dir)."""
    from app import paths

    return paths.models_dir(override)


def load_generator(model: str | None = None, cache_dir: str | os.PathLike | None = None,
                   max_draft: int = 16, *, device: str | None = None, exact: bool = False):
    """(LoadedModel, Generator) for a model spec (None: the bundled SmolLM2)."""
    from decoding.model import load_model

    cache = model_cache_dir(cache_dir)
    loaded = load_model(model, cache, device=device, exact=exact)
    return loaded, generator_for(loaded, cache, max_draft)


def generator_for(loaded, cache_dir: str | os.PathLike | None = None, max_draft: int = 16):
    """The Generator for a LoadedModel, with this machine's forward-cost curve (measured on the
    first use of this model, device and dtype; cached in the model cache)."""
    from decoding.calibrate import load_or_measure
    from decoding.engine import Generator

    cost = None  # a model that cannot speculate never uses the curve (nor could measure it)
    if loaded.speculation_off_reason is None:
        cost = load_or_measure(loaded.model, loaded.device, loaded.dtype, max_draft + 1,
                               model_cache_dir(cache_dir))
    return Generator.from_loaded(loaded, cost=cost)


def describe_device(loaded) -> str:
    """'cpu (2 threads, float32)' or 'cuda (NVIDIA ..., bfloat16)' for reports."""
    import torch

    dtype = str(loaded.dtype).replace("torch.", "")
    if loaded.device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(loaded.device)}, {dtype})"
    return f"{loaded.device.type} ({torch.get_num_threads()} threads, {dtype})"
