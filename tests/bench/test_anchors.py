"""The benchmark's native anchors: each build's flags come from the CPU that builds it, llama-server
is driven with token ids and timed on the client's clock (a stand-in server on loopback), its
methods run beside ragspec's in the bench, and — where `make bench-anchors` has built them — the
real llama-server, llama-bench and anchor-probe answer as the bench expects."""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from cpuinfo_fixtures import cpuinfo

from ragspec.bench import runner as core
from ragspec.bench import summary as summary
from ragspec.bench.anchors import build as anchor_build
from ragspec.bench.anchors import llama_server as llamaserver
from ragspec.bench.anchors import native as native_anchors
from ragspec.bench.anchors.llama_build import NO_AMX, cpu_flags

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
NO_NETWORK = {"-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"}


def _amx_off(args: list[str]) -> bool:
    return f"-DCMAKE_C_FLAGS={NO_AMX}" in args and f"-DCMAKE_CXX_FLAGS={NO_AMX}" in args


# -- build flags ----------------------------------------------------------------------------------

@pytest.mark.parametrize("cpu, amx_works, mainline_amx_off, ik_avx512", [
    ("epyc-avx2", None, False, []),
    ("epyc-avx512", None, False, ["GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_VBMI",
                                  "GGML_AVX512_BF16"]),
    ("xeon-amx", True, False, ["GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_VBMI",
                               "GGML_AVX512_BF16"]),
    ("xeon-amx", False, True, ["GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_VBMI",
                                "GGML_AVX512_BF16"]),
    ("arm", None, False, []),
])
def test_each_anchor_is_a_native_build_with_only_what_this_cpu_has(tmp_path, cpu, amx_works,
                                                                    mainline_amx_off, ik_avx512):
    flags = cpu_flags(cpuinfo(tmp_path, cpu))
    mainline = anchor_build.cmake_args("llama.cpp", flags, amx_works)
    ik = anchor_build.cmake_args("ik_llama.cpp", flags, amx_works)
    for args in (mainline, ik):
        assert "-DGGML_NATIVE=ON" in args and "-DCMAKE_BUILD_TYPE=Release" in args
    assert NO_NETWORK <= set(mainline)  # nothing fetched while building
    assert _amx_off(mainline) is mainline_amx_off
    assert not _amx_off(ik)  # ik_llama.cpp has no AMX kernels to keep out
    assert [a[2:-3] for a in ik if a.startswith("-DGGML_AVX512")] == ik_avx512
    assert not any(a.startswith("-DGGML_AVX512") for a in mainline)  # native decides there


def test_the_flags_command_prints_what_the_build_uses(tmp_path, capsys):
    path = cpuinfo(tmp_path, "xeon-amx")
    assert anchor_build.main(["flags", "llama.cpp", "--cpuinfo", str(path), "--amx", "no"]) == 0
    assert _amx_off(shlex.split(capsys.readouterr().out))
    with pytest.raises(SystemExit):
        anchor_build.main(["flags", "no-such-engine"])


def test_arch_flags_come_from_the_kernels_compile_line(tmp_path):
    (tmp_path / "build.ninja").write_text(
        "build x.o: CXX_COMPILER__llama\n  FLAGS = -O3 -DNDEBUG -std=gnu++17\n"
        "build y.o: C_COMPILER__ggml-cpu\n"
        "  FLAGS = -O3 -DNDEBUG -fPIC -march=native -mno-amx-tile -mno-amx-int8 -fopenmp\n")
    assert anchor_build.arch_flags(tmp_path) == ["-march=native", "-mno-amx-tile",
                                                 "-mno-amx-int8"]
    assert anchor_build.arch_flags(tmp_path / "missing") == []


@pytest.mark.skipif(platform.machine() != "x86_64" or not shutil.which("cc"),
                    reason="needs an x86-64 C compiler")
def test_the_recorded_instruction_sets_are_what_the_compiler_enables():
    v3 = anchor_build.instruction_sets(["-march=x86-64-v3"])
    assert {"AVX", "AVX2", "FMA", "F16C", "BMI2"} <= set(v3) and "AVX512F" not in v3
    assert "AVX512F" in anchor_build.instruction_sets(["-march=x86-64-v4"])
    amx = anchor_build.instruction_sets(["-march=sapphirerapids"])
    assert "AMX_INT8" in amx and "AVX512_BF16" in amx
    off = anchor_build.instruction_sets(["-march=sapphirerapids", *NO_AMX.split()])
    assert "AMX_INT8" not in off and "AVX512_BF16" in off


@pytest.mark.skipif(not shutil.which("cmake"), reason="needs cmake")
def test_the_build_info_script_ik_llama_cpp_lacks_fills_its_template(tmp_path):
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "build-info.cpp.in").write_text(
        'int LLAMA_BUILD_NUMBER = @BUILD_NUMBER@;\nchar const *LLAMA_COMMIT = "@BUILD_COMMIT@";\n'
        'char const *LLAMA_COMPILER = "@BUILD_COMPILER@";\n')
    script = tmp_path / "gen.cmake"
    script.write_text(anchor_build.IK_BUILD_INFO)
    # what ik_llama.cpp's common/CMakeLists.txt runs, from the source root
    subprocess.run(["cmake", "-DCMAKE_C_COMPILER_ID=GNU", "-DCMAKE_C_COMPILER_VERSION=12.2",
                    "-P", str(script)], cwd=tmp_path, check=True, capture_output=True)
    out = (tmp_path / "common" / "build-info.cpp").read_text()
    assert "LLAMA_BUILD_NUMBER = 0;" in out and '"unknown"' in out and '"GNU 12.2"' in out


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def test_the_amx_check_runs_the_built_engine_and_names_a_crash(tmp_path):
    # what anchor-probe answers to prefill / step 2 / quit, and what a SIGILL looks like
    good = _script(tmp_path / "good", "echo 'ready 0.1 5'; echo 0.01; echo 0.002")
    crash = _script(tmp_path / "crash", "echo 'ready 0.1 5'; kill -ILL $$")
    assert anchor_build.runs_a_forward(good, tmp_path / "m.gguf") == (True, "ran")
    assert anchor_build.runs_a_forward(crash, tmp_path / "m.gguf") == (
        False, "exit status -4 (SIGILL)")


def test_a_failed_amx_check_builds_again_without_amx_and_says_so(tmp_path, monkeypatch):
    built = []

    def fake_build(name, where, jobs, cpuinfo, flags, amx_works, amx_note=None):
        built.append(amx_works)
        sets = ["AVX512F"] + (["AMX_INT8"] if amx_works else [])
        return {"instruction_sets": sets, "amx_note": amx_note}

    monkeypatch.setattr(anchor_build, "_build", fake_build)
    monkeypatch.setattr(anchor_build, "runs_a_forward", lambda probe, model: (False, "SIGILL"))
    record = anchor_build.build("llama.cpp", tmp_path, 2, cpuinfo(tmp_path, "xeon-amx"),
                                amx="yes", check_model=tmp_path / "m.gguf")
    assert built == [True, False] and "SIGILL" in record["amx_note"]
    built.clear()
    monkeypatch.setattr(anchor_build, "runs_a_forward", lambda probe, model: (True, "ran"))
    record = anchor_build.build("llama.cpp", tmp_path, 2, cpuinfo(tmp_path, "xeon-amx"),
                                amx="yes", check_model=tmp_path / "m.gguf")
    assert built == [True] and "AMX_INT8" in record["instruction_sets"]


def _fake_anchor(root: Path, name: str = "llama.cpp", server: str | None = None) -> dict:
    """A build record and programs under `root`, as anchor_build.build leaves them."""
    anchor = anchor_build.ANCHORS[name]
    bin_dir = root / name / "bin"
    bin_dir.mkdir(parents=True)
    for program in (*anchor.targets, "anchor-probe"):
        (bin_dir / program).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / program).chmod(0o755)
    if server is not None:
        (bin_dir / "llama-server").write_text(f'#!/bin/sh\nexec "{sys.executable}" {server} "$@"\n')
    manifest = {"anchor": name, "package": anchor.package, "version": anchor.version,
                "cmake_args": anchor_build.cmake_args(name, None), "arch_flags": ["-march=native"],
                "instruction_sets": ["AVX2"], "amx_usable": None, "compiler": "cc 12",
                "cpu": "test CPU", "programs": [*anchor.targets, "anchor-probe"]}
    (root / name / anchor_build.MANIFEST).write_text(json.dumps(manifest))
    return manifest


def test_a_build_record_counts_only_with_all_its_programs(tmp_path):
    _fake_anchor(tmp_path)
    loaded = anchor_build.load("llama.cpp", tmp_path)
    assert loaded["bin"] == str(tmp_path / "llama.cpp" / "bin")
    assert "-DGGML_NATIVE=ON" in anchor_build.describe(loaded)
    assert "AVX2" in anchor_build.describe(loaded)
    (tmp_path / "llama.cpp" / "bin" / "llama-server").unlink()
    assert anchor_build.load("llama.cpp", tmp_path) is None
    assert anchor_build.load("ik_llama.cpp", tmp_path) is None


# -- llama-server: requests, responses, clocks ----------------------------------------------------

def test_the_request_posts_token_ids_greedy_without_prompt_reuse():
    body = llamaserver.completion_request([5, 6, 7], 32)
    assert body["prompt"] == [5, 6, 7] and body["n_predict"] == 32
    assert body["temperature"] == 0.0 and body["top_k"] == 1
    assert body["cache_prompt"] is False and body["stream"] and body["return_tokens"]


def test_server_sent_events_are_parsed_and_errors_raised():
    assert llamaserver.parse_event(b'data: {"tokens": [4], "stop": false}\n') == {
        "tokens": [4], "stop": False}
    assert llamaserver.parse_event(b"\n") is None
    assert llamaserver.parse_event(b"data: [DONE]\n") is None
    with pytest.raises(llamaserver.ServerError, match="context"):
        llamaserver.parse_event(b'data: {"error": {"message": "context too long"}}\n')


def test_a_reused_prefix_is_refused():
    run = llamaserver.ServerRun([1], 0.1, 0.05, 0.1, {"cache_n": 12, "prompt_n": 4})
    with pytest.raises(llamaserver.ServerError, match="reused"):
        llamaserver.check_no_reuse(run, 16)
    llamaserver.check_no_reuse(llamaserver.ServerRun([1], 0.1, 0.05, 0.1,
                                                     {"cache_n": 0, "prompt_n": 16}), 16)


@pytest.fixture()
def fake_servers(tmp_path, monkeypatch):
    """Stand-in llama-servers (tests/support/fake_llama_server.py) for greedy and two n-gram modes."""
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_SERVER_LOG", str(log))
    manifest = _fake_anchor(tmp_path / "anchors", server=str(TESTS / "support" / "fake_llama_server.py"))
    manifest["bin"] = str(tmp_path / "anchors" / "llama.cpp" / "bin")
    servers = llamaserver.LlamaServers.open(
        tmp_path / "m.gguf", 256, ("llama_server", "llama_server_ngram_simple",
                                   "llama_server_ngram_mod"), threads=2, manifest=manifest)
    yield servers, log
    assert servers.logs.is_dir()
    servers.close()
    assert not servers.logs.exists()  # the servers' logs go with them


def test_llama_server_streams_the_answer_timed_on_the_clients_clock(fake_servers):
    servers, log = fake_servers
    run = servers.generate("llama_server", [5, 6, 7, 8], 10, eos_ids={99})
    assert run.token_ids == [5, 6, 7, 8, 5, 6, 7, 8, 5, 6] and run.written == 10
    assert 0 < run.ttft_seconds < run.seconds <= run.stream_seconds
    assert run.ttft_seconds >= 0.02  # the stand-in's prefill
    record = run.summary()
    assert record["timings"]["prompt_n"] == 4
    assert 0.8 < record["clock_ratio"] < 3  # its own clock and ours over the same stream
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert sent[-1]["prompt"] == [5, 6, 7, 8] and sent[-1]["cache_prompt"] is False
    assert {s["spec_type"] for s in sent} == {None}


def test_the_answer_ends_at_end_of_text_or_the_stop_rule_and_the_rest_is_untimed(fake_servers):
    servers, _ = fake_servers
    eos = servers.generate("llama_server", [5, 6, 99, 7], 12, eos_ids={99})
    assert eos.token_ids == [5, 6, 99] and eos.written == 12
    assert eos.seconds < eos.stream_seconds
    stopped = servers.generate("llama_server", [5, 6, 7, 8], 12, eos_ids=set(),
                               stop=lambda token: token == 7)
    assert stopped.token_ids == [5, 6, 7]
    # several tokens per event (an n-gram mode's accepted draft): the answer still ends exactly
    mode = servers.generate("llama_server_ngram_mod", [5, 6, 7, 8], 12, eos_ids={8})
    assert mode.token_ids == [5, 6, 7, 8]


def test_each_mode_is_a_server_of_its_own_started_with_its_spec_type(fake_servers):
    servers, log = fake_servers
    assert len(set(servers.ports.values())) == 3
    for method in servers.methods:
        servers.generate(method, [3, 4], 4, eos_ids=set())
    sent = {json.loads(line)["spec_type"] for line in log.read_text().splitlines()}
    assert sent == {None, "ngram-simple", "ngram-mod"}


def test_a_server_that_cannot_start_says_why(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import sys\nprint('error: failed to load model m.gguf')\nsys.exit(1)\n")
    manifest = _fake_anchor(tmp_path / "anchors", server=str(broken))
    manifest["bin"] = str(tmp_path / "anchors" / "llama.cpp" / "bin")
    before = set(Path(tempfile.gettempdir()).glob("ragspec-llama-server-*"))
    with pytest.raises(llamaserver.ServerError, match="failed to load model"):
        llamaserver.LlamaServers.open(tmp_path / "m.gguf", 256, ("llama_server",),
                                      manifest=manifest)
    # the error carries the log's last lines: its folder is not left behind
    assert set(Path(tempfile.gettempdir()).glob("ragspec-llama-server-*")) <= before


def test_server_methods_run_beside_ragspec_with_first_token_and_decode_apart(
        fake_servers, tiny_gen, tiny_tokenizer, one_thread):
    servers, _ = fake_servers
    texts = [("c1", "copy", "the quick brown fox jumps over the lazy dog. the quick brown fox "),
             ("o1", "open", "Write a poem about the sea:")]
    prepared = [core.Prepared(core.Question(qid, text, kind), tiny_tokenizer(text)["input_ids"])
                for qid, kind, text in texts]
    runner = core.Runner(tiny_gen, servers=servers, methods=["ragspec", "llama_server_ngram_simple",
                                                              "llama_server_ngram_mod"])
    assert runner.methods == ("greedy", "ragspec", "llama_server", "llama_server_ngram_simple",
                              "llama_server_ngram_mod")
    entries = core.run_bench(runner, prepared, 6)
    results = summary.build_results("tiny", "cpu", 6, entries, llama_server_build=servers.build)
    for entry in entries:
        for run in entry["results"].values():
            assert run["decode_seconds"] == pytest.approx(run["seconds"] - run["ttft_seconds"])
        assert entry["results"]["llama_server"]["identical_to_greedy"] is None
        assert entry["results"]["llama_server_ngram_mod"]["identical_to_greedy"] is True
        assert entry["results"]["llama_server_ngram_simple"]["identical_to_greedy"] is False
        assert entry["results"]["llama_server"]["anchor"]["timings"]["predicted_n"] == 6
    assert results["llama_server_build"]["cmake_args"] and "bin" not in results["llama_server_build"]
    assert results["llama_server_best_mode"] in llamaserver.NGRAM_METHODS
    best = results["ratios"]["all"]["ragspec/best_ngram"]
    fastest = [max(e["results"][m]["tokens_per_s"] for m in llamaserver.NGRAM_METHODS
                   if m in e["results"]) for e in entries]
    assert best["median"] == pytest.approx(statistics.median(
        e["results"]["ragspec"]["tokens_per_s"] / f for e, f in zip(entries, fastest, strict=True)))
    assert "ragspec/llama_server" in results["ratios"]["all"]
    table = summary.format_questions(results)
    assert table.count("| c1") == 5 and "client clock / its own timings" in table
    assert "median decode ms/token" in summary.format_table(results)


# -- the real anchors, where `make bench-anchors` built them --------------------------------------

ANCHORS_ROOT = Path(os.environ.get(anchor_build.ANCHORS_ENV, REPO / ".ragspec-home" / "anchors"))


def _built(name: str) -> dict:
    manifest = anchor_build.load(name, ANCHORS_ROOT)
    if manifest is None:
        pytest.skip(f"{name} is not built under {ANCHORS_ROOT}: `make bench-anchors` (or "
                    f"python -m ragspec.bench.anchors.build build {name})")
    return manifest


@pytest.fixture(scope="module")
def bundled_gguf():
    from ragspec.models.load import bundled_gguf_path

    return bundled_gguf_path()


def test_the_real_llama_server_repeats_its_greedy_answer_and_its_clock_agrees(bundled_gguf):
    manifest = _built("llama.cpp")
    prompt = list(range(400, 700))  # token ids as the bench posts them
    with llamaserver.LlamaServers.open(bundled_gguf, 512, ("llama_server",), threads=2,
                                       manifest=manifest) as servers:
        first = servers.generate("llama_server", prompt, 24, eos_ids=set())
        again = servers.generate("llama_server", prompt, 24, eos_ids=set())
    assert len(first.token_ids) == 24 and first.token_ids == again.token_ids
    for run in (first, again):
        assert run.server["prompt_n"] == len(prompt) and run.server.get("cache_n", 0) == 0
        assert 0.7 < run.summary()["clock_ratio"] < 1.5


@pytest.mark.parametrize("engine", native_anchors.NATIVE_ENGINES)
def test_the_real_probe_and_llama_bench_measure_a_file(engine, bundled_gguf, monkeypatch):
    _built(engine)
    monkeypatch.setenv(anchor_build.ANCHORS_ENV, str(ANCHORS_ROOT))
    got = native_anchors.measure(engine, bundled_gguf, context=64, max_tokens=3, rounds=1,
                                 threads=2)
    assert len(got["c"]) == 3 and all(c > 0 for c in got["c"]) and got["prefill_s"] > 0
    assert got["rss_mb"] > 10 and "AVX" in got["system_info"] or "NEON" in got["system_info"]
    bench = native_anchors.llama_bench(engine, bundled_gguf, 2, prompt=32, generate=4)
    assert bench["pp32"]["tokens_per_s"] > 0 and bench["tg4"]["tokens_per_s"] > 0


def test_the_bench_times_a_server_answer_to_its_end_not_to_the_end_of_the_stream(
        fake_servers, tiny_gen, one_thread):
    servers, _ = fake_servers
    runner = core.Runner(tiny_gen, servers=servers, methods=["llama_server"])
    # the tiny model's end of text is token 2: the answer ends at the third token written
    run = runner.run("llama_server", [5, 6, 2, 7], 40)
    assert run.token_ids == [5, 6, 2]
    assert run.seconds < run.anchor["stream_seconds"] - 0.02  # 37 more tokens were written after
    assert run.anchor["written_tokens"] == 40


def test_a_probe_that_logs_more_than_a_pipe_holds_still_answers(tmp_path):
    """llama.cpp logs hundreds of kB while loading; the probe must not stall on its own log."""
    from ragspec.bench.anchors.native import Probe

    fake = tmp_path / "anchor-probe"
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import sys\n"
        "sys.stderr.write('load log line\\n' * 40000)\n"  # ~560 kB, far over a pipe's 64 kB
        "sys.stderr.flush()\n"
        "print('ready 0.5 12.0', flush=True)\n"
        "for line in sys.stdin:\n"
        "    if line.strip() == 'quit':\n"
        "        break\n"
        "    print('0.25', flush=True)\n")
    fake.chmod(0o755)
    result: dict = {}

    def run() -> None:
        probe = Probe(fake, tmp_path / "model.gguf", 2, 800, 8, repack=False)
        result["load"] = probe.load_s
        result["step"] = probe.seconds("step 1")
        probe.close()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the probe stalled writing its log"
    assert result == {"load": 0.5, "step": 0.25}


def test_llama_servers_flash_attention_is_its_default_unless_set(monkeypatch):
    from ragspec.bench.anchors import llama_server

    monkeypatch.delenv(llama_server.FLASH_ENV, raising=False)
    plain = llama_server.server_argv("llama-server", Path("m.gguf"), 1, 512, 2, None)
    assert "-fa" not in plain and plain[plain.index("-np") + 1] == "1"
    monkeypatch.setenv(llama_server.FLASH_ENV, "off")
    argv = llama_server.server_argv("llama-server", Path("m.gguf"), 1, 512, 2, "ngram-simple")
    assert argv[argv.index("-fa") + 1] == "off" and argv[-2:] == ["--spec-type", "ngram-simple"]
