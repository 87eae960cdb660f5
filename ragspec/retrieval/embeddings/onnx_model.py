"""A sentence-transformers text model with its transformer run by onnxruntime (CPU).

Contract: `OnnxEncoder.load(model, folder, cache_dir)` takes a loaded `SentenceTransformer` (on
the CPU) and the folder it was loaded from, and returns an encoder whose `encode(texts,
batch_size)` gives the vectors `model.encode(texts, normalize_embeddings=True)` gives, to within
float rounding (TOLERANCE, checked on a probe batch at every load), or raises `OnnxUnavailable`
with a reason a user can read. Only the transformer's forward (word-piece ids -> one vector per
word piece, nearly all of the time) runs in onnxruntime; the words are cut by the model's own
`preprocess` and pooled and normalised by the model's own modules after the transformer, so
whatever pooling the folder names is kept.

The ONNX file is made once, from the model folder on disk (torch.onnx's exporter: no network),
and kept at `<cache_dir>/<digest>.onnx`; the digest covers every file of the model folder and the
versions of the exporter (torch, onnx, opset, this module's FORMAT), so another model, changed
weights or another exporter make a new file. It is written beside its final name and renamed
(a crash leaves no half file under that name), and a lock file makes a second process wait for
the first one's export and reuse it. A file that does not load, or loads but disagrees with
the torch model on the probe batch (damaged on disk), is removed and made again, once.

Whether it pays differs between machines (measured on a 2-core Xeon with AVX-512, torch 2.13's
forward took 0.75x the CPU time of onnxruntime's; elsewhere onnxruntime was 1.7-2x faster), so
`speedup(batch_size)` measures it once per machine: the CPU time (all threads) of both forwards
on 32 fixed passages of ~220 word pieces in batches of the size the embedder uses (torch gains
much more from larger batches than onnxruntime: at 8 onnxruntime was 1.4-1.6x faster here, at 32
0.8x), best of two rounds each, kept beside the ONNX file under a key of this CPU's model and
flags, the thread count, the batch size and both engines' versions.

int8 (`build="int8"`): the same graph with the weights of its 36 weight matrix products stored
as int8, one scale per output column, the activations quantised per batch as they come
(onnxruntime.quantization's dynamic quantisation; the integer products use VNNI where the CPU has
it). benchmarks/embed_speed.py measures it; the embedder does not offer it (on the 2-core Xeon it
was short of MIN_SPEEDUP at ingest's batch of 32 and moved recall@5 by more than 0.02 on one
question set: docs/documents-and-search.md, "The embedder in onnxruntime"). Its vectors are near torch's, not equal: on the probe batch every
vector's cosine to torch's must be at least INT8_MIN_COSINE, checked at every load (measured:
>= 0.98 on real passages), and since a batch's activations share one scale, a text's vector
depends a little on the batch it came in. It is made from the fp32 file and kept at
`<cache_dir>/<digest>.int8-<q>.onnx` (<q>: onnxruntime's version and INT8_FORMAT), written and
renamed as the fp32 file is, under the same lock; a file that fails the check is made again
once, with the fp32 file it came from.

Threads: onnxruntime uses as many threads within an operator as torch does
(`torch.get_num_threads()`, 2 on a 2-core machine), one between operators; with
OMP_WAIT_POLICY=PASSIVE its idle threads sleep instead of spinning, as torch's do.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ragspec.fileio import write_atomically

logger = logging.getLogger(__name__)

OPSET = 17
FORMAT = 1  # bump when the exported graph or its inputs change
TOLERANCE = 1e-5  # largest |difference| of a unit vector's entries on the probe batch
BUILDS = ("fp32", "int8")
INT8_FORMAT = 1  # bump when the quantisation settings change
INT8_MIN_COSINE = 0.97  # smallest cosine of an int8 vector of the probe batch to torch's
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
# Three lengths, so the probe batch is padded: a graph that ignored the mask would fail it.
PROBE = (
    "ragspec",
    "Passages are embedded in batches sorted by length, each padded to its longest passage.",
    "Word pieces past the model's limit are cut off.",
)


# The timed passages: 32 of ~220 word pieces, about what a PDF's passages are (median 188 in
# libtasn1's manual, most near the limit of 256).
SPEED_BATCH = (" ".join(PROBE) + " ") * 5
SPEED_ROUNDS = 2


def cpu_key(threads: int) -> str:
    """This CPU (model name and flags), the thread count and both engines' versions."""
    lines = []
    try:
        lines = [line for line in open("/proc/cpuinfo", encoding="utf-8", errors="replace")
                 if line.startswith(("model name", "flags"))][:2]
    except OSError:
        pass
    text = "".join(lines) + f"{platform.machine()} threads {threads} torch {version('torch')} " \
                            f"onnxruntime {version('onnxruntime')} {SPEED_BATCH}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class OnnxUnavailable(RuntimeError):
    """onnxruntime cannot run this model here; the message says why."""


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def folder_digest(folder: Path) -> str:
    """sha256 over every file of the model folder (relative path and bytes) and the exporter."""
    digest = hashlib.sha256(f"format {FORMAT} opset {OPSET} torch {version('torch')} "
                            f"onnx {version('onnx')}\n".encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as data:
            for block in iter(lambda: data.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:32]


def onnx_file(folder: Path, cache_dir: Path, build: str = "fp32") -> Path:
    """Where the exported (fp32) or quantised (int8) graph of the model in `folder` is kept."""
    if build not in BUILDS:
        raise ValueError(f"build must be one of {BUILDS}, got {build!r}")
    digest = folder_digest(folder)
    if build == "fp32":
        return cache_dir / f"{digest}.onnx"
    quantiser = hashlib.sha256(f"onnxruntime {version('onnxruntime')} int8 "
                               f"{INT8_FORMAT}".encode()).hexdigest()[:8]
    return cache_dir / f"{digest}.int8-{quantiser}.onnx"


def quantise(source: Path, target: Path) -> None:
    """Write `source`'s graph to `target` with its weight matrix products in int8 (dynamic)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(source), load_external_data=False).graph
    stored = {tensor.name for tensor in graph.initializer}
    # Products of two activations (attention scores) stay fp32: only stored weights are int8.
    activations = [node.name for node in graph.node
                   if node.op_type == "MatMul" and not stored.intersection(node.input)]
    quiet = logging.getLogger()  # its advice on pre-processing goes to the root logger
    hush = _Hush()
    quiet.addFilter(hush)
    try:
        quantize_dynamic(str(source), str(target), per_channel=True,
                         weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                         nodes_to_exclude=activations)
    finally:
        quiet.removeFilter(hush)


class _Hush(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def _input_names(model) -> list[str]:
    """The transformer's tensor inputs, as the model's own preprocess hands them over."""
    features = model.preprocess(list(PROBE[:2]))
    names = [name for name in INPUT_NAMES if name in features]
    if names[:2] != ["input_ids", "attention_mask"]:
        raise OnnxUnavailable(f"the model's inputs are {sorted(features)}, not word-piece ids "
                              "with an attention mask")
    return names


def _check_model(model) -> None:
    from sentence_transformers.base.modules.transformer import Transformer

    first = model[0]
    config = getattr(first, "modality_config", {}).get("text", {})
    if not isinstance(first, Transformer) or config.get("method") != "forward" \
            or config.get("method_output_name") != "last_hidden_state" \
            or first.module_output_name != "token_embeddings":
        raise OnnxUnavailable("its first module is not a plain transformer over text")
    if model.device.type != "cpu":
        raise OnnxUnavailable(f"it runs on {model.device.type}; onnxruntime here runs on the CPU")


def export(model, names: list[str], target: Path) -> None:
    """Write the transformer's forward (ids -> last hidden state) to `target` as ONNX."""
    import torch

    class Hidden(torch.nn.Module):
        def __init__(self, bert) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, *tensors):
            return self.bert(**dict(zip(names, tensors, strict=True)), return_dict=True).last_hidden_state

    features = model.preprocess(list(PROBE))  # padded: the traced graph keeps the mask
    sample = tuple(features[name] for name in names)
    axes = {name: {0: "batch", 1: "pieces"} for name in [*names, "hidden"]}
    with warnings.catch_warnings():
        # The exporter's notes on tracing (shape checks taken as constants, the legacy exporter)
        # are for its users' models; ours is checked against torch on every load instead.
        warnings.simplefilter("ignore")
        torch.onnx.export(Hidden(model[0].auto_model).eval(), sample, str(target),
                          input_names=names, output_names=["hidden"], dynamic_axes=axes,
                          opset_version=OPSET, dynamo=False)


def _speed_record(path: Path, threads: int, batch_size: int) -> Path:
    return path.with_name(f"{path.stem}.speed-{cpu_key(threads)}-b{batch_size}.json")


def _read_speedup(record: Path) -> float | None:
    try:
        return float(json.loads(record.read_text())["speedup"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


class OnnxEncoder:
    """The model's transformer in an onnxruntime session; see the module docstring."""

    def __init__(self, model, session, names: list[str], path: Path, threads: int = 1,
                 build: str = "fp32") -> None:
        self.model, self.session, self.names, self.path = model, session, names, path
        self.threads, self.build = threads, build

    @classmethod
    def load(cls, model, folder: str | os.PathLike, cache_dir: str | os.PathLike,
             threads: int | None = None, build: str = "fp32") -> OnnxEncoder:
        try:
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            raise OnnxUnavailable(f"onnxruntime is not installed ({exc})") from exc
        folder, cache_dir = Path(folder), Path(cache_dir)
        if not folder.is_dir():
            raise OnnxUnavailable(f"{folder} is not a model folder on disk")
        _check_model(model)
        names = _input_names(model)
        cache_dir.mkdir(parents=True, exist_ok=True)
        fp32 = onnx_file(folder, cache_dir)
        path = onnx_file(folder, cache_dir, build)
        from filelock import FileLock

        with FileLock(str(fp32) + ".lock", timeout=900):
            for attempt in (0, 1):
                if not fp32.exists():
                    cls._write(fp32, lambda built: export(model, names, built), "ONNX export")
                if not path.exists():
                    cls._write(path, lambda built: quantise(fp32, built), "int8 quantisation")
                try:
                    threads = threads or _torch_threads()
                    encoder = cls(model, cls._session(path, threads), names, path, threads,
                                  build)
                    encoder.check()
                    return encoder
                except Exception as exc:  # noqa: BLE001 - onnxruntime's errors have no common base
                    if attempt:
                        raise OnnxUnavailable(f"the exported model does not run ({exc})") from exc
                    logger.info("ONNX file %s is damaged (%s): exporting it again", path, exc)
                    path.unlink(missing_ok=True)
                    fp32.unlink(missing_ok=True)  # an int8 file is only as good as its source
        raise AssertionError("unreachable")

    @staticmethod
    def _write(path: Path, make, what: str) -> None:
        """`make(built)` writes a file beside `path`; it is synced and renamed to `path`."""
        work = Path(tempfile.mkdtemp(prefix=".export-", dir=path.parent))
        try:
            built = work / path.name
            try:
                make(built)
            except Exception as exc:  # noqa: BLE001 - the exporter raises many kinds
                raise OnnxUnavailable(f"the {what} failed ({type(exc).__name__}: "
                                      f"{exc})") from exc
            if sorted(p.name for p in work.iterdir()) != [path.name]:
                raise OnnxUnavailable("the model is too large for one ONNX file")
            with open(built, "rb+") as out:
                os.fsync(out.fileno())
            os.replace(built, path)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    @staticmethod
    def _session(path: Path, threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3  # errors only: its warnings are about graph rewrites
        if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    @staticmethod
    def recorded_speedup(folder: str | os.PathLike, cache_dir: str | os.PathLike,
                         batch_size: int = 32, threads: int | None = None) -> float | None:
        """What `speedup` measured for this model folder here before, None if nothing (no
        session is opened: a machine where torch won pays only for hashing the folder)."""
        path = onnx_file(Path(folder), Path(cache_dir))
        return _read_speedup(_speed_record(path, threads or _torch_threads(), batch_size))

    def speedup(self, batch_size: int = 32) -> float:
        """CPU time of torch's forward over onnxruntime's on this machine at this batch size
        (> 1: onnxruntime is faster), measured on the first call and read back after that."""
        record = _speed_record(self.path, self.threads, batch_size)
        known = _read_speedup(record)
        if known is not None:
            return known
        import torch

        texts = [SPEED_BATCH] * 32

        def cpu_seconds(run) -> float:
            run()  # warm: first calls allocate
            best = float("inf")
            for _ in range(SPEED_ROUNDS):
                start = time.process_time()
                run()
                best = min(best, time.process_time() - start)
            return best

        with torch.inference_mode():
            torch_s = cpu_seconds(lambda: self.model.encode(texts, batch_size=batch_size,
                                                            show_progress_bar=False))
        onnx_s = cpu_seconds(lambda: self.encode(texts, batch_size))
        measured = {"speedup": torch_s / onnx_s, "torch_cpu_s": torch_s, "onnx_cpu_s": onnx_s,
                    "threads": self.threads, "batch_size": batch_size, "passages": len(texts)}
        write_atomically(record, json.dumps(measured))
        return measured["speedup"]

    def check(self) -> None:
        """Raise ValueError when this session's vectors of the probe batch are not torch's
        (fp32: to TOLERANCE; int8: to a cosine of INT8_MIN_COSINE)."""
        want = self.model.encode(list(PROBE), normalize_embeddings=True, convert_to_numpy=True,
                                 show_progress_bar=False)
        got = self.encode(PROBE)
        if self.build == "int8":
            cosine = float((got * want).sum(axis=1).min())
            if not cosine >= INT8_MIN_COSINE:
                raise ValueError(f"its vectors' cosine to torch's is as low as {cosine:.4f}")
            return
        worst = float(np.abs(got - want).max())
        if not worst <= TOLERANCE:
            raise ValueError(f"its vectors differ from torch's by {worst:.2e}")

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Unit vectors, (len(texts), dim) float32; batches taken longest first, as
        sentence-transformers does, and put back in the order given."""
        import torch

        order = np.argsort([-len(text) for text in texts], kind="stable")
        rows: list[np.ndarray] = []
        with torch.inference_mode():
            for first in range(0, len(order), batch_size):
                batch = [texts[i] for i in order[first : first + batch_size]]
                features = self.model.preprocess(batch)
                feed = {name: features[name].numpy().astype(np.int64, copy=False)
                        for name in self.names}
                [hidden] = self.session.run(["hidden"], feed)
                features["token_embeddings"] = torch.from_numpy(hidden)
                for module in list(self.model)[1:]:
                    features = module(features)
                vectors = torch.nn.functional.normalize(features["sentence_embedding"], p=2, dim=1)
                rows.append(vectors.numpy())
        out = np.empty((len(texts), rows[0].shape[1]), dtype=np.float32)
        out[order] = np.concatenate(rows)
        return out
