"""`ragspec ask` and `ragspec ui` through click's CliRunner with a temporary data directory (the
converted bundled model is shared through RAGSPEC_MODEL_CACHE, so it is converted at most once)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ragspec.commands.ask import ask
from ragspec.describe import CACHED_NOTE
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
    # the second run's prompt came from the prompt cache (exact on every native read), so the
    # speed-up is the time after the first token's, and says so
    assert out["answer"]["stats"]["cached_prompt_tokens"] > 0
    assert out["speedup_note"] == CACHED_NOTE and out["speedup"] > 0
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


@pytest.mark.slow
def test_ask_json_reads_from_the_top_answer_first_token_ids_last(indexed):
    """`ragspec ask --json | head` shows the answer: indented JSON whose first lines hold the
    answer's text, with the token ids (the prompt's: hundreds) at the end."""
    result = CliRunner().invoke(ask, [QUESTION, "--json", "-k", "1", "--max-new-tokens", "12"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    head = "\n".join(result.stdout.splitlines()[:10])
    assert f'"text": {json.dumps(out["answer"]["text"], ensure_ascii=False)}' in head, head
    assert '"prompt_token_ids"' not in head  # not one long line: the head is not the whole
    assert list(out)[0] == "answer"
    assert list(out["answer"])[0] == "text" and list(out["answer"])[-1] == "prompt_token_ids"
    lines = result.stdout.splitlines()
    ids_line = next(i for i, line in enumerate(lines) if '"prompt_token_ids"' in line)
    assert ids_line > next(i for i, line in enumerate(lines) if '"spans"' in line)


def test_readable_json_is_the_same_value_one_key_a_line_lists_of_numbers_kept_whole():
    from ragspec.commands.common import readable_json

    value = {"answer": {"text": "Port 7431.\n", "spans": [{"token_ids": [5, 6], "origin": None}],
                        "token_ids": list(range(900))},
             "passages": [], "boxes": [[1.5, 2.0, 3.0, 4.0]], "empty": {}, "score": None}
    text = readable_json(value)
    assert json.loads(text) == value
    lines = text.splitlines()
    assert lines[:3] == ["{", '  "answer": {', '    "text": "Port 7431.\\n",']
    assert f'    "token_ids": {json.dumps(list(range(900)))}' in lines
