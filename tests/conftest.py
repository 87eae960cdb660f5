"""Shared fixtures: a tiny randomly initialised Llama with a character tokenizer (fast tests),
and the bundled SmolLM2 (slow tests, converted once into a cache shared across runs)."""

from __future__ import annotations

import atexit
import os
import shutil
import string
import tempfile
from pathlib import Path

import pytest
import torch
from full_disk import disk  # noqa: F401 (a fixture for every test: a small disk that fills up)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
# The de-quantised bundled model is reused between test runs (conversion takes ~30 s).
MODEL_CACHE = Path(os.environ.get("RAGSPEC_TEST_MODEL_CACHE", REPO / ".ragspec-home" / "models"))
# ragspec's CPU kernels are compiled once (about a minute) and shared by every test and every
# command a test runs, whatever RAGSPEC_HOME it sets.
os.environ.setdefault("RAGSPEC_KERNELS_DIR", str(MODEL_CACHE / "kernels"))
# ragspec's machine-wide cache (the model cache of a data folder without its own, ragspec.paths)
# is a temporary folder: one for the session, and one per test (the autouse fixture below), so
# a test's "first run" is never another test's second.
_SESSION_CACHE = tempfile.mkdtemp(prefix="ragspec-test-cache-")
atexit.register(shutil.rmtree, _SESSION_CACHE, True)
os.environ["RAGSPEC_CACHE_DIR"] = _SESSION_CACHE
# The chat loads its first model in the background when a page first runs; the page tests load
# what they ask for themselves (tests/web/test_ui_warm.py turns it on).
os.environ.setdefault("RAGSPEC_UI_WARM", "0")


def make_char_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(string.ascii_letters + string.digits + string.punctuation + " \n") + ["é", "→"]
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def make_tiny_model(vocab_size: int, seed: int = 0, **overrides):
    """A 2-layer Llama with random weights. initializer_range 0.3 (not transformers' 0.02) makes
    its greedy output varied: with tiny weights every prompt makes it repeat one token forever,
    and an engine test on such output checks almost nothing (every draft of that token is
    right)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ragspec.decoding.attention import register

    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=True,
        initializer_range=0.3,
    )
    cfg.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    model.set_attn_implementation(register())
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    return make_tiny_model(len(tiny_tokenizer))


@pytest.fixture(scope="session")
def bundled():
    """The bundled model as ragspec runs it by default (its GGUF's own formats, packed)."""
    from ragspec.models.load import load_model

    return load_model(None, MODEL_CACHE)


@pytest.fixture(scope="session")
def bundled_fp32():
    """The bundled model de-quantised to fp32 in transformers' own layers (--weights fp32)."""
    from ragspec.models.load import load_model

    return load_model(None, MODEL_CACHE, weights="fp32")


# -- the architecture matrix: one tiny randomly initialised model per family -------------------

WINDOW = 24  # sliding window of the tiny models that have one; test prompts are longer
_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
               eos_token_id=2, pad_token_id=0)
_ALTERNATING = ["sliding_attention", "full_attention"]
# model_type -> overrides; each family's distinctive trait is switched on at this size.
FAMILIES = {
    "llama": {},
    "qwen2": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    "qwen3": {},
    "mistral": dict(sliding_window=WINDOW),  # every layer slides
    "gemma2": dict(sliding_window=WINDOW, head_dim=16, layer_types=_ALTERNATING,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    "gemma3_text": dict(sliding_window=WINDOW, head_dim=16, layer_types=_ALTERNATING),
    "phi3": {},
    "gpt2": dict(n_positions=256),  # learned absolute positions
    "gpt_neox": {},
    "olmo2": {},
    "granite": {},
    "smollm3": dict(no_rope_layers=[1, 0]),  # the second layer has no RoPE
}
SLIDING_FAMILIES = ("qwen2", "mistral", "gemma2", "gemma3_text")
# Layers whose state a crop cannot undo: one pure state-space model and one hybrid.
RECURRENT = {
    "mamba": dict(hidden_size=64, num_hidden_layers=2, state_size=8),
    "jamba": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2,
                  attn_layer_offset=1, expert_layer_period=2, num_experts=2, mamba_d_state=8),
}


def make_family_model(model_type: str, vocab_size: int, seed: int = 0):
    """A tiny random causal LM of `model_type`, built from its config (no download)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    overrides = FAMILIES.get(model_type)
    if overrides is None:
        kwargs = dict(RECURRENT[model_type], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    else:
        kwargs = {**_COMMON, **overrides}
    config = AutoConfig.for_model(model_type, vocab_size=vocab_size, **kwargs)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model


def save_model_folder(model, tokenizer, path: Path) -> Path:
    """model and tokenizer saved as a transformers model folder at `path`."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def run(tmp_path, monkeypatch):
    """Invoke the `ragspec` CLI in-process (click's CliRunner) with RAGSPEC_HOME in tmp_path."""
    from click.testing import CliRunner

    from ragspec.cli import main

    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path / "home"))

    def invoke(*args):
        return CliRunner().invoke(main, list(args))

    return invoke


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny-model tests: the tiny model gains nothing from
    threads, and on a shared 2-core machine torch's spinning worker threads make every small op
    wait for a descheduled sibling."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_gen(tiny_model, tiny_tokenizer):
    """A Generator over the tiny model (its draft policy learns within one module)."""
    from ragspec.decoding.engine import Generator

    return Generator(tiny_model, tiny_tokenizer, eos_token_ids=[2])


@pytest.fixture
def opened():
    """Opens indexes (ragspec.retrieval.backends.open_index; the hash embedder unless one is
    given) and closes every one it opened when the test ends."""
    from fakes import HashEmbedder

    from ragspec.retrieval import backends

    stores = []

    def open_(where, embedder=None):
        store = backends.open_index(where, embedder or HashEmbedder())
        stores.append(store)
        return store

    yield open_
    for store in stores:
        store.close()


@pytest.fixture(autouse=True)
def _machine_cache(tmp_path, monkeypatch):
    """Each test's own ragspec cache folder (see _SESSION_CACHE above)."""
    monkeypatch.setenv("RAGSPEC_CACHE_DIR", str(tmp_path / "ragspec-cache"))
