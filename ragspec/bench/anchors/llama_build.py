"""Build settings for llama.cpp (the benchmark's anchor) that suit the CPU it is built on.

`make bench-anchors` builds llama-cpp-python from source on the machine that will run it, so the
default is ggml's native build (`-DGGML_NATIVE=ON`: the compiler targets exactly this CPU's
instruction sets). The one exception is AMX: some virtual machines list AMX flags in
/proc/cpuinfo without letting a process use the tile registers (Linux hands them out only on
request, `arch_prctl(ARCH_REQ_XCOMP_PERM)`, and a hypervisor may not pass the state through), and
ggml's AMX kernels then crash. So where the CPU reports AMX, `amx_usable()` compiles and runs a
small AMX program in a child process (ask for the tile state, one int8 tile dot product checked
against plain arithmetic). That program passing is necessary, not sufficient: on an Intel Xeon
under KVM it ran and checked out while ggml's AMX kernels died with SIGILL on their first tile
load. So llama-cpp-python, which cannot be run before it is installed, keeps the AMX kernels out
(`-mno-amx-*`) unless told `--amx yes`; the native llama.cpp anchor (ragspec.bench.anchors.build)
probes, builds with them, runs a forward and rebuilds without them when it fails. GCC and Clang let an explicit `-mno-...` win
over `-march=native` whatever their order on the command line.

    python -m ragspec.bench.anchors.llama_build flags [--cpuinfo FILE] [--amx probe|yes|no]
        the CMAKE_ARGS for this CPU (--amx: whether ggml's AMX kernels may be kept: yes, no
        (the default), or probe: where the small AMX program runs here)
    python -m ragspec.bench.anchors.llama_build check [--cpuinfo FILE] [--amx probe|yes|no]
        load the installed llama_cpp (in a child process), print the instruction sets it was
        compiled for, and exit 1 when it fails to load or uses one this CPU does not report or
        cannot use (e.g. a wheel built elsewhere and taken from pip's cache)

`make bench-anchors` runs both around `pip install`; without the checkout:
    CMAKE_ARGS="$(python -m ragspec.bench.anchors.llama_build flags)" \\
        pip install --no-binary llama-cpp-python 'ragspec[bench]'
Standard library only (and ragspec.cpuinfo, which is too): it runs before llama.cpp is
installed, and imports nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ragspec import cpuinfo as cpu_facts

CPUINFO = cpu_facts.CPUINFO
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

# ggml's name for a compiled-in feature (llama_print_system_info) -> the /proc/cpuinfo flag a CPU
# must report to run it. SSE3 is "pni" in cpuinfo.
FEATURE_FLAGS = {
    "SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX2": "avx2", "AVX_VNNI": "avx_vnni",
    "F16C": "f16c", "FMA": "fma", "BMI2": "bmi2", "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str] | None:
    """The flags of the first processor in `cpuinfo`, or None where there is no such file
    (macOS, Windows) or it lists no x86 flags (ARM says "Features")."""
    flags = cpu_facts.field("flags", cpuinfo)
    return None if flags is None else set(flags.split())


def cpu_name(cpuinfo: Path = CPUINFO) -> str | None:
    """The first processor's model name in `cpuinfo` (None where it says none)."""
    return cpu_facts.field("model name", cpuinfo)


def reports_amx(flags: set[str] | None) -> bool:
    return bool(flags) and any(flag.startswith("amx") for flag in flags)


def cmake_args(flags: set[str] | None, amx_works: bool | None = None) -> list[str]:
    """CMake arguments for llama.cpp on a CPU with these flags (None: unknown CPU);
    amx_works: what `amx_usable()` found (None: not tried, taken as unusable)."""
    args = ["-DGGML_NATIVE=ON"]
    if reports_amx(flags) and not amx_works:
        args += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    return args


# Ask Linux for the AMX tile state, then one int8 tile dot product (16x64 by 64x16) compared with
# plain arithmetic: exit 0 only when both work.
_AMX_PROGRAM = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
struct tilecfg { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; };
int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 3;
    struct tilecfg cfg; memset(&cfg, 0, sizeof cfg); cfg.palette = 1;
    for (int t = 0; t < 3; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    static int8_t a[16 * 64], b[16 * 64]; static int32_t c[16 * 16];
    for (int i = 0; i < 16 * 64; ++i) { a[i] = (int8_t)(i % 7 - 3); b[i] = (int8_t)(i % 5 - 2); }
    _tile_loadconfig(&cfg); _tile_zero(0); _tile_loadd(1, a, 64); _tile_loadd(2, b, 64);
    _tile_dpbssd(0, 1, 2); _tile_stored(0, c, 64); _tile_release();
    for (int m = 0; m < 16; ++m) for (int n = 0; n < 16; ++n) {
        int32_t sum = 0;
        for (int k = 0; k < 16; ++k) for (int i = 0; i < 4; ++i)
            sum += a[m * 64 + 4 * k + i] * b[k * 64 + 4 * n + i];
        if (sum != c[m * 16 + n]) return 4;
    }
    return 0;
}
"""


def amx_usable(cc: str | None = None) -> bool | None:
    """Whether a process here may use AMX and gets right answers from it: True or False, or None
    where it cannot be tried (no C compiler, or one without AMX support)."""
    cc = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    with tempfile.TemporaryDirectory(prefix="ragspec-amx-") as tmp:
        source, program = Path(tmp) / "amx.c", Path(tmp) / "amx"
        source.write_text(_AMX_PROGRAM)
        try:
            built = subprocess.run([cc, "-O1", "-mamx-tile", "-mamx-int8", str(source), "-o",
                                    str(program)], capture_output=True)
        except OSError:
            return None
        if built.returncode:
            return None
        try:
            ran = subprocess.run([str(program)], capture_output=True, timeout=30)
        except subprocess.TimeoutExpired:
            return False
        return ran.returncode == 0  # a SIGILL without the tile state is a negative code


def amx_choice(choice: str, flags: set[str] | None) -> bool | None:
    """--amx probe|yes|no as a verdict; probing only where the CPU reports AMX at all."""
    if choice in ("yes", "no"):
        return choice == "yes"
    return amx_usable() if reports_amx(flags) else None


def compiled_features(system_info: str) -> dict[str, bool]:
    """{feature: on} from llama.cpp's system info line ("CPU : SSE3 = 1 | AVX = 1 | ...")."""
    features = {}
    for part in system_info.replace(":", "|").split("|"):
        name, sep, value = part.partition("=")
        if sep and value.strip() in ("0", "1"):
            features[name.strip()] = value.strip() == "1"
    return features


def missing_on_cpu(features: dict[str, bool], flags: set[str],
                   amx_works: bool | None = None) -> list[str]:
    """The compiled-in features this CPU does not report, and AMX kernels where AMX was not
    found usable (see the module docstring)."""
    bad = [name for name, on in features.items()
           if on and name in FEATURE_FLAGS and FEATURE_FLAGS[name] not in flags]
    if features.get("AMX_INT8") and not amx_works and "AMX_INT8" not in bad:
        bad.append("AMX_INT8")
    return bad


_PROBE = ("import json, llama_cpp; "
          "print(json.dumps(llama_cpp.llama_print_system_info().decode()))")


def check(cpuinfo: Path, amx: str = "probe") -> int:
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
    bad = missing_on_cpu(features, flags,
                         amx_choice(amx, flags) if features.get("AMX_INT8") else None)
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
    parser.add_argument("--amx", choices=("probe", "yes", "no"), default="no",
                        help="whether ggml's AMX kernels may be kept where the CPU reports AMX: "
                             "no (default: see above), yes, or probe (a small AMX program "
                             "runs here)")
    args = parser.parse_args(argv)
    if args.command == "flags":
        flags = cpu_flags(args.cpuinfo)
        print(shlex.join(cmake_args(flags, amx_choice(args.amx, flags))))
        return 0
    return check(args.cpuinfo, args.amx)


if __name__ == "__main__":
    sys.exit(main())
