"""What this machine's CPU can do, read from /proc/cpuinfo: facts, never timings.

Contract: `field(name, cpuinfo)` is the value of `name` for the first processor (None where
there is no such file, as on macOS or Windows, or no such field); `flags(cpuinfo)` is the set
of flags the first processor lists (empty where there is no x86 `flags` line: ARM says
"Features"); `ram_bytes()` is the physical memory; `has_native_bf16(cpuinfo)` says whether they name an
instruction set that multiplies bfloat16 natively (avx512_bf16, amx_bf16: what oneDNN uses for
torch's bf16 matrix products). `cpuinfo` defaults to CPUINFO, read at each call (tests point it
at a file of their own).

Choices that change a result's bits (the prefill's precision, the embedder's) are made from
these facts and not from a timing: a timing taken while the machine is busy can go either way,
and the same model would then answer a question differently after a restart.
"""

from __future__ import annotations

import os
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
NATIVE_BF16 = ("avx512_bf16", "amx_bf16")


def field(name: str, cpuinfo: Path | None = None) -> str | None:
    """The value of `name` for the first processor in `cpuinfo` (default: CPUINFO)."""
    try:
        text = (cpuinfo or CPUINFO).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return None


def flags(cpuinfo: Path | None = None) -> frozenset[str]:
    """The flags of the first processor in `cpuinfo` (default: CPUINFO)."""
    return frozenset((field("flags", cpuinfo) or "").split())


def has_native_bf16(cpuinfo: Path | None = None) -> bool:
    """Whether the CPU multiplies bfloat16 natively (see the module docstring)."""
    return not flags(cpuinfo).isdisjoint(NATIVE_BF16)


def ram_bytes() -> int:
    """The machine's physical memory in bytes (8 GiB where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30
