"""One forward over the rows of many sequences, each attending to its own KV cache.

Contract: `packed_forward(model, blocks)` runs ONE call
`model(input_ids=(1, T), position_ids=(1, T), cache=PackedCache)` over the row blocks of several
sequences packed along the sequence dimension (ragged, no padding), and returns each block's
logits. Every block is a run of new tokens for one sequence at consecutive positions: a chunk of
its prompt, or [last token, draft...] in a decode step; its keys and values go into that
sequence's own cache (ragspec.decoding.cache layers, so a rejected draft is cropped as in the
single-sequence engine), and its queries attend to that cache only, causally inside the block.

    input_ids     [a0 a1 a2 | b0 | c0 c1]          T = 6 rows, three sequences
    position_ids  [17 18 19 | 40 | 3  4 ]          each block at its own positions
    attention     a* vs A's cache, b0 vs B's, c* vs C's (never across sequences)

How: the model's linear layers, norms and RoPE see the packed (1, T, hidden) rows as one
sequence (RoPE takes position_ids per row). `PackedCache.update` routes each block's new keys and
values into its sequence's cache and keeps the views it gets back; the attention function
registered here (attn_implementation "ragspec_packed", switched on only for the duration of a
packed forward) then calls the model's own attention function (ragspec.decoding.attention:
SDPA, or the native row-invariant kernel) once per block, against that block's own view, with
the mask the single-sequence engine makes for it, and concatenates the outputs. No mask function is registered under this name, so transformers
builds no (T x T) mask for the packed rows.

With the native decode step installed (ragspec.decoding.native_step), `packed_forward` runs
every block that the native step would run alone (a decode block, a short prompt) in ONE
native call over all their rows, each block against its own cache layers at its own positions
(native_step.forward_many: the weights are read once for all blocks; norms, rotary positions
and attention per block), and any other block (a long prompt) as the forward it makes alone.
The native step is row-invariant, so a request served beside others computes, bit for bit,
what it computes alone (the native step rounds norms, rotary and SiLU otherwise than the
modules, so mixing the two paths inside one sequence's forward would not be exact).

`packing_problem(model)` says why a model cannot be packed (None when it can): its attention
must be plain scaled-dot-product attention reached through transformers' attention interface
(no soft-capping, no ALiBi, no recurrent layers), and its family must be one checked by the test
suite. Such a model is still served, one forward per sequence per step (ragspec.decoding.batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ragspec.decoding import native_step
from ragspec.decoding.attention import gqa_sdpa_forward
from ragspec.decoding.cache import GrowingLayer, SlidingLayer

NAME = "ragspec_packed"
KWARG = "ragspec_packed"  # the model's forward passes it through to the attention function

# Families whose packed greedy output the test suite checks against the single-sequence engine.
PACKABLE_FAMILIES = frozenset({"llama", "qwen2", "qwen3", "mistral", "phi3", "olmo2", "granite",
                               "smollm3", "gemma3_text"})


@dataclass
class Block:
    """One sequence's rows in a packed forward: `tokens` at positions start..start+len-1, its
    cache (holding exactly `start` positions), and which of its rows need logits:
    "all" (a decode step), "last" (the last prompt chunk) or "none" (an earlier prompt chunk)."""

    cache: object
    tokens: list[int]
    start: int
    logits: str = "all"

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("a packed block needs at least one token")
        if self.logits not in ("all", "last", "none"):
            raise ValueError(f"logits must be 'all', 'last' or 'none', got {self.logits!r}")


class PackedCache:
    """Routes each block's rows to its sequence's cache (see the module docstring). Made for one
    forward; not a transformers Cache (nothing in the model needs more than `update`)."""

    def __init__(self, blocks: Sequence[Block], inner=gqa_sdpa_forward):
        self.blocks = list(blocks)
        self.inner = inner  # the model's own attention function, called once per block
        self.bounds: list[tuple[int, int]] = []
        row = 0
        for block in self.blocks:
            self.bounds.append((row, row + len(block.tokens)))
            row += len(block.tokens)
        self.rows = row
        self.views: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        # (block index, key length, window) -> mask: the same for every layer of a kind
        self.masks: dict[tuple[int, int, int | None], torch.Tensor | None] = {}

    def mask(self, i: int, kv_len: int, window: int | None, device) -> torch.Tensor | None:
        key = (i, kv_len, window)
        if key not in self.masks:
            lo, hi = self.bounds[i]
            self.masks[key] = _block_mask(self.blocks[i].start, hi - lo, kv_len, window, device)
        return self.masks[key]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        # key_states: (1, kv_heads, T, head_dim) -> each block's slice into its own cache
        views = []
        for block, (lo, hi) in zip(self.blocks, self.bounds, strict=True):
            views.append(block.cache.update(key_states[:, :, lo:hi], value_states[:, :, lo:hi],
                                            layer_idx))
        self.views[layer_idx] = views
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        raise TypeError("a packed forward has no single sequence length: pass position_ids")


def _block_mask(q_start: int, q_len: int, kv_len: int, window: int | None,
                device: torch.device) -> torch.Tensor | None:
    """The boolean mask (1, 1, q_len, kv_len) the single-sequence engine's sdpa mask gives this
    block, or None where it gives none (one query row, or a causal block with no past; and
    for a sliding layer only while the keys fit inside the window)."""
    if (q_len == 1 or kv_len == q_len) and (window is None or kv_len < window):
        return None
    kv_first = q_start + q_len - kv_len  # the block's rows are the last keys
    q_pos = torch.arange(q_start, q_start + q_len, device=device)[:, None]
    kv_pos = torch.arange(kv_first, kv_first + kv_len, device=device)[None, :]
    allowed = kv_pos <= q_pos
    if window is not None:
        allowed &= kv_pos > q_pos - window
    return allowed[None, None]


def packed_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                     is_causal=None, **kwargs):
    """query: (1, heads, T, head_dim) for all blocks -> (1, T, heads, head_dim); key/value (the
    packed new rows) are not used: each block attends to its own cache's view."""
    packed: PackedCache | None = kwargs.pop(KWARG, None)
    if packed is None:
        raise RuntimeError("ragspec_packed attention runs only inside packed_forward")
    window = kwargs.get("sliding_window") or None
    views = packed.views[module.layer_idx]
    outs = []
    for i, ((lo, hi), (k, v)) in enumerate(zip(packed.bounds, views, strict=True)):
        q = query[:, :, lo:hi]
        mask = packed.mask(i, k.shape[-2], window, query.device)
        out, _ = packed.inner(module, q, k, v, mask, dropout=dropout, scaling=scaling,
                              is_causal=is_causal, **kwargs)
        outs.append(out)
    return torch.cat(outs, dim=1), None


_registered = False


def register() -> str:
    global _registered
    if not _registered:
        AttentionInterface.register(NAME, packed_attention)
        _registered = True
    return NAME


@contextmanager
def _packed_attention(model):
    """Switch the model's attention to the packed function for one forward (the owner thread
    is the only caller while it lasts); yields the model's own attention function, which the
    packed one calls per block."""
    config = model.config
    before = config._attn_implementation
    inner = ALL_ATTENTION_FUNCTIONS[before]
    config._attn_implementation = register()
    try:
        yield inner
    finally:
        config._attn_implementation = before


def packing_problem(model) -> str | None:
    """Why `model` cannot run packed forwards (one line), or None when it can."""
    from ragspec.decoding.attention import NAME as SDPA_NAME
    from ragspec.decoding.attention import NATIVE
    from ragspec.decoding.cache import new_cache, rollback_problem

    kind = getattr(model.config, "model_type", type(model).__name__)
    problem = rollback_problem(model)
    if problem:
        return problem
    attention = getattr(model.config, "_attn_implementation", None)
    if attention not in (SDPA_NAME, NATIVE, "sdpa"):
        return f"{kind} runs {attention} attention (packing needs scaled-dot-product attention)"
    if kind not in PACKABLE_FAMILIES:
        return f"{kind} is not among the families checked for packed forwards"
    if not all(isinstance(layer, (GrowingLayer, SlidingLayer)) for layer in new_cache(model).layers):
        return f"{kind}: its cache layers cannot be routed per sequence"
    return None


@torch.inference_mode()
def packed_forward(model, blocks: Sequence[Block]) -> list[torch.Tensor | None]:
    """One forward over all blocks; per block: logits (rows, vocab) in fp32 for "all", (1, vocab)
    for "last", None for "none". Each block's cache grows by its rows. With the native step
    installed, one forward per block, as the sequence runs alone (see the module docstring)."""
    if native_step.installed(model):
        return _native(model, blocks)
    packed = PackedCache(blocks)
    ids, positions, keep = [], [], []
    for block, (lo, hi) in zip(blocks, packed.bounds, strict=True):
        ids.extend(block.tokens)
        positions.extend(range(block.start, block.start + len(block.tokens)))
        if block.logits == "all":
            keep.extend(range(lo, hi))
        elif block.logits == "last":
            keep.append(hi - 1)
    device = model.device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    position_ids = torch.tensor([positions], dtype=torch.long, device=device)
    if not keep:  # every block is a prompt chunk before its last: the head is not run at all
        keep_rows = torch.zeros(0, dtype=torch.long, device=device)
    else:
        keep_rows = torch.tensor(keep, dtype=torch.long, device=device)
    with _packed_attention(model) as inner:
        packed.inner = inner
        out = model(input_ids=input_ids, position_ids=position_ids, cache=packed, use_cache=True,
                    logits_to_keep=keep_rows, **{KWARG: packed})
    logits = out.logits[0].float()  # (len(keep), vocab)
    results: list[torch.Tensor | None] = []
    at = 0
    for block in blocks:
        n = len(block.tokens) if block.logits == "all" else 1 if block.logits == "last" else 0
        results.append(logits[at : at + n] if n else None)
        at += n
    return results


def _native(model, blocks: Sequence[Block]) -> list[torch.Tensor | None]:
    """packed_forward with the native step installed: every block its own forward alone would
    run natively goes into ONE native call (native_step.forward_many), the others (a prompt
    the modules read alone) run as they do alone."""
    results: list[torch.Tensor | None] = [None] * len(blocks)
    native = []
    for i, block in enumerate(blocks):
        if native_step.start_of(model, len(block.tokens), block.cache) == block.start:
            native.append(i)
        else:
            results[i] = alone(model, block)
    if native:
        keeps = {"all": None, "last": 1, "none": 0}
        runs = [(blocks[i].tokens, blocks[i].cache,
                 len(blocks[i].tokens) if keeps[blocks[i].logits] is None else keeps[blocks[i].logits])
                for i in native]
        for i, logits in zip(native, native_step.forward_many(model, runs), strict=True):
            results[i] = logits if blocks[i].logits != "none" else None
    return results


def alone(model, block: Block) -> torch.Tensor | None:
    """`block` as the single-sequence engine's forward (ragspec.decoding.engine.forward) runs it
    against the block's own cache: logits as packed_forward returns them."""
    from ragspec.decoding.engine import forward

    logits = forward(model, block.tokens, block.cache, logits_to_keep=0 if block.logits == "all" else 1)
    return None if block.logits == "none" else logits
