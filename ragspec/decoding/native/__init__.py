"""ragspec's CPU kernels, compiled on first use for the machine that runs them.

Contract: `ops(cache_dir)` returns `torch.ops.ragspec` with the kernels loaded (qmatmul,
dequantize_rows, quantize_activations, attend, argmax_rows, has_avx2, has_tiled_kernel,
amx_available, set_amx, the native step's StepModel), or raises KernelsUnavailable with one
line saying why (no C++ compiler, a failed build, a CPU-less torch). `available(cache_dir)` is
the same as a bool, and `unavailable_reason()` the last reason.

The sources are compiled with `-march=native`: the instruction sets are the ones this CPU
reports (AVX2/FMA/F16C and, where present, AVX-512, VNNI and AMX), never assumed. Prompt reads
of 65 rows or more can run on AMX where the CPU and Linux allow it (`RAGSPEC_AMX=1`; off by
default, as it measured slower than the bf16 prompt path at three of four shapes on one Xeon);
the values are the VNNI kernel's, bit for bit (amx.h). The build is
cached under `ragspec.paths.kernels_dir()/<key>` (`$RAGSPEC_KERNELS_DIR`, else the user's cache
folder, shared by every RAGSPEC_HOME), the key covering the sources, the compiler, torch's
version and the CPU's model and flags, so a copied cache on another machine is rebuilt rather
than run. Builds take a file lock (two first runs at once build once); a build takes about a
minute on an idle 2-core machine. The `cache_dir` the functions take is the model cache they
serve; it no longer decides where the build goes.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import torch

from ragspec import cpuinfo, paths

NAME = "ragspec_kernels"
SOURCES = ("qmatmul.cpp", "attention.cpp", "step.cpp", "amx.cpp", "argmax.cpp")
HEADERS = ("amx.h", "formats.h", "kernels.h", "simd.h", "tiled.h")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-std=c++17", "-fopenmp")
# -ffp-contract=off: only the fused multiply-adds written in the source are fused, so the
# compiler cannot fuse differently in two instantiations of a kernel (batch invariance).
# -fopenmp: at::parallel_for is compiled into the kernels themselves; without it they would
# run on one thread (the OpenMP runtime is torch's own, already loaded: the same libgomp).



def tuning_flags() -> tuple[str, ...]:
    """Compile-time tuning that depends on the CPU's maker (read from /proc/cpuinfo, part of the
    build key): how far ahead the tiled kernel requests weight bytes, and whether its products
    broadcast activation bytes from their memory operand (tiled.h, dot4)."""
    if cpuinfo.field("vendor_id") == "AuthenticAMD":
        return ("-DRS_AHEAD_BYTES=8192", "-DRS_LOAD_BROADCAST=0")
    return ()


_lock = threading.Lock()
_loaded = False
_reason: str | None = None
_built: str | None = None  # build_key() of the kernels this process loaded


class KernelsUnavailable(RuntimeError):
    """The native kernels cannot be built or loaded here; the message says why."""


def _here() -> Path:
    return Path(__file__).resolve().parent


def _cpu_fingerprint() -> str:
    model, flags = platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key = line.split(":", 1)[0].strip()
            if key == "model name" and model == platform.machine():
                model += " " + line.split(":", 1)[1].strip()
            elif key in ("flags", "Features") and not flags:
                flags = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{model}|{flags}"


def _compiler() -> str:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise KernelsUnavailable(f"no C++ compiler ({cxx!r} not found): install g++ (e.g. "
                                 f"`apt-get install g++`) to run packed weights")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelsUnavailable(f"the C++ compiler {cxx!r} does not run ({exc})") from exc
    return out.stdout.splitlines()[0] if out.stdout else cxx


def build_key() -> str:
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update((_here() / name).read_bytes())
    for part in (_compiler(), torch.__version__, _cpu_fingerprint(),
                 " ".join((*FLAGS, *tuning_flags()))):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


KERNELS_ENV = paths.KERNELS_ENV
TORCH_BATON = "lock"  # torch.utils.cpp_extension's mark of a build in progress, in the folder


def build_folder(cache_dir: Path | str | None = None) -> Path:
    """This machine's build: paths.kernels_dir()/<build_key()> (cache_dir is not used: the
    kernels are shared by every model cache and data folder)."""
    return paths.kernels_dir() / build_key()


def _build(cache_dir: Path) -> None:
    global _built
    from filelock import FileLock
    from torch.utils.cpp_extension import load

    folder = build_folder(cache_dir)
    _built = folder.name
    folder.mkdir(parents=True, exist_ok=True)
    # torch runs `ninja` from PATH: the one installed with ragspec sits beside this Python
    bins = [str(Path(sys.executable).parent)]
    try:
        import ninja

        bins.insert(0, str(ninja.BIN_DIR))
    except (ImportError, AttributeError):
        pass
    os.environ["PATH"] = os.pathsep.join([*bins, os.environ.get("PATH", "")])
    with FileLock(str(folder) + ".lock"):
        # torch marks a build in progress with a file named "lock" in the folder and waits, without
        # end, while it exists; a build that was killed (Ctrl-C in a first run, a timeout) leaves it
        # behind, and every later run would wait forever. Builds here run only under the FileLock
        # we hold, which its holder's death releases, so such a file is always a dead build's.
        (folder / TORCH_BATON).unlink(missing_ok=True)
        load(name=NAME, sources=[str(_here() / s) for s in SOURCES],
             extra_cflags=[*FLAGS, *tuning_flags()],
             extra_ldflags=["-fopenmp"], extra_include_paths=[str(_here())],
             build_directory=str(folder),
             is_python_module=False, verbose=False)


def ops(cache_dir: Path | str):
    """torch.ops.ragspec with the kernels loaded (built into cache_dir on first use)."""
    global _loaded, _reason
    with _lock:
        if not _loaded:
            if _reason is not None:
                raise KernelsUnavailable(_reason)
            try:
                _build(Path(cache_dir))
            except KernelsUnavailable as exc:
                _reason = str(exc)
                raise
            except (OSError, RuntimeError, subprocess.SubprocessError, ImportError) as exc:
                first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                _reason = f"the CPU kernels did not build ({type(exc).__name__}: {first[:200]})"
                raise KernelsUnavailable(_reason) from exc
            _loaded = True
    return torch.ops.ragspec


def needs_build(cache_dir: Path | str) -> bool:
    """True when the kernels are not loaded and not yet built for this machine in cache_dir
    (the next `ops` call compiles them)."""
    if _loaded or _reason is not None:
        return False
    try:
        folder = build_folder(cache_dir)
    except KernelsUnavailable:
        return False
    return not any(folder.glob(f"{NAME}*.so"))


def available(cache_dir: Path | str) -> bool:
    try:
        ops(cache_dir)
    except KernelsUnavailable:
        return False
    return True


def unavailable_reason() -> str | None:
    return _reason


def loaded() -> bool:
    """True once the kernels are loaded in this process (ops can be called directly)."""
    return _loaded


def loaded_build() -> str | None:
    """The build key of the kernels loaded in this process (None before they are): what a
    measurement of their speed is valid for (ragspec.decoding.calibrate keys its curves by it)."""
    return _built if _loaded else None
