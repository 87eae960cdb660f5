"""Which weights a model runs with, and the packed models made for it in the model cache.

Choices (`--weights`):
  * "gguf"  — a GGUF file's own formats (Q4_0, Q4_K, Q6_K, Q8_0, ...), kept packed in memory;
  * "int8", "int4", "bf16" — the model's weights quantised by ragspec (Q8_0; Q4_1 with Q8_0
    embeddings and LM head; BF16), kept packed;
  * "fp32"  — de-quantised fp32 weights in transformers' own layers (bf16 on a GPU unless
    --exact), the only choice on a GPU;
  * "auto"  — the default: on a CPU where ragspec's kernels build, "gguf" for a GGUF file and
    "int8" for a model folder; otherwise "fp32". The benchmark behind this choice is in the
    docs/kernels.md.

Packed weights run ragspec's native kernels (ragspec.decoding.native): decode and verify
forwards are batch-invariant, so greedy output with speculation equals the same loaded model
without it, for every choice. A quantised model folder is made once per (source, choice) in the
model cache, named after the source's files (path, sizes, modification times), under a lock.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

WEIGHTS = ("auto", "gguf", "int8", "int4", "bf16", "fp32")
PACKED = ("gguf", "int8", "int4", "bf16")


class WeightsUnavailable(ValueError):
    """The requested weights cannot be used for this model here; the message says why."""


def choose(requested: str, is_gguf: bool, device: torch.device, kernels: Callable[[], bool]) -> str:
    """The weights to run with. kernels() says whether the native kernels are available (it
    may build them, so it is only called when packed weights are wanted)."""
    if requested not in WEIGHTS:
        raise WeightsUnavailable(f"unknown weights {requested!r}: choose one of {', '.join(WEIGHTS)}")
    if requested == "fp32":
        return "fp32"
    if requested == "auto":
        if device.type != "cpu" or not kernels():
            return "fp32"
        return "gguf" if is_gguf else "int8"
    if device.type != "cpu":
        raise WeightsUnavailable(f"--weights {requested} runs on a CPU only; on {device.type} "
                                 f"use --weights fp32 (or auto)")
    if requested == "gguf" and not is_gguf:
        raise WeightsUnavailable("--weights gguf keeps a GGUF file's formats: this model is not a "
                                 ".gguf file (use int8, int4 or bf16)")
    if not kernels():
        from ragspec.decoding import native

        raise WeightsUnavailable(f"--weights {requested} needs ragspec's CPU kernels: "
                                 f"{native.unavailable_reason()}")
    return requested


def _source_key(folder: Path) -> str:
    digest = hashlib.sha256(str(folder.resolve()).encode())
    for f in sorted(folder.iterdir()):
        if f.is_file():
            st = f.stat()
            digest.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


def quantised_folder(source: Path, weights: str, cache_dir: Path,
                     on_convert: Callable[[Path], None] | None = None) -> tuple[Path, bool]:
    """(folder, made now) of `source` (a transformers model folder) quantised to `weights`."""
    from ragspec.models.gguf import is_converted, make_locked

    target = Path(cache_dir) / f"packed-{_source_key(source)}-{weights}"
    if is_converted(target):
        return target, False
    made = make_locked(target, lambda out: _save_quantised(source, weights, out),
                       None if on_convert is None else lambda: on_convert(source))
    return target, made


def _save_quantised(source: Path, weights: str, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragspec.models import packed_cache as packing

    tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    # The checkpoint's own dtype (often bf16): quantising reads one weight at a time in fp32.
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype="auto", local_files_only=True)
    model.config.torch_dtype = torch.float32
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    packing.save(packing.quantised_entries(model, weights), out / packing.PACKED_FILE)
    (out / "ragspec-source.json").write_text(json.dumps({"source": str(source), "weights": weights}))


def load_packed(folder: Path):
    """(model, tokenizer) of a packed model folder (convert.gguf_folder(packed=True) or
    quantised_folder), attention switched to ragspec's row-invariant kernel."""
    from transformers import AutoTokenizer, GenerationConfig

    from ragspec.decoding.attention import install
    from ragspec.models import packed_cache as packing

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = packing.build(folder, packing.load(Path(folder) / packing.PACKED_FILE))
    if (Path(folder) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(folder), local_files_only=True)
    install(model, native=True)
    return model, tokenizer


def describe(model) -> str:
    """'Q4_1 + Q8_0, 96.6 MB packed' for a packed model, '' for another."""
    from ragspec.decoding.packed import PackedEmbedding, PackedLinear, packed_bytes

    formats: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, (PackedLinear, PackedEmbedding)):
            formats[m.packed.fmt] = formats.get(m.packed.fmt, 0) + m.packed.nbytes
    if not formats:
        return ""
    names = " + ".join(sorted(formats, key=formats.get, reverse=True))
    return f"{names}, {packed_bytes(model) / 1e6:.1f} MB packed"
