"""`ragspec bench --sessions` on a tiny packed model (int8 prompt reads, where the prompt cache is
exact): sessions grouped by document, turns asked after one another, every answer compared with
its run without the cache (and a different model caught as different), and the prompt of a turn
after another reusing the previous one's pages only when its passages keep their places."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import MODEL_CACHE
from test_native_step import _model
from test_packed import packed_copy

from ragspec.bench import sessions
from ragspec.bench.questions import Question, load_questions
from ragspec.decoding import native, native_step
from ragspec.decoding.engine import Generator
from ragspec.decoding.packed import PAGES_ENV, PREFILL_ENV, prefill_precision, reads_in_pages
from ragspec.decoding.types import GenerationConfig
from ragspec.pipeline import PipelineConfig
from ragspec.retrieval.faiss.store import Hit, Passage, SearchResult
from ragspec.retrieval.trim import DEFAULT_TRIM

BIG = 64 << 20
CONFIG = GenerationConfig(max_new_tokens=8)
PIPE = PipelineConfig(k=3, max_new_tokens=8, system_prompt="Answer.", question_suffix="")
TEXTS = {
    "p1": "metrics listen on port 7432 only.",
    "p2": "logs are kept for 14 days, then go.",
    "p3": "a log over max_log_size is cut.",
    "p4": "the api listens on port 7431 too.",
}
PASSAGES = {k: Passage(id=k, doc_id=k, source=f"{k}.txt", page=None, start=0, text=t)
            for k, t in TEXTS.items()}
# question -> its passages in rank order: turn 1 shows p4 p2 p1 (best last); turn 2 retrieves
# p4 and p1 again and a new best, p3: kept places show p4 p1 p3, the rank order p1 p4 p3
RANKS = {"Which port has metrics?": ["p1", "p2", "p4"], "How long are logs kept?": ["p3", "p4", "p1"]}
SESSION = sessions.Session("ops.txt", (Question("t1", "Which port has metrics?"),
                                       Question("t2", "How long are logs kept?",
                                                answers=("kept for 14 days",))))


class Store:
    """Hits by question (RANKS), scores falling with rank."""

    def passage_count(self):
        return len(PASSAGES)

    def retrieve(self, query, k=4, mode="dense"):
        hits = [Hit(score=0.9 - i / 10, passage=PASSAGES[n]) for i, n in enumerate(RANKS[query])]
        return SearchResult(hits=hits[:k], best_score=hits[0].score, mode=mode)


@pytest.fixture(scope="module")
def packed(one_thread, tiny_tokenizer, tmp_path_factory):
    native.ops(MODEL_CACHE)
    model = packed_copy(_model("llama", len(tiny_tokenizer)), "int8", tmp_path_factory.mktemp("m"))
    assert native_step.install(model) is None
    return model


@pytest.fixture(autouse=True)
def int8_reads(monkeypatch):
    """Prompt reads in int8, where the prompt cache is exact on every machine."""
    monkeypatch.setenv(PREFILL_ENV, "int8")
    monkeypatch.delenv(PAGES_ENV, raising=False)
    prefill_precision.cache_clear()
    reads_in_pages.cache_clear()
    yield
    prefill_precision.cache_clear()
    reads_in_pages.cache_clear()


def _run(model, tokenizer, order, cold=None):
    warm = Generator(model, tokenizer, eos_token_ids=[2], prompt_cache_bytes=BIG)
    return sessions.run_sessions(Store(), warm, [SESSION], CONFIG, pipeline_config=PIPE,
                                 order=order, cold=cold)


def test_every_answer_is_compared_with_its_run_without_the_cache(packed, tiny_tokenizer):
    ran = _run(packed, tiny_tokenizer, "keep")
    turns = ran[0]["turns"]
    assert [t["id"] for t in turns] == ["t1", "t2"] and [t["turn"] for t in turns] == [1, 2]
    for t in turns:
        assert t["identical"] is True
        assert t["off"]["cached_prompt_tokens"] == 0
        assert t["off"]["prompt_cache_off"].startswith("turned off")
        assert t["on"]["prompt_cache_off"] == ""
        assert t["on"]["text"] == t["off"]["text"]
        assert t["on"]["prompt_tokens"] + CONFIG.max_new_tokens <= packed.config.max_position_embeddings
    summary = sessions.summarize(ran)
    assert summary["all_identical"] and summary["not_identical"] == []
    assert summary["first"]["turns"] == 1 and summary["later"]["turns"] == 1
    assert summary["later"]["on"]["mean_recall"] == turns[1]["on"]["recall"]


def test_a_different_answer_without_the_cache_is_caught(packed, tiny_tokenizer, tmp_path):
    other = packed_copy(_model("llama", len(tiny_tokenizer), seed=1), "int8", tmp_path)
    assert native_step.install(other) is None
    cold = Generator(other, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=0)
    ran = _run(packed, tiny_tokenizer, "keep", cold=cold)
    summary = sessions.summarize(ran)
    assert not summary["all_identical"]
    assert summary["not_identical"] == [t["id"] for t in ran[0]["turns"] if not t["identical"]]
    assert summary["not_identical"]


def test_kept_places_let_the_next_turn_reuse_the_previous_prompt(packed, tiny_tokenizer):
    keep = _run(packed, tiny_tokenizer, "keep")[0]["turns"][1]
    rank = _run(packed, tiny_tokenizer, "rank")[0]["turns"][1]
    assert keep["on"]["passages"] == ["p4", "p1", "p3"]  # p4 keeps its place, the first
    assert rank["on"]["passages"] == ["p1", "p4", "p3"]  # rank order, best last
    assert keep["on"]["shared_prefix_tokens"] > rank["on"]["shared_prefix_tokens"] + len(TEXTS["p4"])
    cached = keep["on"]["cached_prompt_tokens"]
    assert 0 < cached <= keep["on"]["shared_prefix_tokens"]
    assert cached > rank["on"]["cached_prompt_tokens"]
    assert keep["on"]["cached_share"] == cached / keep["on"]["prompt_tokens"]
    assert keep["identical"] and rank["identical"]


def test_sessions_group_questions_by_document_in_file_order(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join([
        '{"id": "a1", "question": "q a1", "source": "a.txt"}',
        '{"id": "b1", "question": "q b1", "source": "b.txt"}',
        '{"id": "x", "question": "q x", "source": null, "unanswerable": true}',
        '{"id": "a2", "question": "q a2", "source": "a.txt"}',
        '{"id": "n", "question": "q n"}',
    ]), encoding="utf-8")
    groups = sessions.group_sessions(load_questions(path))
    assert [(g.source, [q.id for q in g.questions]) for g in groups] == [
        ("a.txt", ["a1", "a2"]), ("b.txt", ["b1"])]
    assert [g.source for g in sessions.group_sessions(load_questions(path), limit=1)] == ["a.txt"]


def test_sessions_need_greedy_decoding_and_a_known_order(packed, tiny_tokenizer):
    from dataclasses import replace

    from ragspec.decoding.types import SamplingConfig

    warm = Generator(packed, tiny_tokenizer, eos_token_ids=[2])
    with pytest.raises(ValueError, match="greedy"):
        sessions.run_sessions(Store(), warm, [SESSION],
                              replace(CONFIG, sampling=SamplingConfig(temperature=0.7)))
    with pytest.raises(ValueError, match="order"):
        sessions.run_sessions(Store(), warm, [SESSION], CONFIG, order="best")


def test_cli_sessions_writes_one_results_file_and_appends_a_later_run(
        packed, tiny_tokenizer, tmp_path, monkeypatch):
    import json
    from types import SimpleNamespace

    import torch
    from click.testing import CliRunner

    from ragspec import loading
    from ragspec.bench import prepare
    from ragspec.cli import main

    loaded = SimpleNamespace(name="tiny", dtype=torch.float32, device=torch.device("cpu"),
                             weights="int8", weights_note="")
    monkeypatch.setattr(loading, "load_generator", lambda *a, **k: (
        loaded, Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=BIG)))
    monkeypatch.setattr(loading, "open_store", lambda *a, **k: Store())
    monkeypatch.setattr(prepare, "ingest_corpus", lambda store, corpus: [])
    # the tiny model's context (256 characters) holds PIPE's short prompts, not the default's
    # (the trim `bench --trim` sets reaches the run: recorded, then put on PIPE)
    trims, run_sessions = [], sessions.run_sessions

    def with_pipe(*args, pipeline_config, **kwargs):
        trims.append(pipeline_config.trim)
        return run_sessions(*args, pipeline_config=replace(PIPE, trim=pipeline_config.trim),
                            **kwargs)

    monkeypatch.setattr(sessions, "run_sessions", with_pipe)
    questions = tmp_path / "q.jsonl"
    questions.write_text("\n".join(
        json.dumps({"id": q.id, "question": q.question, "source": "ops.txt"})
        for q in SESSION.questions), encoding="utf-8")
    out = tmp_path / "sessions.json"
    args = ["bench", "--sessions", "--corpus", str(tmp_path), "--questions", str(questions),
            "--max-new-tokens", "8", "--out", str(out)]
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path / "home"))
    from ragspec.bench import provenance
    monkeypatch.setattr(provenance, "started_with", lambda: {  # as if the command began so
        "GOMP_SPINCOUNT": "12345", "RAGSPEC_MILVUS_TOKEN": "secret", "PATH": "/usr/bin"})
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "every answer identical to its run without the cache" in first.output
    again = CliRunner().invoke(main, [*args, "--json", "--trim", "0"])
    assert again.exit_code == 0, again.output
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert set(saved) == {"command", "commit", "machine", "runs"} and len(saved["runs"]) == 2
    run = saved["runs"][-1]
    assert run["prompt_read"] == "int8" and run["order"] == "rank"
    # the settings that change speed are recorded, secrets are not
    assert run["environment"] == {"GOMP_SPINCOUNT": "12345"}
    assert trims == [DEFAULT_TRIM, 0] and [r["trim"] for r in saved["runs"]] == [DEFAULT_TRIM, 0]
    assert run["summary"]["all_identical"] and run["summary"]["turns"] == 2
    assert [t["id"] for t in run["sessions"][0]["turns"]] == ["t1", "t2"]
    # --llama-server: the same prompt ids through llama-server, cache off then on
    opened = []
    monkeypatch.setattr(prepare, "open_servers",
                        lambda *a, **k: opened.append(FakeServers()) or opened[-1])
    third = CliRunner().invoke(main, [*args, "--llama-server"])
    assert third.exit_code == 0, third.output
    assert "0 of 2 answers changed with its prompt cache on" in third.output
    assert len(opened[0].prompts) == 4 and opened[0].closed
    run = json.loads(out.read_text(encoding="utf-8"))["runs"][-1]
    assert run["llama_server"]["summary"]["turns"] == 2
    assert all("prompt_ids" not in t for t in run["sessions"][0]["turns"])


class FakeServers:
    """llama-server's side of a sessions run: answers each prompt with its last three tokens;
    with the cache on it reports the prefix the slot's previous prompt shares as `cache_n`, and
    (changed, to be caught) writes another answer for `changes`' prompts."""

    build = {"name": "llama.cpp (fake)"}

    def __init__(self, changes=()):
        self.closed = False
        self.slot: list[int] = []
        self.prompts: list[tuple[list[int], bool]] = []
        self.changes = [list(p) for p in changes]

    def generate(self, method, prompt, max_new_tokens, eos_ids, stop=None, cache_prompt=False):
        from ragspec.bench.anchors.llama_server import ServerRun

        prompt = list(prompt)
        self.prompts.append((prompt, cache_prompt))
        reused = sessions.common_prefix(self.slot, prompt) if cache_prompt else 0
        self.slot = prompt
        tokens = prompt[-3:] if not (cache_prompt and prompt in self.changes) else [5, 5, 5]
        return ServerRun(tokens, 0.2, 0.1, 0.2, {"cache_n": reused, "prompt_n": len(prompt) - reused})

    def close(self):
        self.closed = True


def test_llama_server_reads_the_same_prompts_with_its_cache_on_then_off(packed, tiny_tokenizer):
    warm = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=BIG)
    ran = sessions.run_sessions(Store(), warm, [SESSION, SESSION], CONFIG, pipeline_config=PIPE,
                                keep_prompts=True)
    prompts = [t["prompt_ids"] for s in ran for t in s["turns"]]
    servers = FakeServers(changes=[prompts[1]])
    sessions.run_llama_sessions(servers, ran, 8, {2}, lambda: (lambda token: False))
    # every prompt ragspec read, cache on for all, in session order, then off for all
    assert servers.prompts == [(p, True) for p in prompts] + [(p, False) for p in prompts]
    turns = [t for s in ran for t in s["turns"]]
    assert all("prompt_ids" not in t for t in turns)
    assert [t["llama_server"]["identical"] for t in turns] == [True, False, True, False]
    # the second session's first turn follows the first session's last on the one slot
    assert turns[2]["llama_server"]["on"]["cached_prompt_tokens"] == sessions.common_prefix(
        prompts[1], prompts[2]) > 0
    assert turns[0]["llama_server"]["off"]["cached_prompt_tokens"] == 0
    summary = sessions.summarize_llama(ran)
    assert summary["changed_with_cache"] == ["t2", "t2"]
    assert summary["later"]["on"]["ttft_seconds"] == 0.1
    assert summary["later"]["ragspec_over_llama_seconds"] == pytest.approx(
        sessions._median([t["on"]["seconds"] for t in turns if t["turn"] > 1]) / 0.2)
    assert sessions.summarize_llama(sessions.run_sessions(
        Store(), warm, [SESSION], CONFIG, pipeline_config=PIPE)) is None
