"""`ragspec ask` and `ragspec search` with the search mode and the relevance floor, through
click's CliRunner. Fast: HashEmbedder for retrieval, and a model loader that fails if called
(a refusal must not load, let alone run, the model)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fakes import HashEmbedder

import ragspec.commands.ask as ask_module
import ragspec.loading as loading
from ragspec.cli import main
from ragspec.retrieval.faiss.store import PassageStore
from ragspec.retrieval.ingest import ingest_paths
from ragspec.search import NOT_IN_DOCUMENTS

DOC = ("The metrics endpoint of the daemon listens on port 7432 and serves /metrics only.\n\n"
       "Error E204 means that the queue is full.\n")


class ModelLoaded(Exception):
    """Raised by the test's model loader: the command tried to load the model."""


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("RAGSPEC_HOME", str(home))
    monkeypatch.delenv("RAGSPEC_EMBEDDER", raising=False)
    monkeypatch.setattr(loading, "cached_embedder", lambda name: HashEmbedder())

    def no_model(*args, **kwargs):
        raise ModelLoaded

    monkeypatch.setattr(ask_module, "generator_from_options", no_model)
    doc = tmp_path / "metrics.txt"
    doc.write_text(DOC)
    assert ingest_paths([doc], PassageStore.open(home / "index", HashEmbedder())).ok
    return home


def test_ask_json_below_the_floor_is_refused_with_the_closest_passages_and_no_model(home):
    result = CliRunner().invoke(main, ["ask", "what is the capital of australia", "--json",
                                       "--min-score", "0.9", "-k", "2"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["refused"] is True and out["answer"] is None and out["model"] is None
    assert out["message"] == NOT_IN_DOCUMENTS and out["min_score"] == 0.9
    assert out["best_score"] < 0.9 and len(out["passages"]) >= 1
    assert out["passages"][0]["source"].endswith("metrics.txt")
    assert out["passages"][0]["score"] == pytest.approx(out["best_score"], abs=1e-6)


def test_ask_text_below_the_floor_says_not_in_the_documents(home):
    result = CliRunner().invoke(main, ["ask", "what is the capital of australia",
                                       "--min-score", "0.9"])
    assert result.exit_code == 0, result.output
    assert "do not appear to contain the answer" in result.output
    assert "metrics.txt" in result.output and "--min-score" in result.output


@pytest.mark.parametrize("floor", ["0", "0.01"])
def test_ask_above_the_floor_goes_on_to_load_the_model(home, floor):
    result = CliRunner().invoke(main, ["ask", "which port does the metrics endpoint use",
                                       "--json", "--min-score", floor])
    assert isinstance(result.exception, ModelLoaded)


def test_ask_rejects_a_floor_outside_0_to_1_and_an_unknown_mode(home):
    assert CliRunner().invoke(main, ["ask", "x y z", "--min-score", "1.5"]).exit_code == 2
    assert CliRunner().invoke(main, ["ask", "x y z", "--search-mode", "bm25"]).exit_code == 2


def test_search_mode_reaches_the_store(home):
    runner = CliRunner()
    outs = {mode: json.loads(runner.invoke(main, ["search", "E204", "--search-mode", mode,
                                                  "--json"]).stdout)
            for mode in ("dense", "hybrid")}
    [dense], [hybrid] = outs["dense"], outs["hybrid"]
    assert dense["fused"] is None and hybrid["fused"] == pytest.approx(1 / 61 + 1 / 61, abs=1e-6)
    assert dense["score"] == hybrid["score"]  # the cosine, whatever the mode
