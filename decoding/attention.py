"""Attention for multi-token verify forwards without copying the KV cache.

transformers' sdpa path handles grouped-query attention (fewer KV heads than query heads) by
broadcasting when there is no mask (prefill) or one query token (plain decoding), but for
several query tokens with a mask — exactly a verify forward over [last token + draft] — it
repeats K and V across head groups: a copy of the whole cache in every layer, every step.
Measured here (SmolLM2-135M, 800-token context, 2 cores) that copy made an 8-token forward
~25% slower. SDPA's enable_gqa broadcasts instead; the math is the same attention.

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
    if plain and query.shape[2] <= getattr(getattr(module, "config", None), ROW_EXACT, 0):
        rows = _row_by_row(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        if rows is not None:
            return rows
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


# A model config entry (set by `row_exact`): forwards over up to this many tokens compute every
# query row exactly as a one-token forward at its position would.
ROW_EXACT = "ragspec_row_exact"


def row_exact(model, max_rows: int) -> None:
    """Make `model`'s attention batch-invariant for forwards of up to `max_rows` tokens (the
    verify forwards): a forward over k tokens then returns, for each of them, bit for bit what
    k one-token forwards would. Needed where the layers after attention round their input
    (4-bit linears take bf16 activations): SDPA's kernels for a k-row masked query and for a
    1-row query sum in different orders, and a last-bit difference that fp32 linears carry
    along harmlessly can flip a bf16 rounding, then a greedy token. Costs one small SDPA call
    per query row instead of one per forward; a longer forward (a prompt's prefill) is
    computed the same way by every caller and keeps the one call."""
    setattr(model.config, ROW_EXACT, max_rows)


def _row_by_row(module, query, key, value, attention_mask, dropout, scaling, **kwargs):
    """Each query row as its own one-token call (no mask: it sees its prefix of the keys); None
    when the mask is not the plain causal one of a batch-1 forward (then the caller's path)."""
    q_len, kv_len = query.shape[2], key.shape[2]
    if query.shape[0] != 1 or q_len > kv_len:
        return None
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool or attention_mask.shape[-2:] != (q_len, kv_len):
            return None
        mask = attention_mask.reshape(-1, q_len, kv_len)
        if mask.shape[0] != 1 or not torch.equal(mask[0], _causal(q_len, kv_len, query.device)):
            return None
    rows = []
    for i in range(q_len):
        end = kv_len - q_len + 1 + i
        out, _ = sdpa_attention_forward(module, query[:, :, i:i + 1], key[:, :, :end],
                                        value[:, :, :end], None, dropout=dropout,
                                        scaling=scaling, is_causal=False, **kwargs)
        rows.append(out)
    return (rows[0] if q_len == 1 else torch.cat(rows, dim=1)), None


def _causal(q_len: int, kv_len: int, device) -> torch.Tensor:
    """(q_len, kv_len) bool: the last q_len positions of a kv_len sequence, each seeing itself
    and everything before it."""
    cols = torch.arange(kv_len, device=device)
    last = torch.arange(kv_len - q_len, kv_len, device=device)
    return cols[None, :] <= last[:, None]


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
