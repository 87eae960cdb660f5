"""A first `ragspec ask` in a new data folder: the answer comes first, the forward-cost
measurement after it (for the next runs), each with a line; through click's CliRunner on a tiny
model folder (converted into the temporary home's model cache), HashEmbedder for retrieval, and
the measurement itself replaced (its own tests are in tests/decoding/test_calibrate.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import save_model_folder
from fakes import HashEmbedder

import ragspec.loading as loading
from ragspec import paths
from ragspec.cli import main
from ragspec.decoding import calibrate
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.ingest import ingest_paths

DOC = "The metrics endpoint of the daemon listens on port 7432 and serves /metrics only.\n"
LATER = "Measuring this machine's forward cost for the next runs"


@pytest.fixture
def home(tmp_path, monkeypatch, tiny_model, tiny_tokenizer):
    home = tmp_path / "home"
    monkeypatch.setenv("RAGSPEC_HOME", str(home))
    monkeypatch.delenv("RAGSPEC_MODEL_CACHE", raising=False)  # the test's own machine cache
    monkeypatch.delenv("RAGSPEC_EMBEDDER", raising=False)
    monkeypatch.setattr(loading, "cached_embedder", lambda name: HashEmbedder())
    doc = tmp_path / "metrics.txt"
    doc.write_text(DOC)
    assert ingest_paths([doc], PassageStore.open(home / "index", HashEmbedder())).ok
    return home, save_model_folder(tiny_model, tiny_tokenizer, tmp_path / "model")


def ask(model):
    return CliRunner().invoke(main, ["ask", "On which port does the metrics endpoint listen?",
                                     "-k", "1", "--max-new-tokens", "6", "--max-draft", "4",
                                     "--model", str(model)])


def test_a_first_ask_answers_before_it_measures_and_the_next_one_does_not_measure(
        home, monkeypatch):
    folder, model = home
    idle = calibrate.Calibration((0.01, 0.012, 0.015, 0.019, 0.024), spread=0.05, rounds=9,
                                 context=32, measured_at="t")
    calls = []
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: calls.append(1) or idle)
    first = ask(model)
    assert first.exit_code == 0, first.output
    out = first.output
    assert "Measuring this machine's forward cost once" not in out  # nothing before the answer
    assert "it is measured after the answer" in out
    assert out.index("tokens in") < out.index(LATER) < out.index("Measured; cached in")
    assert calls == [1]
    assert (paths.models_dir() / calibrate.COSTS_FILE).is_file()
    second = ask(model)
    assert second.exit_code == 0, second.output
    assert "forward cost" not in second.output and calls == [1]


def test_a_first_ask_on_a_busy_machine_caches_nothing_and_says_the_next_run_tries(
        home, monkeypatch):
    folder, model = home
    busy = calibrate.Calibration((0.01,) * 5, spread=0.9, rounds=9, context=32, measured_at="t")
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: busy)
    first = ask(model)
    assert first.exit_code == 0, first.output
    assert first.output.index("tokens in") < first.output.index(LATER)
    assert "too busy to measure it: the next run tries again" in first.output
    assert not (paths.models_dir() / calibrate.COSTS_FILE).exists()
    second = ask(model)
    assert LATER in second.output  # tried again, after the answer again


def test_calibrate_if_missing_gets_ready_once_and_is_not_an_error_when_busy(home, monkeypatch):
    """What `make demo` runs before the chat: the model loaded (converted into the new home's
    model cache), the curve measured only when none is cached; a busy machine exits 0."""
    folder, model = home
    busy = calibrate.Calibration((0.01,) * 5, spread=0.9, rounds=9, context=32, measured_at="t")
    idle = calibrate.Calibration((0.01, 0.012, 0.015, 0.019, 0.024), spread=0.05, rounds=9,
                                 context=32, measured_at="t")
    results = [busy, busy, idle]
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: results.pop(0))
    args = ["calibrate", "--if-missing", "--max-draft", "4", "--model", str(model)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "too busy" in first.output and "not measured yet" in first.output
    second = CliRunner().invoke(main, args)
    assert second.exit_code == 0 and "Ready:" in second.output, second.output
    assert "Measured this machine's forward cost" in second.output and not results
    third = CliRunner().invoke(main, args)
    assert "forward cost" not in third.output and "its forward-cost curve is measured" in \
        third.output
    assert "--show" in CliRunner().invoke(main, [*args, "--show"]).output
