"""Attention for multi-token verify forwards: without copying the KV cache, and row-invariant.

transformers' sdpa path handles grouped-query attention (fewer KV heads than query heads) by
broadcasting when there is no mask (prefill) or one query token (plain decoding), but for
several query tokens with a mask — exactly a verify forward over [last token + draft] — it
repeats K and V across head groups: a copy of the whole cache in every layer, every step (the
docs/how-it-works.md gives what it cost on one machine). SDPA's enable_gqa broadcasts
instead; the math is the same attention.

The broadcast is used on the CPU only, where it was measured: on CUDA, SDPA with both a mask and
enable_gqa may fall back to its slowest (math) kernel, so there every shape goes to transformers'
own sdpa function, which picks its kernels for that device — except cuDNN's attention
(`CUDA_BACKENDS`): cuDNN builds an execution graph for every new key length, i.e. at every
decode step of a generation, which on an H200 (bf16, the bundled model) made a one-token step
~61 ms on new lengths against ~22 ms on lengths seen before; flash and memory-efficient
attention need no such plan.

`install(model)` switches a loaded model to this function (attn_implementation "ragspec_sdpa",
mask built as for "sdpa") when the model runs stock sdpa attention. A model whose class refuses
sdpa — Gemma 2, whose logit soft-capping sdpa cannot express — keeps the attention transformers
chose for it (eager); so does one loaded with another implementation on purpose.

`install(model, native=True)` (CPU models with packed weights, ragspec.decoding.packed) uses
NATIVE instead: step forwards (decode and verify, up to packed.STEP_ROWS query rows or inside
packed.step_forward()) run ragspec's attention kernel (native/attention.cpp), in which every
query row visits its keys in the same order whether it is computed alone or with the draft rows
after it, so a verify forward reproduces the one-token steps bit for bit; longer forwards
(prefill) run SDPA as above. The kernel takes soft-capping too, so Gemma 2 runs it as well.
Keys and values may be stored as fp16 (the native step's cache, ragspec.decoding.native_step):
the kernel widens them as it reads; the SDPA paths get them widened first. An attention module
with `_ragspec_kv_dtype` set reads keys rounded to that type whatever cache holds them.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "ragspec_sdpa"
NATIVE = "ragspec_native"


# SDPA's kernels on CUDA, in torch's order of preference, without cuDNN (docstring above).
CUDA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def gqa_sdpa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                     is_causal=None, **kwargs):
    # query: (batch, heads, q_len, head_dim); key/value: (batch, kv_heads, kv_len, head_dim)
    groups = getattr(module, "num_key_value_groups", 1)
    plain = kwargs.get("position_bias") is None and kwargs.get("softcap") is None
    if (groups > 1 and query.shape[2] > 1 and attention_mask is not None and plain
            and query.device.type == "cpu"):
        if attention_mask.dtype != torch.bool and attention_mask.dtype != query.dtype:
            attention_mask = attention_mask.to(query.dtype)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
            enable_gqa=True,
        )
        return out.transpose(1, 2).contiguous(), None
    if query.device.type == "cuda":
        with sdpa_kernel(CUDA_BACKENDS):
            return sdpa_attention_forward(module, query, key, value, attention_mask,
                                          dropout=dropout, scaling=scaling, is_causal=is_causal,
                                          **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, is_causal=is_causal, **kwargs)


class _Ranges:
    """The key range each query row sees, read once per mask (every layer of a forward gets
    the same mask object, or None): (lo, hi) int64 tensors of length q_len, or None when a row
    sees a non-contiguous set of keys (then the forward falls back to SDPA)."""

    def __init__(self):
        self._memo: list = []  # [(mask, q_len, kv_len, result)], newest last, two kept

    def __call__(self, mask, q_len: int, kv_len: int):
        for held, q, k, result in self._memo:
            if held is mask and q == q_len and k == kv_len:
                return result
        result = _ranges(mask, q_len, kv_len)
        self._memo = [*self._memo[-1:], (mask, q_len, kv_len, result)]
        return result


def _ranges(mask, q_len: int, kv_len: int):
    if mask is None:  # causal, the new rows being the last q_len keys
        hi = torch.arange(kv_len - q_len, kv_len, dtype=torch.long)
        return torch.zeros(q_len, dtype=torch.long), hi
    m = mask[0, 0] if mask.dim() == 4 else mask
    m = m[-q_len:, -kv_len:]
    visible = m if m.dtype == torch.bool else torch.isfinite(m) & (m == 0)
    if not bool(visible.any(-1).all()):
        return None
    idx = torch.arange(kv_len)
    lo = torch.where(visible, idx, kv_len).amin(-1)
    hi = torch.where(visible, idx, -1).amax(-1)
    if not bool((visible.sum(-1) == hi - lo + 1).all()):
        return None
    return lo.contiguous(), hi.contiguous()


_ranges_memo = _Ranges()
_KERNEL_TYPES = (torch.float32, torch.float16)  # the key/value storages native/attention.cpp reads


def native_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                   is_causal=None, **kwargs):
    # query: (1, heads, q_len, head_dim); key/value: (1, kv_heads, kv_len, head_dim)
    from ragspec.decoding.packed import _is_step

    q_len, kv_len = query.shape[2], key.shape[2]
    storage = getattr(module, "_ragspec_kv_dtype", None)
    if storage is not None and key.dtype != storage:
        # keys as the model's cache stores them (a cache of transformers' own layers holds them
        # unrounded), so every forward of the model sees the same values whichever cache it has
        key, value = key.to(storage), value.to(storage)
    plain = kwargs.get("position_bias") is None and kwargs.get("s_aux") is None
    if (query.shape[0] == 1 and plain and _is_step(q_len) and key.dtype in _KERNEL_TYPES
            and value.dtype == key.dtype):
        ranges = _ranges_memo(attention_mask, q_len, kv_len)
        if ranges is not None:
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            out = torch.ops.ragspec.attend(query[0], key[0], value[0], ranges[0], ranges[1],
                                           float(scale), float(kwargs.get("softcap") or 0.0))
            return out.unsqueeze(0), None
    if key.dtype != query.dtype:  # an fp16 cache under fp32 queries: SDPA takes one type
        key, value = key.to(query.dtype), value.to(query.dtype)
    if kwargs.get("softcap") is not None:
        return _softcapped(query, key, value, attention_mask, scaling, kwargs["softcap"])
    return gqa_sdpa_forward(module, query, key, value, attention_mask, dropout=dropout,
                            scaling=scaling, is_causal=is_causal, **kwargs)


def _softcapped(query, key, value, mask, scaling, softcap):
    """Attention with logit soft-capping in torch ops (what SDPA cannot do): for long forwards of
    models such as Gemma 2 under NATIVE. mask: bool (True = attend) or additive, or None."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.tanh(query @ key.transpose(-1, -2) * scale / softcap) * softcap
    if mask is None:
        q_len, kv_len = scores.shape[-2:]
        mask = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask[..., -scores.shape[-1]:]
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    return (probs @ value).transpose(1, 2).contiguous(), None


_registered = False


def register() -> str:
    """Make NAME and NATIVE valid attn_implementations (idempotent); returns NAME."""
    global _registered
    if not _registered:
        AttentionInterface.register(NAME, gqa_sdpa_forward)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        AttentionInterface.register(NATIVE, native_forward)
        AttentionMaskInterface.register(NATIVE, sdpa_mask)
        _registered = True
    return NAME


def install(model, native: bool = False) -> str:
    """Use NAME for `model` where its class allows sdpa and it runs sdpa now (NATIVE with
    native=True, also for eager models such as Gemma 2); returns the attention implementation
    the model runs afterwards."""
    current = getattr(model.config, "_attn_implementation", None)
    register()
    if native and current in ("sdpa", "eager"):
        model.set_attn_implementation(NATIVE)
        return NATIVE
    if current == "sdpa" and getattr(type(model), "_supports_sdpa", False):
        model.set_attn_implementation(NAME)
        return NAME
    return str(current)
