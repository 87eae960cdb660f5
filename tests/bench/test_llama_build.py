"""llama.cpp's build flags come from the CPU that builds it: native, with ggml's AMX kernels
compiled out where /proc/cpuinfo reports AMX that a process here cannot use; and the check after the build catches a
library compiled for instruction sets this CPU lacks (e.g. a wheel from another machine)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cpuinfo_fixtures import CPUS, cpuinfo

from ragspec.bench.anchors import llama_build

REPO = Path(__file__).resolve().parents[2]
# what llama_print_system_info() says for a native build on each (the Zen 4 line is this
# machine's, verbatim)
SYSTEM_INFO = {
    "epyc-avx2": "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
                 "BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ",
    "epyc-avx512": "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | "
                   "FMA = 1 | BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | "
                   "AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ",
}


@pytest.mark.parametrize("cpu", ["epyc-avx2", "epyc-avx512"])
def test_a_cpu_without_amx_gets_the_plain_native_build(tmp_path, cpu):
    flags = llama_build.cpu_flags(cpuinfo(tmp_path, cpu))
    assert llama_build.cmake_args(flags) == ["-DGGML_NATIVE=ON"]


@pytest.mark.parametrize("amx_works", [False, None])  # tried and failed; could not be tried
def test_a_cpu_whose_amx_is_not_usable_gets_native_without_the_amx_kernels(tmp_path, amx_works):
    args = llama_build.cmake_args(llama_build.cpu_flags(cpuinfo(tmp_path, "xeon-amx")),
                                  amx_works)
    assert args[0] == "-DGGML_NATIVE=ON"
    for lang in ("C", "CXX"):
        flag = next(a for a in args if a.startswith(f"-DCMAKE_{lang}_FLAGS="))
        assert set(flag.split("=", 1)[1].split()) == {"-mno-amx-tile", "-mno-amx-int8",
                                                      "-mno-amx-bf16"}
    assert not any("AVX512" in a for a in args)  # nothing forced on: native decides


def test_a_cpu_whose_amx_works_keeps_ggmls_amx_kernels(tmp_path):
    flags = llama_build.cpu_flags(cpuinfo(tmp_path, "xeon-amx"))
    assert llama_build.cmake_args(flags, amx_works=True) == ["-DGGML_NATIVE=ON"]


def test_the_flags_command_keeps_amx_out_unless_told_and_probes_only_where_reported(tmp_path, monkeypatch,
                                                                   capsys):
    tried = []
    monkeypatch.setattr(llama_build, "amx_usable", lambda: tried.append(1) or True)
    assert llama_build.main(["flags", "--cpuinfo", str(cpuinfo(tmp_path, "epyc-avx512")),
                             "--amx", "probe"]) == 0
    assert not tried
    assert llama_build.main(["flags", "--cpuinfo", str(cpuinfo(tmp_path, "xeon-amx")),
                             "--amx", "probe"]) == 0
    assert tried == [1]
    assert capsys.readouterr().out.split("\n")[1] == "-DGGML_NATIVE=ON"  # AMX kept: it works
    assert llama_build.main(["flags", "--cpuinfo", str(cpuinfo(tmp_path, "xeon-amx"))]) == 0
    assert tried == [1] and "-mno-amx-int8" in capsys.readouterr().out  # the default: no


def _fake_cc(tmp_path: Path, program: str | None) -> str:
    """A 'compiler' that writes `program` (a shell script) as its output, or fails (None)."""
    cc = tmp_path / "cc"
    if program is None:
        cc.write_text("#!/bin/sh\necho 'unknown option -mamx-tile' >&2\nexit 1\n")
    else:
        cc.write_text("#!/bin/sh\nwhile [ \"$1\" != -o ]; do shift; done\n"
                      f"printf '#!/bin/sh\\n{program}\\n' > \"$2\"; chmod +x \"$2\"\n")
    cc.chmod(0o755)
    return str(cc)


@pytest.mark.parametrize("program, verdict", [
    ("exit 0", True),
    ("exit 3", False),          # the kernel refused the tile state
    ("kill -ILL $$", False),    # the tile instructions trapped
    (None, None),               # no compiler that knows AMX: not tried
])
def test_the_amx_probe_says_what_running_an_amx_program_here_did(tmp_path, program, verdict):
    assert llama_build.amx_usable(_fake_cc(tmp_path, program)) is verdict
    assert llama_build.amx_usable(str(tmp_path / "no-such-cc")) is None


def test_no_cpuinfo_or_no_x86_flags_is_a_plain_native_build(tmp_path):
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n")
    assert llama_build.cpu_flags(arm) is None
    assert llama_build.cpu_flags(tmp_path / "missing") is None
    assert llama_build.cmake_args(None) == ["-DGGML_NATIVE=ON"]


def test_the_flags_command_prints_what_scikit_build_core_splits_back(tmp_path, capsys):
    assert llama_build.main(["flags", "--cpuinfo", str(cpuinfo(tmp_path, "xeon-amx")),
                             "--amx", "no"]) == 0
    printed = capsys.readouterr().out.strip()
    # scikit-build-core splits CMAKE_ARGS with shlex
    assert shlex.split(printed) == llama_build.cmake_args(set(CPUS["xeon-amx"].split()), False)


def test_make_bench_anchors_uses_the_flags_for_this_cpu(tmp_path):
    """The Makefile's default, for a CPU given by its cpuinfo (make -n: nothing runs)."""
    for cpu, usable, amx_out in [("epyc-avx2", "no", False), ("xeon-amx", "no", True),
                                 ("xeon-amx", "yes", False)]:
        out = subprocess.run(
            ["make", "-n", "-s", "bench-anchors", f"PY={sys.executable}", "STAMP=",
             f"LLAMA_CPUINFO={cpuinfo(tmp_path, cpu)}", f"LLAMA_AMX={usable}"],
            cwd=REPO, capture_output=True, text=True, check=True).stdout
        install = next(line for line in out.splitlines() if "pip install" in line)
        assert "-DGGML_NATIVE=ON" in install and "GGML_AVX512" not in install
        assert ("-mno-amx-int8" in install) is amx_out
        # the native anchors are built for the same CPU, with the same AMX verdict
        for anchor in ("llama.cpp", "ik_llama.cpp"):
            build = next(line for line in out.splitlines()
                         if "anchors.build build" in line and anchor in line.split())
            assert f"--cpuinfo {cpuinfo(tmp_path, cpu)}" in build
            assert f"--amx {usable}" in build


@pytest.mark.parametrize("built, cpu, missing", [
    ("epyc-avx2", "epyc-avx2", []),
    ("epyc-avx512", "epyc-avx512", []),
    ("epyc-avx2", "epyc-avx512", []),  # an older build runs on a newer CPU
    ("epyc-avx512", "epyc-avx2", ["AVX_VNNI", "AVX512", "AVX512_VBMI", "AVX512_VNNI",
                                  "AVX512_BF16"]),
])
def test_the_check_names_instruction_sets_the_cpu_lacks(built, cpu, missing):
    features = llama_build.compiled_features(SYSTEM_INFO[built])
    assert features["AVX2"] and features["LLAMAFILE"]
    assert llama_build.missing_on_cpu(features, set(CPUS[cpu].split())) == missing


def test_the_check_refuses_amx_kernels_unless_amx_was_found_usable():
    features = llama_build.compiled_features(SYSTEM_INFO["epyc-avx512"] + "AMX_INT8 = 1 | ")
    xeon = set(CPUS["xeon-amx"].split())
    assert llama_build.missing_on_cpu(features, xeon) == ["AMX_INT8"]  # not tried
    assert llama_build.missing_on_cpu(features, xeon, amx_works=False) == ["AMX_INT8"]
    assert llama_build.missing_on_cpu(features, xeon, amx_works=True) == []


@pytest.mark.parametrize("cpu, code", [("epyc-avx512", 0), ("epyc-avx2", 1)])
def test_check_loads_the_library_in_a_child_and_exits_by_the_verdict(tmp_path, monkeypatch,
                                                                      capsys, cpu, code):
    import json

    def child(argv, **kwargs):
        assert argv[0] == sys.executable and "llama_cpp" in argv[-1]
        return subprocess.CompletedProcess(argv, 0, json.dumps(SYSTEM_INFO["epyc-avx512"]), "")

    monkeypatch.setattr(llama_build.subprocess, "run", child)
    assert llama_build.check(cpuinfo(tmp_path, cpu)) == code
    out = capsys.readouterr()
    assert "compiled for: AVX, AVX2, AVX512" in out.out
    assert ("rebuild it" in out.err) is bool(code)


def test_check_fails_when_llama_cpp_does_not_load(tmp_path, monkeypatch, capsys):
    def crashed(argv, **kwargs):  # what a SIGILL in the library's initialisers looks like
        return subprocess.CompletedProcess(argv, -4, "", "")

    monkeypatch.setattr(llama_build.subprocess, "run", crashed)
    assert llama_build.check(cpuinfo(tmp_path, "epyc-avx2")) == 1
    assert "does not load on this machine" in capsys.readouterr().err
