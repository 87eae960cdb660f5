"""Attention for multi-token verify forwards without copying the KV cache.

transformers' sdpa path handles grouped-query attention (fewer KV heads than query heads) by
broadcasting when there is no mask (prefill) or one query token (plain decoding), but for
several query tokens with a mask — exactly a verify forward over [last token + draft] — it
repeats K and V across head groups: a copy of the whole cache in every layer, every step (the
README's "How it works" gives what it cost on one machine). SDPA's enable_gqa broadcasts
instead; the math is the same attention.

The broadcast is used on the CPU only, where it was measured: on CUDA, SDPA with both a mask and
enable_gqa may fall back to its slowest (math) kernel, so there every shape goes to transformers'
own sdpa function, which picks its kernels for that device.

`install(model)` switches a loaded model to this function (attn_implementation "ragspec_sdpa",
mask built as for "sdpa") when the model runs stock sdpa attention. A model whose class refuses
sdpa — Gemma 2, whose logit soft-capping sdpa cannot express — keeps the attention transformers
chose for it (eager); so does one loaded with another implementation on purpose.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "ragspec_sdpa"


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
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, is_causal=is_causal, **kwargs)


_registered = False


def register() -> str:
    """Make NAME a valid attn_implementation (idempotent); returns NAME."""
    global _registered
    if not _registered:
        AttentionInterface.register(NAME, gqa_sdpa_forward)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        _registered = True
    return NAME


def install(model) -> str:
    """Use NAME for `model` where its class allows sdpa and it runs sdpa now; returns the
    attention implementation the model runs afterwards."""
    current = getattr(model.config, "_attn_implementation", None)
    if current == "sdpa" and getattr(type(model), "_supports_sdpa", False):
        model.set_attn_implementation(register())
        return NAME
    return str(current)
