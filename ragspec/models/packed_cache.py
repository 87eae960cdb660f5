"""Packed models: weights from a GGUF file (kept in its own formats) or quantised from a
transformers model, stored once in the model cache and loaded back without de-quantising.

Contract:
  * `gguf_entries(path, model)` — every tensor of a GGUF file under the parameter name of
    `model` (a transformers model for the file's config, on the meta device is enough): the
    weights of linear and embedding layers as PackedWeight, in the file's own format (rows
    reordered where transformers' loader reorders them, e.g. Llama's query/key heads); every
    other tensor de-quantised to fp32 exactly as transformers' GGUF loader does. A linear weight
    in a format the kernels do not read (IQ*, Q2_K, Q3_K, ...) is stored de-quantised as F32
    rows, so every linear still runs the batch-invariant kernel.
  * `quantised_entries(model, weights)` — the same for a loaded transformers model, its linear
    weights quantised to `weights` ("int8": Q8_0, "int4": Q4_1 with Q8_0 embeddings and LM head,
    "bf16": BF16) by gguf's own quantisers.
  * `save(entries, file)` / `load(file)` — one safetensors file (uint8 rows for packed weights,
    their format in the metadata); `load` memory-maps it, so resident memory is what is used.
    `save` stores weights of the tileable formats tiled (packed.tile: the layout the fastest
    kernel reads, so loading stays a memory map); RAGSPEC_WEIGHT_LAYOUT=rows keeps GGUF rows.
  * `build(folder, entries)` — the transformers model of `folder`'s config with PackedLinear /
    PackedEmbedding layers in place of the packed ones, every other tensor assigned, and
    buffers (rotary frequencies) initialised as transformers initialises them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ragspec.decoding.packed import FORMATS, PackedEmbedding, PackedLinear, PackedWeight, tile

PACKED_FILE = "packed.safetensors"
LAYOUT_ENV = "RAGSPEC_WEIGHT_LAYOUT"
_META_KEY = "ragspec.packed"
WEIGHT_CHOICES = ("int8", "int4", "bf16")
# gguf's quantiser for each choice: linear layers, then embeddings and the LM head.
_QUANT = {"int8": ("Q8_0", "Q8_0"), "int4": ("Q4_1", "Q8_0"), "bf16": ("BF16", "BF16")}


class PackingError(ValueError):
    """Weights that cannot be packed or loaded as asked; the message says which and why."""


def targets(model: nn.Module) -> dict[str, str]:
    """Parameter name -> "linear" | "conv1d" | "embedding" for every weight a packed layer can
    take: nn.Linear, transformers' Conv1D (GPT-2: weight stored transposed) and nn.Embedding."""
    from transformers.pytorch_utils import Conv1D

    kinds = {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, nn.Embedding):
            kinds[prefix + "weight"] = "embedding"
        elif isinstance(module, Conv1D):
            kinds[prefix + "weight"] = "conv1d"
        elif isinstance(module, nn.Linear):
            kinds[prefix + "weight"] = "linear"
    return kinds


# -- from a GGUF file -----------------------------------------------------------------------------

def _raw_rows(tensor) -> np.ndarray:
    """A GGUF tensor's bytes as (rows, bytes per row); GGUF lists the inner dimension first."""
    rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1
    return np.asarray(tensor.data).view(np.uint8).reshape(rows, -1)


def _row_order(processor, tensor, name_map, kind: str) -> np.ndarray | None:
    """How transformers' loader rearranges this weight, found by running its processor on the
    row indices: an index array (rows in the order the model wants), or None when it does more
    than reorder rows (then the tensor is de-quantised instead)."""
    rows = int(tensor.shape[-1])
    probe = np.arange(rows, dtype=np.float32).reshape(rows, 1)
    result = processor.process(weights=probe, name=tensor.name, tensor_key_mapping=name_map,
                               parsed_parameters={"tensors": {}, "config": {}})
    if result.name != tensor.name:
        return None
    out = np.asarray(result.weights)
    if kind == "conv1d":  # the loader transposes to Conv1D's layout: the file's rows are ours
        return np.arange(rows) if out.shape == (1, rows) and np.array_equal(out[0], probe[:, 0]) else None
    if out.shape != (rows, 1):
        return None
    order = out[:, 0].astype(np.int64)
    return order if np.array_equal(np.sort(order), np.arange(rows)) else None


def gguf_entries(path: Path | str, model: nn.Module) -> dict[str, PackedWeight | torch.Tensor]:
    """See the module docstring."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        read_field,
    )

    reader = GGUFReader(str(path))
    arch = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=model.config.to_dict())
    name_map = get_gguf_hf_weights_map(model, processor)
    kinds = targets(model)
    parsed: dict = {"tensors": {}, "config": model.config.to_dict()}
    entries: dict[str, PackedWeight | torch.Tensor] = {}
    for tensor in reader.tensors:
        hf = name_map.get(tensor.name)
        kind = kinds.get(hf) if hf else None
        fmt = tensor.tensor_type.name
        k = int(tensor.shape[0])
        if kind and len(tensor.shape) == 2 and fmt in FORMATS:
            order = _row_order(processor, tensor, name_map, kind)
            if order is not None:
                rows = _raw_rows(tensor)
                if not np.array_equal(order, np.arange(len(order))):
                    rows = rows[order]
                entries[hf] = PackedWeight(torch.from_numpy(np.array(rows, copy=True)), fmt, k)
                continue
        weights = dequantize(tensor.data, tensor.tensor_type)
        result = processor.process(weights=weights, name=tensor.name, tensor_key_mapping=name_map,
                                   parsed_parameters=parsed)
        if result.name is None or result.name not in name_map:
            continue
        hf = name_map[result.name]
        value = torch.from_numpy(np.array(result.weights, dtype=np.float32))
        kind = kinds.get(hf)
        if kind and value.dim() == 2:
            entries[hf] = _f32_rows(value.t() if kind == "conv1d" else value)
        else:
            entries[hf] = value
    for name, value in parsed["tensors"].items():  # tensors a processor placed itself
        entries.setdefault(name, value.float())
    return entries


def _f32_rows(weight: torch.Tensor) -> PackedWeight:
    w = weight.float().contiguous()
    return PackedWeight(w.view(torch.uint8).reshape(w.shape[0], -1).clone(), "F32", int(w.shape[1]))


# -- from a transformers model ---------------------------------------------------------------------

def quantise(weight: torch.Tensor, fmt: str) -> PackedWeight:
    """An fp32 (N, K) weight in `fmt`, by gguf's quantiser (F32 rows when K does not fit)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    _, per_block, _ = FORMATS[fmt]
    w = weight.detach().float().contiguous()
    if w.shape[1] % per_block:
        return _f32_rows(w)
    if fmt == "BF16":
        data = w.to(torch.bfloat16).view(torch.uint8).reshape(w.shape[0], -1).clone()
        return PackedWeight(data, fmt, int(w.shape[1]))
    data = quantize(w.numpy(), GGMLQuantizationType[fmt])
    return PackedWeight(torch.from_numpy(np.ascontiguousarray(data.reshape(w.shape[0], -1))), fmt,
                        int(w.shape[1]))


def quantised_entries(model: nn.Module, weights: str) -> dict[str, PackedWeight | torch.Tensor]:
    """See the module docstring. The model's own tensors are read, not changed."""
    if weights not in _QUANT:
        raise PackingError(f"unknown weight format {weights!r}: choose one of {', '.join(_QUANT)}")
    linear_fmt, outer_fmt = _QUANT[weights]
    kinds = targets(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_name = next((n for n, m in model.named_modules() if m is head), None)
    entries: dict[str, PackedWeight | torch.Tensor] = {}
    done: dict[int, PackedWeight] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        kind = kinds.get(name)
        if kind is None:
            entries[name] = tensor.detach().float()
            continue
        if tensor.data_ptr() in done:  # a tied weight: one packed copy
            entries[name] = done[tensor.data_ptr()]
            continue
        outer = kind == "embedding" or name == f"{head_name}.weight"
        w = tensor.detach().t() if kind == "conv1d" else tensor.detach()
        entries[name] = done[tensor.data_ptr()] = quantise(w, outer_fmt if outer else linear_fmt)
    return entries


# -- storing and loading ----------------------------------------------------------------------------

def save(entries: dict[str, PackedWeight | torch.Tensor], file: Path | str) -> None:
    """One safetensors file; shared packed weights are stored once (under their first name)."""
    from safetensors.torch import save_file

    layout = os.environ.get(LAYOUT_ENV, "tiled").strip().lower() or "tiled"
    if layout not in ("tiled", "rows"):
        raise PackingError(f"{LAYOUT_ENV}={layout!r}: choose tiled or rows")
    tensors, formats, aliases, first = {}, {}, {}, {}
    for name, value in entries.items():
        if isinstance(value, PackedWeight):
            key = id(value)
            if key in first:
                aliases[name] = first[key]
                continue
            first[key] = name
            if layout == "tiled":
                value = tile(value)
            tensors[name] = value.data.contiguous()
            formats[name] = [value.fmt, value.in_features] + (["tiled"] if value.tiled else [])
        else:
            tensors[name] = value.contiguous()
    meta = {_META_KEY: json.dumps({"formats": formats, "aliases": aliases})}
    save_file(tensors, str(file), metadata=meta)


def load(file: Path | str) -> dict[str, PackedWeight | torch.Tensor]:
    """The entries saved by `save`, memory-mapped."""
    from safetensors import safe_open

    entries: dict[str, PackedWeight | torch.Tensor] = {}
    with safe_open(str(file), framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get(_META_KEY, "{}"))
        formats, aliases = meta.get("formats", {}), meta.get("aliases", {})
        for name in f.keys():
            tensor = f.get_tensor(name)
            if name in formats:
                fmt, k, *layout = formats[name]
                entries[name] = PackedWeight(tensor, fmt, int(k), tiled=layout == ["tiled"])
            else:
                entries[name] = tensor
    for name, target in aliases.items():
        entries[name] = entries[target]
    return entries


# -- the model ---------------------------------------------------------------------------------------

def meta_model(folder: Path | str):
    """The transformers model of folder's config, on the meta device (no memory)."""
    from transformers import AutoConfig

    return meta_model_from_config(AutoConfig.from_pretrained(str(folder), local_files_only=True))


def meta_model_from_config(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _swap(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def build(folder: Path | str, entries: dict[str, PackedWeight | torch.Tensor], model=None):
    """See the module docstring; `model` may be the meta model already made for `folder`."""
    model = model if model is not None else meta_model(folder)
    kinds = targets(model)
    packed_for: dict[int, PackedWeight] = {}
    for name, value in entries.items():
        if not isinstance(value, PackedWeight):
            continue
        module_name = name.rpartition(".")[0]
        module = model.get_submodule(module_name)
        if kinds.get(name) == "embedding":
            scale = getattr(module, "scalar_embed_scale", None)
            new = PackedEmbedding(value, getattr(module, "padding_idx", None),
                                  torch.tensor(scale, dtype=torch.float32) if scale is not None else None)
        else:
            bias = entries.get(f"{module_name}.bias")
            new = PackedLinear(value, bias if isinstance(bias, torch.Tensor) else None)
        packed_for[id(module)] = value
        _swap(model, module_name, new)
    _tie_head(model, entries)
    rest = {n: v for n, v in entries.items() if isinstance(v, torch.Tensor)}
    model.load_state_dict(rest, strict=False, assign=True)
    _materialise(model)
    model.eval()
    return model


def _tie_head(model: nn.Module, entries) -> None:
    """A tied LM head (no weight of its own in the file) shares the packed embedding."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or isinstance(head, PackedLinear) or not isinstance(head, nn.Linear):
        return
    if not getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        return  # an untied head without its weight is reported missing
    embed = model.get_input_embeddings()
    if not isinstance(embed, PackedEmbedding):
        return
    head_name = next(n for n, m in model.named_modules() if m is head)
    if f"{head_name}.weight" in entries:
        return
    bias = entries.get(f"{head_name}.bias")
    _swap(model, head_name, PackedLinear(embed.packed, bias if isinstance(bias, torch.Tensor) else None))


def _materialise(model: nn.Module) -> None:
    """Buffers still on the meta device are initialised as transformers does (rotary
    frequencies, embedding scales); a parameter still there is a weight the file lacks."""
    missing = [f"{m}.{p}" if m else p for m, mod in model.named_modules()
               for p, t in mod.named_parameters(recurse=False) if t.is_meta]
    if missing:
        raise PackingError(f"the weights lack {len(missing)} tensor(s) the model needs, e.g. "
                           f"{', '.join(missing[:3])}")
    for module in model.modules():
        if any(b.is_meta for b in module.buffers(recurse=False)):
            module.to_empty(device="cpu", recurse=False)
            model._init_weights(module)
    left = [n for n, b in model.named_buffers() if b.is_meta]
    if left:
        raise PackingError(f"cannot initialise buffer(s) {', '.join(left[:3])} of this model")
