"""What a benchmark run needs before it starts: the model, the corpus ingested, and every
question's prompt as the product builds it (`ragspec ask`'s pipeline).

Contract: `build_setup` raises ragspec.models.load.ModelNotFound, retrieval's RetrievalError
and BenchInputError; a corpus file or a question that fails is listed in Setup.failures and the
rest go on.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ragspec.bench.questions import BenchInputError, Prepared, Question

ANCHOR_CONTEXT = 4096  # tokens of context for the llama.cpp methods (prompt + answer)


@dataclass
class Setup:
    """What a benchmark run needs: the generator and each question's prompt (tests inject it)."""

    model_name: str
    device: str
    generator: object  # ragspec.decoding.engine.Generator
    prepared: list[Prepared] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    anchors: object = None  # ragspec.bench.anchors.llamacpp.LlamaCppAnchors, or None
    stock_model: object = None  # the fp32 model hf_greedy runs beside a packed one, or None
    servers: object = None  # ragspec.bench.anchors.llama_server.LlamaServers (running), or None

    def close(self) -> None:
        """Stop what the setup started (the llama-server processes)."""
        if self.servers is not None:
            self.servers.close()


def build_setup(model: str | None, corpus: str, index: str | None,
                questions: Sequence[Question], max_new_tokens: int,
                log: Callable[[str], None] = lambda message: None,
                llamacpp: bool | None = None, weights: str = "auto",
                methods: Sequence[str] | None = None, llama_server: bool | None = None,
                trim: int | None = None) -> Setup:
    """Load the model, ingest `corpus` (into a temporary index, or into `index`, where unchanged
    files are skipped) and build every question's prompt with the real pipeline.

    llamacpp: run the llama.cpp methods too (None: when llama_cpp is installed and the model
    came from a GGUF file). llama_server: start llama-server for its methods in `methods` (all
    of them when None), the same default. Raises ragspec.models.load.ModelNotFound and
    retrieval's RetrievalError; a corpus file or a question that fails is listed in
    Setup.failures and the rest go on. The caller stops the servers: Setup.close()."""
    from ragspec.loading import describe_device, load_generator, open_store, timing_prompt_cache

    # the forward-cost lines say whether this run drafts by a measured curve or the stand-in
    loaded, generator = load_generator(model, weights=weights, on_note=log,
                                       prompt_cache_bytes=timing_prompt_cache())
    stock = None
    wants_hf = methods is None or any(m.startswith("hf_") for m in methods)
    if loaded.weights not in ("fp32", "bf16") and wants_hf:
        from ragspec.loading import model_cache_dir
        from ragspec.models.load import load_model

        log("Loading the de-quantised fp32 model for the transformers baselines ...")
        stock = load_model(model, model_cache_dir(), weights="fp32").model
    # llama.cpp's prompt-lookup context keeps float32 logits for every position it may hold
    # (n_ctx x vocabulary: 0.8 GB at 4096 for SmolLM2), so it gets the room a RAG prompt needs
    n_ctx = min(generator.context_length, ANCHOR_CONTEXT)
    anchors = _open_anchors(model, llamacpp, n_ctx, log)
    with tempfile.TemporaryDirectory(prefix="ragspec-bench-") as scratch:
        store = open_store(index or scratch)
        log(f"Ingesting {corpus} ...")
        failures = ingest_corpus(store, corpus)
        prepared = prepare_prompts(generator, store, questions, max_new_tokens, failures,
                                   trim=trim)
    servers = open_servers(model, llama_server, n_ctx, methods, log)
    return Setup(loaded.name, describe_device(loaded), generator, prepared, failures, anchors,
                 stock, servers)


def _gguf_of(model: str | None) -> Path | None:
    """The GGUF file the model comes from, or None (a folder or a hub id)."""
    from ragspec.models.load import BUNDLED, bundled_gguf_path

    if model in (None, "", BUNDLED):
        return bundled_gguf_path()
    if str(model).lower().endswith(".gguf"):
        return Path(model).expanduser()
    return None


def open_servers(model: str | None, wanted: bool | None, n_ctx: int,
                  methods: Sequence[str] | None, log):
    from ragspec.bench.anchors import build as anchor_build
    from ragspec.bench.anchors.llama_server import SERVER_METHODS, LlamaServers

    chosen = [m for m in SERVER_METHODS if methods is None or m in methods
              or (m == "llama_server" and any(x in SERVER_METHODS for x in methods))]
    if wanted is False or not chosen:
        return None
    manifest = anchor_build.load("llama.cpp")
    gguf = _gguf_of(model)
    if manifest is None or gguf is None:
        if wanted or (methods is not None and any(m in SERVER_METHODS for m in methods)):
            raise BenchInputError(
                "llama-server is " + anchor_build.MISSING.format(name="llama.cpp")
                if manifest is None else f"the llama-server methods need a GGUF file; "
                                         f"{model} is not one")
        return None
    log(f"Starting llama-server ({', '.join(chosen)}) on {gguf}: "
        + anchor_build.describe(manifest))
    return LlamaServers.open(gguf, n_ctx, chosen, manifest=manifest)


def ingest_corpus(store, corpus: str) -> list[str]:
    """Ingest the folder `corpus` into `store`; the files that failed, each with its reason.
    Raises BenchInputError when no passage could be made at all."""
    from ragspec.retrieval.ingest import ingest_paths

    report = ingest_paths([corpus], store)
    if store.passage_count() == 0:
        raise BenchInputError(f"no passages could be made from {corpus}: nothing to "
                              "retrieve (give a folder of .md/.txt/.pdf/.html/.docx)")
    return [f"corpus file {path}: {why}" for path, why in report.failed]


def _open_anchors(model: str | None, wanted: bool | None, n_ctx: int, log):
    from ragspec.bench.anchors import llamacpp as bench_llamacpp

    if wanted is False or (wanted is None and not bench_llamacpp.available()):
        return None
    if not bench_llamacpp.available():
        raise BenchInputError("llama_cpp is not installed: `make bench-anchors` installs "
                              "llama-cpp-python (a source build, ~10 minutes)")
    gguf = _gguf_of(model)
    if gguf is None:
        if wanted:
            raise BenchInputError(f"the llama.cpp methods need a GGUF file; {model} is not one")
        return None
    log(f"llama.cpp anchors on {gguf}")
    return bench_llamacpp.LlamaCppAnchors.open(gguf, n_ctx)


def prepare_prompts(generator, store, questions: Sequence[Question], max_new_tokens: int,
                    failures: list[str], k: int = 4, trim: int | None = None) -> list[Prepared]:
    """Each question's prompt as `ragspec ask` builds it (k passages, room for the answer,
    each passage cut to `trim` prompt tokens: None is the product's default, 0 whole);
    a question whose prompt cannot be built is appended to `failures`."""
    from ragspec.pipeline import NoDocumentsError, Pipeline, PipelineConfig
    from ragspec.retrieval.errors import RetrievalError

    config = PipelineConfig(k=k, max_new_tokens=max_new_tokens)
    pipe = Pipeline(store, generator,
                    config if trim is None else replace(config, trim=trim))
    prepared = []
    for q in questions:
        try:
            p = pipe.prepare(q.question)
        except (RetrievalError, NoDocumentsError, ValueError) as exc:
            failures.append(f"question {q.id}: {exc}")
            continue
        prepared.append(Prepared(q, list(p.prompt_ids), tuple(p.sources)))
    return prepared
