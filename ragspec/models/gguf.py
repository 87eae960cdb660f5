"""GGUF files into the model cache: checked, converted once, keyed by their content.

Contract: `gguf_folder(path, cache_dir)` returns (folder, converted_now): a transformers model
folder (fp32 safetensors, config, tokenizer, generation config) holding the de-quantised
weights of the GGUF file at `path`. `gguf_folder(..., packed=True)` makes instead the folder
of a packed model (ragspec.models.packed_cache): config, tokenizer and generation config, and the
weights in the file's own formats (`packed.safetensors`), never de-quantised as a whole. The folder is named after the sha256 of the file's bytes, so
a changed file is converted again and two copies of one file share one conversion. A file
transformers cannot read raises GGUFError with one line saying why: not a GGUF file (damaged
or truncated), an architecture or a quantisation type transformers does not de-quantise.

Hashing a multi-GB file takes seconds, so the hash is remembered per (path, size, mtime) in
`gguf-hashes.json`; a later load only stats the file. Conversion takes a file lock per target:
a second process asking for the same file waits, then finds the folder made; each converter
writes into its own temporary folder and renames it into place, so a crash or a concurrent run
never leaves or deletes a half-written folder.

A conversion reads the file's header once (`parsed_once`): transformers builds the tokenizer and
the config from a GGUF file by parsing it again each time, and the packed weights need a third
parse, each walking every vocabulary entry (a third of the bundled model's conversion), and it
maps tensor names per module (another third).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ragspec.fileio import WriteFailed, write_atomically

HASHES_FILE = "gguf-hashes.json"
_CHUNK = 8 << 20
_PROGRESS_BYTES = 256 << 20  # files at least this large show a progress bar while hashing


class GGUFError(ValueError):
    """A GGUF file that cannot be converted; the message says which file and why."""


def is_converted(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


# "-tiled": packed folders made since weights are stored tiled (an older folder is converted again)
PACKED_SUFFIX = "-packed-tiled"


def _hash_file(path: Path) -> str:
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=f"Hashing {path.name}",
                                     disable=size < _PROGRESS_BYTES) as bar:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def _memo(cache_dir: Path) -> dict:
    try:
        memo = json.loads((Path(cache_dir) / HASHES_FILE).read_text())
    except (OSError, ValueError):
        return {}  # no memo yet, or a damaged one: it only saves time, so start afresh
    return memo if isinstance(memo, dict) else {}


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def remembered_hash(path: Path, cache_dir: Path) -> str | None:
    """The file's sha256 if it was hashed before and has not changed since (size, mtime)."""
    path = Path(path).resolve()
    entry = _memo(cache_dir).get(str(path))
    if isinstance(entry, dict) and entry.get("stamp") == _stamp(path):
        sha = entry.get("sha256")
        return sha if isinstance(sha, str) else None
    return None


def content_hash(path: Path, cache_dir: Path) -> str:
    """sha256 of the file's bytes, remembered per (real path, size, mtime) in cache_dir."""
    path = Path(path).resolve()
    sha = remembered_hash(path, cache_dir)
    if sha is not None:
        return sha
    stamp = _stamp(path)
    sha = _hash_file(path)
    memo = _memo(cache_dir)
    memo[str(path)] = {"stamp": stamp, "sha256": sha}
    memo_path = Path(cache_dir) / HASHES_FILE
    memo_path.parent.mkdir(parents=True, exist_ok=True)
    # atomic; two writers at once only lose each other's memo entry
    write_atomically(memo_path, json.dumps(memo, indent=1))
    return sha


def target_folder(sha: str, cache_dir: Path, packed: bool = False) -> Path:
    return Path(cache_dir) / f"gguf-{sha[:24]}{PACKED_SUFFIX if packed else ''}"


def is_ready(path: Path, cache_dir: Path, packed: bool = False) -> bool:
    """True when the file is known (unchanged since hashed) and its folder is converted; only
    stats the file."""
    sha = remembered_hash(path, cache_dir)
    return sha is not None and is_converted(target_folder(sha, cache_dir, packed))


def _text_field(reader, key: str) -> str | None:
    field = reader.fields.get(key)
    return None if field is None else bytes(field.parts[field.data[0]]).decode("utf-8")


def _check_tokenizer(path: Path, arch: str, tokenizer: str | None) -> None:
    """The file must describe a tokenizer transformers can rebuild (ragspec needs the text)."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import select_tokenizer_builder
    except ImportError:
        return  # another transformers layout: conversion itself will say what is wrong
    try:
        select_tokenizer_builder(arch, tokenizer)
    except ValueError as exc:
        raise GGUFError(f"{path}: its tokenizer ({tokenizer or 'none in the file'}) cannot be "
                        f"rebuilt by transformers: {exc}") from exc


def check_gguf(path: Path) -> str:
    """The file's architecture, after checking that transformers can read and de-quantise it."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        reader = GGUFReader(path)
        arch = _text_field(reader, "general.architecture")
        tokenizer = _text_field(reader, "tokenizer.ggml.model")
    except (ValueError, OSError, IndexError, TypeError, struct.error, UnicodeDecodeError) as exc:
        raise GGUFError(
            f"{path}: not a readable GGUF file, damaged or truncated ({exc.__class__.__name__}: "
            f"{str(exc)[:120]})"
        ) from exc
    if arch is None:
        raise GGUFError(f"{path}: a GGUF file without general.architecture; it cannot be read")
    readable = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]
    if arch not in readable:
        raise GGUFError(
            f"{path}: GGUF architecture {arch!r} is not one transformers can read "
            f"(it reads {', '.join(readable)})"
        )
    _check_quantisation(path, reader)
    _check_tokenizer(path, arch, tokenizer)
    return arch


def _check_quantisation(path: Path, reader) -> None:
    """Every tensor type in the file must be one gguf can de-quantise."""
    from gguf.quants import dequantize

    first_of_type = {}
    for tensor in reader.tensors:
        first_of_type.setdefault(tensor.tensor_type, tensor)
    unreadable = set()
    for qtype, tensor in first_of_type.items():
        try:
            dequantize(tensor.data[:1], qtype)  # one row: proves the type can be de-quantised
        except NotImplementedError:
            unreadable.add(qtype.name)
    if unreadable:
        raise GGUFError(
            f"{path}: quantisation type {', '.join(sorted(unreadable))} cannot be de-quantised "
            f"by transformers/gguf; use a file quantised as Q4_0, Q4_K, Q8_0, F16 or similar"
        )


def _save_dequantised(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained while it still carries the gguf quantizer;
    # its weights are already plain fp32 tensors, so dropping the marker is enough.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    model.generation_config.save_pretrained(out)


def _save_packed(gguf: Path, out: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from ragspec.models import packed_cache as packing

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    model = packing.meta_model(out)
    packing.save(packing.gguf_entries(gguf, model), out / packing.PACKED_FILE)


def make_locked(target: Path, make: Callable[[Path], None],
                announce: Callable[[], None] | None = None) -> bool:
    """Make the folder `target` with make(folder) unless it exists; True when this call made it.
    Under a file lock beside it; the folder is built under a temporary name and renamed, so
    readers see no folder or a whole one. announce() is called once the work really starts."""
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.with_name(target.name + ".lock"))):
        if is_converted(target):
            return False  # another process made it while this one waited
        # Inside the lock only this process makes `target`: leftovers are from a crash.
        for stale in target.parent.glob(target.name + ".partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = target.with_name(f"{target.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        tmp.mkdir()
        if announce is not None:
            announce()
        try:
            make(tmp)
            if target.exists():
                shutil.rmtree(target)  # an incomplete folder from an older run
            tmp.rename(target)  # atomic
        except OSError as exc:  # a full disk, a read-only cache: one line naming the folder
            raise WriteFailed(target, exc) from exc
        except Exception as exc:
            code = _os_code(exc)
            if code is None:
                raise
            raise WriteFailed(target, OSError(code, os.strerror(code))) from exc
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return True


def _os_code(exc: Exception) -> int | None:
    """The errno a library written in Rust (safetensors) reports only as text
    ("IoError(Os { code: 28, kind: StorageFull, ... })"), or None."""
    found = re.search(r"Os \{ code: (\d+)", str(exc))
    return int(found.group(1)) if found else None


_once_lock = threading.RLock()


@contextmanager
def parsed_once() -> Iterator[None]:
    """While open (one thread at a time), `gguf.GGUFReader(path)` gives one reader per file and
    `gguf.get_tensor_name_map(arch, blocks)` one map per pair, to every caller that imports them
    from the `gguf` package at call time (transformers' GGUF loading does, as ragspec's): the
    same values, read or built once. Readers are read-only memory maps; the maps are only
    looked up."""
    import functools

    import gguf as package

    with _once_lock:
        make_reader, make_map = package.GGUFReader, package.get_tensor_name_map
        readers: dict = {}

        def reader(path, mode: str = "r"):
            key = (str(Path(path).resolve()), mode)
            if key not in readers:
                readers[key] = make_reader(path, mode)
            return readers[key]

        package.GGUFReader, package.get_tensor_name_map = reader, functools.cache(make_map)
        try:
            yield
        finally:
            package.GGUFReader, package.get_tensor_name_map = make_reader, make_map


def convert_locked(gguf: Path, target: Path, on_convert: Callable[[Path], None] | None = None,
                   packed: bool = False) -> bool:
    """Make `target` from `gguf` unless it exists; True when this call converted it.
    on_convert(gguf) is called once the conversion really starts (to tell the user).
    packed: make a packed model's folder rather than a de-quantised one."""
    save = _save_packed if packed else _save_dequantised

    def make(out: Path) -> None:
        with parsed_once():
            save(gguf, out)

    return make_locked(target, make, None if on_convert is None else lambda: on_convert(gguf))


def gguf_folder(path: Path | str, cache_dir: Path | str,
                on_convert: Callable[[Path], None] | None = None, packed: bool = False
                ) -> tuple[Path, bool]:
    """(converted folder, converted by this call) for a GGUF file; see the module docstring.
    on_convert and packed as for convert_locked."""
    path, cache_dir = Path(path), Path(cache_dir)
    target = target_folder(content_hash(path, cache_dir), cache_dir, packed)
    if is_converted(target):
        return target, False
    check_gguf(path)
    try:
        return target, convert_locked(path, target, on_convert, packed)
    except (ValueError, KeyError, NotImplementedError, OSError) as exc:
        # transformers reports an architecture it maps but cannot build, a tokenizer it cannot
        # rebuild, or a tensor it cannot place with these exception types; say which file.
        raise GGUFError(f"{path}: transformers could not convert this GGUF file "
                        f"({exc.__class__.__name__}: {str(exc)[:200]})") from exc
