"""The GGUF models Ollama and LM Studio keep on this machine, as `--model` specs.

Contract:
  * `local_gguf(spec)` is the GGUF file a spec names, or None when the spec is not one of these:
      - "ollama:NAME[:TAG]" (TAG defaults to "latest"): the manifest
        $OLLAMA_MODELS/manifests/<host>/<namespace>/<name>/<tag> (OLLAMA_MODELS defaults to
        ~/.ollama/models; a bare NAME is registry.ollama.ai/library/NAME, "user/name" is
        registry.ollama.ai/user/name, "host/ns/name" is taken as written) lists layers; the
        one of media type application/vnd.ollama.image.model is the blob
        blobs/sha256-<hex>, a GGUF file;
      - "lmstudio:NAME": a folder publisher/model under ~/.lmstudio/models or
        ~/.cache/lm-studio/models whose NAME is "model", "publisher/model", or either followed
        by "/FILE.gguf" when the folder holds several (vision projectors, mmproj-*.gguf, are
        not models and never chosen).
    A spec that names nothing here raises LocalModelError with what it looked for, and one whose
    manifest has no model layer (a vision projector alone) says so.
  * `linked_gguf(spec, cache_dir)` is `local_gguf` as a `.gguf` path the loader takes: a symbolic
    link in cache_dir/linked to the file where the tool keeps it (never a copy: these files are
    gigabytes).
  * `discover()` lists every model both tools hold (`LocalModel`: spec, path, size), and
    `describe(path)` reads a GGUF header for its architecture, quantisation and name.
Reads files only; never starts or asks the tools themselves.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

OLLAMA, LMSTUDIO = "ollama:", "lmstudio:"
MODEL_LAYER = "application/vnd.ollama.image.model"
_DEFAULT_HOST = "registry.ollama.ai"
_PROJECTOR = re.compile(r"mmproj", re.IGNORECASE)


class LocalModelError(Exception):
    """A spec for Ollama or LM Studio that names nothing ragspec can load; the message says why."""


@dataclass(frozen=True)
class LocalModel:
    spec: str  # what --model takes
    path: Path  # the GGUF file, where the tool keeps it
    size: int  # bytes

    def __post_init__(self) -> None:
        if not self.spec.startswith((OLLAMA, LMSTUDIO)) or self.size < 0:
            raise ValueError(f"not a local model spec: {self.spec!r} ({self.size} bytes)")


def is_local_spec(spec: str | None) -> bool:
    return bool(spec) and spec.startswith((OLLAMA, LMSTUDIO))


def ollama_root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def lmstudio_roots() -> list[Path]:
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def local_gguf(spec: str | None) -> Path | None:
    if not is_local_spec(spec):
        return None
    if spec.startswith(OLLAMA):
        return _ollama_blob(spec[len(OLLAMA):])
    return _lmstudio_file(spec[len(LMSTUDIO):])


def linked_gguf(spec: str | None, cache_dir: Path) -> str | None:
    target = local_gguf(spec)
    if target is None:
        return None
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", spec.replace(":", "-", 1)).strip("-")
    link = Path(cache_dir) / "linked" / f"{name}.gguf"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not (link.is_symlink() and link.resolve() == target.resolve()):
        tmp = link.with_name(link.name + f".{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target.resolve())
        os.replace(tmp, link)  # atomic: a concurrent load sees the old link or the new one
    return str(link)


# -- Ollama ---------------------------------------------------------------------------------------

def _manifest_path(name: str) -> Path:
    base, _, tag = name.partition(":")
    if not base or "/" in tag or ".." in base.split("/"):
        raise LocalModelError(f"ollama:{name}: expected ollama:NAME or ollama:NAME:TAG")
    parts = base.split("/")
    if len(parts) == 1:
        parts = [_DEFAULT_HOST, "library", *parts]
    elif len(parts) == 2:
        parts = [_DEFAULT_HOST, *parts]
    return ollama_root() / "manifests" / Path(*parts) / (tag or "latest")


def _ollama_blob(name: str) -> Path:
    manifest = _manifest_path(name)
    if not manifest.is_file():
        raise LocalModelError(
            f"ollama:{name}: no manifest at {manifest}; `ollama list` shows the models Ollama "
            f"has (set OLLAMA_MODELS if they live elsewhere)")
    try:
        layers = json.loads(manifest.read_text("utf-8")).get("layers") or []
        kinds = [str(layer.get("mediaType", "")) for layer in layers]
        digests = [str(layer.get("digest", "")) for layer in layers if
                   layer.get("mediaType") == MODEL_LAYER]
    except (OSError, ValueError, AttributeError) as exc:
        raise LocalModelError(f"ollama:{name}: unreadable manifest {manifest} ({exc})") from exc
    if not digests:
        held = ", ".join(k.rsplit(".", 1)[-1] for k in kinds) or "nothing"
        raise LocalModelError(
            f"ollama:{name}: the manifest has no language-model layer (it holds: {held}); "
            "ragspec runs language models")
    digest = digests[0]
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise LocalModelError(f"ollama:{name}: the model layer's digest {digest!r} is malformed")
    blob = ollama_root() / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise LocalModelError(f"ollama:{name}: its model blob {blob} is missing; `ollama pull` it "
                              "again")
    return blob


def _ollama_models() -> list[LocalModel]:
    root = ollama_root() / "manifests"
    found = []
    for manifest in sorted(p for p in root.glob("*/*/*/*") if p.is_file()):
        host, namespace, name, tag = manifest.relative_to(root).parts
        short = name if (host, namespace) == (_DEFAULT_HOST, "library") else (
            f"{namespace}/{name}" if host == _DEFAULT_HOST else f"{host}/{namespace}/{name}")
        spec = f"{OLLAMA}{short}:{tag}"
        try:
            blob = _ollama_blob(spec[len(OLLAMA):])
        except LocalModelError:
            blob = None
        found.append(LocalModel(spec, blob or manifest, blob.stat().st_size if blob else 0))
    return found


# -- LM Studio ------------------------------------------------------------------------------------

def _lmstudio_candidates() -> list[tuple[str, Path]]:
    """("publisher/model", GGUF file) for every model file in LM Studio's folders."""
    out = []
    for root in lmstudio_roots():
        for path in sorted(root.glob("*/*/*.gguf")):
            if path.is_file() and not _PROJECTOR.search(path.name):
                out.append((f"{path.parent.parent.name}/{path.parent.name}", path))
    return out


def _lmstudio_file(name: str) -> Path:
    folder, file = name, ""
    if name.endswith(".gguf"):  # publisher/model/FILE.gguf or model/FILE.gguf
        folder, _, file = name.removesuffix(".gguf").rpartition("/")
    wanted = [(m, p) for m, p in _lmstudio_candidates()
              if folder in (m, m.split("/")[1]) and (not file or p.stem == file)]
    if not wanted:
        where = " or ".join(str(r) for r in lmstudio_roots())
        raise LocalModelError(f"lmstudio:{name}: no such model under {where} "
                              "(`ragspec models` lists the ones found)")
    if len(wanted) > 1:
        choices = ", ".join(f"lmstudio:{m}/{p.name}" for m, p in wanted)
        raise LocalModelError(f"lmstudio:{name} holds several files; name one: {choices}")
    return wanted[0][1]


def _lmstudio_models() -> list[LocalModel]:
    return [LocalModel(f"{LMSTUDIO}{m}/{p.name}", p, p.stat().st_size)
            for m, p in _lmstudio_candidates()]


def discover() -> list[LocalModel]:
    return _ollama_models() + _lmstudio_models()


def describe(path: Path) -> dict:
    """{"architecture", "quantisation", "name"} from the GGUF header (None where absent);
    raises LocalModelError for a file that is not a readable GGUF. Reads the metadata only
    (gguf's GGUFReader also builds every vocabulary array: seconds for one file), skipping
    arrays without decoding them."""
    from gguf import GGMLQuantizationType, LlamaFileType

    try:
        with path.open("rb") as f:
            values, tensor_types = _read_header(f)
    except (OSError, ValueError, struct.error) as exc:
        raise LocalModelError(f"{path}: not a readable GGUF file ({exc})") from exc
    file_type = values.get("general.file_type")
    if isinstance(file_type, int):
        try:
            quant = LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except ValueError:
            quant = f"type {file_type}"
    elif tensor_types:  # older files: the type most tensors have
        common = max(set(tensor_types), key=tensor_types.count)
        try:
            quant = GGMLQuantizationType(common).name
        except ValueError:
            quant = f"type {common}"
    else:
        quant = None
    return {"architecture": values.get("general.architecture"), "quantisation": quant,
            "name": values.get("general.name")}


# GGUF value types: struct format of the scalars; 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_STRING = 1 << 20  # a key or a scalar string; longer is a damaged file
_MAX_ITEMS = 1 << 28


def _read_header(f) -> tuple[dict, list[int]]:
    """(scalar metadata by key, tensor types) of a GGUF v2/v3 file; arrays are skipped."""
    if f.read(4) != b"GGUF":
        raise ValueError("no GGUF magic")
    version, tensors, kvs = struct.unpack("<IQQ", f.read(20))
    if version < 2 or kvs > _MAX_ITEMS or tensors > _MAX_ITEMS:
        raise ValueError(f"unsupported GGUF version {version}" if version < 2 else "damaged")

    def string() -> bytes:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > _MAX_STRING:
            f.seek(n, 1)
            return b""
        return f.read(n)

    def value(kind: int):
        if kind in _SCALARS:
            fmt = _SCALARS[kind]
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
        if kind == _STRING:
            return string().decode("utf-8", "replace")
        if kind == _ARRAY:
            item, count = struct.unpack("<IQ", f.read(12))
            if count > _MAX_ITEMS:
                raise ValueError("damaged array")
            if item in _SCALARS:
                f.seek(struct.calcsize(_SCALARS[item]) * count, 1)
            else:
                for _ in range(count):
                    value(item)
            return None
        raise ValueError(f"unknown value type {kind}")

    values = {}
    for _ in range(kvs):
        key = string().decode("utf-8", "replace")
        (kind,) = struct.unpack("<I", f.read(4))
        values[key] = value(kind)
    types = []
    for _ in range(tensors):
        string()
        (dims,) = struct.unpack("<I", f.read(4))
        f.seek(8 * dims, 1)
        kind, _offset = struct.unpack("<IQ", f.read(12))
        types.append(kind)
    return values, types
