"""Models a user brings: folders of any family, hub ids from the local cache, `ragspec pull`,
GGUF files (converted once, keyed by content, under a lock), and the one-line errors for what
ragspec cannot run."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import REPO, make_family_model, save_model_folder
from test_arch_matrix import hf_greedy

from ragspec.cli import main
from ragspec.decoding.attention import NAME, NATIVE
from ragspec.decoding.engine import Generator
from ragspec.decoding.types import GenerationConfig
from ragspec.models.hub import HubError, select_files, wanted
from ragspec.models.load import ModelNotFound, ModelNotSupported, load_model

RAGSPEC = str(Path(sys.executable).with_name("ragspec"))
SPECULATION_OFF = "speculation off: this model's layers cannot be rolled back"


def one_line_error(res, code: int = 1) -> str:
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), res.output
    return lines[0]


# -- folders of other families -------------------------------------------------------------------

@pytest.mark.parametrize("weights,attention", [("fp32", "eager"), ("auto", NATIVE)])
def test_gemma2_folder_loads_with_its_attention_and_matches_generate(tmp_path, tiny_tokenizer,
                                                                    weights, attention):
    """fp32: transformers' eager attention (sdpa cannot soft-cap); packed weights: ragspec's
    kernel, which soft-caps."""
    folder = save_model_folder(make_family_model("gemma2", len(tiny_tokenizer)), tiny_tokenizer,
                               tmp_path / "gemma2")
    loaded = load_model(str(folder), tmp_path / "cache", weights=weights)
    assert loaded.attention == attention and loaded.speculation_off_reason is None
    prompt = [5, 6, 7, 8, 9, 10] * 10
    got = Generator.from_loaded(loaded).generate(prompt, GenerationConfig(max_new_tokens=24))
    assert got.token_ids == hf_greedy(loaded.model, prompt, 24)


def test_attention_on_cuda_never_asks_cudnn_which_plans_every_key_length(monkeypatch):
    """cuDNN's SDPA builds a graph per new key length (every decode step); on CUDA the
    attention runs with it switched off, and on the CPU nothing is switched."""
    import types

    from ragspec.decoding import attention

    seen = []

    def fake_sdpa(module, query, *args, **kwargs):
        seen.append((query.device.type, torch.backends.cuda.cudnn_sdp_enabled(),
                     torch.backends.cuda.flash_sdp_enabled()))
        return None, None

    monkeypatch.setattr(attention, "sdpa_attention_forward", fake_sdpa)
    cuda_query = types.SimpleNamespace(shape=(1, 9, 1, 64), device=torch.device("cuda"))
    cpu_query = types.SimpleNamespace(shape=(1, 9, 1, 64), device=torch.device("cpu"))
    module = types.SimpleNamespace(num_key_value_groups=3)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    for query in (cuda_query, cpu_query):
        attention.gqa_sdpa_forward(module, query, None, None, None)
    assert seen == [("cuda", False, True), ("cpu", before, True)]
    assert torch.backends.cuda.cudnn_sdp_enabled() == before  # restored after the call


def test_llama_folder_runs_ragspecs_attention(tmp_path, tiny_model, tiny_tokenizer):
    folder = save_model_folder(tiny_model, tiny_tokenizer, tmp_path / "llama")
    assert load_model(str(folder), tmp_path / "cache", weights="fp32").attention == NAME
    packed = load_model(str(folder), tmp_path / "cache")
    assert packed.attention == NATIVE and packed.weights == "int8"


def test_recurrent_model_generates_without_drafts_and_the_cli_says_so_once(run, tmp_path,
                                                                          tiny_tokenizer):
    folder = save_model_folder(make_family_model("mamba", len(tiny_tokenizer)), tiny_tokenizer,
                               tmp_path / "mamba")
    loaded = load_model(str(folder), tmp_path / "cache")
    assert "recurrent" in loaded.speculation_off_reason
    res = run("generate", "--prompt", "abcabcabcabcabc", "--raw", "--max-new-tokens", "12",
              "--model", str(folder))
    assert res.exit_code == 0, res.output
    assert res.stderr.count(SPECULATION_OFF) == 1
    res = run("generate", "--prompt", "abcabcabcabcabc", "--raw", "--max-new-tokens", "12",
              "--model", str(folder), "--json")
    assert json.loads(res.stdout)["stats"]["drafted_tokens"] == 0


def _config_only(path: Path, config) -> Path:
    path.mkdir(parents=True)
    config.save_pretrained(path)
    return path


@pytest.mark.parametrize("kind,message", [
    ("t5", "encoder-decoder"),
    ("vit", "no causal language-model head"),
    ("unknown", "does not know this model's architecture"),
])
def test_models_ragspec_cannot_run_are_one_clear_line(run, tmp_path, kind, message):
    from transformers import T5Config, ViTConfig

    folder = tmp_path / kind
    if kind == "unknown":
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    else:
        _config_only(folder, T5Config(num_layers=1) if kind == "t5" else ViTConfig())
    with pytest.raises(ModelNotSupported, match=message):
        load_model(str(folder), tmp_path / "cache")
    line = one_line_error(run("generate", "--prompt", "hi", "--model", str(folder)))
    assert message in line


def test_a_model_whose_forward_takes_no_cache_is_refused(tmp_path, tiny_tokenizer):
    from transformers import RwkvConfig, RwkvForCausalLM

    model = RwkvForCausalLM(RwkvConfig(vocab_size=len(tiny_tokenizer), hidden_size=32,
                                       attention_hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2))
    folder = save_model_folder(model, tiny_tokenizer, tmp_path / "rwkv")
    with pytest.raises(ModelNotSupported, match="takes no KV cache"):
        load_model(str(folder), tmp_path / "cache")


# -- hub ids: the local cache, as the hub lays it out --------------------------------------------

def hub_layout(root: Path, repo_id: str, files_from: Path) -> Path:
    """Put a model folder into `root` the way huggingface_hub caches a download: content in
    blobs/<sha256>, a snapshot of symlinks per commit, refs/main naming the commit."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in sorted(files_from.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, tiny_model, tiny_tokenizer):
    from huggingface_hub import constants

    root = tmp_path / "hf-hub"
    staged = save_model_folder(tiny_model, tiny_tokenizer, tmp_path / "staged")
    assert not getattr(tiny_tokenizer, "chat_template", None)  # a base model: no chat template
    hub_layout(root, "tiny-org/tiny-base", staged)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    return root


def test_a_cached_hub_id_loads_offline_and_a_base_model_generates_without_a_template(
        hub_cache, run, tmp_path, tiny_model):
    fp32 = load_model("tiny-org/tiny-base", tmp_path / "cache", weights="fp32")
    assert str(hub_cache) in str(fp32.model.config._name_or_path)
    loaded = load_model("tiny-org/tiny-base", tmp_path / "cache")  # quantised from the same files
    assert loaded.name == "tiny-org/tiny-base"
    source = Path(loaded.model.config._name_or_path) / "ragspec-source.json"
    assert str(hub_cache) in json.loads(source.read_text())["source"]
    res = run("generate", "--prompt", "abcabcabc", "--max-new-tokens", "10",
              "--model", "tiny-org/tiny-base", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["token_ids"] == hf_greedy(loaded.model, out["prompt_token_ids"], 10)  # same weights


def test_ask_with_a_cached_hub_id_answers_offline(hub_cache, run, tmp_path):
    from ragspec.retrieval.embeddings.embedder import Embedder
    from ragspec.retrieval.faiss.store import PassageStore
    from ragspec.retrieval.ingest import ingest_paths

    doc = tmp_path / "metrics.txt"
    doc.write_text("The metrics endpoint listens on port 7432 and serves /metrics only.\n")
    report = ingest_paths([doc], PassageStore.open(tmp_path / "home" / "index", Embedder()))
    assert report.ok, report.failed
    res = run("ask", "Which port?", "--model", "tiny-org/tiny-base", "--max-new-tokens", "12",
              "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["model"] == "tiny-org/tiny-base" and out["answer"]["stats"]["new_tokens"] >= 1
    assert "7432" in out["passages"][0]["text"]


def test_a_hub_id_not_in_the_cache_says_to_pull_it(hub_cache, run, tmp_path):
    with pytest.raises(ModelNotFound, match="run: ragspec pull tiny-org/elsewhere"):
        load_model("tiny-org/elsewhere", tmp_path / "cache")
    line = one_line_error(run("generate", "--prompt", "hi", "--model", "tiny-org/elsewhere"))
    assert "run: ragspec pull tiny-org/elsewhere" in line


def test_pull_takes_safetensors_config_and_tokenizer_never_pickles():
    listing = ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
               "model-00002-of-00002.safetensors", "model.safetensors.index.json",
               "pytorch_model.bin", "pytorch_model.bin.index.json", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "merges.txt", "vocab.json",
               "chat_template.jinja", "README.md", ".gitattributes", "original/consolidated.00.pth",
               "onnx/model.safetensors", "training_args.bin", "model.gguf", "optimizer.pt"]
    assert select_files(listing) == sorted([
        "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json", "merges.txt", "vocab.json",
        "chat_template.jinja"])
    assert not any(wanted(f) for f in ("pytorch_model.bin", "x.pt", "a.ckpt", "sub/config.json"))
    with pytest.raises(HubError, match=r"no safetensors weights \(it has \.bin\)"):
        select_files(["config.json", "pytorch_model.bin", "tokenizer.json"])


@pytest.mark.parametrize("env,message", [
    ({"HF_HUB_OFFLINE": "1"}, "downloads are switched off (HF_HUB_OFFLINE is set)"),
    # a closed local port: the same failure as no network, without touching one
    ({"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"},
     "cannot reach the Hugging Face hub"),
])
def test_pull_without_network_fails_with_one_line(tmp_path, env, message):
    full = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "RAGSPEC_HOME": str(tmp_path), **env}
    res = subprocess.run([RAGSPEC, "pull", "HuggingFaceTB/SmolLM2-135M-Instruct"], env=full,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], res.stderr


# -- GGUF files ----------------------------------------------------------------------------------

def write_gguf(path: Path, arch: str, qtype, row_bytes: int) -> Path:
    writer = gguf.GGUFWriter(path, arch)
    writer.add_tensor("token_embd.weight", np.zeros((4, row_bytes), dtype=np.uint8),
                      raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_conversion_parses_a_gguf_file_once_and_builds_each_name_map_once(tmp_path):
    """Inside parsed_once, every `from gguf import GGUFReader` caller (transformers' tokenizer
    and config loading, the packed weights) gets the one reader of a file, and the tensor name
    map is built once per (architecture, blocks); outside it, gguf's own functions are back."""
    from ragspec.models.gguf import parsed_once

    one = write_gguf(tmp_path / "one.gguf", "llama", gguf.GGMLQuantizationType.Q8_0, 34)
    two = write_gguf(tmp_path / "two.gguf", "llama", gguf.GGMLQuantizationType.Q8_0, 34)
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with parsed_once():
        from gguf import GGUFReader, get_tensor_name_map

        first = GGUFReader(one)
        assert GGUFReader(str(one)) is first and GGUFReader(two) is not first
        assert [t.name for t in first.tensors] == ["token_embd.weight"]
        arch = gguf.MODEL_ARCH.LLAMA
        assert get_tensor_name_map(arch, 2) is get_tensor_name_map(arch, 2)
        assert get_tensor_name_map(arch, 2).get_name("blk.1.attn_q") == \
            name_map(arch, 2).get_name("blk.1.attn_q")
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(one) is not gguf.GGUFReader(one)


def bundled_gguf() -> Path:
    from ragspec.models.load import bundled_gguf_path

    return bundled_gguf_path()


@pytest.mark.parametrize("make,message", [
    (lambda p: p.write_bytes(bundled_gguf().read_bytes()[: 4 << 20]), "damaged or truncated"),
    (lambda p: p.write_bytes(b"\x00junk" * 500), "not a readable GGUF file"),
    (lambda p: write_gguf(p, "bert", gguf.GGMLQuantizationType.Q8_0, 34),
     "architecture 'bert' is not one transformers can read"),
    (lambda p: write_gguf(p, "llama", gguf.GGMLQuantizationType.Q8_K, 292),
     "quantisation type Q8_K cannot be de-quantised"),
    (lambda p: write_gguf(p, "llama", gguf.GGMLQuantizationType.Q8_0, 34),
     "its tokenizer (none in the file) cannot be rebuilt"),
], ids=["truncated", "junk", "architecture", "quantisation", "no-tokenizer"])
def test_a_gguf_transformers_cannot_read_is_one_line_saying_why(run, tmp_path, make, message):
    path = tmp_path / "user" / "model.gguf"
    path.parent.mkdir()
    make(path)
    with pytest.raises(ModelNotSupported, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model(str(path), tmp_path / "cache")
    assert message in one_line_error(run("generate", "--prompt", "hi", "--model", str(path)))
    assert not list((tmp_path / "cache").glob("gguf-*.partial-*"))


def test_a_file_that_is_not_gguf_is_one_clear_line(run, tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x80\x04")
    assert "not a .gguf" in one_line_error(run("generate", "--prompt", "hi", "--model", str(path)))


CONVERT = ("import sys, json; from ragspec.models.gguf import gguf_folder; "
           "folder, converted = gguf_folder(sys.argv[1], sys.argv[2]); "
           "print(json.dumps({'folder': str(folder), 'converted': converted}))")


@pytest.fixture(scope="module")
def user_gguf(tmp_path_factory):
    """The bundled GGUF copied to a user path and converted by two processes at once."""
    root = tmp_path_factory.mktemp("user-gguf")
    path = root / "downloads" / "my-model.gguf"
    path.parent.mkdir()
    shutil.copyfile(bundled_gguf(), path)
    cache = root / "cache"
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}  # see test_gpu_check: busy machines
    procs = [subprocess.Popen([sys.executable, "-c", CONVERT, str(path), str(cache)], env=env,
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return path, cache, results


@pytest.mark.slow
def test_two_first_runs_convert_a_gguf_once_and_both_get_the_folder(user_gguf):
    path, cache, results = user_gguf
    assert sorted(r["converted"] for r in results) == [False, True]
    assert results[0]["folder"] == results[1]["folder"]
    folders = [p.name for p in cache.iterdir() if p.is_dir()]
    assert folders == [Path(results[0]["folder"]).name]  # no partial folder left behind
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert folders[0] == f"gguf-{sha[:24]}"


@pytest.mark.slow
def test_a_converted_gguf_loads_fast_with_the_bundled_models_logits(user_gguf, bundled_fp32):
    bundled = bundled_fp32
    path, cache, _ = user_gguf
    loaded = load_model(str(path), cache, weights="fp32")
    assert not loaded.converted
    assert loaded.load_seconds < 5.0  # measured ~0.3-0.6 s on the 2-core development machine
    ids = torch.tensor([list(range(100, 160))])
    with torch.inference_mode():
        assert torch.equal(loaded.model(ids).logits, bundled.model(ids).logits)


@pytest.mark.slow
def test_generate_with_a_gguf_path_works_and_a_changed_file_converts_again(user_gguf, tmp_path,
                                                                           monkeypatch):
    from ragspec.models.load import needs_conversion

    path, cache, _ = user_gguf
    monkeypatch.setenv("RAGSPEC_MODEL_CACHE", str(cache))
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path / "home"))
    # --max-draft 1: the first use of this model measures a forward-cost curve of 2 points only
    res = CliRunner().invoke(main, ["generate", "--prompt", "Say hi.", "--max-new-tokens", "8",
                                    "--max-draft", "1", "--model", str(path), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["stats"]["new_tokens"] >= 1
    assert not needs_conversion(str(path), cache)
    from ragspec.models.gguf import content_hash

    copy = tmp_path / "copy.gguf"
    shutil.copyfile(path, copy)
    assert content_hash(copy, cache) == content_hash(path, cache)
    assert not needs_conversion(str(copy), cache)  # same bytes: the same converted folder
    with open(copy, "ab") as f:
        f.write(b"\0" * 64)  # trailing bytes: a different file, still readable
    assert needs_conversion(str(copy), cache)
    assert content_hash(copy, cache) != content_hash(path, cache)


@pytest.mark.slow
def test_a_gguf_runs_packed_by_default_in_the_files_own_formats(user_gguf, bundled):
    """By default a GGUF file is not de-quantised: its weights are kept in its own formats
    (the bundled file: Q4_1 layers, a Q8_0 embedding), converted once into a packed folder, and
    the model computes what the bundled model computes."""
    from ragspec.decoding.packed import packed_bytes, packed_formats

    path, cache, _ = user_gguf
    first = load_model(str(path), cache)
    assert first.weights == "gguf" and packed_formats(first.model) == ["Q4_1", "Q8_0"]
    assert packed_bytes(first.model) <= 1.05 * path.stat().st_size
    again = load_model(str(path), cache)
    assert not again.converted
    ids = torch.tensor([list(range(100, 160))])
    with torch.inference_mode():
        assert torch.equal(again.model(ids).logits, bundled.model(ids).logits)
