"""`ragspec ask` and `ragspec ui` through click's CliRunner with a temporary data directory (the
converted bundled model is shared through RAGSPEC_MODEL_CACHE, so it is converted at most once)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ragspec.commands.ask import ask
from tests.conftest import MODEL_CACHE

DOC = ("The metrics endpoint of the daemon listens on port 7432 and serves /metrics only.\n"
       "Job logs are kept for 14 days by default.\n")
QUESTION = "On which port does the metrics endpoint listen?"


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("RAGSPEC_HOME", str(home))
    monkeypatch.setenv("RAGSPEC_MODEL_CACHE", str(MODEL_CACHE))
    return home


@pytest.fixture
def indexed(home, tmp_path):
    from ragspec.retrieval.embeddings.embedder import Embedder
    from ragspec.retrieval.faiss.store import PassageStore
    from ragspec.retrieval.ingest import ingest_paths

    doc = tmp_path / "metrics.txt"
    doc.write_text(DOC)
    report = ingest_paths([doc], PassageStore.open(home / "index", Embedder()))
    assert report.ok, report.failed
    return home


def test_ask_empty_question_is_a_usage_error(home):
    result = CliRunner().invoke(ask, ["   "])
    assert result.exit_code == 2 and "empty" in result.output


def test_ask_without_documents_says_how_to_add_them(home):
    result = CliRunner().invoke(ask, [QUESTION])
    assert result.exit_code == 1
    assert "no documents" in result.output and "ragspec ingest" in result.output
    assert "Traceback" not in result.output


def test_ask_compare_conflicts_with_no_spec(home):
    result = CliRunner().invoke(ask, [QUESTION, "--compare", "--no-spec"])
    assert result.exit_code == 2


@pytest.mark.slow
def test_ask_json_compare_gives_answer_passages_and_identical_baseline(indexed):
    result = CliRunner().invoke(ask, [QUESTION, "--json", "--compare", "-k", "1",
                                      "--max-new-tokens", "12"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert {"text", "prompt_token_ids", "token_ids", "spans", "stats"} <= set(out["answer"])
    assert out["baseline"]["token_ids"] == out["answer"]["token_ids"]
    assert out["identical"] is True
    assert out["baseline"]["stats"]["drafted_tokens"] == 0
    [passage] = out["passages"]
    assert passage["n"] == 1 and passage["source"].endswith("metrics.txt")
    for start, end in passage["copied"]:
        assert 0 <= start < end <= len(passage["text"])


@pytest.mark.slow
def test_ask_prints_answer_stats_and_passages(indexed):
    result = CliRunner().invoke(ask, [QUESTION, "-k", "1", "--max-new-tokens", "8"])
    assert result.exit_code == 0, result.output
    assert "tokens in" in result.output and "Passages" in result.output
    assert "metrics.txt" in result.output
