"""Linear and embedding layers whose weights stay packed (GGUF block formats) in memory.

Contract: `PackedLinear(weight, bias)` computes x·Wᵀ + b and `PackedEmbedding(weight)` looks rows
up, with W a `PackedWeight` — N rows of K values in one of GGUF's formats (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32), as uint8 bytes, never de-quantised as a whole. Two paths,
chosen per forward:

  * step forwards (decode and verify: up to `STEP_ROWS` rows, or any forward inside
    `step_forward()`) run `ragspec.qmatmul`, the native kernel that reads the packed rows once
    for all input rows and whose result for one row does not depend on the others
    (ragspec/decoding/native/qmatmul.cpp). A k-token verify therefore gives, row for row, what
    k one-token steps give: greedy speculation stays exact on packed weights.
  * long forwards (a prompt's prefill) take one of three precisions, `prefill_precision()`:
    "int8" runs them through the step kernels too (the native step where the model has it),
    so a prompt's rows get, bit for bit, what one-token steps would give them, and the weights
    are never de-quantised: the default where the CPU has AVX-512 VNNI and no AMX-BF16, and
    with AMX-BF16 too for models up to INT8_WIDTH_WITH_AMX wide (`model_precision`; on a
    2-core AMD EPYC of the Zen 4 kind, an 893-token prompt of the bundled model read in 0.96 s
    this way against 1.35 s de-quantised to bf16: the products ran at 320-370 GOP/s, bf16 at
    260-345 GFLOP/s). "bf16" and "fp32" de-quantise the weight in tiles of rows (exactly as
    GGUF's own de-quantisation computes it) and multiply with torch's matmul: bf16 where the
    CPU's flags name a native bf16 instruction set (AVX512-BF16 or AMX-BF16, ragspec.cpuinfo;
    with AMX's bf16 tiles, bf16 products ran 3.7-6.5x the fp32 rate on a 2-core Xeon), else
    fp32. RAGSPEC_PREFILL_DTYPE=int8|bf16|fp32 overrides. A fact of the CPU and not a timing,
    because the precisions read a prompt into slightly different caches: a choice that a busy
    moment could flip would change the answer after a restart.
    Exception: with RAGSPEC_AMX=1 on a CPU with AMX (Intel's int8 tile unit, usable when
    `torch.ops.ragspec.amx_available()`), tiled weights take the step path at every row count,
    where the kernel multiplies the int8 activations on the tile unit (native/amx.h), with the
    same bits a step gives. Off by default: whole prompt reads measured
    faster on the de-quantising path at three of four shapes and formats on one Xeon.
    Prefill runs the same way whether speculation is on or off, so it does not affect exactness.
    With RAGSPEC_PROMPT_PAGES=1 (`reads_in_pages`) a bf16 or fp32 prompt read runs in pages
    (ragspec.decoding.native_step, inside `prompt_pages()`): pieces of PROMPT_PAGE rows, each a
    forward of its own on the de-quantised path whatever its rows, every weight de-quantised
    once for the whole read, so that the prompt cache can reuse its pages exactly. Off by
    default: each page is a forward of every module, and on a busy 2-core Xeon (load average
    7-9.5) the many small forwards made an 800-token bf16 read 1.9-2.6x slower
    (docs/results/prompt-pages-xeon.json).

A weight may be stored tiled (`PackedWeight.tiled`, made by `tile`): its rows regrouped in tiles
of 16 so that the kernel multiplies 16 output features per instruction (layout and kernel:
ragspec/decoding/native/tiled.h). The bytes are a permutation of the GGUF rows (`untile` gives
them back), the shape is the same, and every operation (products, row look-ups, de-quantisation)
gives the same values for a tiled weight on every machine; only the speed differs.

Which path a forward takes depends only on its shape (and the `step_forward` override), so every
caller of the same model object — ragspec's engine and transformers' `generate` alike — runs the
same function.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ragspec import cpuinfo

# Format name -> (code the kernels use, values per block, bytes per block).
FORMATS: dict[str, tuple[int, int, int]] = {
    "F32": (0, 1, 4), "F16": (1, 1, 2), "BF16": (2, 1, 2),
    "Q4_0": (3, 32, 18), "Q4_1": (4, 32, 20), "Q8_0": (5, 32, 34),
    "Q4_K": (6, 256, 144), "Q5_K": (7, 256, 176), "Q6_K": (8, 256, 210),
    "Q5_0": (9, 32, 22), "Q5_1": (10, 32, 24),
}
# Tiled weights: rows per tile, the bit added to the format's code, the formats that tile, and
# each format's 2-byte fields at the start and end of a block (every other field is 4 bytes).
TILE_ROWS = 16
TILED_BIT = 32
TILEABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
_HALVES = {"Q4_0": (1, 0), "Q5_0": (1, 0), "Q8_0": (1, 0), "Q6_K": (0, 1)}
# Forwards over at most this many rows are steps (decode, verify); longer ones are prefills.
STEP_ROWS = 64
# Prefill de-quantises at most this many values of a weight at a time.
_TILE_VALUES = 2 << 20
PREFILL_ENV = "RAGSPEC_PREFILL_DTYPE"
# A de-quantised prompt read runs in pieces of this many rows, cut at multiples of it counted
# from the prompt's first token (the prompt cache's pages are as long: prefix_cache.PAGE_TOKENS).
PROMPT_PAGE = 64
PAGES_ENV = "RAGSPEC_PROMPT_PAGES"
# On a CPU with AMX-BF16 and AVX-512 VNNI, a model this wide or narrower reads its prompts in
# int8 (model_precision): the bundled 135M model (576 wide) read 400-900-token prompts in int8 in
# 0.83-0.85x the bf16 time on a 2-core Xeon (docs/results/prefill-precision-ab-xeon-wide.json). Wider
# models keep bf16 there: the tile unit's advantage grows with the matrices, and no wider model
# was measured.
INT8_WIDTH_WITH_AMX = 1024

_state = threading.local()


class _Tiles(dict):
    """The de-quantised tiles of the weights a `prompt_pages()` block has used, by layer, while
    they take at most `limit` bytes (the rest is de-quantised at each use: the same values)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.bytes = limit, 0


@contextmanager
def prompt_pages() -> Iterator[None]:
    """Every packed layer takes the prefill path inside the block, however few rows a forward
    has, and de-quantises a weight once for the whole block (kept up to an eighth of the RAM):
    a prompt read page by page (ragspec.decoding.native_step) costs one de-quantisation."""
    previous = getattr(_state, "pages", None)
    if previous is None:
        _state.pages = _Tiles(cpuinfo.ram_bytes() // 8)
    try:
        yield
    finally:
        _state.pages = previous


@contextmanager
def _holding(name: str, value, default) -> Iterator[None]:
    """This thread's `_state.<name>` is `value` inside the block, as it was (or `default`) after."""
    previous = getattr(_state, name, default)
    setattr(_state, name, value)
    try:
        yield
    finally:
        setattr(_state, name, previous)


def reading_as(precision: str):
    """Prompt reads inside the block take `precision` (a model's own, model_precision) instead
    of the machine's prefill_precision()."""
    return _holding("precision", precision, None)


def _precision() -> str:
    return getattr(_state, "precision", None) or prefill_precision()


def step_forward():
    """Every packed layer takes the step path inside the block, however many rows a forward
    has (a batched verify over many sequences is still a set of steps)."""
    return _holding("step", True, False)


@functools.lru_cache(maxsize=1)
def prefill_precision() -> str:
    """How prompt reads multiply on this machine: "int8", "bf16" or "fp32" (see the module
    docstring); an unknown RAGSPEC_PREFILL_DTYPE is ignored."""
    forced = os.environ.get(PREFILL_ENV, "").strip().lower()
    if forced in ("int8", "bf16", "fp32"):
        return forced
    flags = cpuinfo.flags()
    if "avx512_vnni" in flags and "amx_bf16" not in flags:
        return "int8"
    return "bf16" if cpuinfo.has_native_bf16() else "fp32"


def model_precision(hidden_size: int) -> str:
    """How a model `hidden_size` wide reads its prompts on this machine: prefill_precision(),
    except on a CPU with AMX-BF16 and AVX-512 VNNI, where models up to INT8_WIDTH_WITH_AMX wide
    read them in int8 (faster there for such models, and exact in pieces: the prompt cache
    reuses their prefixes). A fact of the CPU and the model's shape, never of a timing; an
    override (RAGSPEC_PREFILL_DTYPE) holds for every model. Asked at every forward: cheap, and
    it follows the machine's answer (prefill_precision) wherever that changes."""
    forced = os.environ.get(PREFILL_ENV, "").strip().lower() in ("int8", "bf16", "fp32")
    return _model_precision(hidden_size, prefill_precision(), forced, str(cpuinfo.CPUINFO))


@functools.lru_cache(maxsize=32)
def _model_precision(hidden_size: int, precision: str, forced: bool, _cpuinfo: str) -> str:
    if (precision == "bf16" and not forced and hidden_size <= INT8_WIDTH_WITH_AMX
            and "avx512_vnni" in cpuinfo.flags()):
        return "int8"
    return precision


@functools.lru_cache(maxsize=1)
def reads_in_pages() -> bool:
    """Whether bf16 and fp32 prompt reads run in pages (RAGSPEC_PROMPT_PAGES=1; see the module
    docstring): fixed for the process, as the precision is, since it changes the answer's bits."""
    return os.environ.get(PAGES_ENV, "").strip() == "1"


def prefill_dtype() -> torch.dtype:
    """The dtype of de-quantised prefill matmuls (bf16 or fp32; see prefill_precision)."""
    return torch.bfloat16 if _precision() == "bf16" else torch.float32


def _is_step(rows: int) -> bool:
    """Whether a forward of `rows` rows runs the step kernels (always, with int8 prompt reads;
    never inside prompt_pages(), otherwise)."""
    if getattr(_state, "step", False) or _precision() == "int8":
        return True
    return rows <= STEP_ROWS and getattr(_state, "pages", None) is None


def _ops():
    from ragspec.decoding import native

    if not native.loaded():
        raise RuntimeError("packed weights need ragspec's native kernels: load them first "
                           "(ragspec.decoding.native.ops)")
    return torch.ops.ragspec


@dataclass
class PackedWeight:
    """N rows (output features) of K values (input features) in a GGUF format, as bytes."""

    data: torch.Tensor  # (N, bytes per row) uint8, contiguous, on the CPU
    fmt: str
    in_features: int
    tiled: bool = False  # rows stored in tiles of 16 (see `tile`)

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"unknown packed format {self.fmt!r}; known: {', '.join(FORMATS)}")
        _, per_block, block_bytes = FORMATS[self.fmt]
        if self.in_features % per_block:
            raise ValueError(f"{self.in_features} input features are not a whole number of "
                             f"{self.fmt} blocks of {per_block}")
        if self.data.dtype != torch.uint8 or self.data.dim() != 2:
            raise ValueError("packed data must be a (rows, bytes) uint8 tensor")
        expected = self.in_features // per_block * block_bytes
        if self.data.shape[1] != expected:
            raise ValueError(f"{self.fmt} rows of {self.in_features} values take {expected} bytes, "
                             f"not {self.data.shape[1]}")
        if self.tiled and self.fmt not in TILEABLE:
            raise ValueError(f"{self.fmt} weights cannot be tiled; tiled formats: {', '.join(TILEABLE)}")
        if not self.data.is_contiguous():
            self.data = self.data.contiguous()

    @property
    def code(self) -> int:
        return FORMATS[self.fmt][0] | (TILED_BIT if self.tiled else 0)

    @property
    def out_features(self) -> int:
        return int(self.data.shape[0])

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` de-quantised to fp32: (len(ids), K)."""
        return _ops().dequantize_rows(self.data, self.code, self.in_features, ids)

    def dequantize(self) -> torch.Tensor:
        """The whole matrix in fp32 (N, K): for tests and conversions, not for running."""
        return self.rows(torch.arange(self.out_features))


def _regions(fmt: str) -> list[tuple[int, int, int]]:
    """(start, fields, width) of the 2-byte head, the 4-byte middle and the 2-byte tail of a block."""
    block = FORMATS[fmt][2]
    head, tail = _HALVES.get(fmt, (2, 0))
    middle = block - 2 * head - 2 * tail
    return [(0, head, 2), (2 * head, middle // 4, 4), (block - 2 * tail, tail, 2)]


def _retile(data: np.ndarray, fmt: str, to_tiles: bool) -> np.ndarray:
    """GGUF rows -> tiles (to_tiles) or back: each field of 16 rows side by side, per block."""
    n, row_bytes = data.shape
    block = FORMATS[fmt][2]
    blocks, tiles = row_bytes // block, n // TILE_ROWS
    out = data.copy()
    if tiles == 0:
        return out
    src, dst = data[:tiles * TILE_ROWS], out[:tiles * TILE_ROWS]
    for start, fields, width in _regions(fmt):
        if fields == 0:
            continue
        end = start + fields * width
        as_rows = (tiles, TILE_ROWS, blocks, block)
        as_tiles = (tiles, blocks, TILE_ROWS * block)
        if to_tiles:
            part = src.reshape(as_rows)[..., start:end].reshape(tiles, TILE_ROWS, blocks, fields, width)
            dst.reshape(as_tiles)[..., TILE_ROWS * start:TILE_ROWS * end] = (
                part.transpose(0, 2, 3, 1, 4).reshape(tiles, blocks, -1))
        else:
            part = src.reshape(as_tiles)[..., TILE_ROWS * start:TILE_ROWS * end].reshape(
                tiles, blocks, fields, TILE_ROWS, width)
            dst.reshape(as_rows)[..., start:end] = part.transpose(0, 3, 1, 2, 4).reshape(
                tiles, TILE_ROWS, blocks, -1)
    return out


def _flip_q8(data: np.ndarray, fmt: str, tiles: int) -> None:
    """Q8_0's quants of the tiled rows, as signed <-> plus 128 (in place)."""
    if fmt == "Q8_0" and tiles:
        blocks = data[:tiles * TILE_ROWS].reshape(tiles * TILE_ROWS, -1, 34)
        blocks[:, :, 2:] ^= 0x80


def tile(weight: PackedWeight) -> PackedWeight:
    """The weight with its rows in tiles of 16 (a copy; itself when its format does not tile or
    it is tiled already)."""
    if weight.tiled or weight.fmt not in TILEABLE:
        return weight
    rows = weight.data.numpy().copy()
    _flip_q8(rows, weight.fmt, rows.shape[0] // TILE_ROWS)
    return PackedWeight(torch.from_numpy(_retile(rows, weight.fmt, True)), weight.fmt,
                        weight.in_features, tiled=True)


def untile(weight: PackedWeight) -> PackedWeight:
    """The weight as GGUF rows (a copy; itself when it is not tiled)."""
    if not weight.tiled:
        return weight
    rows = _retile(weight.data.numpy(), weight.fmt, False)
    _flip_q8(rows, weight.fmt, rows.shape[0] // TILE_ROWS)
    return PackedWeight(torch.from_numpy(rows), weight.fmt, weight.in_features)


class PackedLinear(nn.Module):
    """nn.Linear's computation on a PackedWeight (see the module docstring for the two paths)."""

    def __init__(self, weight: PackedWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.packed = weight
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.bias = nn.Parameter(bias.float(), requires_grad=False) if bias is not None else None

    @property
    def weight(self) -> torch.Tensor:
        """The de-quantised fp32 weight (out, in), made on each access: for model code that
        reads a linear layer's weight directly (Mamba's dt_proj), not for the forward."""
        return self.packed.dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        w = self.packed
        if _is_step(rows) or (w.tiled and _ops().amx_available()):
            y = _ops().qmatmul(x, w.data, w.code, w.in_features)
        else:
            y = self._prefill(x.reshape(rows, self.in_features).float())
            y = y.reshape(*x.shape[:-1], self.out_features)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def _prefill(self, x: torch.Tensor) -> torch.Tensor:
        dtype = prefill_dtype()
        x = x.to(dtype)
        out = None
        for start, end, tile in self._tiles(dtype):
            if end - start == self.out_features:  # one tile: no copy into a result buffer
                return (x @ tile.t()).float()
            if out is None:
                out = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)
            out[:, start:end] = x @ tile.t()
        return out

    def _tiles(self, dtype: torch.dtype):
        """(start, end, rows start..end de-quantised to dtype) over the weight's rows, a tile
        at a time; inside prompt_pages() each made once for the block (prompt_pages)."""
        kept = getattr(_state, "pages", None)
        if kept is not None and id(self) in kept:
            return kept[id(self)]
        step = max(1, _TILE_VALUES // self.in_features)
        tiles = ((a, min(self.out_features, a + step),
                  self.packed.rows(torch.arange(a, min(self.out_features, a + step))).to(dtype))
                 for a in range(0, self.out_features, step))
        size = self.out_features * self.in_features * torch.empty(0, dtype=dtype).element_size()
        if kept is None or kept.bytes + size > kept.limit:
            return tiles
        kept[id(self)] = list(tiles)
        kept.bytes += size
        return kept[id(self)]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"format={self.packed.fmt}, bias={self.bias is not None}")


class PackedEmbedding(nn.Module):
    """nn.Embedding's lookup on a PackedWeight; `scale` multiplies the rows as the model's
    own embedding does (Gemma scales by √hidden)."""

    def __init__(self, weight: PackedWeight, padding_idx: int | None = None,
                 scale: torch.Tensor | float | None = None):
        super().__init__()
        self.packed = weight
        self.num_embeddings, self.embedding_dim = weight.out_features, weight.in_features
        self.padding_idx = padding_idx
        self.scale = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.packed.rows(ids.reshape(-1)).reshape(*ids.shape, self.embedding_dim)
        if self.scale is not None:
            rows = rows * (self.scale.to(rows.dtype) if torch.is_tensor(self.scale) else self.scale)
        return rows

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, format={self.packed.fmt}"


def packed_bytes(model: nn.Module) -> int:
    """Bytes of packed weights in `model` (a shared weight counted once)."""
    seen: dict[int, int] = {}
    for module in model.modules():
        if isinstance(module, (PackedLinear, PackedEmbedding)):
            seen[module.packed.data.data_ptr()] = module.packed.nbytes
    return sum(seen.values())


def packed_formats(model: nn.Module) -> list[str]:
    """The packed formats `model` runs, sorted ([] for a model without packed layers)."""
    return sorted({m.packed.fmt for m in model.modules()
                   if isinstance(m, (PackedLinear, PackedEmbedding))})
