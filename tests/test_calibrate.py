"""Forward-cost measurement: measured once per model/device, cached as JSON, reused."""

import json

from decoding.calibrate import cost_key, load_or_measure


def test_cost_is_measured_once_and_cached(tiny_model, tmp_path):
    import torch

    first = load_or_measure(tiny_model, torch.device("cpu"), torch.float32, 5, tmp_path)
    assert len(first.seconds) == 5 and all(s > 0 for s in first.seconds)
    assert first.seconds == sorted(first.seconds)  # smoothed non-decreasing
    table = json.loads((tmp_path / "forward_costs.json").read_text())
    key = cost_key(tiny_model, torch.device("cpu"), torch.float32)
    table[key] = [9.0] * 5  # a cached value is used as is
    (tmp_path / "forward_costs.json").write_text(json.dumps(table))
    again = load_or_measure(tiny_model, torch.device("cpu"), torch.float32, 5, tmp_path)
    assert again.seconds == [9.0] * 5


def test_damaged_cache_is_remeasured(tiny_model, tmp_path):
    import torch

    (tmp_path / "forward_costs.json").write_text("{not json")
    cost = load_or_measure(tiny_model, torch.device("cpu"), torch.float32, 3, tmp_path)
    assert len(cost.seconds) == 3
    json.loads((tmp_path / "forward_costs.json").read_text())
