"""The KV cache layers: the in-place layer gives the same logits as transformers' DynamicCache
through prefill, verify forwards, crops and buffer growth (cropping only moves the fill mark); the
sliding-window layer shows exactly the window and can be rolled back after the window has passed."""

import pytest
import torch
from transformers import DynamicCache

from ragspec.decoding import cache as kv
from ragspec.decoding.cache import GrowingLayer, SlidingLayer, crop_cache, new_cache


@torch.inference_mode()
def _step(model, cache, ids):
    return model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True).logits[0]


def test_growing_cache_matches_dynamic_cache_through_crops_and_growth(tiny_model, monkeypatch):
    monkeypatch.setattr(kv, "_SPARE", 3)  # force the buffers to grow many times
    gen = torch.Generator().manual_seed(1)
    vocab = tiny_model.config.vocab_size
    ours, theirs = new_cache(tiny_model), DynamicCache(config=tiny_model.config)
    assert all(isinstance(layer, GrowingLayer) for layer in ours.layers)
    prompt = torch.randint(3, vocab, (40,), generator=gen).tolist()
    assert torch.equal(_step(tiny_model, ours, prompt), _step(tiny_model, theirs, prompt))
    length = len(prompt)
    for n, keep in [(1, 1), (6, 2), (9, 9), (4, 0), (12, 5), (1, 1), (17, 3)]:
        ids = torch.randint(3, vocab, (n,), generator=gen).tolist()
        a, b = _step(tiny_model, ours, ids), _step(tiny_model, theirs, ids)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        length += keep
        crop_cache(ours, length)
        crop_cache(theirs, length)
        assert ours.get_seq_length() == theirs.get_seq_length() == length
        for mine, ref in zip(ours.layers, theirs.layers, strict=True):
            assert torch.equal(mine.keys, ref.keys) and torch.equal(mine.values, ref.values)


def test_crop_keeps_the_buffer_and_later_writes_overwrite():
    layer = GrowingLayer()
    first = torch.arange(2 * 5 * 4, dtype=torch.float32).view(1, 2, 5, 4)
    keys, _ = layer.update(first, -first)
    buffer = layer._key_buf
    assert layer.get_seq_length() == 5 and torch.equal(keys, first)
    layer.crop(-3)
    assert layer.get_seq_length() == 2 and torch.equal(layer.keys, first[:, :, :2])
    new = torch.full((1, 2, 1, 4), 7.0)
    keys, values = layer.update(new, new)
    assert layer._key_buf is buffer  # no reallocation, no copy of the kept positions
    assert torch.equal(keys, torch.cat([first[:, :, :2], new], dim=2))
    assert torch.equal(values, torch.cat([-first[:, :, :2], new], dim=2))
    with pytest.raises(ValueError):
        layer.crop(2)


def _kv(start: int, n: int) -> torch.Tensor:
    """(1, 1, n, 2) keys whose values name their absolute positions start..start+n-1."""
    pos = torch.arange(start, start + n, dtype=torch.float32)
    return torch.stack([pos, -pos], dim=-1).view(1, 1, n, 2)


def test_sliding_layer_shows_the_window_and_rolls_back_past_it(monkeypatch):
    monkeypatch.setattr(kv, "_SPARE", 2)
    window = 5
    layer = SlidingLayer(sliding_window=window)
    keys, _ = layer.update(_kv(0, 9), _kv(0, 9))  # prefill longer than the window
    assert torch.equal(keys, _kv(0, 9))  # the prefill itself sees all of its positions
    assert torch.equal(layer.keys, _kv(5, 4))  # window - 1 kept for the next step
    length = 9
    for step in range(30):
        new = 1 + step % 6
        assert layer.get_mask_sizes(new) == (window - 1 + new, length - window + 1)
        keys, _ = layer.update(_kv(length, new), _kv(length, new))
        assert torch.equal(keys, _kv(length - window + 1, window - 1 + new))
        keep = step % (new + 1)  # reject the rest of this forward
        layer.crop(keep - new)
        length += keep
        assert layer.get_seq_length() == length
        assert torch.equal(layer.keys, _kv(length - window + 1, window - 1))
    # old positions are freed: the buffer never holds more than window + forward + spare
    assert layer._key_buf.shape[-2] <= window + 6 + max(kv._SPARE, window)


def test_sliding_layer_refuses_a_rollback_into_positions_it_dropped(monkeypatch):
    monkeypatch.setattr(kv, "_SPARE", 1)
    layer = SlidingLayer(sliding_window=3)
    for start in range(0, 40, 2):
        layer.update(_kv(start, 2), _kv(start, 2))
    with pytest.raises(ValueError, match="cannot roll a sliding-window layer back"):
        layer.crop(-30)
    layer.crop(-2)  # the last forward's positions: always possible
    assert layer.get_seq_length() == 38


def test_new_cache_replaces_sliding_layers_only_where_the_config_slides(tiny_tokenizer):
    from conftest import make_family_model

    model = make_family_model("gemma2", len(tiny_tokenizer))
    kinds = [type(layer) for layer in new_cache(model).layers]
    assert kinds == [SlidingLayer, GrowingLayer]
