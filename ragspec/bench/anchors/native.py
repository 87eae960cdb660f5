"""The natively built anchors (ragspec.bench.anchors.build) measured on a GGUF file: forward costs
through anchor-probe, and each engine's own benchmark tool, llama-bench.

Contract: `measure(engine, gguf, context, max_tokens, rounds, threads)` runs the engine's
anchor-probe (a process of its own, linked against that engine's library) and returns what
ragspec.bench.engine returns for every engine: load seconds, resident memory that loading and a
first prefill added, the faster of two prefills of `context` tokens (one llama_decode call) and
c(k) for k = 1..max_tokens — one llama_decode over k new tokens after the `context` cached
ones with logits for all k positions and their argmax read back (what a speculative verify
needs; ragspec's c(k) computes the same), the k new tokens then dropped from the cache —
timed inside the probe, sizes interleaved in shuffled rounds and the low quantile kept
(ragspec.decoding.calibrate's method, the same function as for ragspec). ik_llama.cpp runs
with its run-time repacking, as its users run it on a CPU (`-rtr 1`).

`llama_bench(engine, gguf, threads, prompt, generate)` runs the engine's llama-bench
(`-t THREADS -p PROMPT -n GENERATE -o json`, `-rtr 1` for ik_llama.cpp) and returns its
prompt-processing and generation rates (tokens/s, mean and deviation over its repetitions).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from ragspec.bench.anchors import build as anchor_build

NATIVE_ENGINES = ("llama.cpp", "ik_llama.cpp")
REPACK = {"llama.cpp": False, "ik_llama.cpp": True}  # ik_llama.cpp's -rtr 1


class AnchorMissing(RuntimeError):
    pass


def manifest_of(engine: str) -> dict:
    manifest = anchor_build.load(engine)
    if manifest is None:
        raise AnchorMissing(f"{engine} is " + anchor_build.MISSING.format(name=engine))
    return manifest


class Probe:
    """anchor-probe on one file: one command in, one line out (see anchor_probe.cpp)."""

    def __init__(self, binary: Path, gguf: Path, threads: int, context: int, max_tokens: int,
                 repack: bool):
        # The engine logs hundreds of kB while loading: into a file, since a pipe nobody reads
        # fills up and stops the probe before it says "ready".
        self._log = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            [str(binary), str(gguf), str(threads), str(context), str(max_tokens),
             "1" if repack else "0"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
            bufsize=1)
        ready = self._line().split()
        if len(ready) != 3 or ready[0] != "ready":
            raise RuntimeError(f"anchor-probe on {gguf.name}: {self._why()}")
        self.load_s, self.rss_before_mb = float(ready[1]), float(ready[2])

    def _line(self) -> str:
        return self._proc.stdout.readline().strip()

    def _why(self) -> str:
        self._proc.kill()
        self._proc.wait()
        self._log.seek(0)
        err = self._log.read().strip().splitlines()
        return (err or [f"exit status {self._proc.wait()}"])[-1][:300]

    def ask(self, command: str) -> str:
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        answer = self._line()
        if not answer:
            raise RuntimeError(f"anchor-probe stopped at {command!r}: {self._why()}")
        return answer

    def seconds(self, command: str) -> float:
        value = float(self.ask(command))
        if value < 0:
            raise RuntimeError(f"anchor-probe could not run {command!r}")
        return value

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write("quit\n")
                self._proc.stdin.flush()
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
        self._log.close()


def measure(engine: str, gguf: Path, context: int, max_tokens: int, rounds: int,
            threads: int) -> dict:
    from ragspec.decoding.calibrate import QUANTILE, interleaved, quantile

    manifest = manifest_of(engine)
    probe = Probe(Path(manifest["bin"]) / "anchor-probe", Path(gguf), threads, context,
                  max_tokens, REPACK[engine])
    try:
        prefills = [probe.seconds("prefill") for _ in range(2)]
        rss = float(probe.ask("rss")) - probe.rss_before_mb
        samples = interleaved(list(range(1, max_tokens + 1)),
                              lambda k: probe.seconds(f"step {k}"), rounds)
        info = probe.ask("info")
    finally:
        probe.close()
    return {"load_s": probe.load_s, "rss_mb": rss, "prefill_s": min(prefills),
            "c": [quantile(samples[k], QUANTILE) for k in range(1, max_tokens + 1)],
            "system_info": info, "repack": REPACK[engine],
            "build": anchor_build.describe(manifest)}


def llama_bench(engine: str, gguf: Path, threads: int, prompt: int = 512,
                generate: int = 64, timeout: float = 1800) -> dict:
    """llama-bench's own pp/tg figures for one file (tokens/s)."""
    manifest = manifest_of(engine)
    argv = [str(Path(manifest["bin"]) / "llama-bench"), "-m", str(gguf), "-t", str(threads),
            "-p", str(prompt), "-n", str(generate), "-o", "json"]
    if REPACK[engine]:
        argv += ["-rtr", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"llama-bench ({engine}) on {gguf.name}: "
                           + (proc.stderr.strip().splitlines() or ["no output"])[-1][:300])
    rows = parse_llama_bench(proc.stdout)
    out = {"engine": engine, "argv": argv[1:], "build": anchor_build.describe(manifest)}
    for row in rows:
        kind = "pp" if row.get("n_gen", 0) == 0 else "tg"
        n = row.get("n_prompt") if kind == "pp" else row.get("n_gen")
        out[f"{kind}{n}"] = {"tokens_per_s": row.get("avg_ts"), "stddev": row.get("stddev_ts")}
        out.setdefault("cpu_info", row.get("cpu_info"))
        out.setdefault("type", row.get("model_type"))
    return out


def parse_llama_bench(stdout: str) -> list[dict]:
    """llama-bench's `-o json` output: a JSON array, possibly after log lines."""
    start = stdout.find("[")
    if start < 0:
        raise RuntimeError("llama-bench printed no JSON")
    return json.loads(stdout[start:])
