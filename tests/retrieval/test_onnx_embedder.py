"""The embedder's transformer in onnxruntime: the same vectors as sentence-transformers' torch
forward, the exported file made once and reused, a damaged, wrong or half-written file never used,
chosen by default only where it measured faster (once per machine), and torch's forward whenever
onnxruntime cannot run (one line says why).

The cache tests use a tiny randomly initialised BERT (the bundled tokenizer, 2 layers of 32): its
export takes about a second. One slow test checks the bundled all-MiniLM-L6-v2 on real text."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from fakes import tiny_sentence_transformer

from ragspec.retrieval.embeddings import onnx_model as onnx_embed
from ragspec.retrieval.embeddings.embedder import Embedder, bundled_model_dir
from ragspec.retrieval.embeddings.onnx_model import OnnxEncoder, OnnxUnavailable

REPO = Path(__file__).resolve().parents[2]
REAL_PDF = Path("/usr/share/doc/libtasn1-doc/libtasn1.pdf")
# Measured: 1.8e-7 on real passages of up to 256 word pieces (float rounding of the two
# engines' different operation orders); a graph with a wrong mask or position is off by > 1e-2.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return tiny_sentence_transformer(tmp_path_factory.mktemp("tiny-embedder"))


@pytest.fixture(scope="module")
def tiny_torch(tiny_folder):
    embedder = Embedder(str(tiny_folder), onnx=False, dtype="fp32")
    embedder.embed_array(["warm"])
    return embedder


TEXTS = ["a", "scheduling of jobs", "the quick brown fox jumps over the lazy dog " * 6,
         "Larkspur retries failed jobs three times", ""]


def load(tiny_torch, tiny_folder, cache: Path) -> OnnxEncoder:
    return OnnxEncoder.load(tiny_torch.model, tiny_folder, cache)


def test_tiny_model_vectors_equal_torch_vectors_in_any_batch(tiny_torch, tiny_folder, tmp_path):
    encoder = load(tiny_torch, tiny_folder, tmp_path)
    want = tiny_torch.embed_array(TEXTS)
    for size in (1, 2, 32):  # padded and unpadded batches, longer than the traced one
        assert np.abs(encoder.encode(TEXTS, size) - want).max() < TOLERANCE


def test_the_second_load_reuses_the_file_and_does_not_export(tiny_torch, tiny_folder, tmp_path,
                                                             monkeypatch):
    first = load(tiny_torch, tiny_folder, tmp_path)
    stamp = first.path.stat().st_mtime_ns

    def no_export(*args):
        raise AssertionError("exported again although the cached file is whole")

    monkeypatch.setattr(onnx_embed, "export", no_export)
    second = load(tiny_torch, tiny_folder, tmp_path)
    assert second.path == first.path and second.path.stat().st_mtime_ns == stamp
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".lock", ".onnx"]


def test_another_model_folder_content_gets_another_file(tiny_folder, tmp_path):
    import shutil

    copy = shutil.copytree(tiny_folder, tmp_path / "copy")
    assert onnx_embed.folder_digest(copy) == onnx_embed.folder_digest(tiny_folder)
    [weights] = copy.rglob("model.safetensors")
    changed = bytearray(weights.read_bytes())
    changed[-1] ^= 1  # one bit of one weight: same size, same names
    weights.write_bytes(bytes(changed))
    assert onnx_embed.folder_digest(copy) != onnx_embed.folder_digest(tiny_folder)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_cache_file_is_exported_again(tiny_torch, tiny_folder, tmp_path, monkeypatch,
                                                damage):
    path = load(tiny_torch, tiny_folder, tmp_path).path
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\0" * len(data))
    exports = []
    real_export = onnx_embed.export
    monkeypatch.setattr(onnx_embed, "export", lambda *a: (exports.append(a), real_export(*a)))
    encoder = load(tiny_torch, tiny_folder, tmp_path)
    assert len(exports) == 1 and encoder.path.stat().st_size > len(data) // 2
    assert np.abs(encoder.encode(TEXTS) - tiny_torch.embed_array(TEXTS)).max() < TOLERANCE


def export_another_model(tiny_torch, target: Path) -> None:
    """Export the tiny model with its word embeddings negated: another model's file."""
    import torch

    weight = tiny_torch.model[0].auto_model.embeddings.word_embeddings.weight
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.mul_(-1.0)
    try:
        onnx_embed.export(tiny_torch.model, ["input_ids", "attention_mask", "token_type_ids"],
                          target)
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def test_a_cache_file_that_loads_but_gives_other_vectors_is_exported_again(
        tiny_torch, tiny_folder, tmp_path, monkeypatch):
    path = load(tiny_torch, tiny_folder, tmp_path).path
    export_another_model(tiny_torch, path)  # another model's file under this model's name
    exports = []
    real_export = onnx_embed.export
    monkeypatch.setattr(onnx_embed, "export", lambda *a: (exports.append(a), real_export(*a)))
    encoder = load(tiny_torch, tiny_folder, tmp_path)
    assert len(exports) == 1
    assert np.abs(encoder.encode(TEXTS) - tiny_torch.embed_array(TEXTS)).max() < TOLERANCE


def test_an_export_that_dies_leaves_no_file_behind(tiny_torch, tiny_folder, tmp_path, monkeypatch):
    def dies_halfway(model, names, target):
        target.write_bytes(b"half of an onnx file")
        raise KeyboardInterrupt

    monkeypatch.setattr(onnx_embed, "export", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        load(tiny_torch, tiny_folder, tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def fresh(tiny_torch, tiny_folder, monkeypatch, tmp_path, **kwargs) -> Embedder:
    monkeypatch.setenv("RAGSPEC_MODEL_CACHE", str(tmp_path))
    embedder = Embedder(str(tiny_folder), **{"dtype": "fp32", **kwargs})
    embedder._model = tiny_torch.model  # the loaded model, not a second copy
    return embedder


def test_the_switch_on_uses_onnxruntime_for_passages_and_queries(tiny_torch, tiny_folder,
                                                                  tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSPEC_EMBEDDER_ONNX", "1")
    monkeypatch.setattr(OnnxEncoder, "speedup", lambda *a: pytest.fail("measured: forced on"))
    embedder = fresh(tiny_torch, tiny_folder, monkeypatch, tmp_path)
    assert embedder.backend == "onnxruntime"
    assert list((tmp_path / "embedders").glob("*.onnx"))
    assert np.abs(embedder.embed_array(TEXTS) - tiny_torch.embed_array(TEXTS)).max() < TOLERANCE
    assert np.allclose(embedder.embed_query(TEXTS[1]), tiny_torch.embed_array(TEXTS[1:2])[0],
                       atol=TOLERANCE)


def test_the_speed_is_measured_once_per_machine_and_read_back(tiny_torch, tiny_folder, tmp_path,
                                                              monkeypatch):
    encoder = load(tiny_torch, tiny_folder, tmp_path)
    speedup = encoder.speedup(32)
    [record] = tmp_path.glob("*.speed-*-b32.json")
    assert speedup > 0 and json.loads(record.read_text())["speedup"] == speedup
    monkeypatch.setattr(onnx_embed.time, "process_time", lambda: pytest.fail("measured again"))
    assert load(tiny_torch, tiny_folder, tmp_path).speedup(32) == speedup
    for other in (lambda: encoder.speedup(8), lambda: (
            monkeypatch.setattr(onnx_embed, "cpu_key", lambda threads: "another-machine"),
            encoder.speedup(32))):
        with pytest.raises(pytest.fail.Exception, match="measured again"):
            other()


@pytest.mark.parametrize("speedup, backend", [(0.7, "sentence-transformers"),
                                              (1.7, "onnxruntime")])
def test_auto_uses_onnxruntime_only_where_it_measured_faster(
        tiny_torch, tiny_folder, tmp_path, monkeypatch, speedup, backend):
    monkeypatch.setenv("RAGSPEC_EMBEDDER_ONNX", "auto")
    monkeypatch.setattr(OnnxEncoder, "speedup", lambda self, batch_size: speedup)
    embedder = fresh(tiny_torch, tiny_folder, monkeypatch, tmp_path)
    assert embedder.backend == backend
    assert np.abs(embedder.embed_array(TEXTS) - tiny_torch.embed_array(TEXTS)).max() < TOLERANCE


def test_where_torch_measured_faster_a_later_load_opens_no_session(tiny_torch, tiny_folder,
                                                                   tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSPEC_EMBEDDER_ONNX", "auto")
    monkeypatch.setattr(OnnxEncoder, "speedup", lambda self, batch_size: 0.7)
    assert fresh(tiny_torch, tiny_folder, monkeypatch, tmp_path).backend == "sentence-transformers"
    [path] = (tmp_path / "embedders").glob("*.onnx")
    onnx_embed._speed_record(path, onnx_embed._torch_threads(), 32).write_text('{"speedup": 0.7}')
    monkeypatch.setattr(OnnxEncoder, "load", lambda *a, **k: pytest.fail("opened a session"))
    assert fresh(tiny_torch, tiny_folder, monkeypatch, tmp_path).backend == "sentence-transformers"


@pytest.mark.parametrize("how", ["unset", "env", "option"])
def test_the_switch_keeps_torch_and_exports_nothing(tiny_torch, tiny_folder, tmp_path,
                                                    monkeypatch, how):
    monkeypatch.delenv("RAGSPEC_EMBEDDER_ONNX", raising=False)
    if how == "env":
        monkeypatch.setenv("RAGSPEC_EMBEDDER_ONNX", "0")
    embedder = fresh(tiny_torch, tiny_folder, monkeypatch, tmp_path,
                     **({"onnx": False} if how == "option" else {}))
    monkeypatch.setattr(OnnxEncoder, "load", lambda *a, **k: pytest.fail("tried onnxruntime"))
    assert embedder.backend == "sentence-transformers"
    assert embedder.embed_array(TEXTS).shape == (len(TEXTS), 32)
    assert not (tmp_path / "embedders").exists()


def _no_export(*args):
    raise RuntimeError("Unsupported: aten::something")


@pytest.mark.parametrize("breakage", ["no onnxruntime", "export fails"])
def test_without_onnxruntime_or_export_the_embedder_uses_torch_and_says_so_once(
        tiny_torch, tiny_folder, tmp_path, monkeypatch, caplog, breakage):
    monkeypatch.setenv("RAGSPEC_EMBEDDER_ONNX", "1")
    if breakage == "no onnxruntime":
        monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import raises ImportError
    else:
        monkeypatch.setattr(onnx_embed, "export", _no_export)
    embedder = fresh(tiny_torch, tiny_folder, monkeypatch, tmp_path)
    with caplog.at_level(logging.WARNING, logger="ragspec.retrieval.embeddings.embedder"):
        got = embedder.embed_array(TEXTS)
        embedder.embed_array(TEXTS)
        assert embedder.backend == "sentence-transformers"
    assert np.array_equal(got, tiny_torch.embed_array(TEXTS))
    [line] = [r.getMessage() for r in caplog.records]
    assert "sentence-transformers" in line and "\n" not in line
    assert ("onnxruntime is not installed" if breakage == "no onnxruntime"
            else "export failed (RuntimeError: Unsupported") in line
    assert list((tmp_path / "embedders").glob("*.onnx")) == []


def test_a_model_that_is_not_a_plain_text_transformer_is_refused(tiny_torch, tiny_folder,
                                                                 tmp_path, monkeypatch):
    from sentence_transformers.base.modules.transformer import Transformer

    monkeypatch.setattr(tiny_torch.model[0], "module_output_name", "scores")
    assert isinstance(tiny_torch.model[0], Transformer)
    with pytest.raises(OnnxUnavailable, match="not a plain transformer"):
        load(tiny_torch, tiny_folder, tmp_path)


@pytest.mark.slow
def test_bundled_model_onnx_vectors_equal_torch_vectors_on_real_passages(tmp_path):
    from ragspec.retrieval.passages import split_documents
    from ragspec.retrieval.readers.loaders import load_file

    torch_embedder = Embedder(onnx=False, dtype="fp32")
    source = REAL_PDF if REAL_PDF.is_file() else REPO / "data" / "corpus" / "operations-guide.pdf"
    texts = [d.text for d in split_documents(load_file(source), torch_embedder)]
    texts = sorted(texts, key=len)[:: max(1, len(texts) // 24)][:24]  # short to the longest
    assert max(torch_embedder.count_tokens(t) for t in texts) > 150
    encoder = OnnxEncoder.load(torch_embedder.model, bundled_model_dir(), tmp_path)
    want = torch_embedder.embed_array(texts)
    got = encoder.encode(texts, 8)
    assert np.abs(got - want).max() < TOLERANCE
    assert (got * want).sum(axis=1).min() > 1 - 1e-6


# -- int8 (build="int8": measured by benchmarks/embed_speed.py, not an option of the embedder) ------

# Measured on the bundled model: cosine >= 0.987 to torch's on 96 real passages (libtasn1's
# manual); per-tensor scales (onnxruntime's default) gave 0.83, which the check must refuse.
INT8_MIN_COSINE = onnx_embed.INT8_MIN_COSINE


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got * want).sum(axis=1)


def test_int8_vectors_are_near_torch_but_not_equal(tiny_torch, tiny_folder, tmp_path):
    encoder = OnnxEncoder.load(tiny_torch.model, tiny_folder, tmp_path, build="int8")
    assert encoder.build == "int8" and ".int8-" in encoder.path.name
    assert encoder.path.stat().st_size < onnx_embed.onnx_file(tiny_folder, tmp_path).stat().st_size
    want = tiny_torch.embed_array(TEXTS)
    for size in (1, 32):
        got = encoder.encode(TEXTS, size)
        assert cosines(got, want).min() >= INT8_MIN_COSINE
        assert np.abs(got - want).max() > TOLERANCE  # quantised: not the fp32 graph renamed
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".lock") == sorted(
        [encoder.path.name, onnx_embed.onnx_file(tiny_folder, tmp_path).name])


def test_an_int8_file_that_gives_other_vectors_is_made_again(tiny_torch, tiny_folder, tmp_path,
                                                             monkeypatch):
    path = OnnxEncoder.load(tiny_torch.model, tiny_folder, tmp_path, build="int8").path
    other = tmp_path / "other" / "model.onnx"
    other.parent.mkdir()
    export_another_model(tiny_torch, other)
    onnx_embed.quantise(other, path)  # another model's int8 file under this model's name
    made = []
    real = onnx_embed.quantise
    monkeypatch.setattr(onnx_embed, "quantise", lambda *a: (made.append(a), real(*a)))
    encoder = OnnxEncoder.load(tiny_torch.model, tiny_folder, tmp_path, build="int8")
    assert len(made) == 1
    assert cosines(encoder.encode(TEXTS), tiny_torch.embed_array(TEXTS)).min() >= INT8_MIN_COSINE


@pytest.mark.slow
def test_bundled_model_int8_vectors_are_near_torch_vectors_on_real_passages(tmp_path):
    from ragspec.retrieval.passages import split_documents
    from ragspec.retrieval.readers.loaders import load_file

    torch_embedder = Embedder(onnx=False, dtype="fp32")
    source = REAL_PDF if REAL_PDF.is_file() else REPO / "data" / "corpus" / "operations-guide.pdf"
    texts = [d.text for d in split_documents(load_file(source), torch_embedder)]
    texts = sorted(texts, key=len)[:: max(1, len(texts) // 48)][:48]
    encoder = OnnxEncoder.load(torch_embedder.model, bundled_model_dir(), tmp_path, build="int8")
    got, want = encoder.encode(texts, 8), torch_embedder.embed_array(texts)
    assert cosines(got, want).min() >= INT8_MIN_COSINE
    assert cosines(got, want).mean() >= 0.99
