"""ragspec/bench/load_test.py end to end on a small scale: a tiny model folder, two questions, one and
two clients, the fault cases and the `ragspec ask` anchor (the real command in its own
process; the bundled embedder indexes the documents)."""

from __future__ import annotations

import json

import pytest
import serve_support

from ragspec.bench import load_test


def test_the_server_runs_without_a_prompt_cache_unless_asked(tmp_path):
    """Every level after the solo one asks the solo level's questions again: with the server's
    prompt cache on it would reuse their prompts, and the levels' speeds would be the cache's."""
    def argv(*extra):
        args = load_test.build_parser().parse_args(["--index", "i", "--questions", "q", *extra])
        return load_test.Server(tmp_path, 1, args, tmp_path / "log").argv()

    default = argv()
    assert default[default.index("--prompt-cache-mb") + 1] == "0"
    asked = argv("--prompt-cache-mb", "256")
    assert asked[asked.index("--prompt-cache-mb") + 1] == "256"


@pytest.mark.slow
def test_load_test_reports_levels_faults_and_the_ask_anchor(tmp_path, tiny_tokenizer,
                                                            monkeypatch):
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path / "home"))
    model, corpus, questions = serve_support.tiny_server_inputs(tmp_path, tiny_tokenizer)
    out = tmp_path / "report.json"
    status = load_test.main(["--corpus", str(corpus), "--questions", str(questions),
                             "--clients", "1,2", "--max-tokens", "12", "--model", str(model),
                             "--faults", "--malformed", "24", "--anchor", "1",
                             "--max-seconds", "600", "--out", str(out)])
    report = json.loads(out.read_text())
    assert status == 0, report["failures"]
    two = report["levels"]["2"]
    assert two["requests"] == 2 and two["all_complete"] and two["identical_to_solo"]
    assert two["ttft_p95_s"] > 0 and two["aggregate_tokens_per_s"] > 0
    assert report["disconnect"]["ok"] and report["kill_restart"]["ok"]
    assert report["malformed"]["sent"] == 24 and report["malformed"]["bad_count"] == 0
    assert report["anchor"][0]["identical"] is True
