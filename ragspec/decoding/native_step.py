"""The whole decode step in one native call, for packed models of the Llama family.

Contract: `install(model)` makes a packed model's step forwards (decode and verify: up to
packed.STEP_ROWS rows, or any forward inside packed.step_forward()) run as ONE call of
ragspec's StepModel (native/step.cpp) instead of transformers' modules around the kernels, and
returns None; where the model cannot run it (a family or a layer kind it does not cover, or
RAGSPEC_NATIVE_STEP=0) it changes nothing and returns why, in one line. A long prefill with
bf16 or fp32 prompt reads (the model's `prompt_precision`, packed.model_precision: a fact
of the CPU and the model's width) runs the model's own forward, or, with
RAGSPEC_PROMPT_PAGES=1 (packed.reads_in_pages), runs in pages (`_read_in_pages`): the
model's own forward on de-quantised weights one PROMPT_PAGE at a time, then the native step for
the piece holding the last token, so that a prompt read after pages kept by the prompt cache
(ragspec.decoding.prefix_cache) makes the calls a whole read makes. Every other forward — a call
with embeddings, a mask other than all ones or positions other than the rows' own, a cache of
other layers — runs the model's own forward.
transformers' `generate` (an all-ones mask, its own DynamicCache) takes the native step too,
so greedy `generate` and ragspec's engine compute the same steps on the same model object.
`stats(model)` gives the native step's time counters. The product installs it on every packed
model it covers unless RAGSPEC_NATIVE_STEP=0 (`chosen`, the one reader of that variable).
`forward_many(model, runs)` runs several sequences' step forwards, each on its own cache, in
one native call (StepModel.forward_many): the weights are read once for all their rows, and
each sequence gets bit for bit what its forward alone gives (`start_of` says which forwards
qualify: those the model's own forward would run natively). Batched serving uses it
(ragspec.decoding.ragged), so served and solo answers take the same path.

What stays as it was:
  * the cache: the new keys and values go into the same GrowingLayer buffers
    (ragspec.decoding.cache) the module path writes, at the same positions, so a rejected
    draft is cropped as before and a later forward of either path sees the same cache. The
    buffers store fp16 (`kv_dtype`, RAGSPEC_KV_CACHE=fp32 for fp32): both paths round a key or
    value as it is written and every attention of the model reads the rounded values, the
    module path's too (attention.native_forward), so the paths keep computing the same thing;
  * batch invariance: every operation in step.cpp computes a row from that row alone (see
    there), so a k-token verify gives, row for row, what k one-token steps give;
  * the reference: fp32 models keep transformers' modules (only packed models take this);
  * the arithmetic: the same kernels (kernels.h's products, attention.cpp's attend_row) on the
    same inputs; norms, rotary positions and activations are fp32 loops, so logits agree
    with the module path to float rounding (the test suite bounds the difference) — not bit
    for bit, so at a near-tie the greedy token can differ from the module path's (seen on the
    bundled model: a 96-token answer from Python's zlib documentation diverged at token 15).
    Exactness holds within each path: speculation on equals off, `generate` equals the
    engine, and a batched forward equals each sequence alone, on the same model object.

Families are one code path with parameters (FAMILIES): optional biases on every product
(Qwen2), per-head q/k norms (Qwen3), residual/embedding/logit multipliers (Granite), layers
without rotary positions (SmolLM3's every fourth, `use_rope` false on its attention). A family
not listed, sliding-window layers, partial or dynamic rotary positions, or an activation other
than SiLU keep the module path.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer

from ragspec.decoding.cache import GrowingLayer
from ragspec.decoding.packed import (
    PROMPT_PAGE,
    PackedLinear,
    _is_step,
    model_precision,
    prefill_precision,
    prompt_pages,
    reading_as,
    reads_in_pages,
)

ENV = "RAGSPEC_NATIVE_STEP"
KV_ENV = "RAGSPEC_KV_CACHE"


def kv_dtype() -> torch.dtype:
    """The KV cache's storage for models the native step runs: fp16 (IEEE half, as llama.cpp's
    default cache) unless RAGSPEC_KV_CACHE=fp32; the one reader of that variable. A step reads
    every cached key and value once per layer, so half the bytes is most of attention's time at
    long contexts; the arithmetic stays fp32 (values are widened exactly as they are read)."""
    value = os.environ.get(KV_ENV, "").strip().lower()
    if value in ("", "fp16", "f16", "half"):
        return torch.float16
    if value in ("fp32", "f32", "float"):
        return torch.float32
    raise ValueError(f"{KV_ENV}={value!r}: use fp16 or fp32")


def chosen() -> str | None:
    """None when the product should install the native step on the packed models it loads,
    else why not: the one place RAGSPEC_NATIVE_STEP is read. On unless RAGSPEC_NATIVE_STEP=0
    (batched serving runs each sequence's rows through the native step too,
    ragspec.decoding.ragged, so a request served beside others computes what it does alone)."""
    if os.environ.get(ENV, "").strip() == "0":
        return f"turned off ({ENV}=0)"
    return None


_ROPE_TYPES = ("default", "linear", "llama3")
_LAYERS = (GrowingLayer, DynamicLayer)  # cache layers whose buffers the native step writes


@dataclass(frozen=True)
class Variant:
    """How a family departs from Llama's step (all off: Llama)."""

    qk_norm: bool = False  # RMSNorm over each head of q and k before the rotary positions
    multipliers: bool = False  # Granite's embedding, residual, attention and logit multipliers


# Families checked against their module forward by the test suite (tests/decoding/test_native_step.py).
FAMILIES: dict[str, Variant] = {
    "llama": Variant(), "mistral": Variant(), "qwen2": Variant(),
    "qwen3": Variant(qk_norm=True), "granite": Variant(multipliers=True), "smollm3": Variant(),
}


def _empty() -> torch.Tensor:
    return torch.empty(0)


def _linear(module, name: str, tensors: list, formats: list) -> None:
    if not isinstance(module, PackedLinear):
        raise _Unsupported(f"{name} is not a packed linear layer")
    tensors += [module.packed.data, module.bias.data if module.bias is not None else _empty()]
    formats.append(module.packed.code)


class _Unsupported(Exception):
    pass


def _layer_attrs(layer) -> tuple:
    attn, mlp = layer.self_attn, layer.mlp
    return attn, mlp, layer.input_layernorm, layer.post_attention_layernorm


def _arguments(model, variant: Variant) -> tuple[list, list, list]:
    """StepModel's (tensors, ints, floats) for `model` (layout in step.cpp)."""
    cfg = model.config
    inner = model.model
    rotary = inner.rotary_emb
    if getattr(rotary, "rope_type", "default") not in _ROPE_TYPES:
        raise _Unsupported(f"rotary type {rotary.rope_type!r}")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise _Unsupported(f"activation {cfg.hidden_act!r}")
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    if rotary.inv_freq.numel() * 2 != head_dim:
        raise _Unsupported("partial rotary positions")
    head = model.get_output_embeddings()
    tensors: list = [rotary.inv_freq.float(), inner.norm.weight.data]
    formats: list = []
    rotary: list = []  # per layer: 1 when its q and k take rotary positions
    head_tensors: list = []
    _linear(head, "the LM head", head_tensors, formats)
    tensors += head_tensors
    eps = float(inner.norm.variance_epsilon)
    scale = None
    for i, layer in enumerate(inner.layers):
        attn, mlp, norm1, norm2 = _layer_attrs(layer)
        if float(norm1.variance_epsilon) != eps or float(norm2.variance_epsilon) != eps:
            raise _Unsupported("norms with different epsilons")
        if scale is not None and attn.scaling != scale:
            raise _Unsupported("layers with different attention scales")
        scale = attn.scaling
        rotary.append(int(bool(getattr(attn, "use_rope", True))))
        tensors.append(norm1.weight.data)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            _linear(getattr(attn, name), f"layer {i} {name}", tensors, formats)
        tensors.append(norm2.weight.data)
        for name in ("gate_proj", "up_proj", "down_proj"):
            _linear(getattr(mlp, name), f"layer {i} {name}", tensors, formats)
        if variant.qk_norm:
            tensors += [attn.q_norm.weight.data, attn.k_norm.weight.data]
        else:
            tensors += [_empty(), _empty()]
    head_format = formats.pop(0)
    per_layer = [v for i, flag in enumerate(rotary) for v in (*formats[7 * i:7 * i + 7], flag)]
    ints = [len(inner.layers), cfg.hidden_size, heads, kv_heads, head_dim, cfg.intermediate_size,
            head.out_features, *per_layer, head_format]
    resid = embed = logit = 1.0
    if variant.multipliers:
        resid, embed = float(cfg.residual_multiplier), float(cfg.embedding_multiplier)
        logit = 1.0 / float(cfg.logits_scaling)
    floats = [eps, float(scale), float(getattr(rotary, "attention_scaling", 1.0)), resid, embed,
              logit, 0.0]
    return tensors, ints, floats


def problem(model) -> str | None:
    """Why `model`'s steps cannot run natively (None when they can)."""
    from ragspec.decoding.cache import new_cache

    kind = getattr(model.config, "model_type", type(model).__name__)
    variant = FAMILIES.get(kind)
    if variant is None:
        return f"{kind} is not a family the native step covers"
    layers = new_cache(model).layers
    if not layers or not all(type(layer) is GrowingLayer for layer in layers):
        return f"{kind}: sliding-window or other non-growing cache layers"
    try:
        _arguments(model, variant)
    except _Unsupported as exc:
        return f"{kind}: {exc}"
    except AttributeError as exc:
        return f"{kind}: layers laid out unlike Llama's ({exc})"
    return None


def install(model) -> str | None:
    """See the module docstring: None when installed, else why not."""
    from ragspec.decoding import native

    if not native.loaded():
        return "the native kernels are not loaded"
    reason = chosen() or problem(model)
    if reason is not None:
        return reason
    tensors, ints, floats = _arguments(model, FAMILIES[model.config.model_type])
    step = torch.classes.ragspec.StepModel(tensors, ints, floats)
    module_forward = model.forward
    embed = model.get_input_embeddings()
    n_layers = len(model.model.layers)
    kv_heads, head_dim = ints[3], ints[4]
    storage = kv_dtype()
    width = model.config.hidden_size
    # shapes and types the cache buffers GrowingLayer makes
    dummy = torch.empty(1, kv_heads, 0, head_dim, dtype=storage)

    def native(input_ids, cache, start: int, keep: int) -> torch.Tensor:
        rows = input_ids.shape[1]
        keys, values = _reserve(cache.layers, start, start + rows, dummy)
        x = embed(input_ids[0]).float()
        logits = _in_pieces(step, x, keys, values, start, keep)
        _publish(cache.layers, keys, values, start + rows)
        return logits

    @functools.wraps(module_forward)
    def forward(input_ids=None, attention_mask=None, position_ids=None, cache=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        with reading_as(model_precision(width)):  # every forward of it, its modules' too
            start = _plain_start(input_ids, attention_mask, position_ids, cache, inputs_embeds,
                                 labels, use_cache, logits_to_keep, kwargs, n_layers)
            if start is None or not (_is_step(input_ids.shape[1]) or reads_in_pages()):
                return module_forward(input_ids=input_ids, attention_mask=attention_mask,
                                      position_ids=position_ids, cache=cache,
                                      inputs_embeds=inputs_embeds, labels=labels,
                                      use_cache=use_cache, logits_to_keep=logits_to_keep,
                                      **kwargs)
            rows = input_ids.shape[1]
            keep = rows if logits_to_keep <= 0 else min(rows, logits_to_keep)
            if _is_step(rows):
                return _output(native(input_ids, cache, start, keep), cache)
            return _output(_read_in_pages(model, module_forward, native, input_ids, cache, start,
                                          keep), cache)

    model.forward = forward
    model._ragspec_step = step
    model._ragspec_kv_dtype = storage  # read by cache.new_cache
    for layer in model.model.layers:  # every attention reads the keys as stored (attention.py)
        layer.self_attn._ragspec_kv_dtype = storage
    model._ragspec_step_parts = _Parts(embed, n_layers, dummy)
    return None


@dataclass(frozen=True)
class _Parts:
    """What `forward_many` needs of an installed model besides its StepModel."""

    embed: torch.nn.Module
    n_layers: int
    dummy: torch.Tensor


def start_of(model, rows: int, cache) -> int | None:
    """The cached positions before `rows` new tokens of one sequence on `cache`, when the native
    step runs that forward (the model's own forward on these rows would take it), else None."""
    parts = getattr(model, "_ragspec_step_parts", None)
    if parts is None:
        return None
    ids = torch.empty((1, rows), dtype=torch.long)
    with reading_as(prompt_precision(model)):
        return _native_start(ids, None, None, cache, None, None, True, 0, {}, parts.n_layers)


def forward_many(model, runs) -> list[torch.Tensor]:
    """Several sequences' forwards in ONE native call: runs are (tokens, cache, keep) with each
    cache at a length `start_of` accepted for its tokens, keep the number of last rows that get
    logits (0: none). Returns each run's logits (keep, vocab); each cache grows by its tokens.
    The products read the weights once for all the runs' rows; everything else is per run, so a
    run's logits and cache rows are bit-identical to the model's own forward on it alone."""
    step, parts = model._ragspec_step, model._ragspec_step_parts
    keys, values, starts, rows, keeps, ends = [], [], [], [], [], []
    for tokens, cache, keep in runs:
        start = cache.layers[0].get_seq_length()
        k, v = _reserve(cache.layers, start, start + len(tokens), parts.dummy)
        keys += k
        values += v
        starts.append(start)
        rows.append(len(tokens))
        keeps.append(max(0, min(int(keep), len(tokens))))
        ends.append(start + len(tokens))
    ids = torch.tensor([t for tokens, _, _ in runs for t in tokens], dtype=torch.long)
    x = parts.embed(ids).float()
    logits = step.forward_many(x, keys, values, starts, rows, keeps)
    n = parts.n_layers
    for i, ((_, cache, _), end) in enumerate(zip(runs, ends, strict=True)):
        _publish(cache.layers, keys[i * n:(i + 1) * n], values[i * n:(i + 1) * n], end)
    return list(torch.split(logits, keeps))


def _native_start(input_ids, attention_mask, position_ids, cache, inputs_embeds, labels,
                  use_cache, logits_to_keep, kwargs, n_layers: int) -> int | None:
    """The cached positions before a forward the native step runs, or None when it does not:
    a plain forward (`_plain_start`) of a step's rows (packed._is_step)."""
    start = _plain_start(input_ids, attention_mask, position_ids, cache, inputs_embeds, labels,
                         use_cache, logits_to_keep, kwargs, n_layers)
    return start if start is not None and _is_step(input_ids.shape[1]) else None


def _plain_start(input_ids, attention_mask, position_ids, cache, inputs_embeds, labels,
                 use_cache, logits_to_keep, kwargs, n_layers: int) -> int | None:
    """The cached positions before a plain forward, else None: one sequence, no embeddings or
    labels, a cache of GrowingLayer (ragspec's) or DynamicLayer (transformers' generate) layers
    at one length, no mask or an all-ones one, and no position ids or the rows' own (what
    generate passes). The native step runs those of a step's rows; longer ones on bf16 or fp32
    prompt reads are read in pages (`_read_in_pages`)."""
    layers = getattr(cache, "layers", None)
    if (input_ids is None or input_ids.dim() != 2 or input_ids.shape[0] != 1
            or inputs_embeds is not None or labels is not None
            or use_cache is False or not isinstance(logits_to_keep, int)
            or any(k != "return_dict" or v is not True for k, v in kwargs.items())
            or layers is None or len(layers) != n_layers
            or not all(type(layer) in _LAYERS for layer in layers)):
        return None
    start = layers[0].get_seq_length()
    if any(layer.get_seq_length() != start for layer in layers):
        return None
    if attention_mask is not None and (
            attention_mask.shape != (1, start + input_ids.shape[1]) or not bool(attention_mask.all())):
        return None
    if position_ids is not None and not torch.equal(
            position_ids.reshape(-1), torch.arange(start, start + input_ids.shape[1])):
        return None
    return start


# A long forward (a prompt read with int8 prefill, packed.prefill_precision) runs in pieces of
# at most this many rows: the step's buffers grow with its rows (~70 MB at 512 rows of a 1.7B
# model), and a row's result does not depend on the rows computed beside it.
PIECE_ROWS = 512


def _in_pieces(step, x: torch.Tensor, keys: list, values: list, start: int,
               keep: int) -> torch.Tensor:
    """step.forward over x's rows (rows, hidden) from position `start`, PIECE_ROWS at a time;
    logits for the last `keep` rows, as one call would give them."""
    rows = x.shape[0]
    if rows <= PIECE_ROWS:
        return step.forward(x, keys, values, start, keep)
    parts = []
    for a in range(0, rows, PIECE_ROWS):
        b = min(rows, a + PIECE_ROWS)
        wanted = max(0, min(b - a, b - (rows - keep)))  # this piece's rows among the last `keep`
        parts.append(step.forward(x[a:b], keys, values, start + a, wanted))
    return torch.cat(parts)


def _read_in_pages(model, module_forward, native, input_ids, cache, start: int,
                   keep: int) -> torch.Tensor:
    """A bf16 or fp32 prompt read of input_ids (1, rows) from position `start`, in pieces that
    end at multiples of PROMPT_PAGE: every piece but the last a forward of the model's modules
    of its own (de-quantised weights, inside packed.prompt_pages()), the last piece (the one
    holding the last row: 1 to PROMPT_PAGE rows) the native step. Logits for the last `keep`
    rows. A read that starts at a page boundary makes, piece for piece, the calls a read from
    the prompt's start makes from there on, so a prompt whose first pages come from the prompt
    cache ends with the cache and logits of a whole read, bit for bit, whatever the kernels do
    inside a call; and a rest of a step's rows after the cached pages is that last piece."""
    rows = input_ids.shape[1]
    end = start + rows
    last = max(start, (end - 1) // PROMPT_PAGE * PROMPT_PAGE)
    parts, a = [], start
    with prompt_pages():
        while a < last:
            b = min(last, (a // PROMPT_PAGE + 1) * PROMPT_PAGE)
            piece = input_ids[:, a - start:b - start]
            wanted = max(0, min(b - a, b - (end - keep)))  # this piece's rows among the last keep
            if wanted:
                parts.append(module_forward(input_ids=piece, cache=cache, use_cache=True,
                                            logits_to_keep=wanted).logits[0].float())
            else:  # no logits: the model without its head
                model.model(input_ids=piece, cache=cache, use_cache=True)
            a = b
    parts.append(native(input_ids[:, last - start:], cache, last, min(keep, end - last)))
    return torch.cat(parts)


def _reserve(layers, start: int, end: int, dummy: torch.Tensor) -> tuple[list, list]:
    """Each layer's key and value buffers with room for positions up to `end`: a GrowingLayer's
    own (grown when full); for a DynamicLayer new ones holding its keys and values, as its
    own update's concatenation would make."""
    keys, values = [], []
    for layer in layers:
        if not layer.is_initialized:
            layer.lazy_initialization(dummy, dummy)
        if type(layer) is GrowingLayer:
            buf = layer._key_buf
            if buf is None or buf.shape[-2] < end:
                layer._reserve(end, dummy, dummy)
            keys.append(layer._key_buf)
            values.append(layer._value_buf)
        else:
            for old, out in ((layer.keys, keys), (layer.values, values)):
                buf = torch.empty((*dummy.shape[:2], end, dummy.shape[-1]), dtype=dummy.dtype)
                if start:
                    buf[..., :start, :].copy_(old)
                out.append(buf)
    return keys, values


def _publish(layers, keys: list, values: list, end: int) -> None:
    """Record that the layers now hold `end` positions (the native step wrote them)."""
    for layer, k, v in zip(layers, keys, values, strict=True):
        if type(layer) is GrowingLayer:
            layer._length = end  # its keys and values are views made when read
        else:
            layer.keys, layer.values = k, v


def _output(logits: torch.Tensor, cache):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return CausalLMOutputWithPast(logits=logits.unsqueeze(0), cache=cache)


def installed(model) -> bool:
    return getattr(model, "_ragspec_step", None) is not None


def prompt_precision(model) -> str:
    """How this model reads its prompts: packed.model_precision of its width where the native
    step is installed, else the machine's packed.prefill_precision()."""
    return model_precision(model.config.hidden_size) if installed(model) else prefill_precision()


def reads_prompts(model) -> bool:
    """Whether the native step runs this model's whole prompt reads (int8 prompt reads,
    prompt_precision): then a prompt read in pieces of any size gives, bit for bit, the
    cache and logits of the prompt read whole, and a piece can share one native call with other
    sequences' steps (ragspec.decoding.batch). (bf16 and fp32 reads are exact in pieces only
    where the pieces start at pages: `_read_in_pages`.)"""
    return installed(model) and prompt_precision(model) == "int8"


def stats(model) -> dict[str, float] | None:
    """The native step's counters since the last reset: forwards, and seconds in all, in
    products (with preparing their inputs) and in attention; None when it is not installed."""
    step = getattr(model, "_ragspec_step", None)
    if step is None:
        return None
    calls, total, matmul, attend = step.stats()
    return {"forwards": calls, "seconds": total / 1e9, "product_seconds": matmul / 1e9,
            "attention_seconds": attend / 1e9}


def reset_stats(model) -> None:
    step = getattr(model, "_ragspec_step", None)
    if step is not None:
        step.reset_stats()
