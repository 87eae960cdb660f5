"""Forward-cost measurement: interleaved rounds, a low quantile, a spread check that refuses to
cache a curve measured on a busy machine, and live step times that trigger a re-measure."""

from __future__ import annotations

import json
import multiprocessing
import random
import time

import pytest
import torch

from ragspec import paths
from ragspec.decoding import calibrate
from ragspec.decoding.calibrate import Calibration, CostWatch, cost_key, load_or_measure
from ragspec.decoding.engine import Generator
from ragspec.decoding.policy import ForwardCost
from ragspec.decoding.types import GenerationConfig

CPU = torch.device("cpu")


def test_cost_is_measured_once_and_cached(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(calibrate, "MAX_SPREAD", 10.0)  # this test is about caching, not noise
    first = load_or_measure(tiny_model, CPU, torch.float32, 5, tmp_path, seconds=None).cost
    assert len(first.seconds) == 5 and all(s > 0 for s in first.seconds)
    assert first.seconds == sorted(first.seconds)  # smoothed non-decreasing
    table = json.loads((tmp_path / calibrate.COSTS_FILE).read_text())
    key = cost_key(tiny_model, CPU, torch.float32)
    entry = table[key]
    assert entry["rounds"] == calibrate.ROUNDS and "measured_at" in entry and "spread" in entry
    entry["seconds"] = [9.0] * 5  # a cached value is used as is
    (tmp_path / calibrate.COSTS_FILE).write_text(json.dumps(table))
    again = load_or_measure(tiny_model, CPU, torch.float32, 5, tmp_path, seconds=None).cost
    assert again.seconds == [9.0] * 5


def test_damaged_cache_is_remeasured(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(calibrate, "MAX_SPREAD", 10.0)
    (tmp_path / calibrate.COSTS_FILE).write_text("{not json")
    cost = load_or_measure(tiny_model, CPU, torch.float32, 3, tmp_path, seconds=None).cost
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
    first = load_or_measure(packed, CPU, torch.float32, 3, tmp_path, seconds=None).cost
    table = json.loads((tmp_path / calibrate.COSTS_FILE).read_text())
    table[keys["aaaa"]]["seconds"] = [9.0] * 3  # what this build measured
    (tmp_path / calibrate.COSTS_FILE).write_text(json.dumps(table))
    assert load_or_measure(packed, CPU, torch.float32, 3, tmp_path, seconds=None).cost.seconds == [9.0] * 3
    monkeypatch.setattr(native, "_built", "bbbb")  # other kernels: measured again
    again = load_or_measure(packed, CPU, torch.float32, 3, tmp_path, seconds=None).cost
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
    # the two contexts' prefills, in chunks of PREFILL_CHUNK (64) tokens
    assert seen[:3] == [(32, 0), (64, 0), (32, 64)]
    rounds = [seen[3 + 8 * r : 3 + 8 * (r + 1)] for r in range(4)]
    assert all(sorted(r) == sorted((n, c) for n in range(1, 5) for c in (32, 96)) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # not the same order every round
    assert (cal.context, cal.far_context) == (32, 96) and len(cal.far_seconds) == 4
    assert cal.cost(3, 96) == cal.far_seconds[2] and cal.cost(3, 32) == cal.seconds[2]


def test_noisy_curves_are_neither_used_nor_cached(tiny_model, tmp_path, monkeypatch):
    """A busy machine's curve (flat here: long forwards as cheap as short ones, the shape that
    makes the policy draft long) gives way to the conservative stand-in, and nothing is cached."""
    noisy = Calibration((0.01, 0.01, 0.01), spread=0.9, rounds=9, context=32, measured_at="t")
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: noisy)
    curve = load_or_measure(tiny_model, CPU, torch.float32, 3, tmp_path, seconds=None)
    assert not curve.trusted and curve.cost == calibrate.conservative_cost(3)
    assert "too busy" in curve.note and "spread was 90%" in curve.note
    assert not (tmp_path / calibrate.COSTS_FILE).exists()


class SlowMachine:
    """A clock on which every forward of `model` takes `forward_seconds` (a busy machine, made
    deterministic): the measurement reads time only from it."""

    def __init__(self, model, forward_seconds: float):
        self.now = 0.0
        self.forwards = 0
        self.model = model
        self.forward_seconds = forward_seconds
        self._forward = model.forward

    def __call__(self) -> float:
        return self.now

    def __enter__(self):
        def slow(*args, **kwargs):
            self.now += self.forward_seconds
            self.forwards += 1
            return self._forward(*args, **kwargs)

        self.model.forward = slow
        return self

    def __exit__(self, *exc):
        del self.model.forward


def test_the_measurement_stops_at_its_bound_over_all_attempts(tiny_model, tmp_path):
    """Forwards of 0.5 s against a 20 s bound: the two contexts' prefills (256 and 1021 tokens
    in chunks of 64: 20 forwards) take 10 s, the warm-up round (sizes 1..3 at two contexts: 6
    forwards) 3 s, then two rounds are kept and a third would not fit. No forward starts that
    would end after the bound, over both attempts together; 2 kept rounds are too few to
    trust, so nothing is cached."""
    with SlowMachine(tiny_model, 0.5) as machine:
        cal = calibrate.measure_and_save(tiny_model, CPU, torch.float32, 3, tmp_path,
                                         seconds=20.0, clock=machine)
    assert machine.now <= 20.0
    assert machine.forwards == 20 + 6 * 3  # no forwards spent on a round that could not finish
    assert cal is not None and cal.rounds == 2 and not cal.trusted and not cal.noisy
    assert not (tmp_path / calibrate.COSTS_FILE).exists()
    with SlowMachine(tiny_model, 0.5) as machine:  # the same machine, given the time it needs
        cal = calibrate.measure_and_save(tiny_model, CPU, torch.float32, 3, tmp_path,
                                         seconds=1000.0, clock=machine)
    assert cal.rounds == calibrate.ROUNDS and cal.trusted
    assert calibrate.cached(tiny_model, CPU, torch.float32, tmp_path, 3) == cal


@pytest.mark.parametrize(("forward_seconds", "bound"), [
    (4.0, 20.0),  # the bound passes while the contexts are filled (20 forwards of 64 tokens)
    (1.0, 22.0),  # ... during the warm-up round, whose forwards have no time of their own yet
])
def test_a_first_use_that_cannot_finish_one_round_works_with_the_stand_in(
        tiny_model, tmp_path, forward_seconds, bound):
    notes = []
    with SlowMachine(tiny_model, forward_seconds) as machine:
        curve = load_or_measure(tiny_model, CPU, torch.float32, 3, tmp_path, seconds=bound,
                                on_measure=notes.append, clock=machine)
    assert notes == [bound] and machine.now <= bound
    assert not curve.trusted and curve.cost == calibrate.conservative_cost(3)
    assert "not one round finished" in curve.note
    assert not (tmp_path / calibrate.COSTS_FILE).exists()


def test_the_stand_in_curve_drafts_less_than_a_measured_one_until_drafts_prove_sure():
    """The stand-in is dearer per extra token than the curves measured (the bundled model's
    cached curve on a 2-core Xeon, below: c(4)/c(1) 1.18, c(17)/c(1) 2.7): on weak evidence it
    drafts nothing, it never drafts longer than the measured curve would, and once the policy
    has learnt that a kind of match is always accepted it drafts long under it too."""
    from ragspec.decoding.ngram import Match
    from ragspec.decoding.policy import DraftPolicy
    from ragspec.decoding.types import DraftConfig

    measured = ForwardCost([0.0149, 0.0149, 0.0166, 0.0176, 0.0179, 0.0192, 0.0209, 0.0245,
                            0.0262, 0.0262, 0.0314, 0.0314, 0.0334, 0.0334, 0.0363, 0.0402,
                            0.0402])
    stand_in = calibrate.conservative_cost(17)
    assert stand_in(4) / stand_in(1) == 2.5 and stand_in(17) / stand_in(1) == 9.0
    for extended in (1, 2, 4, 8, 16, 32):
        match = Match(n=min(extended, 4), extended=extended, origin=0, tokens=list(range(16)))
        fresh = [DraftPolicy(DraftConfig(), cost) for cost in (measured, stand_in)]
        under_measured, under_stand_in = (p.choose(match, 100) for p in fresh)
        assert under_stand_in <= under_measured
        if extended <= 2:
            assert under_stand_in == 0 < under_measured
        for policy in fresh:
            for _ in range(30):
                policy.observe(match, 8, 8)
        assert fresh[1].choose(match, 100) >= 8


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
    assert data["file"] == str(paths.models_dir() / calibrate.COSTS_FILE)
    assert paths.models_dir() == calibrate_cli / "ragspec-cache" / "models"  # the machine's


def test_calibrate_says_why_a_curve_cut_short_is_not_cached(calibrate_cli, monkeypatch):
    from click.testing import CliRunner

    from ragspec.cli import main

    short = Calibration((0.01, 0.02), spread=0.05, rounds=2, context=32, measured_at="t")
    results = [short, short, None, None]
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: results.pop(0))
    runner = CliRunner()
    cut = runner.invoke(main, ["calibrate", "--max-draft", "1", "--max-seconds", "5"])
    assert cut.exit_code == 0, cut.output
    assert "(at most 5 s)" in cut.output and "only 2 rounds finished in time" in cut.output
    assert not (paths.models_dir() / calibrate.COSTS_FILE).exists()
    nothing = runner.invoke(main, ["calibrate", "--max-draft", "1", "--max-seconds", "5"])
    assert nothing.exit_code == 1 and "not one round of the measurement finished" in nothing.output


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


def test_a_stand_in_curve_is_replaced_once_a_measurement_is_trusted(
        tiny_model, tiny_tokenizer, monkeypatch):
    """A generator working with the stand-in re-measures between generations, not right after
    its owner's own try, and not more often than every RETRY_SECONDS while the machine stays
    busy; the first trusted curve replaces the stand-in, and the policy takes it up."""
    now = [0.0]
    monkeypatch.setattr(Generator, "retry_clock", staticmethod(lambda: now[0]))
    answers = [None, ForwardCost(TRUE)]  # busy, then idle
    calls = []

    def recalibrate():
        calls.append(now[0])
        return answers[len(calls) - 1]

    stand_in = calibrate.conservative_cost(len(TRUE))
    gen = Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2], cost=stand_in,
                    recalibrate=recalibrate, provisional=True)
    policy = gen.policy_for(GenerationConfig())
    assert gen.recalibration_due and policy.cost is stand_in
    now[0] = 10.0
    assert not gen.recalibrate_if_due() and calls == []  # the owner has just tried
    now[0] = Generator.RETRY_SECONDS + 1
    assert not gen.recalibrate_if_due() and calls == [now[0]]  # tried: still busy
    assert gen.provisional and gen.recalibration_due and gen.cost is stand_in
    now[0] += Generator.RETRY_SECONDS / 2
    assert not gen.recalibrate_if_due() and len(calls) == 1  # not again so soon
    now[0] += Generator.RETRY_SECONDS
    assert gen.recalibrate_if_due() and len(calls) == 2
    assert gen.cost is answers[1] and policy.cost is answers[1] and not gen.provisional
    assert not gen.recalibrate_if_due() and len(calls) == 2  # trusted: nothing due


@pytest.fixture
def tiny_loaded(tiny_model, tiny_tokenizer):
    from ragspec.models.load import LoadedModel

    return LoadedModel(tiny_model, tiny_tokenizer, "tiny", CPU, torch.float32, 0.0)


def test_a_busy_first_run_caches_nothing_and_a_later_trusted_one_is_kept(
        tiny_loaded, tmp_path, monkeypatch):
    """The product's path (ragspec.loading.generator_for): a first measurement that is not
    trusted gives the stand-in, says so in two lines and caches nothing; the generator's
    re-measure between generations, once trusted, replaces it and caches it; a later run then
    loads it without measuring."""
    from ragspec.loading import generator_for

    busy = Calibration((0.01,) * 4, spread=0.05, rounds=2, context=32, measured_at="t")
    idle = Calibration((0.01, 0.012, 0.015, 0.019), spread=0.05, rounds=9, context=32,
                       measured_at="t")
    results = [busy, busy, idle]  # the first run's two attempts, then the re-measure
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: results.pop(0))
    monkeypatch.setattr(Generator, "retry_clock", staticmethod(lambda: 0.0))
    notes = []
    gen = generator_for(tiny_loaded, tmp_path, max_draft=3, on_note=notes.append)
    assert gen.provisional and gen.cost == calibrate.conservative_cost(4)
    assert notes[0] == (f"Measuring this machine's forward cost once (at most "
                        f"{calibrate.MEASURE_SECONDS:.0f} s)...")
    assert len(notes) == 2 and "conservative curve" in notes[1] and "2 of 9 rounds" in notes[1]
    assert not (tmp_path / calibrate.COSTS_FILE).exists()
    monkeypatch.setattr(Generator, "retry_clock", staticmethod(lambda: 1e9))  # much later
    assert gen.recalibrate_if_due() and gen.cost == idle.cost and not gen.provisional
    assert calibrate.cached(tiny_loaded.model, CPU, torch.float32, tmp_path, 4) == idle
    again, notes = generator_for(tiny_loaded, tmp_path, max_draft=3, on_note=notes.append), []
    assert not again.provisional and again.cost == idle.cost and notes == [] and not results


@pytest.mark.slow
def test_a_first_run_on_a_busy_machine_ends_within_the_bound(bundled, tmp_path):
    """Twice as many CPU-burning processes as cores while the bundled model's generator is made
    for a fresh model cache: it is ready within the bound (generous headroom: what overruns it
    is at most one forward), and it works with a measured curve only if that curve was trusted
    and cached, else with the stand-in and nothing cached."""
    import os
    import subprocess
    import sys

    from ragspec.loading import generator_for

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(2 * (os.cpu_count() or 2))]
    notes = []
    try:
        start = time.monotonic()
        gen = generator_for(bundled, tmp_path, on_note=notes.append)
        took = time.monotonic() - start
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert took < calibrate.MEASURE_SECONDS + 40, notes
    stored = calibrate.cached(bundled.model, bundled.device, bundled.dtype, tmp_path, 17)
    assert gen.provisional == (stored is None), notes
    if gen.provisional:
        assert gen.cost == calibrate.conservative_cost(17) and "too busy" in notes[-1]
    else:
        assert stored.trusted and gen.cost == stored.cost
    print(f"ready in {took:.1f} s; {notes}")
