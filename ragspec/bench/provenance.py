"""Where a measurement came from: the commit of the checkout and the machine, in words.

Contract: `commit()` is the checkout's short commit, with "+changes" when tracked files differ
from it ("unknown" outside a git checkout or without git). `machine()` names the CPU: model
name, family and model, whether it runs under a hypervisor, cores, and the instruction-set
flags the kernels choose by. Both are what a results file's "commit" and "machine" say (the
benchmarks/ scripts through benchmarks/record.py, `ragspec bench --sessions` directly).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ragspec import cpuinfo

KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


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
