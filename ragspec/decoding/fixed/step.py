"""The fixed-shape decode step: one shape for every decode and verify, captured once.

Contract: `FixedStep(model)` reads a Llama-family model's weights (no copy) and runs its decode
step itself, in plain torch ops: `FixedStep.sequence(prompt_cache, need)` takes the cache an
ordinary prompt read filled (transformers' forward, ragspec.decoding.cache) and returns a
`FixedSequence` whose `step(ids)` gives the logits (len(ids), vocab) in fp32 of 1 to `rows`
new tokens, and whose `crop(length)` rolls a rejected draft back. `unsupported(model)` says why
a model cannot run it (None when it can); `choice(model, asked)` whether it runs.

Why a fixed shape: a k-row verify and k one-row steps round differently when their kernels see
different shapes (bf16 speculation changed the answer on 4 of 7 prompts on an H200,
docs/results/gpu-check-h200.json). Here every step runs `rows` query rows (1 + the longest
draft; the rows past the real ones repeat the last token and are thrown away) against a static
cache of `capacity` positions:
  * every matmul has the same shape whatever the draft, and a row's values come from that
    row's input alone (no kernel reduces across rows), so a token's logits and keys do not
    depend on how many rows were real or which row it sat in;
  * attention visits all `capacity` keys of a row in one fixed order, masked past the row's own
    position: a masked key adds an exact 0 (its probability is exp(-inf) = 0, the cache starts
    zeroed and only ever holds finite values), so stale keys of a rejected draft, or the
    padding rows' keys, change nothing;
  * rollback is the length pointer (`crop`): positions past it are masked and overwritten.
So greedy speculation on == off by construction, in bf16 as in fp32, for one request (its
capacity: a power of two from the prompt and max_new_tokens, 512 at least on a CPU and 4096 on
CUDA; a different capacity may round otherwise). Sampling draws from the same rows, so a seeded sampled answer is the same too.

No Python per layer per token: the step function is compiled once per capacity (and model) with
`torch.compile(fullgraph=True, dynamic=False)` (`compiled=False`: run eagerly, the reference; RAGSPEC_FIXED_STEP_BACKEND names
another torch.compile backend, e.g. aot_eager, which captures the same graph without inductor's
code generation)
and, on CUDA, captured once as a CUDA graph and replayed; only the `rows` token ids and their
positions go in and the logits come back. On a CPU the same compiled code runs without the
graph (the CPU's default stays the packed native step; this path runs there when asked:
RAGSPEC_FIXED_STEP or Generator(fixed_step=...)).

Supported: model types in FAMILIES with transformers' standard decoder (RMSNorm, RoPE from the
model's own inverse frequencies and attention scaling, grouped-query attention, optional biases,
SiLU MLP, tied or separate head), full attention in every layer, plain nn.Linear weights.
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ENV = "RAGSPEC_FIXED_STEP"
BACKEND_ENV = "RAGSPEC_FIXED_STEP_BACKEND"  # torch.compile's backend (default inductor)
MODES = ("off", "compiled", "eager")  # what RAGSPEC_FIXED_STEP / Generator(fixed_step=) take
FAMILIES = ("llama", "qwen2", "mistral")
ROWS = 17  # 1 + DraftConfig().max_draft: one shape for every step
# smallest static cache (positions) per device type; larger ones are powers of two. On CUDA one
# size serves prompts up to ~4k tokens, so one graph is compiled and captured (attention over
# 4096 positions reads 94 MB a step at the bundled model's shape: ~30 us on an H100).
MIN_CAPACITY = {"cuda": 4096, "cpu": 512}


def mode(asked: str | None, device: torch.device) -> str:
    """The mode a Generator runs: `asked` (Generator(fixed_step=...)), else RAGSPEC_FIXED_STEP
    (1 = compiled, 0 = off), else compiled on CUDA and off elsewhere."""
    value = asked if asked is not None else os.environ.get(ENV, "").strip().lower()
    value = {"1": "compiled", "0": "off", "on": "compiled"}.get(value, value)
    if not value:
        return "compiled" if device.type == "cuda" else "off"
    if value not in MODES:
        raise ValueError(f"fixed_step / {ENV} takes one of {', '.join(MODES)} (or 1/0), "
                         f"got {value!r}")
    return value


def unsupported(model) -> str | None:
    """Why the fixed step cannot run `model` (None: it can)."""
    cfg = model.config
    kind = getattr(cfg, "model_type", type(model).__name__)
    if kind not in FAMILIES:
        return f"{kind} is not one of the families it covers ({', '.join(FAMILIES)})"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"{kind} with activation {cfg.hidden_act} (it runs SiLU)"
    slides = any("sliding" in t for t in (getattr(cfg, "layer_types", None) or ()))
    if slides or (kind == "mistral" and getattr(cfg, "sliding_window", None)):
        return f"{kind} with sliding-window layers (it attends over every position)"
    body = getattr(model, "model", None)
    if body is None or not hasattr(getattr(body, "rotary_emb", None), "inv_freq"):
        return f"{kind} without the standard rotary embedding"
    for layer in body.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj,
                   mlp.up_proj, mlp.down_proj)
        if any(type(m) is not torch.nn.Linear for m in linears):
            return f"{kind} with packed or quantised layers (it reads plain weights)"
    return None


@dataclass(frozen=True)
class Weights:
    """The model's tensors the step reads (the model's own, not copies) and its shape."""

    embed: torch.Tensor  # (vocab, hidden)
    layers: tuple  # per layer: (ln1, q, qb, k, kb, v, vb, o, ob, ln2, gate, gb, up, ub, down, db)
    norm: torch.Tensor
    head: torch.Tensor  # (vocab, hidden)
    inv_freq: torch.Tensor  # (head_dim // 2,) fp32
    rope_scale: float
    eps: float
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, model) -> Weights:
        cfg, body = model.config, model.model

        def wb(m):
            return m.weight, m.bias

        layers = tuple((lay.input_layernorm.weight, *wb(lay.self_attn.q_proj),
                        *wb(lay.self_attn.k_proj), *wb(lay.self_attn.v_proj),
                        *wb(lay.self_attn.o_proj), lay.post_attention_layernorm.weight,
                        *wb(lay.mlp.gate_proj), *wb(lay.mlp.up_proj), *wb(lay.mlp.down_proj))
                       for lay in body.layers)
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return cls(body.embed_tokens.weight, layers, body.norm.weight, model.lm_head.weight,
                   body.rotary_emb.inv_freq.float(),
                   float(getattr(body.rotary_emb, "attention_scaling", 1.0)),
                   float(cfg.rms_norm_eps), heads, getattr(cfg, "num_key_value_heads", heads),
                   head_dim)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # as transformers' LlamaRMSNorm: in fp32, then back to the activations' dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (rows, heads, head_dim); cos/sin: (rows, 1, head_dim); Llama's rotate-half convention
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


def step_math(w: Weights, keys: torch.Tensor, values: torch.Tensor, ids: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
    """One step: ids, positions (rows,) -> logits (rows, vocab) fp32. Writes the rows' keys and
    values at their positions into keys/values (layers, kv_heads, capacity, head_dim); row j
    attends to the positions <= positions[j]."""
    rows, cap = ids.shape[0], keys.shape[2]
    hd, groups = w.head_dim, w.heads // w.kv_heads
    x = w.embed[ids]  # (rows, hidden)
    freqs = positions[:, None].float() * w.inv_freq[None, :]  # (rows, head_dim/2), fp32
    angle = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    cos = (angle.cos() * w.rope_scale).to(x.dtype)
    sin = (angle.sin() * w.rope_scale).to(x.dtype)
    # (1, rows, cap): key position <= the row's position; the same mask for every head group
    visible = (torch.arange(cap, device=ids.device)[None, :] <= positions[:, None])[None]
    scale = hd ** -0.5
    for i, (ln1, q, qb, k, kb, v, vb, o, ob, ln2, gate, gb, up, ub, down, db) in enumerate(
            w.layers):
        h = _rms(x, ln1, w.eps)
        qs = _rotate(F.linear(h, q, qb).view(rows, w.heads, hd), cos, sin)
        ks = _rotate(F.linear(h, k, kb).view(rows, w.kv_heads, hd), cos, sin)
        vs = F.linear(h, v, vb).view(rows, w.kv_heads, hd)
        keys[i].index_copy_(1, positions, ks.transpose(0, 1))
        values[i].index_copy_(1, positions, vs.transpose(0, 1))
        # queries of one KV head's group side by side: (kv_heads, groups * rows, head_dim)
        qg = qs.view(rows, w.kv_heads, groups, hd).permute(1, 2, 0, 3).reshape(
            w.kv_heads, groups * rows, hd)
        scores = torch.matmul(qg, keys[i].transpose(1, 2)) * scale  # (kv_heads, g*rows, cap)
        scores = scores.view(w.kv_heads, groups, rows, cap).masked_fill(
            ~visible[:, None], float("-inf")).view(w.kv_heads, groups * rows, cap)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(x.dtype)
        att = torch.matmul(probs, values[i])  # (kv_heads, g*rows, head_dim)
        att = att.view(w.kv_heads, groups, rows, hd).permute(2, 0, 1, 3).reshape(rows, -1)
        x = x + F.linear(att, o, ob)
        h = _rms(x, ln2, w.eps)
        x = x + F.linear(F.silu(F.linear(h, gate, gb)) * F.linear(h, up, ub), down, db)
    return F.linear(_rms(x, w.norm, w.eps), w.head).float()


def capacity_for(need: int, limit: int, device: torch.device) -> int:
    """Static cache positions for a request that needs `need`: a power of two from the
    device's MIN_CAPACITY, at most `limit` (then exactly `need`, which the engine keeps
    <= limit)."""
    cap = MIN_CAPACITY.get(device.type, MIN_CAPACITY["cpu"])
    while cap < need:
        cap *= 2
    return max(need, min(cap, limit))


class FixedStep:
    """The fixed-shape step of one model: its compiled function, and per capacity the static
    cache and (on CUDA) the captured graph, reused by every sequence (one at a time)."""

    def __init__(self, model, rows: int = ROWS, compiled: bool = True):
        self.model, self.rows, self.compiled = model, rows, compiled
        self.weights = Weights.of(model)
        self.device = self.weights.embed.device
        self.dtype = self.weights.embed.dtype
        cfg = model.config
        self.context = int(getattr(cfg, "max_position_embeddings", 0) or 2048)
        self.backend = os.environ.get(BACKEND_ENV, "").strip() or "inductor"
        self._slots: dict[int, _Slot] = {}

    def describe(self) -> str:
        how = f"compiled, {self.backend}" if self.compiled else "eager"
        graph = ", CUDA graph" if self.compiled and self.device.type == "cuda" else ""
        return f"fixed ({self.rows} rows, {how}{graph})"

    def sequence(self, prompt_cache, need: int) -> FixedSequence:
        """A sequence whose static cache holds what `prompt_cache` (a filled DynamicCache)
        holds; `need`: the positions it may reach (prompt + new tokens)."""
        cap = capacity_for(need + self.rows, self.context + self.rows, self.device)
        slot = self._slots.get(cap)
        if slot is None:
            slot = self._slots[cap] = _Slot(self, cap)
        length = prompt_cache.get_seq_length()
        for i, layer in enumerate(prompt_cache.layers):
            slot.keys[i, :, :length].copy_(layer.keys[0])
            slot.values[i, :, :length].copy_(layer.values[0])
        return FixedSequence(slot, length)


class _Slot:
    """A static cache of `cap` positions, the step's input buffers and, on CUDA, its graph."""

    def __init__(self, owner: FixedStep, cap: int):
        w = owner.weights
        shape = (len(w.layers), w.kv_heads, cap, w.head_dim)
        # zeroed: a masked position multiplies its value by 0, which must stay finite
        self.keys = torch.zeros(shape, dtype=owner.dtype, device=owner.device)
        self.values = torch.zeros(shape, dtype=owner.dtype, device=owner.device)
        self.ids = torch.zeros(owner.rows, dtype=torch.long, device=owner.device)
        self.positions = torch.zeros(owner.rows, dtype=torch.long, device=owner.device)
        self.owner, self.cap = owner, cap
        self.fn = (torch.compile(_own_copy(step_math), fullgraph=True, dynamic=False,
                                 backend=owner.backend) if owner.compiled else step_math)
        self.graph = None
        self.out: torch.Tensor | None = None

    @torch.inference_mode()
    def run(self, ids: list[int], start: int) -> torch.Tensor:
        owner = self.owner
        padded = ids + [ids[-1]] * (owner.rows - len(ids))
        host = torch.tensor([padded, list(range(start, start + owner.rows))], dtype=torch.long)
        self.ids.copy_(host[0])
        self.positions.copy_(host[1])
        call = (self.fn, owner.weights, self.keys, self.values, self.ids, self.positions)
        if owner.device.type == "cuda" and owner.compiled:
            if self.graph is None:
                self.graph, self.out = _capture(*call)
            self.graph.replay()
            return self.out[: len(ids)]
        return call[0](*call[1:])[: len(ids)]


def _own_copy(fn):
    """`fn` under a code object of its own. Dynamo keeps the graphs compiled from one code
    object together, at most 8 (torch._dynamo.config.recompile_limit; past it, with fullgraph,
    a hard error): each slot, one model at one capacity, compiles its own copy once instead."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)


def _capture(fn, *args):
    """Compile (two warm-up calls on a side stream, as torch's CUDA-graph notes ask), then
    capture one step as a CUDA graph. The warm-ups and the captured step write the same keys at
    the same free positions, so they change nothing the replay does not write again."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    return graph, out


class FixedSequence:
    """One sequence on a FixedStep: its length pointer over the slot's static cache."""

    def __init__(self, slot: _Slot, length: int):
        self.slot, self.length = slot, length
        self.rows = slot.owner.rows

    def step(self, ids: list[int]) -> torch.Tensor:
        """ids: 1 to rows new tokens at positions length.. -> logits (len(ids), vocab) fp32;
        the sequence grows by len(ids)."""
        if not 1 <= len(ids) <= self.rows:
            raise ValueError(f"a fixed step takes 1 to {self.rows} tokens, got {len(ids)}")
        if self.length + self.rows > self.slot.cap:
            raise ValueError(f"the static cache holds {self.slot.cap} positions; the sequence "
                             f"is at {self.length}")
        logits = self.slot.run(list(ids), self.length)
        self.length += len(ids)
        return logits

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (the rest are masked, then overwritten)."""
        self.length = min(self.length, length)
