"""Forward-cost measurement: interleaved rounds, a low quantile, a spread check that refuses to
cache a curve measured on a busy machine, and live step times that trigger a re-measure."""

from __future__ import annotations

import json
import multiprocessing
import random
import time

import pytest
import torch

from ragspec.decoding import calibrate
from ragspec.decoding.calibrate import Calibration, CostWatch, cost_key, load_or_measure
from ragspec.decoding.engine import Generator
from ragspec.decoding.policy import ForwardCost
from ragspec.decoding.types import GenerationConfig

CPU = torch.device("cpu")


def test_cost_is_measured_once_and_cached(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(calibrate, "MAX_SPREAD", 10.0)  # this test is about caching, not noise
    first = load_or_measure(tiny_model, CPU, torch.float32, 5, tmp_path)
    assert len(first.seconds) == 5 and all(s > 0 for s in first.seconds)
    assert first.seconds == sorted(first.seconds)  # smoothed non-decreasing
    table = json.loads((tmp_path / calibrate.COSTS_FILE).read_text())
    key = cost_key(tiny_model, CPU, torch.float32)
    entry = table[key]
    assert entry["rounds"] == calibrate.ROUNDS and "measured_at" in entry and "spread" in entry
    entry["seconds"] = [9.0] * 5  # a cached value is used as is
    (tmp_path / calibrate.COSTS_FILE).write_text(json.dumps(table))
    again = load_or_measure(tiny_model, CPU, torch.float32, 5, tmp_path)
    assert again.seconds == [9.0] * 5


def test_damaged_cache_is_remeasured(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(calibrate, "MAX_SPREAD", 10.0)
    (tmp_path / calibrate.COSTS_FILE).write_text("{not json")
    cost = load_or_measure(tiny_model, CPU, torch.float32, 3, tmp_path)
    assert len(cost.seconds) == 3
    json.loads((tmp_path / calibrate.COSTS_FILE).read_text())


def test_a_packed_model_s_curve_holds_for_the_kernel_build_that_measured_it(
        tiny_model, tmp_path, monkeypatch):
    """Faster kernels change the curve's shape (a cheaper verify): a curve cached under one
    build of the native kernels is not used with another; fp32 models do not run them."""
    from conftest import MODEL_CACHE
    from test_packed import packed_copy

    from ragspec.decoding import native

    native.ops(MODEL_CACHE)  # as the product loads them before any packed model
    assert native.loaded_build()
    packed = packed_copy(tiny_model, "int8", tmp_path / "packed")
    keys = {}
    for build in ("aaaa", "bbbb"):
        monkeypatch.setattr(native, "_built", build)
        keys[build] = cost_key(packed, CPU, torch.float32)
        assert f"-k{build}" in keys[build]
        assert cost_key(tiny_model, CPU, torch.float32) == cost_key(tiny_model, CPU, torch.float32)
        assert build not in cost_key(tiny_model, CPU, torch.float32)
    assert keys["aaaa"] != keys["bbbb"]
    monkeypatch.setattr(calibrate, "MAX_SPREAD", 10.0)
    monkeypatch.setattr(native, "_built", "aaaa")
    first = load_or_measure(packed, CPU, torch.float32, 3, tmp_path)
    table = json.loads((tmp_path / calibrate.COSTS_FILE).read_text())
    table[keys["aaaa"]]["seconds"] = [9.0] * 3  # what this build measured
    (tmp_path / calibrate.COSTS_FILE).write_text(json.dumps(table))
    assert load_or_measure(packed, CPU, torch.float32, 3, tmp_path).seconds == [9.0] * 3
    monkeypatch.setattr(native, "_built", "bbbb")  # other kernels: measured again
    again = load_or_measure(packed, CPU, torch.float32, 3, tmp_path)
    assert again.seconds != [9.0] * 3 and len(again.seconds) == len(first.seconds)
    assert set(json.loads((tmp_path / calibrate.COSTS_FILE).read_text())) >= set(keys.values())


TRUE = [0.050, 0.052, 0.058, 0.066, 0.075, 0.081, 0.090, 0.098]  # seconds, one machine's shape


def samples_with_bursts(rounds: int, burst_share: float, seed: int = 0) -> list[list[float]]:
    """Timings of each size: the true cost plus small jitter, and in a share of samples a
    burst of other work that doubles or triples the time."""
    rng = random.Random(seed)
    out = []
    for c in TRUE:
        row = []
        for _ in range(rounds):
            t = c * (1 + rng.uniform(0, 0.03))
            if rng.random() < burst_share:
                t *= rng.uniform(2, 3)
            row.append(t)
        out.append(row)
    return out


def test_a_few_bursts_do_not_bend_the_curve():
    cal = calibrate.summarize(samples_with_bursts(9, burst_share=0.2), 9, 512)
    assert not cal.noisy
    shape = [c / cal.seconds[0] for c in cal.seconds]
    true_shape = [c / TRUE[0] for c in TRUE]
    assert max(abs(a - b) for a, b in zip(shape, true_shape, strict=True)) < 0.05


def test_a_busy_measurement_is_flagged_noisy():
    cal = calibrate.summarize(samples_with_bursts(9, burst_share=0.6), 9, 512)
    assert cal.noisy and cal.spread > calibrate.MAX_SPREAD


def test_sizes_and_contexts_are_interleaved_across_rounds(tiny_model):
    seen = []
    forward = tiny_model.forward

    def spy(*args, **kwargs):
        cache = kwargs["cache"]
        seen.append((kwargs["input_ids"].shape[1], cache.get_seq_length()))
        return forward(*args, **kwargs)

    tiny_model.forward = spy
    try:
        cal = calibrate.measure(tiny_model, 4, context=32, rounds=3, far_context=96)
    finally:
        del tiny_model.forward
    assert seen[:2] == [(32, 0), (96, 0)]  # the two contexts' prefills
    rounds = [seen[2 + 8 * r : 2 + 8 * (r + 1)] for r in range(4)]
    assert all(sorted(r) == sorted((n, c) for n in range(1, 5) for c in (32, 96)) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # not the same order every round
    assert (cal.context, cal.far_context) == (32, 96) and len(cal.far_seconds) == 4
    assert cal.cost(3, 96) == cal.far_seconds[2] and cal.cost(3, 32) == cal.seconds[2]


def test_noisy_curves_are_used_but_not_cached(tiny_model, tmp_path, monkeypatch):
    noisy = Calibration((0.01, 0.01, 0.01), spread=0.9, rounds=9, context=32, measured_at="t")
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: noisy)
    cost = load_or_measure(tiny_model, CPU, torch.float32, 3, tmp_path)
    assert cost.seconds == [0.01, 0.01, 0.01]
    assert not (tmp_path / calibrate.COSTS_FILE).exists()


def _spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


@pytest.mark.slow
def test_a_cpu_hog_during_calibration_never_leaves_a_poisoned_curve(tiny_model, tmp_path):
    """Two busy processes on this (2-core) machine while the curve is measured: whatever the
    scheduler does, the cache holds a curve only if its own spread says it was clean."""
    model = tiny_model
    hogs = [multiprocessing.Process(target=_spin, args=(time.monotonic() + 60,))
            for _ in range(2)]
    for hog in hogs:
        hog.start()
    try:
        cal = calibrate.measure_and_save(model, CPU, torch.float32, 6, tmp_path)
    finally:
        for hog in hogs:
            hog.terminate()
            hog.join()
    stored = calibrate.cached(model, CPU, torch.float32, tmp_path, 6)
    assert (stored is not None) == (not cal.noisy)
    if stored is not None:
        assert stored.spread <= calibrate.MAX_SPREAD


def test_live_times_agree_when_the_machine_is_uniformly_slower():
    cost = ForwardCost(TRUE)
    watch = CostWatch(min_samples=4)
    for _ in range(6):
        for n in (1, 2, 4):
            watch.observe(n, 3 * cost(n))  # everything three times slower: same shape
    assert watch.verdict(cost) is False


def test_live_times_disagree_when_the_shape_changed():
    cost = ForwardCost(TRUE)
    watch = CostWatch(min_samples=4)
    for _ in range(6):
        watch.observe(1, cost(1))
        for n in (3, 5):
            watch.observe(n, 2.0 * cost(n))  # long forwards much dearer than the curve says
    assert watch.verdict(cost) is True
    assert CostWatch(min_samples=4).verdict(cost) is None  # nothing seen: no verdict


def test_the_engine_remeasures_after_two_disagreeing_checks(tiny_model, tiny_tokenizer):
    calls = []
    fresh = ForwardCost([1.0] * 17)

    def recalibrate():
        calls.append(1)
        return fresh

    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2], cost=ForwardCost(TRUE),
                    recalibrate=recalibrate)
    policy = gen.policy_for(GenerationConfig())

    def samples(long_step: float):
        for _ in range(10):
            gen.watch.observe(1, 0.05)
            gen.watch.observe(4, long_step)  # the curve says 0.066

    samples(0.20)
    assert not gen.review_cost()  # one disagreement is not yet sustained
    samples(0.066)
    assert not gen.review_cost()  # an agreeing verdict starts the count again
    samples(0.20)
    assert not gen.review_cost() and not calls
    assert not gen.review_cost() and not calls  # no fresh samples: no verdict
    samples(0.20)
    assert gen.review_cost() and not calls  # due, but reviewing never measures
    assert gen.recalibrate_if_due() and calls == [1]
    assert gen.cost is fresh and policy.cost is fresh
    assert not gen.recalibrate_if_due() and calls == [1]  # done: no longer due


def test_a_generation_never_remeasures_inside_itself(tiny_model, tiny_tokenizer):
    """Even when the curve is due for a re-measure, streaming an answer never runs it: the
    re-measure waits for recalibrate_if_due, between generations."""
    calls = []
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2], cost=ForwardCost(TRUE * 3),
                    recalibrate=lambda: calls.append(1) or ForwardCost([1.0] * 24))
    gen.recalibration_due = True
    for _ in range(3):
        for _ in range(20):  # live steps that disagree with the curve wildly
            gen.watch.observe(1, 0.05)
            gen.watch.observe(2, 5.0)
        gen.generate([5, 6, 7, 5, 6, 7, 5, 6], GenerationConfig(max_new_tokens=12))
    assert calls == [] and gen.recalibration_due
    gen.recalibrate_if_due()
    assert calls == [1]


def test_live_steps_are_compared_with_the_curve_at_their_own_context():
    """A curve measured at two contexts: steps at a long context that cost what the curve says
    there agree with it, though they would disagree with its short-context shape."""
    near = [0.050, 0.052, 0.055, 0.060]
    far = [0.060, 0.080, 0.100, 0.130]  # attention makes long forwards dearer at 1024
    cost = ForwardCost(near, 256, far, 1024)
    watch = CostWatch(min_samples=4)
    for _ in range(8):
        for n in range(1, 5):
            watch.observe(n, cost(n, 1000), 1000)
    assert watch.verdict(cost) is False
    single = ForwardCost(near, 256)  # the same samples against a one-context curve
    assert watch.verdict(single) is True
    assert cost(4, 640) == pytest.approx((0.060 + 0.130) / 2)


@pytest.fixture
def calibrate_cli(tiny_model, tiny_tokenizer, tmp_path, monkeypatch):
    """`ragspec calibrate` over the tiny model, in a temporary data directory."""
    from ragspec.models import load as model_mod

    loaded = model_mod.LoadedModel(tiny_model, tiny_tokenizer, "tiny", CPU, torch.float32, 0.0)
    monkeypatch.setattr(model_mod, "load_model", lambda *a, **k: loaded)
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path))
    monkeypatch.delenv("RAGSPEC_MODEL_CACHE", raising=False)
    monkeypatch.setattr(calibrate, "MAX_SPREAD", 10.0)  # about the command, not about noise
    return tmp_path


def test_calibrate_measures_caches_and_shows_the_curve(calibrate_cli):
    from click.testing import CliRunner

    from ragspec.cli import main

    runner = CliRunner()
    missing = runner.invoke(main, ["calibrate", "--show"])
    assert missing.exit_code == 1 and "no curve cached" in missing.output
    png = calibrate_cli / "curve.png"
    measured = runner.invoke(main, ["calibrate", "--max-draft", "3", "--plot", str(png)])
    assert measured.exit_code == 0, measured.output
    assert "cached in" in measured.output and png.read_bytes()[:4] == b"\x89PNG"
    shown = runner.invoke(main, ["calibrate", "--show", "--json"])
    data = json.loads(shown.stdout)
    assert data["saved"] and len(data["seconds"]) == 4 and data["rounds"] == calibrate.ROUNDS
    assert data["file"] == str(calibrate_cli / "models" / calibrate.COSTS_FILE)


def test_two_writers_saving_at_once_keep_both_entries(tiny_model, tmp_path, monkeypatch):
    """Each save reads the table, adds its entry and writes it back: without the lock, two
    saves that overlap both read the old table and the second write loses the first's entry."""
    import threading

    read = calibrate._read_table

    def slow_read(cache_dir):
        table = read(cache_dir)
        time.sleep(0.2)  # both writers hold the old table at the same time
        return table

    monkeypatch.setattr(calibrate, "_read_table", slow_read)
    cal = Calibration((0.01, 0.02), spread=0.0, rounds=9, context=32, measured_at="t")
    keys = [torch.float32, torch.float16]
    workers = [threading.Thread(target=calibrate.save, args=(tiny_model, CPU, d, tmp_path, cal))
               for d in keys]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    table = json.loads((tmp_path / calibrate.COSTS_FILE).read_text())
    assert {cost_key(tiny_model, CPU, d) for d in keys} <= set(table)


def test_interleaved_rounds_time_every_cell_once_per_round_and_drop_the_warm_up():
    calls = []

    def run(cell):
        calls.append(cell)
        return float(len(calls))  # the seconds say when the cell ran

    samples = calibrate.interleaved(["a", "b", "c", "d"], run, rounds=3)
    rounds = [calls[i:i + 4] for i in range(0, 16, 4)]
    assert all(sorted(r) == ["a", "b", "c", "d"] for r in rounds) and len(calls) == 16
    assert len({tuple(r) for r in rounds}) > 1  # shuffled, not one fixed order
    for cell, seconds in samples.items():  # rounds 1..3 kept, round 0 (the warm-up) not
        assert seconds == [float(rounds[r].index(cell) + 1 + 4 * r) for r in (1, 2, 3)]
