"""Build settings for llama.cpp (the benchmark's anchor) that suit the CPU it is built on.

`make bench-anchors` builds llama-cpp-python from source on the machine that will run it, so the
default is ggml's native build (`-DGGML_NATIVE=ON`: the compiler targets exactly this CPU's
instruction sets). The one exception is decided from what the CPU reports in /proc/cpuinfo, never
from what some development machine has: where it lists AMX flags, ggml's AMX kernels are
compiled out (`-mno-amx-*`), because they crash on virtual machines that report AMX without
letting a process use it. GCC and Clang let an explicit `-mno-...` win over `-march=native`
whatever their order on the command line.

    python -m ragspec.bench.llama_build flags [--cpuinfo FILE]   the CMAKE_ARGS for this CPU
    python -m ragspec.bench.llama_build check [--cpuinfo FILE]   load the installed llama_cpp
        (in a child process), print the instruction sets it was compiled for, and exit 1 when
        it fails to load or uses one this CPU does not report (e.g. a wheel built elsewhere
        and taken from pip's cache)

`make bench-anchors` runs both around `pip install`; without the checkout:
    CMAKE_ARGS="$(python -m ragspec.bench.llama_build flags)" \\
        pip install --no-binary llama-cpp-python 'ragspec[bench]'
Standard library only: it runs before llama.cpp is installed, and imports nothing else.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

# ggml's name for a compiled-in feature (llama_print_system_info) -> the /proc/cpuinfo flag a CPU
# must report to run it. SSE3 is "pni" in cpuinfo.
FEATURE_FLAGS = {
    "SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX2": "avx2", "AVX_VNNI": "avx_vnni",
    "F16C": "f16c", "FMA": "fma", "BMI2": "bmi2", "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}


def _first(cpuinfo: Path, field: str) -> str | None:
    """The value of `field` for the first processor in `cpuinfo`; None where there is no such
    file (macOS, Windows) or no such field."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == field:
            return value.strip()
    return None


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str] | None:
    """The flags of the first processor in `cpuinfo`, or None where there is no such file
    (macOS, Windows) or it lists no x86 flags (ARM says "Features")."""
    flags = _first(cpuinfo, "flags")
    return None if flags is None else set(flags.split())


def cpu_name(cpuinfo: Path = CPUINFO) -> str | None:
    """The first processor's model name in `cpuinfo` (None where it says none)."""
    return _first(cpuinfo, "model name")


def cmake_args(flags: set[str] | None) -> list[str]:
    """CMake arguments for llama.cpp on a CPU with these flags (None: unknown CPU)."""
    args = ["-DGGML_NATIVE=ON"]
    if flags and any(flag.startswith("amx") for flag in flags):
        args += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    return args


def compiled_features(system_info: str) -> dict[str, bool]:
    """{feature: on} from llama.cpp's system info line ("CPU : SSE3 = 1 | AVX = 1 | ...")."""
    features = {}
    for part in system_info.replace(":", "|").split("|"):
        name, sep, value = part.partition("=")
        if sep and value.strip() in ("0", "1"):
            features[name.strip()] = value.strip() == "1"
    return features


def missing_on_cpu(features: dict[str, bool], flags: set[str]) -> list[str]:
    """The compiled-in features this CPU does not report, and AMX kernels on any CPU."""
    bad = [name for name, on in features.items()
           if on and name in FEATURE_FLAGS and FEATURE_FLAGS[name] not in flags]
    if features.get("AMX_INT8") and "AMX_INT8" not in bad:
        bad.append("AMX_INT8")  # never built by default: see the module docstring
    return bad


_PROBE = ("import json, llama_cpp; "
          "print(json.dumps(llama_cpp.llama_print_system_info().decode()))")


def check(cpuinfo: Path) -> int:
    probe = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True)
    if probe.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
        print(f"llama_cpp does not load on this machine: {tail}", file=sys.stderr)
        return 1
    info = json.loads(probe.stdout.strip().splitlines()[-1])
    features = compiled_features(info)
    on = sorted(name for name, value in features.items() if value)
    print(f"llama.cpp is compiled for: {', '.join(on) or '(no SIMD extensions)'}")
    flags = cpu_flags(cpuinfo)
    if flags is None:
        return 0
    bad = missing_on_cpu(features, flags)
    if bad:
        print(f"llama.cpp was compiled for {', '.join(bad)}, which this CPU does not report "
              "(or whose kernels are kept off): rebuild it", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("flags", "check"))
    parser.add_argument("--cpuinfo", type=Path, default=CPUINFO,
                        help="read the CPU's flags from this file (default /proc/cpuinfo)")
    args = parser.parse_args(argv)
    if args.command == "flags":
        print(shlex.join(cmake_args(cpu_flags(args.cpuinfo))))
        return 0
    return check(args.cpuinfo)


if __name__ == "__main__":
    sys.exit(main())
