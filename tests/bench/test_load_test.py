"""ragspec/bench/load_test.py end to end on a small scale: a tiny model folder, two questions, one and
two clients, the fault cases and the `ragspec ask` anchor (the real command in its own
process; the bundled embedder indexes the documents)."""

from __future__ import annotations

import json
import os
import time

import pytest
import serve_support

from ragspec.bench import load_test, provenance


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


def test_sessions_keep_the_servers_prompt_cache_and_send_each_turn_its_history(tmp_path,
                                                                               monkeypatch):
    """--sessions: the server keeps its own prompt cache (no --prompt-cache-mb unless given);
    a client takes a whole session and asks its turns in order, each with the turns before it
    (question, the answer it got) as history; results come back in session and turn order."""
    args = load_test.build_parser().parse_args(["--index", "i", "--questions", "q", "--sessions"])
    assert "--prompt-cache-mb" not in load_test.Server(tmp_path, 1, args, tmp_path / "log").argv()
    asked = []

    def fake_ask(client, question, max_tokens, history=None):
        asked.append((question, [m["content"] for m in history or []]))
        time.sleep(0.01)  # let the other client run meanwhile
        return {"question": question, "text": f"answer to {question}", "complete": True,
                "latency_s": 0.01}

    monkeypatch.setattr(load_test, "ask_streamed", fake_ask)
    monkeypatch.setattr(load_test, "client_for", lambda server: None)
    sessions = [["a1", "a2", "a3"], ["b1", "b2"]]
    results, _ = load_test.run_sessions_level(None, sessions, 2, 8, time.monotonic() + 60)
    assert [r["key"] for r in results] == ["0/0", "0/1", "0/2", "1/0", "1/1"]
    assert [r["text"] for r in results] == [f"answer to {q}" for s in sessions for q in s]
    histories = dict(asked)
    assert histories["a1"] == [] and histories["b1"] == []
    assert histories["a3"] == ["a1", "answer to a1", "a2", "answer to a2"]
    assert histories["b2"] == ["b1", "answer to b1"]
    # a session's turns go one after another, never two at once
    order = [q for q, _ in asked]
    assert order.index("a1") < order.index("a2") < order.index("a3")


@pytest.mark.slow
def test_load_test_asks_sessions_on_fresh_servers(tmp_path, tiny_tokenizer, monkeypatch):
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path / "home"))
    model, corpus, _ = serve_support.tiny_server_inputs(tmp_path, tiny_tokenizer)
    questions = tmp_path / "sessions.jsonl"
    rows = [("Which port does the metrics endpoint use?", "daemon.txt"),
            ("And which address does it listen on?", "daemon.txt"),
            ("When do backups run?", "backups.txt")]
    questions.write_text("".join(json.dumps({"question": q, "source": s}) + "\n" for q, s in rows))
    out = tmp_path / "report.json"
    status = load_test.main(["--corpus", str(corpus), "--questions", str(questions), "--sessions",
                             "--clients", "2", "--max-tokens", "12", "--model", str(model),
                             "--max-seconds", "600", "--out", str(out)])
    report = json.loads(out.read_text())
    assert status == 0, report["failures"]
    assert report["sessions"] == 2 and report["questions"] == 3
    assert report["warm_up"] == load_test.WARM_UP  # every question is in a session
    # the servers inherit this process's environment: RAGSPEC_HOME, set above, is in it
    assert report["environment"] == provenance.settings(dict(os.environ))
    assert report["environment"]["RAGSPEC_HOME"] == str(tmp_path / "home")
    for n in ("1", "2"):
        level = report["levels"][n]
        assert level["requests"] == 3 and level["all_complete"]
        cache = level["prompt_cache"]  # each level's own fresh server: a lookup an answer
        assert cache.get("lookups") == 3 - level["refused"] or cache.get("off")
    assert report["levels"]["2"]["identical_to_solo"]
    # nothing is asked twice within a level: only a server that kept the solo level's prompts
    # would answer one from a whole prompt it holds
    assert report["levels"]["2"]["prompt_cache"].get("recalled", 0) == 0
