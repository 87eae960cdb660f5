"""Where a measurement came from: the commit of the checkout and the machine, in words.

Contract: `commit()` is the checkout's short commit, with "+changes" when tracked files differ
from it ("unknown" outside a git checkout or without git). `machine()` names the CPU: model
name, family and model, whether it runs under a hypervisor, cores, and the instruction-set
flags the kernels choose by. Both are what a results file's "commit" and "machine" say (the
benchmarks/ scripts through benchmarks/record.py, `ragspec bench --sessions` directly).
`settings()` lists the environment variables the run was started with that change how fast it
goes (OpenMP's, the BLAS libraries', ragspec's own; secrets left out): what a results file's
"environment" says, empty where every default held. Started with: on Linux the process's
environment as it began (/proc/self/environ), not what imported libraries set for themselves
afterwards (joblib sets KMP_* variables on import); elsewhere os.environ.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ragspec import cpuinfo

KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
# Variables that can change a measurement's speed. OMP_WAIT_POLICY=PASSIVE (idle OpenMP threads
# sleep between parallel regions instead of spinning first) made a 550-token int8 prompt read of
# the bundled model take ~1.18x as long on the 2-core Xeon (family 6 model 167), and torch's bf16
# reads 1.2-1.7x: a figure taken with it set is another figure.
SPEED_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "RAGSPEC_")
SECRET_WORDS = ("TOKEN", "KEY", "AUTH", "SECRET", "PASSWORD")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, check=False,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def commit() -> str:
    head = _git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if head != "unknown" and _git(
        "status", "--porcelain", "--untracked-files=no") else "")


def machine() -> str:
    flags = cpuinfo.flags()
    have = [f for f in KERNEL_FLAGS if f in flags]
    hypervisor = " under a hypervisor" if "hypervisor" in flags else ""
    return (f"{cpuinfo.field('model name') or 'unknown CPU'} (family {cpuinfo.field('cpu family')} "
            f"model {cpuinfo.field('model')}){hypervisor}, {os.cpu_count()} cores, "
            f"{' '.join(have) or 'no AVX2'}")


def started_with() -> dict[str, str]:
    """The environment this process began with (os.environ where /proc cannot tell)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return dict(os.environ)
    pairs = (item.decode("utf-8", "replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}


def settings(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The speed-changing variables set in `environ` (default: started_with()), sorted by name."""
    env = started_with() if environ is None else environ
    return {name: env[name] for name in sorted(env)
            if name.startswith(SPEED_PREFIXES) and not any(w in name for w in SECRET_WORDS)}
