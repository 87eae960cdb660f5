"""/proc/cpuinfo as four kinds of machine report it, for the build-flag tests."""

from __future__ import annotations

from pathlib import Path

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
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 " \
      "atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp\n"


def cpuinfo(tmp_path: Path, cpu: str) -> Path:
    """A cpuinfo file of two processors of kind `cpu` (a key of CPUS, or "arm")."""
    path = tmp_path / f"{cpu}.cpuinfo"
    if cpu == "arm":
        path.write_text(ARM + "\n" + ARM.replace(": 0", ": 1", 1))
        return path
    cores = [f"processor\t: {n}\nvendor_id\t: x\nmodel name\t: {cpu} test CPU\n"
             f"flags\t\t: {CPUS[cpu]}\n" for n in range(2)]
    path.write_text("\n".join(cores))
    return path
