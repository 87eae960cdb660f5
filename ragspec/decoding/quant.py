"""4-bit weights for the CPU decode path: torch's int4-pack kernel under the model's linears.

Decoding on a CPU is memory-bound: every generated token streams every weight through memory
once. `quantize_linears(model)` swaps each linear layer of the decoder for an `Int4Linear`
that keeps its fp32 weight *and* a 4-bit copy (groups of 32 input values, one scale and one
zero per group) packed for `torch.ops.aten._weight_int4pack_mm_for_cpu`. A forward over few
tokens (a decode or verify step, up to `max_int4_tokens`) runs the 4-bit kernel with bf16
activations; a long one (a RAG prompt's prefill) runs the fp32 weight, where the matmul is compute-bound
and the fp32 kernel is the faster one. The rule depends only on the input's shape, so every
caller of the same model object — ragspec's engine and transformers' `model.generate` alike —
runs the same layers. It is not exact, though: the kernel takes bf16 activations, and the
last-bit differences between a k-token attention and k one-token ones (harmless in fp32) can
flip a bf16 rounding, so greedy output with speculation can differ from without it. Opt-in
(ragspec.decoding.model.wants_int4); the README has the measurements.

Quantisation is asymmetric min/max per group: q = round((w - min) / scale), scale = (max -
min) / 15. A model de-quantised from a Q4_1 GGUF (4-bit values, one fp16 scale d and minimum m
per 32 weights) is recovered exactly that way — its group minimum is m and its maximum 15·d + m —
so its 4-bit values are the file's own; only d and m change dtype (bf16, which the kernel
takes). The kernel computes w = (q - 8)·scale + zero, so zero = min + 8·scale.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

GROUP = 32
OUT_MULTIPLE = 16  # the kernel packs output features in blocks of 16
INNER_K_TILES = 2  # the kernel's packing tile; 2, 4 or 8 all work for K divisible by 32
# Forwards over more tokens use the fp32 weight. Every verify forward must stay on the int4 side
# (the longest is max_draft 64 + 1 tokens), or it would compute a different function from the
# one-token steps of model.generate that it stands in for.
DEFAULT_MAX_INT4_TOKENS = 72


def eligible(linear: nn.Module, group: int = GROUP) -> bool:
    """A plain CPU linear whose shape the kernel takes."""
    return (type(linear) is nn.Linear and linear.weight.device.type == "cpu"
            and linear.in_features % group == 0 and linear.out_features % OUT_MULTIPLE == 0)


def supported() -> bool:
    """True when this torch build has the CPU int4-pack kernel."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")


def quantize_weight(weight: torch.Tensor, group: int = GROUP
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """weight (out, in) -> (q (out, in) int32 in 0..15, scales_and_zeros (in/group, out, 2) bf16)
    with w ≈ (q - 8)·scale + zero per group of `group` consecutive input values."""
    out_f, in_f = weight.shape
    if in_f % group:
        raise ValueError(f"in_features {in_f} is not a multiple of the group size {group}")
    w = weight.detach().float().reshape(out_f, in_f // group, group)
    low = w.amin(-1, keepdim=True)
    scale = (w.amax(-1, keepdim=True) - low) / 15
    # a constant group has scale 0: any positive scale represents it exactly (q = 0)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((w - low) / scale).clamp_(0, 15).to(torch.int32).reshape(out_f, in_f)
    zero = low + 8 * scale
    scales_and_zeros = torch.cat([scale, zero], dim=-1)  # (out, groups, 2)
    return q, scales_and_zeros.transpose(0, 1).contiguous().to(torch.bfloat16)


def dequantize(q: torch.Tensor, scales_and_zeros: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """The fp32 weight the kernel multiplies by (for tests and error reports)."""
    sz = scales_and_zeros.float().transpose(0, 1)  # (out, groups, 2)
    scale = sz[..., 0].repeat_interleave(group, dim=1)
    zero = sz[..., 1].repeat_interleave(group, dim=1)
    return (q.float() - 8) * scale + zero


class Int4Linear(nn.Module):
    """A linear layer with an fp32 weight for long inputs and a 4-bit copy for short ones.

    x (..., in) -> (..., out) in x's dtype. Inputs of up to `max_int4_tokens` rows (tokens)
    run the int4 kernel (bf16 activations, bf16 output cast back); longer ones run F.linear.
    """

    def __init__(self, linear: nn.Linear, group: int = GROUP,
                 max_int4_tokens: int = DEFAULT_MAX_INT4_TOKENS):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.group = group
        self.max_int4_tokens = max_int4_tokens
        self.weight = linear.weight  # shared with the model: no second fp32 copy
        self.bias = linear.bias
        q, scales_and_zeros = quantize_weight(linear.weight, group)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            q.contiguous(), INNER_K_TILES), persistent=False)
        self.register_buffer("scales_and_zeros", scales_and_zeros, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > self.max_int4_tokens:
            return nn.functional.linear(x, self.weight, self.bias)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.reshape(rows, self.in_features).to(torch.bfloat16).contiguous(), self.packed, self.group,
            self.scales_and_zeros)
        y = y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group={self.group}, int4 up to {self.max_int4_tokens} tokens")


def quantize_linears(model: nn.Module, *, include_lm_head: bool = True, group: int = GROUP,
                     max_int4_tokens: int = DEFAULT_MAX_INT4_TOKENS) -> int:
    """Swap every eligible nn.Linear of `model` (see `eligible`) for an Int4Linear, in place;
    returns how many were swapped. The LM head (which may share
    its weight with the embeddings) is included unless include_lm_head is False."""
    if not supported():
        raise RuntimeError("this torch build has no CPU int4-pack kernel")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if eligible(child, group) and (include_lm_head or child is not head):
                setattr(parent, name, Int4Linear(child, group, max_int4_tokens))
                swapped += 1
    return swapped


def int4_token_limit(model: nn.Module) -> int | None:
    """The fewest tokens at which some Int4Linear of `model` switches to its fp32 weight (None:
    no Int4Linear). A verify forward longer than this would not match one-token steps."""
    limits = [m.max_int4_tokens for m in model.modules() if isinstance(m, Int4Linear)]
    return min(limits) if limits else None


@contextmanager
def fp32_weights(model: nn.Module) -> Iterator[None]:
    """Every Int4Linear of `model` runs its fp32 weight inside the block: the model as it was
    before quantize_linears (for a transformers baseline)."""
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    limits = [m.max_int4_tokens for m in layers]
    for m in layers:
        m.max_int4_tokens = 0
    try:
        yield
    finally:
        for m, limit in zip(layers, limits, strict=True):
            m.max_int4_tokens = limit
