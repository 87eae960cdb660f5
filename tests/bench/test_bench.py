"""`ragspec bench` on the tiny model: the results schema, the speedup arithmetic, greedy identity,
the per-kind summary, and the questions file's errors. No real model, index or pipeline: the
command's setup is replaced by prepared prompts over the tiny model."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from ragspec.bench import runner as core
from ragspec.bench import summary as summary
from ragspec.cli import main
from ragspec.commands import bench as bench_cmd
from ragspec.retrieval.trim import DEFAULT_TRIM

RESULT_FIELDS = {"new_tokens", "seconds", "ttft_seconds", "tokens_per_s", "decode_tokens_per_s",
                 "forward_passes", "drafted_tokens", "accepted_tokens", "identical_to_greedy",
                 "stop_reason", "decode_seconds"}
SUMMARY_FIELDS = {"median_speedup", "min_speedup", "median_decode_speedup", "median_tokens_per_s",
                  "median_ttft_seconds", "accept_rate", "mean_accepted_length", "all_identical",
                  "median_speedup_non_looping", "min_speedup_non_looping",
                  "median_decode_ms_per_token"}
MAX_NEW = 16

PROMPTS = [
    ("c1", "copy", "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over "),
    ("c2", "copy", "port 7431 serves the api. port 7431 serves the api. port 7431 serves "),
    ("o1", "open", "Write a poem about the sea:"),
]


pytestmark = pytest.mark.usefixtures("one_thread")  # one_thread, tiny_gen: tests/conftest.py


@pytest.fixture(scope="module")
def prepared(tiny_tokenizer):
    return [core.Prepared(core.Question(qid, text, kind), tiny_tokenizer(text)["input_ids"])
            for qid, kind, text in PROMPTS]


@pytest.fixture(scope="module")
def results(tiny_gen, prepared):
    seen = []
    entries = core.run_bench(core.Runner(tiny_gen), prepared, MAX_NEW,
                             progress=lambda q, m: seen.append((q.id, m)))
    assert len(seen) == len(prepared) * len(core.METHODS)  # one progress tick per run
    return summary.build_results("tiny", "cpu", MAX_NEW, entries)


def test_results_json_has_the_issue_schema(results):
    json.loads(json.dumps(results))  # serialisable as is
    assert set(results) == {"model", "device", "max_new_tokens", "repeats", "methods", "questions",
                            "summary", "ratios", "looping"}
    assert results["methods"] == ["greedy", "ragspec", "hf_greedy", "hf_pld", "oracle"]
    assert [q["id"] for q in results["questions"]] == ["c1", "c2", "o1"]
    for q in results["questions"]:
        assert {"id", "kind", "prompt_tokens", "looping", "results"} <= set(q)
        assert q["prompt_tokens"] > 0
        assert set(q["results"]) == set(core.METHODS)
        for method, r in q["results"].items():
            assert RESULT_FIELDS <= set(r), method
            assert 1 <= r["new_tokens"] <= MAX_NEW
            assert 0 < r["ttft_seconds"] <= r["seconds"]
            # the first token and the decode phase after it, apart
            assert r["decode_seconds"] == pytest.approx(r["seconds"] - r["ttft_seconds"])
            assert r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["seconds"])
        # what a transformers method cannot report is null, not a made-up number
        assert q["results"]["hf_greedy"]["forward_passes"] is None
        assert q["results"]["hf_pld"]["forward_passes"] is None
        assert q["results"]["hf_pld"]["drafted_tokens"] is None
        assert q["results"]["greedy"]["drafted_tokens"] == 0
        assert q["results"]["greedy"]["forward_passes"] == q["results"]["greedy"]["new_tokens"] - 1
    assert set(results["summary"]) == {"copy", "open", "all"}
    for kind in results["summary"].values():
        assert set(kind) == set(core.METHODS)
        for stats in kind.values():
            assert set(stats) == SUMMARY_FIELDS


def test_greedy_methods_are_identical_to_greedy(results):
    for q in results["questions"]:
        for method in ("greedy", "ragspec", "hf_greedy", "oracle"):
            assert q["results"][method]["identical_to_greedy"], (q["id"], method)
    for method in ("greedy", "ragspec", "hf_greedy"):
        assert results["summary"]["all"][method]["all_identical"] is True


def test_oracle_accepts_every_draft_of_the_true_continuation(results):
    for q in results["questions"]:
        oracle = q["results"]["oracle"]
        assert oracle["accepted_tokens"] == oracle["drafted_tokens"] > 0
        assert oracle["forward_passes"] < q["results"]["greedy"]["forward_passes"]


def test_repeats_keep_each_methods_fastest_run_and_reset_the_policy(tiny_gen, prepared):
    runner = core.Runner(tiny_gen)
    ragspec_runs, policy_states = [], []
    run = runner.run

    def spy(method, *args, **kwargs):
        if method == "ragspec":
            policy_states.append(copy.deepcopy(
                {key: p.acceptance for key, p in tiny_gen._policies.items()}))
        result = run(method, *args, **kwargs)
        if method == "ragspec":
            ragspec_runs.append((result.forward_passes, result.drafted_tokens))
        return result

    runner.run = spy
    ticks = []
    entry = core.bench_question(runner, 0, prepared[1], MAX_NEW,
                                progress=lambda q, m: ticks.append(m), repeats=3)
    assert len(ticks) == 3 * len(core.METHODS)
    assert ticks[: len(core.METHODS)] != ticks[len(core.METHODS) : 2 * len(core.METHODS)]
    for method, r in entry["results"].items():
        assert len(r["runs_seconds"]) == 3, method
        assert r["seconds"] == min(r["runs_seconds"])
        assert r["identical_to_greedy"], method
    # each round starts from the policy state before the question: the same drafting each time
    assert len(ragspec_runs) == 3 and len(set(ragspec_runs)) == 1
    assert ragspec_runs[0][1] > 0  # it drafted, so a run without the reset would learn
    assert policy_states[0] == policy_states[1] == policy_states[2]
    with pytest.raises(ValueError, match="repeats"):
        core.run_bench(runner, prepared, MAX_NEW, repeats=0)


def _entry(qid, kind, looping=False, **tps):
    """A question entry whose methods have the given tokens_per_s (decode rate twice that)."""
    results = {}
    for method in core.METHODS:
        rate = tps.get(method, 10.0)
        drafted = {"ragspec": 8, "oracle": 8}.get(method, 0)
        results[method] = {
            "new_tokens": 100, "seconds": 100 / rate, "ttft_seconds": 0.5,
            "tokens_per_s": rate, "decode_tokens_per_s": 2 * rate, "forward_passes": None,
            "drafted_tokens": None if method == "hf_pld" else drafted,
            "accepted_tokens": {"ragspec": 6, "oracle": 8}.get(method, 0),
            "identical_to_greedy": True,
            "accepted_lengths": {"ragspec": {"2": 1, "4": 1}, "oracle": {"8": 1}}.get(method, {}),
        }
    return {"id": qid, "kind": kind, "prompt_tokens": 50, "looping": looping, "results": results}


def test_speed_is_also_given_without_looping_answers_and_says_how_many_were_left_out():
    entries = [
        _entry("a", "copy", greedy=10, ragspec=40, llamacpp=10, looping=True),
        _entry("b", "copy", greedy=10, ragspec=20, llamacpp=10),
        _entry("c", "copy", greedy=10, ragspec=16, llamacpp=10),
        _entry("d", "open", greedy=10, ragspec=30, llamacpp=10, looping=True),
    ]
    for e in entries:
        e["results"]["llamacpp"] = dict(e["results"]["greedy"], tokens_per_s=10.0)
    results = summary.build_results("m", "cpu", 100, entries)
    copy_ = results["summary"]["copy"]["ragspec"]
    assert copy_["median_speedup"] == pytest.approx(2.0)
    assert copy_["median_speedup_non_looping"] == pytest.approx(1.8)
    assert copy_["min_speedup_non_looping"] == pytest.approx(1.6)
    assert results["summary"]["open"]["ragspec"]["median_speedup_non_looping"] is None
    assert results["looping"]["copy"] == {"questions": 3, "looping": 1,
                                          "looping_share": pytest.approx(1 / 3)}
    assert results["looping"]["all"]["looping"] == 2
    ratio = results["ratios"]["all"]["ragspec/llamacpp"]
    assert ratio["median"] == pytest.approx(2.5) and ratio["median_non_looping"] == \
        pytest.approx(1.8)
    table = summary.format_table(results)
    assert "| copy (n=3, 1 looping) | ragspec | 1.80× (1.60×) | 2.00× (1.60×) |" in table
    assert "all: 2 of 4 answers looped (50%)" in table
    assert "ragspec/llamacpp tokens/s median 1.80× non-looping" in table


def test_every_method_ends_at_the_stop_rule_and_entries_say_which_looped(tiny_gen, prepared):
    """With a stop rule the tiny model hits, greedy, ragspec, oracle and transformers' methods
    all stop at the same token (identical), and the entry is marked looping."""
    from ragspec.decoding.types import RepeatConfig

    runner = core.Runner(tiny_gen, repeat=RepeatConfig(stop_ngram=2, stop_count=2))
    entries = core.run_bench(runner, prepared, 40)
    free = core.run_bench(core.Runner(tiny_gen, repeat=RepeatConfig()), prepared, 40)
    stopped = 0
    for entry, loose in zip(entries, free, strict=True):
        results = entry["results"]
        for method in ("greedy", "ragspec", "hf_greedy", "hf_pld", "oracle"):
            assert results[method]["identical_to_greedy"], (entry["id"], method)
        if results["greedy"]["stop_reason"] == "repetition":
            stopped += 1
            assert entry["looping"]
            assert results["greedy"]["new_tokens"] < loose["results"]["greedy"]["new_tokens"]
            assert results["hf_pld"]["new_tokens"] == results["greedy"]["new_tokens"]
    assert stopped, "the tiny model should repeat a 2-token run on these prompts"


def test_speedups_are_against_each_methods_own_baseline():
    entries = [
        _entry("a", "copy", greedy=10, ragspec=25, hf_greedy=8, hf_pld=10, oracle=30),
        _entry("b", "copy", greedy=10, ragspec=20, hf_greedy=10, hf_pld=9, oracle=28),
        _entry("c", "open", greedy=10, ragspec=9.8, hf_greedy=10, hf_pld=12, oracle=15),
    ]
    assert summary.entry_speedup(entries[0], "ragspec") == pytest.approx(2.5)
    assert summary.entry_speedup(entries[0], "hf_pld") == pytest.approx(1.25)  # over hf_greedy, not greedy
    assert summary.entry_speedup(entries[0], "hf_greedy") == pytest.approx(0.8)
    assert summary.entry_speedup(entries[0], "hf_pld", "decode_tokens_per_s") == pytest.approx(1.25)
    s = summary.summarize(entries)
    assert s["copy"]["ragspec"]["median_speedup"] == pytest.approx(2.25)
    assert s["copy"]["ragspec"]["min_speedup"] == pytest.approx(2.0)
    assert s["copy"]["hf_pld"]["median_speedup"] == pytest.approx((1.25 + 0.9) / 2)
    assert s["open"]["ragspec"]["median_speedup"] == pytest.approx(0.98)
    assert s["all"]["ragspec"]["min_speedup"] == pytest.approx(0.98)
    assert s["all"]["greedy"]["median_speedup"] == pytest.approx(1.0)
    assert s["copy"]["ragspec"]["median_tokens_per_s"] == pytest.approx(22.5)
    # pooled over questions: 18 of 24 drafted tokens; steps of 2, 4 (three times each)
    assert s["all"]["ragspec"]["accept_rate"] == pytest.approx(0.75)
    assert s["all"]["ragspec"]["mean_accepted_length"] == pytest.approx(3.0)
    assert s["all"]["oracle"]["accept_rate"] == pytest.approx(1.0)
    # no drafts, or drafts a method does not report: null, not 0
    assert s["all"]["greedy"]["accept_rate"] is None
    assert s["all"]["hf_pld"]["accept_rate"] is None

    results = summary.build_results("m", "cpu", 100, entries)
    table = summary.format_table(results)
    assert "copy (n=2, 0 looping)" in table and "open (n=1, 0 looping)" in table
    assert "2.25×" in table


def test_summary_kind_without_questions_is_null():
    s = summary.summarize([_entry("a", "copy", ragspec=20)])
    assert s["open"]["ragspec"] == dict.fromkeys(SUMMARY_FIELDS)
    assert s["all"]["ragspec"]["median_speedup"] == pytest.approx(2.0)
    assert "open (n=" not in summary.format_table(summary.build_results("m", "cpu", 100, [
        _entry("a", "copy", ragspec=20)]))


def test_method_order_runs_greedy_first_and_rotates_the_rest():
    orders = [core.method_order(i) for i in range(4)]
    for order in orders:
        assert order[0] == "greedy" and sorted(order) == sorted(core.METHODS)
    assert len({tuple(o) for o in orders}) == 4


def test_questions_file_missing_kind_means_copy(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a", "question": "Why?"}\n\n{"question": "How?", "kind": "open"}\n'
                    '{"id": "n", "question": "Who?", "kind": "open", "unanswerable": true}\n')
    qs = core.load_questions(path)
    assert [(q.id, q.kind) for q in qs] == [("a", "copy"), ("3", "open")]  # no "n": nothing to copy
    assert len(core.load_questions(path, limit=1)) == 1


@pytest.mark.parametrize("content, message", [
    ('{"id": "a", "question": "Why?"}\n{"id": "b", "question": \n', "line 2: not valid JSON"),
    ('{"id": "a", "question": "Why?", "kind": "poem"}\n', 'must be "copy" or "open"'),
    ('{"id": "a"}\n', '"question" must be a non-empty string'),
    ('["a list"]\n', "expected an object"),
    ('{"id": "a", "question": "x"}\n{"id": "a", "question": "y"}\n', "duplicate id 'a'"),
    ("\n\n", "holds no questions"),
])
def test_bad_questions_file_gives_a_clear_error(tmp_path, content, message):
    path = tmp_path / "q.jsonl"
    path.write_text(content)
    with pytest.raises(core.BenchInputError, match=message.replace("(", r"\(")):
        core.load_questions(path)


@pytest.fixture
def cli_env(tmp_path, monkeypatch, tiny_gen, prepared):
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path / "home"))
    calls = {}

    def fake_setup(model, corpus, index, questions, max_new_tokens, llamacpp=None,
                   weights="auto", methods=None, llama_server=None, trim=None):
        calls.update(model=model, corpus=corpus, index=index, max_new_tokens=max_new_tokens,
                     ids=[q.id for q in questions], llamacpp=llamacpp, weights=weights,
                     llama_server=llama_server, trim=trim)
        return core.Setup("tiny", "cpu", tiny_gen, prepared[: len(questions)])

    monkeypatch.setattr(bench_cmd, "build_setup", fake_setup)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": qid, "question": t, "kind": k}) + "\n"
                                 for qid, k, t in PROMPTS))
    return tmp_path, corpus, questions, calls


def test_cli_writes_results_and_plot(cli_env):
    tmp_path, corpus, questions, calls = cli_env
    out, png = tmp_path / "results.json", tmp_path / "results.png"
    result = CliRunner().invoke(main, [
        "bench", "--corpus", str(corpus), "--questions", str(questions), "--max-new-tokens", "8",
        "--limit", "2", "--out", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert calls["max_new_tokens"] == 8 and calls["ids"] == ["c1", "c2"]
    assert calls["trim"] == DEFAULT_TRIM  # prompts as `ragspec ask` builds them
    data = json.loads(out.read_text())
    assert data["max_new_tokens"] == 8 and len(data["questions"]) == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| copy (n=2, " in result.output and " looping) | ragspec |" in result.output
    assert "MISSED" not in result.output and "target" not in result.output


def test_cli_json_prints_the_results_object(cli_env):
    _, corpus, questions, calls = cli_env
    result = CliRunner().invoke(main, ["bench", "--corpus", str(corpus), "--questions",
                                       str(questions), "--max-new-tokens", "4", "--json",
                                       "--trim", "0"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data["summary"]) == {"copy", "open", "all"}
    assert calls["trim"] == 0  # whole passages, as runs before trimming


def test_cli_bad_questions_file_exits_1_and_says_where(cli_env):
    tmp_path, corpus, _, _ = cli_env
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "ok"}\nnot json\n')
    result = CliRunner().invoke(main, ["bench", "--corpus", str(corpus), "--questions", str(bad)])
    assert result.exit_code == 1
    assert "line 2: not valid JSON" in result.output
    assert "Traceback" not in result.output


def test_cli_methods_runs_those_and_their_baselines(cli_env):
    _, corpus, questions, calls = cli_env
    result = CliRunner().invoke(main, ["bench", "--corpus", str(corpus), "--questions",
                                       str(questions), "--max-new-tokens", "4", "--limit", "1",
                                       "--methods", "ragspec, hf_pld", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["methods"] == ["greedy", "ragspec", "hf_greedy", "hf_pld"]
    assert calls["llamacpp"] is False  # no llama.cpp method chosen: llama.cpp is not loaded
    runs = data["questions"][0]["results"]
    assert runs["ragspec"]["identical_to_greedy"] is True  # greedy ran: compared
    assert runs["hf_greedy"]["new_tokens"] == 4
    alone = CliRunner().invoke(main, ["bench", "--corpus", str(corpus), "--questions",
                                      str(questions), "--max-new-tokens", "4", "--limit", "1",
                                      "--methods", "ragspec", "--json"])
    data = json.loads(alone.stdout)
    assert data["methods"] == ["greedy", "ragspec"]
    assert data["questions"][0]["results"]["greedy"]["identical_to_greedy"] is None  # no hf_greedy
    assert data["summary"]["all"]["greedy"]["all_identical"] is None


@pytest.mark.parametrize("args", [
    ["--methods", "ragspec,fastest"],
    ["--max-new-tokens", "0"],
    ["--limit", "0"],
    ["--questions", "does-not-exist.jsonl"],
])
def test_cli_bad_usage_exits_2(cli_env, args):
    _, corpus, questions, _ = cli_env
    base = {"--corpus": str(corpus), "--questions": str(questions)}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    result = CliRunner().invoke(main, ["bench", *[x for kv in base.items() for x in kv]])
    assert result.exit_code == 2, result.output


def test_cli_failed_inputs_are_named_and_exit_1(cli_env, monkeypatch, tiny_gen, prepared):
    tmp_path, corpus, questions, _ = cli_env
    monkeypatch.setattr(bench_cmd, "build_setup", lambda *a: core.Setup(
        "tiny", "cpu", tiny_gen, prepared[:1], ["corpus file broken.pdf: not a PDF"]))
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["bench", "--corpus", str(corpus), "--questions",
                                       str(questions), "--max-new-tokens", "4",
                                       "--out", str(out)])
    assert result.exit_code == 1
    assert "broken.pdf: not a PDF" in result.output
    assert len(json.loads(out.read_text())["questions"]) == 1  # the rest was still measured


def test_transformers_baselines_run_with_stock_attention(tiny_gen, prepared, monkeypatch):
    """hf_greedy/hf_pld run transformers' own sdpa attention on the same weights; the engine's
    attention is back afterwards."""
    from ragspec.decoding.attention import NAME

    model = tiny_gen.model
    assert model.config._attn_implementation == NAME
    seen = []
    generate = model.generate

    def spy(*args, **kwargs):
        seen.append(model.config._attn_implementation)
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spy)
    runner = core.Runner(tiny_gen)
    for method in ("hf_greedy", "hf_pld"):
        runner.run(method, prepared[0].prompt_ids, 4)
    assert seen == ["sdpa", "sdpa"]
    assert model.config._attn_implementation == NAME
    assert all(layer.self_attn.config._attn_implementation == NAME
               for layer in model.model.layers)


class FakeLlama:
    """Stands in for llama_cpp.Llama: writes the prompt's tokens again, one by one, and records
    whether each run started from an empty cache."""

    instances: list = []

    def __init__(self, model_path, draft_model=None, **kwargs):
        self.model_path, self.draft_model, self.kwargs = model_path, draft_model, kwargs
        self.n_tokens = 0
        self.fresh_starts = []
        FakeLlama.instances.append(self)

    def reset(self):
        self.n_tokens = 0

    def generate(self, tokens, **sampling):
        assert sampling["temp"] == 0.0 and sampling["top_k"] == 1  # greedy
        self.fresh_starts.append(self.n_tokens == 0)
        self.n_tokens = len(tokens)
        for token in tokens:
            self.n_tokens += 1
            yield token


def test_llamacpp_anchors_run_beside_the_others(tiny_gen, prepared, monkeypatch, tmp_path):
    import sys
    import types

    from ragspec.bench.anchors import llamacpp as bench_llamacpp

    fake = types.ModuleType("llama_cpp")
    fake.Llama = FakeLlama
    fake.llama_print_system_info = lambda: b"CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | "
    speculative = types.ModuleType("llama_cpp.llama_speculative")
    speculative.LlamaPromptLookupDecoding = lambda num_pred_tokens: ("pld", num_pred_tokens)
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", speculative)
    monkeypatch.setattr(bench_llamacpp, "available", lambda: True)
    FakeLlama.instances = []
    anchors = bench_llamacpp.LlamaCppAnchors.open(tmp_path / "m.gguf", n_ctx=256)
    runner = core.Runner(tiny_gen, anchors=anchors)
    assert runner.methods[-2:] == ("llamacpp", "llamacpp_pld")
    entries = core.run_bench(runner, prepared[:2], 6, repeats=2)
    results = summary.build_results("tiny", "cpu", 6, entries, repeats=2,
                                    llamacpp_build=anchors.compiled_for)
    assert results["methods"][-2:] == ["llamacpp", "llamacpp_pld"]
    assert results["llamacpp_build"] == ["SSE3", "AVX", "AVX2"]  # what the results record
    for entry in entries:
        run = entry["results"]["llamacpp"]
        assert run["new_tokens"] == 6 and 0 < run["ttft_seconds"] <= run["seconds"]
        assert entry["results"]["llamacpp_pld"]["identical_to_greedy"]  # vs llamacpp
    plain, pld = FakeLlama.instances
    assert pld.draft_model == ("pld", bench_llamacpp.PLD_TOKENS) and plain.draft_model is None
    assert all(plain.fresh_starts) and all(pld.fresh_starts)  # no prefix reuse between runs
    assert len(plain.fresh_starts) == 1 + 2 * 2  # warm-up, then 2 questions x 2 repeats
    ratio = results["ratios"]["all"]["ragspec/llamacpp"]
    assert ratio["median"] > 0 and ratio["min"] <= ratio["median"]
    assert "ragspec/llamacpp tokens/s median" in summary.format_table(results)
