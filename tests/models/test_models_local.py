"""--model ollama:NAME[:TAG] and lmstudio:NAME, and `ragspec models`, on fake Ollama and LM Studio
folders built in a temporary home around the bundled GGUF (linked, as the tools keep blobs)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ragspec.models.load import ModelNotFound, bundled_gguf_path, load_model
from ragspec.models.local import (
    MODEL_LAYER,
    LocalModelError,
    describe,
    discover,
    linked_gguf,
    local_gguf,
)

_PROJECTOR = "application/vnd.ollama.image.projector"


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(2**20):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _add_ollama(root: Path, name: str, tag: str, layers: list[tuple[str, Path]],
                namespace: str = "library") -> None:
    manifest = {"schemaVersion": 2, "layers": []}
    for media_type, source in layers:
        digest = _digest(source)
        blob = root / "blobs" / digest.replace(":", "-")
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.symlink_to(source)
        manifest["layers"].append({"mediaType": media_type, "digest": digest,
                                   "size": source.stat().st_size})
    path = root / "manifests" / "registry.ollama.ai" / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))


def _tiny_gguf(path: Path, arch: str) -> Path:
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_file_type(1)  # MOSTLY_F16
    writer.add_tensor("w", np.zeros((4, 4), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def homes(tmp_path, monkeypatch):
    """A home with Ollama (OLLAMA_MODELS) and LM Studio folders holding the bundled model, a
    projector-only manifest and a model of an architecture ragspec cannot run."""
    home, ollama = tmp_path / "home", tmp_path / "ollama"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    bundled = bundled_gguf_path()
    projector = _tiny_gguf(tmp_path / "projector.gguf", "clip")
    odd = _tiny_gguf(tmp_path / "odd.gguf", "whisperish")
    _add_ollama(ollama, "smollm2", "135m", [(MODEL_LAYER, bundled)])
    _add_ollama(ollama, "eyes", "latest", [(_PROJECTOR, projector)])
    _add_ollama(ollama, "odd", "latest", [(MODEL_LAYER, odd)], namespace="someone")
    studio = home / ".lmstudio" / "models" / "HuggingFaceTB" / "SmolLM2-135M-Instruct-GGUF"
    studio.mkdir(parents=True)
    (studio / "SmolLM2-135M-Instruct.Q4_1.gguf").symlink_to(bundled)
    (studio / "mmproj-model-f16.gguf").symlink_to(projector)  # never taken for the model
    return tmp_path


def test_an_ollama_spec_is_the_model_layers_blob_and_the_tag_defaults_to_latest(homes):
    blob = local_gguf("ollama:smollm2:135m")
    assert blob.parent == homes / "ollama" / "blobs" and blob.name.startswith("sha256-")
    assert blob.resolve() == bundled_gguf_path().resolve()
    with pytest.raises(LocalModelError, match="no manifest at .*smollm2/latest"):
        local_gguf("ollama:smollm2")
    assert local_gguf("ollama:someone/odd").resolve() == (homes / "odd.gguf").resolve()


def test_a_manifest_without_a_model_layer_is_one_clear_line(homes):
    with pytest.raises(LocalModelError, match=r"no language-model layer \(it holds: projector\)"):
        local_gguf("ollama:eyes")


def test_an_lmstudio_spec_is_the_folders_model_file_not_its_projector(homes):
    for spec in ("lmstudio:SmolLM2-135M-Instruct-GGUF",
                 "lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",
                 "lmstudio:SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf"):
        assert local_gguf(spec).name == "SmolLM2-135M-Instruct.Q4_1.gguf", spec
    with pytest.raises(LocalModelError, match="no such model under"):
        local_gguf("lmstudio:nothing-here")


def test_the_loader_gets_a_link_to_the_file_where_it_lies_never_a_copy(homes):
    link = Path(linked_gguf("ollama:smollm2:135m", homes / "cache"))
    assert link.suffix == ".gguf" and link.is_symlink()
    assert link.resolve() == bundled_gguf_path().resolve()
    assert linked_gguf("/some/model.gguf", homes / "cache") is None  # other specs pass through
    with pytest.raises(ModelNotFound, match="ollama:missing: no manifest"):
        load_model("ollama:missing", homes / "cache")


def test_the_header_gives_quantisation_and_architecture():
    facts = describe(bundled_gguf_path())
    assert facts["architecture"] == "llama" and facts["quantisation"] == "Q4_1"


def test_ragspec_models_lists_both_tools_with_size_quantisation_and_what_cannot_run(homes, run):
    specs = {m.spec for m in discover()}
    assert specs == {"ollama:smollm2:135m", "ollama:eyes:latest", "ollama:someone/odd:latest",
                     "lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/"
                     "SmolLM2-135M-Instruct.Q4_1.gguf"}
    result = run("models", "--json")
    assert result.exit_code == 0, result.output
    rows = {r["spec"]: r for r in json.loads(result.output)}
    small = rows["ollama:smollm2:135m"]
    assert small["runs"] and small["quantisation"] == "Q4_1" and small["architecture"] == "llama"
    assert small["bytes"] == bundled_gguf_path().stat().st_size
    assert not rows["ollama:eyes:latest"]["runs"]
    assert "no language-model layer" in rows["ollama:eyes:latest"]["problem"]
    odd = rows["ollama:someone/odd:latest"]
    assert not odd["runs"] and "architecture 'whisperish'" in odd["problem"]
    text = run("models")
    line = next(s for s in text.output.splitlines() if s.startswith("ollama:smollm2:135m"))
    assert "MiB" in line and "Q4_1, llama" in line and "cannot run" not in line
    assert "cannot run:" in next(s for s in text.output.splitlines() if "someone/odd" in s)


def test_load_model_hands_the_linked_file_to_the_gguf_loader(homes, monkeypatch):
    # The whole load (conversion included) is what loading any .gguf path does, tested with
    # the bundled file elsewhere; here: what it is handed.
    import ragspec.models.load as model_module

    seen = []
    monkeypatch.setattr(model_module, "_load_packed", lambda spec, *a: seen.append(spec) or
                        model_module.LoadedModel.__new__(model_module.LoadedModel))
    monkeypatch.setattr(model_module, "_load_transformers", lambda spec, *a: seen.append(spec) or
                        model_module.LoadedModel.__new__(model_module.LoadedModel))
    load_model("ollama:smollm2:135m", homes / "cache", weights="fp32")
    assert len(seen) == 1 and Path(seen[0]).suffix == ".gguf"
    assert Path(seen[0]).resolve() == bundled_gguf_path().resolve()
