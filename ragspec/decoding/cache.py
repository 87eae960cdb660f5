"""KV cache layers that grow in place and roll back after a rejected draft.

Contract: `new_cache(model)` returns a transformers DynamicCache in which every layer the engine
may have to crop is one of ours; `crop_cache(cache, length)` keeps the first `length` positions
(the engine only ever removes positions written by the last forward). The attention sees the
same keys and values as with transformers' own layers, so the logits are the same.
`rollback_problem(model)` says, before anything runs, why a model's cache cannot be cropped
(recurrent or state-space layers); None when it can. `takes_cache(model)` is False for a model
whose forward takes no KV cache at all (it cannot be driven step by step).

Full attention (GrowingLayer). transformers' DynamicLayer appends each step's keys and values
with torch.cat: every forward copies every layer's whole cache, a cost that grows with the
context (docs/how-it-works.md gives a measured share). GrowingLayer keeps one buffer per layer with spare room, writes the new
positions into it and hands attention a view of the filled part. Cropping only moves the fill
mark.

Sliding window (SlidingLayer). transformers' DynamicSlidingWindowLayer keeps only the last
window - 1 positions, so once the sequence is longer than the window a crop cannot bring back
what a rollback needs, and it refuses. SlidingLayer keeps the same visible part (its mask sizes
are transformers' own) but writes into a buffer with room for `window - 1 + spare` positions and
discards old positions only when it runs out of room, after any crop: a rollback of the last
forward's positions always finds the window - 1 positions before them still there. Old
positions are dropped by copying the window's tail to a fresh, smaller buffer, so memory stays
bounded by the window (plus the longest forward) however long the text gets.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

_SPARE = 256  # positions of room added beyond what is needed when a buffer is (re)allocated


def _buffer(like: torch.Tensor, size: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised (batch, heads, size, head_dim) buffer shaped and placed as `like`, of
    `like`'s dtype or `dtype`."""
    return torch.empty((*like.shape[:-2], size, like.shape[-1]), dtype=dtype or like.dtype,
                       device=like.device)


class _OneSequence:
    """Batch reshuffles (beam search) are not ragspec's: it generates one sequence at a time."""

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("ragspec generates one sequence at a time")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("ragspec generates one sequence at a time")


class GrowingLayer(_OneSequence, DynamicLayer):
    """DynamicLayer whose keys/values are views of a buffer that doubles when full. With
    `dtype` (the model's `_ragspec_kv_dtype`, e.g. fp16) the buffer stores that type and the new
    keys and values are rounded to it as they are written; else the type the forward gives.
    The views are made when `keys`/`values` are read, not when the length changes: the native
    step writes the buffers and reads them itself, and making two views per layer at every
    forward and every rollback took ~0.2 ms of a 5 ms step of a 30-layer model."""

    def __init__(self, dtype: torch.dtype | None = None, **kwargs):
        super().__init__(**kwargs)
        self.dtype = dtype
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None
        self._length = 0

    def _reserve(self, needed: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        capacity = 0 if self._key_buf is None else self._key_buf.shape[-2]
        if needed <= capacity:
            return
        size = max(needed + _SPARE, 2 * capacity)

        def grown(buf, like):
            new = _buffer(like, size, self.dtype)
            if buf is not None and self._length:
                new[..., : self._length, :].copy_(buf[..., : self._length, :])
            return new

        self._key_buf = grown(self._key_buf, key_states)
        self._value_buf = grown(self._value_buf, value_states)

    @property
    def keys(self) -> torch.Tensor | None:
        buf = self.__dict__.get("_key_buf")
        return self.__dict__.get("_keys") if buf is None else buf[..., : self._length, :]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:  # what DynamicLayer sets before a buffer
        self._keys = value

    @property
    def values(self) -> torch.Tensor | None:
        buf = self.__dict__.get("_value_buf")
        return self.__dict__.get("_values") if buf is None else buf[..., : self._length, :]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._values = value

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self._length, self._length + key_states.shape[-2]
        self._reserve(end, key_states, value_states)
        self._key_buf[..., start:end, :].copy_(key_states)
        self._value_buf[..., start:end, :].copy_(value_states)
        self._length = end
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of positions to remove")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self._length = max(0, self._length + tokens_to_remove)

    def reset(self) -> None:
        super().reset()
        self._key_buf = self._value_buf = None
        self._length = 0


class SlidingLayer(_OneSequence, DynamicSlidingWindowLayer):
    """A sliding-window layer that can be cropped after the window has been passed.

    Positions are absolute: the buffer holds positions [_first, cumulative_length), at buffer
    index (position - _first). What attention sees (and `keys`/`values` show) is exactly what
    transformers' layer keeps: the last min(length, window - 1) positions, plus the new ones
    during an update.
    """

    def __init__(self, sliding_window: int, **kwargs):
        super().__init__(sliding_window=sliding_window, **kwargs)
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None
        self._first = 0

    def _kept(self, length: int) -> int:
        """First position the next forward must still see when `length` positions precede it."""
        return length - min(length, self.sliding_window - 1)

    def _make_room(self, new: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        end = self.cumulative_length + new
        capacity = 0 if self._key_buf is None else self._key_buf.shape[-2]
        if end - self._first <= capacity:
            return
        # Out of room: keep only the positions the next forward sees, in a buffer sized for
        # the window plus this forward plus spare room, so old positions are really freed.
        keep_from = self._kept(self.cumulative_length)
        kept = self.cumulative_length - keep_from
        size = kept + new + max(_SPARE, self.sliding_window)
        key_buf, value_buf = _buffer(key_states, size), _buffer(value_states, size)
        if kept:
            lo = keep_from - self._first
            key_buf[..., :kept, :].copy_(self._key_buf[..., lo : lo + kept, :])
            value_buf[..., :kept, :].copy_(self._value_buf[..., lo : lo + kept, :])
        self._key_buf, self._value_buf, self._first = key_buf, value_buf, keep_from

    def _view(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = start - self._first, self.cumulative_length - self._first
        return self._key_buf[..., lo:hi, :], self._value_buf[..., lo:hi, :]

    def _publish(self) -> None:
        if self._key_buf is not None:
            self.keys, self.values = self._view(self._kept(self.cumulative_length))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        visible_from = self._kept(self.cumulative_length)  # as get_mask_sizes promised
        new = key_states.shape[-2]
        self._make_room(new, key_states, value_states)
        at = self.cumulative_length - self._first
        self._key_buf[..., at : at + new, :].copy_(key_states)
        self._value_buf[..., at : at + new, :].copy_(value_states)
        self.cumulative_length += new
        out = self._view(visible_from)
        self._publish()
        return out

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of positions to remove")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        length = max(0, self.cumulative_length + tokens_to_remove)
        if self._kept(length) < self._first:
            raise ValueError(
                f"cannot roll a sliding-window layer back to {length} positions: only positions "
                f"from {self._first} on are kept (window {self.sliding_window})"
            )
        self.cumulative_length = length
        self._publish()

    def reset(self) -> None:
        super().reset()
        self._key_buf = self._value_buf = None
        self._first = 0
        self.cumulative_length = 0


def _ours(layer, dtype: torch.dtype | None):
    """Our replacement for one of transformers' layers; other kinds are kept as they are."""
    if type(layer) is DynamicLayer:
        return GrowingLayer(dtype=dtype)
    if type(layer) is DynamicSlidingWindowLayer:
        return SlidingLayer(sliding_window=layer.sliding_window)
    return layer


def new_cache(model) -> DynamicCache:
    """A DynamicCache for `model` whose full-attention and sliding-window layers are ours; its
    full-attention layers store `model._ragspec_kv_dtype` where the model sets one (the native
    step's fp16 cache, ragspec.decoding.native_step)."""
    dtype = getattr(model, "_ragspec_kv_dtype", None)
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:
        cache = DynamicCache()
    if cache.layers:
        cache.layers = [_ours(layer, dtype) for layer in cache.layers]
    else:
        cache.layer_class_to_replicate = functools.partial(GrowingLayer, dtype=dtype)
    return cache


def takes_cache(model) -> bool:
    """True when the model's forward takes a KV cache, so it can be driven step by step."""
    return "cache" in inspect.signature(model.forward).parameters


def rollback_problem(model) -> str | None:
    """Why this model's cache cannot be rolled back after a rejected draft, or None if it can.

    Recurrent and state-space layers (Mamba, hybrid models) fold every token into a state that
    a crop cannot undo. Only our own layers and layers transformers marks croppable pass.
    """
    kind = getattr(model.config, "model_type", type(model).__name__)
    try:
        layers = new_cache(model).layers
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        # a config whose layer kinds transformers' DynamicCache cannot build
        return f"{kind}: its cache layers cannot be built ({exc.__class__.__name__})"
    blocking = sorted({type(layer).__name__ for layer in layers
                       if not isinstance(layer, (GrowingLayer, SlidingLayer))
                       and not getattr(layer, "is_croppable", False)})
    if blocking:
        return f"{kind}: recurrent or state-space layers, {', '.join(blocking)}"
    return None


def crop_cache(cache, length: int) -> None:
    """Keep the first `length` positions of the cache."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
