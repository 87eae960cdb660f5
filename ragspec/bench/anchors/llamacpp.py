"""llama.cpp as a benchmark anchor: what a CPU user runs today (directly, or through Ollama).

Methods (greedy, same GGUF file, same prompt token ids, same stop tokens, same clock):
    llamacpp      llama-cpp-python's own generation loop with a greedy sampler;
    llamacpp_pld  the same with its prompt-lookup drafter (LlamaPromptLookupDecoding, 10 tokens).

Contract: `LlamaCppAnchors.open(gguf, n_ctx)` returns None when llama_cpp is not importable (it
is a benchmark extra: `make bench-anchors`), so a benchmark without it runs the other methods.
Each run starts from an empty KV cache (`reset()`): llama-cpp-python would otherwise reuse the
cached prefix of the previous, identical prompt and skip the prefill it is timed on.
`compiled_for` lists the instruction sets the installed llama.cpp was built for (its own system
info), so that every result says which build it measured.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Sequence
from pathlib import Path

LLAMACPP_METHODS = ("llamacpp", "llamacpp_pld")
PLD_TOKENS = 10


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


class LlamaCppAnchors:
    """Two llama.cpp contexts over one GGUF file: plain greedy, and with prompt lookup."""

    def __init__(self, llms: dict, path: Path, threads: int,
                 compiled_for: list[str] | None = None):
        self._llms = llms
        self.path = path
        self.threads = threads
        self.compiled_for = compiled_for or []

    @classmethod
    def open(cls, gguf: str | os.PathLike, n_ctx: int, threads: int | None = None,
             pld_tokens: int = PLD_TOKENS) -> LlamaCppAnchors | None:
        if not available():
            return None
        import llama_cpp
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from ragspec.bench.anchors.llama_build import compiled_features

        threads = threads or len(os.sched_getaffinity(0))
        common = dict(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads,
                      n_threads_batch=threads, verbose=False)
        llms = {
            "llamacpp": Llama(**common),
            # The drafter needs the logits of every position; asked for at construction, the
            # logits buffer gets one row per context position (else one per batch, and a
            # generation past n_batch tokens fails).
            "llamacpp_pld": Llama(**common, logits_all=True,
                                  draft_model=LlamaPromptLookupDecoding(
                                      num_pred_tokens=pld_tokens)),
        }
        info = getattr(llama_cpp, "llama_print_system_info", None)
        features = compiled_features(info().decode()) if info else {}
        return cls(llms, Path(gguf), threads, [name for name, on in features.items() if on])

    def generate(self, method: str, prompt_ids: Sequence[int], max_new_tokens: int,
                 eos_ids: set[int], stop=None) -> tuple[list[int], float, float]:
        """(token ids, seconds, seconds to the first token) of one greedy generation; `stop`
        (token -> bool) ends it after the token it returns True for (the repetition rule)."""
        llm = self._llms[method]
        llm.reset()  # no prefix reuse from the previous run (see the module docstring)
        tokens: list[int] = []
        start = time.perf_counter()
        ttft = None
        for token in llm.generate(list(prompt_ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                  repeat_penalty=1.0, reset=True):
            if ttft is None:
                ttft = time.perf_counter() - start
            tokens.append(int(token))
            if token in eos_ids or (stop is not None and stop(int(token))) \
                    or len(tokens) >= max_new_tokens:
                break
        seconds = time.perf_counter() - start
        return tokens, seconds, ttft if ttft is not None else seconds
