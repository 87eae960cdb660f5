"""llama.cpp's build flags come from the CPU that builds it: native, with ggml's AMX kernels
compiled out only where /proc/cpuinfo reports AMX; and the check after the build catches a
library compiled for instruction sets this CPU lacks (e.g. a wheel from another machine)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ragspec.bench import llama_build

REPO = Path(__file__).resolve().parent.parent
BASE = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx "
        "fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl "
        "nonstop_tsc cpuid pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes "
        "xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy abm sse4a misalignsse "
        "3dnowprefetch bmi1 avx2 smep bmi2 rdseed adx smap clflushopt clwb sha_ni xsaveopt")
CPUS = {
    # an AMD EPYC of the Zen 2/3 kind: AVX2, no AVX-512
    "epyc-avx2": BASE,
    # an AMD EPYC of the Zen 4 kind: AVX-512, no AMX
    "epyc-avx512": BASE + " avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 "
                          "avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg avx_vnni",
    # an Intel Xeon of the Sapphire Rapids kind, as a virtual machine reports it: AMX too
    "xeon-amx": BASE + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi "
                       "avx512_vnni avx_vnni amx_bf16 amx_tile amx_int8",
}
# what llama_print_system_info() says for a native build on each (the Zen 4 line is this
# machine's, verbatim)
SYSTEM_INFO = {
    "epyc-avx2": "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
                 "BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ",
    "epyc-avx512": "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | "
                   "FMA = 1 | BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | "
                   "AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ",
}


def cpuinfo(tmp_path: Path, cpu: str) -> Path:
    path = tmp_path / f"{cpu}.cpuinfo"
    cores = [f"processor\t: {n}\nvendor_id\t: x\nflags\t\t: {CPUS[cpu]}\n" for n in range(2)]
    path.write_text("\n".join(cores))
    return path


@pytest.mark.parametrize("cpu", ["epyc-avx2", "epyc-avx512"])
def test_a_cpu_without_amx_gets_the_plain_native_build(tmp_path, cpu):
    flags = llama_build.cpu_flags(cpuinfo(tmp_path, cpu))
    assert llama_build.cmake_args(flags) == ["-DGGML_NATIVE=ON"]


def test_a_cpu_that_reports_amx_gets_native_without_the_amx_kernels(tmp_path):
    args = llama_build.cmake_args(llama_build.cpu_flags(cpuinfo(tmp_path, "xeon-amx")))
    assert args[0] == "-DGGML_NATIVE=ON"
    for lang in ("C", "CXX"):
        flag = next(a for a in args if a.startswith(f"-DCMAKE_{lang}_FLAGS="))
        assert set(flag.split("=", 1)[1].split()) == {"-mno-amx-tile", "-mno-amx-int8",
                                                      "-mno-amx-bf16"}
    assert not any("AVX512" in a for a in args)  # nothing forced on: native decides


def test_no_cpuinfo_or_no_x86_flags_is_a_plain_native_build(tmp_path):
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n")
    assert llama_build.cpu_flags(arm) is None
    assert llama_build.cpu_flags(tmp_path / "missing") is None
    assert llama_build.cmake_args(None) == ["-DGGML_NATIVE=ON"]


def test_the_flags_command_prints_what_scikit_build_core_splits_back(tmp_path, capsys):
    assert llama_build.main(["flags", "--cpuinfo", str(cpuinfo(tmp_path, "xeon-amx"))]) == 0
    printed = capsys.readouterr().out.strip()
    # scikit-build-core splits CMAKE_ARGS with shlex
    assert shlex.split(printed) == llama_build.cmake_args(set(CPUS["xeon-amx"].split()))


def test_make_bench_anchors_uses_the_flags_for_this_cpu(tmp_path):
    """The Makefile's default, for a CPU given by its cpuinfo (make -n: nothing runs)."""
    for cpu, amx in [("epyc-avx2", False), ("xeon-amx", True)]:
        out = subprocess.run(
            ["make", "-n", "-s", "bench-anchors", f"PY={sys.executable}", "STAMP=",
             f"LLAMA_CPUINFO={cpuinfo(tmp_path, cpu)}"],
            cwd=REPO, capture_output=True, text=True, check=True).stdout
        install = next(line for line in out.splitlines() if "pip install" in line)
        assert "-DGGML_NATIVE=ON" in install and "GGML_AVX512" not in install
        assert ("-mno-amx-int8" in install) is amx


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


def test_the_check_refuses_amx_kernels_even_on_a_cpu_that_reports_amx():
    features = llama_build.compiled_features(SYSTEM_INFO["epyc-avx512"] + "AMX_INT8 = 1 | ")
    assert llama_build.missing_on_cpu(features, set(CPUS["xeon-amx"].split())) == ["AMX_INT8"]


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
