"""The precision of the embedder's torch forward: fp32, or bfloat16 where the CPU has it natively.

Contract: `choose(setting, device, cpuinfo)` is the one place that decides. RAGSPEC_EMBEDDER_DTYPE
(or `Embedder(dtype=...)`) is the setting:

  auto (also unset)  bf16 when the model runs on the CPU and /proc/cpuinfo's flags name
                     avx512_bf16 or amx_bf16 (ragspec.cpuinfo.has_native_bf16: the
                     instructions oneDNN uses for bf16 matrix products); fp32 on a GPU, on a
                     CPU without them, or where there is no /proc/cpuinfo to read
  fp32               always fp32
  bf16               bf16 on the CPU even without those flags (slow there: emulated); a GPU
                     still gets fp32

`compute_in_bf16(model)` makes a loaded SentenceTransformer's first module (the transformer)
run under torch.autocast("cpu", bfloat16) and hands its outputs on as float32, so pooling and
normalisation stay fp32 and the vectors stay float32 of unit length. On libtasn1's manual at
batch 32 the bf16 vectors are within 0.0017 (max abs) and cosine 0.99995 of fp32's
(docs/documents-and-search.md, "bfloat16 where the CPU has it"); TOLERANCE_COSINE is the bound the tests hold them to.

The index records the model's name, not the precision: the two precisions' vectors are the same
model's to within that tolerance, so an index built in one can be searched in the other.
"""

from __future__ import annotations

from pathlib import Path

from ragspec import cpuinfo as cpuinfo_facts

ENV_VAR = "RAGSPEC_EMBEDDER_DTYPE"
SETTINGS = ("auto", "fp32", "bf16")
TOLERANCE_COSINE = 0.999
_MARK = "_ragspec_bf16"


def setting(value: str | None) -> str:
    """A setting as given (None or "" means auto); ValueError for anything else."""
    value = (value or "auto").strip().lower()
    if value not in SETTINGS:
        raise ValueError(f"{ENV_VAR} must be one of {', '.join(SETTINGS)}, got {value!r}")
    return value


def choose(value: str | None, device: str, cpuinfo: Path | None = None) -> str:
    """"bf16" or "fp32" for a model on `device` ("cpu", "cuda", ...) under setting `value`."""
    value = setting(value)
    if device != "cpu" or value == "fp32":
        return "fp32"
    return "bf16" if value == "bf16" or cpuinfo_facts.has_native_bf16(cpuinfo) else "fp32"


def compute_in_bf16(model) -> None:
    """Run `model[0]`'s forward under CPU bf16 autocast, its tensor outputs cast back to float32.
    Applying it twice changes nothing."""
    import torch

    first = model[0]
    if getattr(first, _MARK, False):
        return
    forward = first.forward

    def bf16_forward(features, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = forward(features, **kwargs)
        return {key: value.float() if torch.is_tensor(value) and value.dtype == torch.bfloat16
                else value for key, value in out.items()}

    first.forward = bf16_forward
    setattr(first, _MARK, True)
