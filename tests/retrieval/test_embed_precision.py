"""The embedder's compute precision: bf16 on a CPU with native bf16 instructions (auto), fp32
elsewhere or when asked; bf16 vectors are float32 unit vectors within the stated cosine of fp32's,
and a bad setting is refused before anything loads.

The vector tests use a tiny randomly initialised BERT (the bundled tokenizer, 2 layers of 32); one
slow test checks the bundled all-MiniLM-L6-v2 on real passages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fakes import tiny_sentence_transformer

from ragspec import cpuinfo as cpu_facts
from ragspec.retrieval.embeddings import precision as embed_precision
from ragspec.retrieval.embeddings.embedder import Embedder
from ragspec.retrieval.errors import EmbedderUnavailableError

REPO = Path(__file__).resolve().parents[2]
REAL_PDF = Path("/usr/share/doc/libtasn1-doc/libtasn1.pdf")
TEXTS = ["a", "scheduling of jobs", "the quick brown fox jumps over the lazy dog " * 6,
         "Larkspur retries failed jobs three times", ""]


def cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: a CPU\nflags\t\t: {flags}\n\n"
                    f"processor\t: 1\nflags\t\t: {flags} avx512_bf16\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("flags, want", [
    ("fpu sse2 avx2 avx512f avx512_bf16", "bf16"),
    ("fpu avx2 amx_tile amx_bf16 amx_int8", "bf16"),
    ("fpu avx2 avx512f avx512_vnni", "fp32"),       # no native bf16: emulated would be slow
    ("fpu avx2 avx512_bf16x", "fp32"),              # whole flag names only
])
def test_auto_takes_bf16_only_where_the_first_cpu_names_native_bf16(tmp_path, flags, want):
    info = cpuinfo(tmp_path, flags)
    assert cpu_facts.has_native_bf16(info) is (want == "bf16")
    for value in (None, "", "auto", " AUTO "):
        assert embed_precision.choose(value, "cpu", info) == want
    assert embed_precision.choose("fp32", "cpu", info) == "fp32"
    assert embed_precision.choose("bf16", "cpu", info) == "bf16"


def test_a_gpu_or_an_unreadable_cpuinfo_keeps_fp32(tmp_path):
    info = cpuinfo(tmp_path, "avx512_bf16 amx_bf16")
    for value in ("auto", "bf16", "fp32"):
        assert embed_precision.choose(value, "cuda", info) == "fp32"
    assert embed_precision.choose("auto", "cpu", tmp_path / "missing") == "fp32"


def test_a_bad_setting_is_refused_before_the_model_loads(monkeypatch):
    with pytest.raises(EmbedderUnavailableError,
                       match="RAGSPEC_EMBEDDER_DTYPE must be one of auto, fp32, bf16"):
        Embedder("/nonexistent-model", dtype="fp16")
    monkeypatch.setenv(embed_precision.ENV_VAR, "half")
    with pytest.raises(EmbedderUnavailableError, match="got 'half'"):
        Embedder("/nonexistent-model")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return tiny_sentence_transformer(tmp_path_factory.mktemp("tiny-embedder"))


def near_but_not_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    assert (got * want).sum(axis=1).min() >= embed_precision.TOLERANCE_COSINE
    assert np.abs(got - want).max() > 1e-5  # computed in bf16: not the fp32 forward renamed


def test_bf16_vectors_are_unit_float32_near_fp32_for_passages_and_queries(tiny_folder,
                                                                         monkeypatch):
    monkeypatch.delenv(embed_precision.ENV_VAR, raising=False)
    fp32 = Embedder(str(tiny_folder), onnx=False, dtype="fp32")
    bf16 = Embedder(str(tiny_folder), onnx=False, dtype="bf16")
    assert (fp32.precision, bf16.precision) == ("fp32", "bf16")
    want = fp32.embed_array(TEXTS)
    near_but_not_equal(bf16.embed_array(TEXTS), want)
    near_but_not_equal(np.asarray([bf16.embed_query(TEXTS[3])], dtype=np.float32), want[3:4])
    again = bf16.embed_array(TEXTS)
    embed_precision.compute_in_bf16(bf16.model)  # a second wrapping changes nothing
    assert np.array_equal(bf16.embed_array(TEXTS), again)
    assert np.array_equal(fp32.embed_array(TEXTS), want)  # the fp32 model is untouched


def test_auto_follows_the_cpu_and_does_not_try_onnxruntime_where_bf16_runs(
        tiny_folder, tmp_path, monkeypatch):
    from ragspec.retrieval.embeddings.onnx_model import OnnxEncoder

    monkeypatch.setenv("RAGSPEC_EMBEDDER_ONNX", "auto")
    monkeypatch.setenv("RAGSPEC_MODEL_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_facts, "CPUINFO", cpuinfo(tmp_path, "avx2 amx_bf16"))
    monkeypatch.setattr(OnnxEncoder, "load", lambda *a, **k: pytest.fail("tried onnxruntime"))
    embedder = Embedder(str(tiny_folder))
    assert (embedder.precision, embedder.backend) == ("bf16", "sentence-transformers")
    assert embedder.embed_array(TEXTS).shape == (len(TEXTS), 32)
    monkeypatch.setattr(cpu_facts, "CPUINFO", cpuinfo(tmp_path, "avx2 avx512_vnni"))
    assert Embedder(str(tiny_folder), onnx=False).precision == "fp32"


@pytest.mark.slow
def test_bundled_model_bf16_vectors_are_near_fp32_on_real_passages():
    from ragspec.retrieval.passages import split_documents
    from ragspec.retrieval.readers.loaders import load_file

    fp32 = Embedder(onnx=False, dtype="fp32")
    source = REAL_PDF if REAL_PDF.is_file() else REPO / "data" / "corpus" / "operations-guide.pdf"
    texts = [d.text for d in split_documents(load_file(source), fp32)]
    texts = sorted(texts, key=len)[:: max(1, len(texts) // 32)][:32]  # short to the longest
    assert max(fp32.count_tokens(t) for t in texts) > 150
    got = Embedder(onnx=False, dtype="bf16").embed_array(texts)
    want = fp32.embed_array(texts)
    near_but_not_equal(got, want)
    # Measured 0.99995 on libtasn1's manual; a bf16 pooling or normalisation gives less.
    assert (got * want).sum(axis=1).min() > 0.9995
