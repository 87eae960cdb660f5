"""`ragspec ask` and `ragspec ui` through click's CliRunner with a temporary data directory (the
converted bundled model is shared through RAGSPEC_MODEL_CACHE, so it is converted at most once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.commands.ask import ask
from app.commands.ui import UI_SCRIPT, streamlit_argv, streamlit_env, ui
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
    from retrieval.embeddings import Embedder
    from retrieval.ingest import ingest_paths
    from retrieval.store import PassageStore

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


def test_ui_command_serves_the_app_headless(tmp_path):
    argv = streamlit_argv(8600, "127.0.0.1")
    assert argv[1:4] == ["-m", "streamlit", "run"] and argv[4] == str(UI_SCRIPT)
    assert Path(argv[4]).is_file()
    assert argv[argv.index("--server.port") + 1] == "8600"
    assert argv[argv.index("--server.headless") + 1] == "true"
    env = streamlit_env(str(tmp_path), "some/model")
    assert env["RAGSPEC_UI_INDEX"] == str(tmp_path) and env["RAGSPEC_UI_MODEL"] == "some/model"
    assert str(UI_SCRIPT.parent.parent) in env["PYTHONPATH"]
    result = CliRunner().invoke(ui, ["--help"])
    assert result.exit_code == 0 and "--port" in result.output and "--host" in result.output
