"""Packed models (ragspec.models.packed_cache / packed / weights) on every family of the matrix.

For each family as a tiny random model, quantised to int8 / int4 / bf16 and rebuilt with packed
layers and ragspec's native attention: a verify forward over k tokens gives bit for bit the
logits of k one-token steps; greedy speculation gives the same ids as plain decoding and as
`model.generate` on the same packed model; the packed file round-trips; a GGUF file's weights
stay in its own formats, with the rows transformers' loader would reorder reordered.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import FAMILIES, MODEL_CACHE, RECURRENT, WINDOW, make_family_model
from test_arch_matrix import hf_greedy, matrix_prompts

from ragspec.decoding import native
from ragspec.decoding.attention import NATIVE, install
from ragspec.decoding.cache import crop_cache, new_cache, rollback_problem
from ragspec.decoding.engine import Generator
from ragspec.decoding.packed import PackedEmbedding, PackedLinear, packed_formats
from ragspec.decoding.types import DraftConfig, GenerationConfig
from ragspec.models import packed_cache as packing

NEW_TOKENS = 32


@pytest.fixture(scope="module", autouse=True)
def kernels():
    native.ops(MODEL_CACHE)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def packed_copy(model, weights: str, folder):
    """`model` quantised to `weights` and rebuilt as ragspec loads a packed model."""
    model.config.save_pretrained(folder)
    # through the packed file, as the product loads it (weights tiled where the format tiles)
    packing.save(packing.quantised_entries(model, weights), folder / packing.PACKED_FILE)
    built = packing.build(folder, packing.load(folder / packing.PACKED_FILE))
    install(built, native=True)
    return built


@pytest.fixture(scope="module")
def packed_families(tiny_tokenizer, tmp_path_factory):
    built = {}
    for family in (*FAMILIES, *RECURRENT):
        model = make_family_model(family, len(tiny_tokenizer))
        weights = ("int8", "int4", "bf16")[len(built) % 3]  # every choice over the matrix
        packed = packed_copy(model, weights, tmp_path_factory.mktemp(family))
        built[family] = packed, weights
    return built


@pytest.mark.parametrize("family", FAMILIES)
def test_a_verify_forward_is_bit_identical_to_one_token_steps(packed_families, family):
    model, _ = packed_families[family]
    assert model.config._attn_implementation == NATIVE
    vocab = model.config.vocab_size
    prompt = next(matrix_prompts(vocab, 1, seed=1))
    g = torch.Generator().manual_seed(0)
    draft = torch.randint(3, vocab, (1, 9), generator=g)
    with torch.inference_mode():
        cache = new_cache(model)
        model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        base = cache.get_seq_length()
        together = model(input_ids=draft, cache=cache, use_cache=True).logits[0]
        crop_cache(cache, base)
        steps = torch.cat([model(input_ids=draft[:, i:i + 1], cache=cache, use_cache=True).logits[0]
                           for i in range(draft.shape[1])])
    assert torch.equal(together, steps)


@pytest.mark.parametrize("family", (*FAMILIES, *RECURRENT))
def test_greedy_speculation_on_packed_weights_equals_plain_decoding_and_generate(
        packed_families, tiny_tokenizer, family):
    model, weights = packed_families[family]
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[2],
                    speculation_off_reason=rollback_problem(model))
    spec = GenerationConfig(max_new_tokens=NEW_TOKENS, draft=DraftConfig(adaptive=False))
    plain = GenerationConfig(max_new_tokens=NEW_TOKENS, draft=DraftConfig(enabled=False))
    accepted = 0
    for prompt in matrix_prompts(model.config.vocab_size, 4):
        on = gen.generate(prompt, spec)
        off = gen.generate(prompt, plain)
        assert on.token_ids == off.token_ids == hf_greedy(model, prompt, NEW_TOKENS), weights
        accepted += on.stats.accepted_tokens
    if family not in RECURRENT:
        assert accepted > 0  # drafts were verified and accepted


def test_quantised_layers_take_the_formats_asked_for(tiny_tokenizer, tmp_path):
    model = make_family_model("llama", len(tiny_tokenizer))
    int4 = packed_copy(model, "int4", tmp_path / "a")
    assert isinstance(int4.lm_head, PackedLinear) and int4.lm_head.packed.fmt == "Q8_0"
    assert int4.model.layers[0].mlp.down_proj.packed.fmt == "Q4_1"
    assert isinstance(int4.model.embed_tokens, PackedEmbedding)
    assert packed_formats(packed_copy(model, "int8", tmp_path / "b")) == ["Q8_0"]
    assert packed_formats(packed_copy(model, "bf16", tmp_path / "c")) == ["BF16"]
    # no fp32 copy of a linear weight is kept beside the packed one
    assert not [n for n, p in int4.named_parameters() if p.dim() == 2]


def test_a_constant_weight_group_is_kept_as_exactly_as_its_format_can(tmp_path):
    # 0.02 in every value of a group: int4 (Q4_1: min and step per group of 32, both fp16) gives
    # back 0.02 as fp16 holds it, not another value
    weight = torch.full((16, 64), 0.02)
    weight[:, 32:] = torch.linspace(-1, 1, 32)
    packed = packing.quantise(weight, "Q4_1")
    as_fp16 = torch.tensor(0.02).half().float()
    assert torch.equal(packed.dequantize()[:, :32], as_fp16.expand(16, 32))


def test_the_packed_file_round_trips_and_shares_tied_weights(tiny_model, tmp_path, monkeypatch):
    model = tiny_model
    assert model.config.tie_word_embeddings
    entries = packing.quantised_entries(model, "int4")
    packing.save(entries, tmp_path / "p.safetensors")
    back = packing.load(tmp_path / "p.safetensors")
    assert back["lm_head.weight"] is back["model.embed_tokens.weight"]
    # the file keeps the tiled layout; RAGSPEC_WEIGHT_LAYOUT=rows keeps GGUF rows
    assert back["lm_head.weight"].tiled and not entries["lm_head.weight"].tiled
    monkeypatch.setenv(packing.LAYOUT_ENV, "rows")
    packing.save(entries, tmp_path / "rows.safetensors")
    rows = packing.load(tmp_path / "rows.safetensors")
    assert not rows["lm_head.weight"].tiled
    model.config.save_pretrained(tmp_path)
    a, b = packing.build(tmp_path, rows), packing.build(tmp_path, back)
    ids = torch.tensor([[5, 9, 14, 3, 22]])
    with torch.inference_mode():
        # the tiled kernel sums in another order than the row kernel: equal to rounding
        assert torch.allclose(a(ids).logits, b(ids).logits, atol=1e-4, rtol=1e-4)
        assert torch.equal(packing.build(tmp_path, entries)(ids).logits, a(ids).logits)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_prefill_de_quantises_or_runs_the_step_kernel_as_its_precision_says(
        tiny_tokenizer, tmp_path, monkeypatch, precision):
    """fp32/bf16: long forwards de-quantise tiles and use torch's matmul, the same layer to within
    the int8 rounding of the activations; int8: they run the step kernel, so every row is what
    it is in a short forward."""
    from ragspec.decoding.packed import PREFILL_ENV, STEP_ROWS, prefill_precision, step_forward

    model = make_family_model("llama", len(tiny_tokenizer))
    layer = packed_copy(model, "int8", tmp_path).model.layers[0].mlp.up_proj
    x = torch.randn(STEP_ROWS + 5, layer.in_features)
    monkeypatch.setenv(PREFILL_ENV, precision)
    prefill_precision.cache_clear()
    amx = torch.ops.ragspec.set_amx(False)  # with AMX, tiled weights take the kernel (test_native_amx)
    try:
        long = layer(x)
    finally:
        torch.ops.ragspec.set_amx(amx)
        prefill_precision.cache_clear()
    with step_forward():
        stepped = layer(x)
    assert torch.equal(layer(x[:3]), stepped[:3])
    if precision == "int8":
        assert torch.equal(long, stepped)
    else:
        assert torch.allclose(long, stepped, atol=0.05 * long.abs().max().item())
        assert not torch.equal(long, stepped)  # two paths really ran


@pytest.mark.parametrize("flags, width, want", [
    ("fpu avx2 avx512f avx512_vnni avx512_bf16 amx_bf16", 576, "int8"),
    ("fpu avx2 avx512f avx512_vnni avx512_bf16 amx_bf16", 1024, "int8"),
    ("fpu avx2 avx512f avx512_vnni avx512_bf16 amx_bf16", 2048, "bf16"),
    ("fpu avx2 avx512f amx_tile amx_bf16", 576, "bf16"),
    ("fpu avx2 avx512f avx512_vnni", 4096, "int8"),
    ("fpu avx2 fma", 576, "fp32")])
def test_beside_amx_a_narrow_model_reads_its_prompts_in_int8(tmp_path, monkeypatch, flags, width,
                                                              want):
    """With AMX-BF16 the machine reads prompts in bf16, but a model up to INT8_WIDTH_WITH_AMX
    wide reads its own in int8 where the CPU has VNNI (faster there, and exact in pieces);
    elsewhere a model reads as the machine does, and an override holds for every model."""
    from ragspec import cpuinfo
    from ragspec.decoding.packed import PREFILL_ENV, model_precision, prefill_precision

    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n", encoding="utf-8")
    monkeypatch.setattr(cpuinfo, "CPUINFO", info)
    monkeypatch.delenv(PREFILL_ENV, raising=False)
    try:
        prefill_precision.cache_clear()
        assert model_precision(width) == want
        for forced in ("bf16", "fp32", "int8"):
            monkeypatch.setenv(PREFILL_ENV, forced)
            prefill_precision.cache_clear()
            assert model_precision(width) == forced
    finally:
        prefill_precision.cache_clear()


@pytest.mark.parametrize("flags, want", [("fpu avx2 avx512f amx_tile amx_bf16", "bf16"),
                                         ("fpu avx2 avx512f avx512_vnni avx512_bf16 amx_bf16",
                                          "bf16"),
                                         ("fpu avx2 avx512_bf16", "bf16"),
                                         ("fpu avx2 avx512f avx512_vnni avx512_bf16", "int8"),
                                         ("fpu avx2 avx512f avx512_vnni", "int8"),
                                         ("fpu avx2 fma", "fp32")])
def test_the_prefill_precision_is_a_fact_of_the_cpu_not_a_timing(tmp_path, monkeypatch, flags,
                                                                  want):
    """The precisions read a prompt into different caches (a tiny model answered differently
    after a restart when a timing picked them), so only the CPU's flags and the override decide:
    int8 (the step kernels) with AVX-512 VNNI unless AMX's bf16 tiles are there, else bf16
    where bf16 is native, else fp32."""
    from ragspec import cpuinfo
    from ragspec.decoding.packed import PREFILL_ENV, prefill_dtype, prefill_precision

    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n", encoding="utf-8")
    monkeypatch.setattr(cpuinfo, "CPUINFO", info)
    monkeypatch.delenv(PREFILL_ENV, raising=False)
    try:
        for _ in range(3):
            prefill_precision.cache_clear()
            assert prefill_precision() == want
        assert prefill_dtype() == (torch.bfloat16 if want == "bf16" else torch.float32)
        for forced, precision in (("fp32", "fp32"), (" BF16", "bf16"), ("int8", "int8")):
            monkeypatch.setenv(PREFILL_ENV, forced)
            prefill_precision.cache_clear()
            assert prefill_precision() == precision
    finally:
        prefill_precision.cache_clear()


# -- GGUF files ----------------------------------------------------------------------------------

def write_llama_gguf(model, path, qtype):
    """A tiny Llama as a GGUF file the way llama.cpp's converter lays it out: Q/K rows permuted
    for its rotary layout, weights in `qtype`."""
    import gguf
    import numpy as np
    from gguf.quants import quantize

    cfg = model.config
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)

    def permute(w, heads):
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}

    def add(name, value, quantised=True):
        if quantised and value.ndim == 2:
            writer.add_tensor(name, quantize(value, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, value.astype(np.float32))

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    if not cfg.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        add(f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads))
        add(f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads))
        add(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        add(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        add(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        add(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        add(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
        add(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        add(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("qtype_name", ["Q8_0", "Q4_0"])
def test_a_gguf_keeps_its_formats_and_matches_its_de_quantised_model(tiny_tokenizer, tmp_path,
                                                                     qtype_name):
    import gguf

    qtype = gguf.GGMLQuantizationType[qtype_name]
    model = make_family_model("llama", len(tiny_tokenizer))
    path = write_llama_gguf(model, tmp_path / "tiny.gguf", qtype)
    meta = packing.meta_model_from_config(model.config)
    entries = packing.gguf_entries(path, meta)
    assert entries["model.layers.0.self_attn.q_proj.weight"].fmt == qtype_name
    # de-quantised, the packed rows are the file's weights in transformers' order
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    reader = GGUFReader(str(path))
    tensor = next(t for t in reader.tensors if t.name == "blk.1.attn_k.weight")
    want = LlamaTensorProcessor(model.config.to_dict()).process(
        weights=gguf.quants.dequantize(tensor.data, tensor.tensor_type), name=tensor.name).weights
    got = entries["model.layers.1.self_attn.k_proj.weight"].dequantize().numpy()
    assert (got == want).all()
    # and the same model comes out: close to the original weights' logits
    model.config.save_pretrained(tmp_path / "cfg")
    packed = packing.build(tmp_path / "cfg", entries)
    install(packed, native=True)
    ids = torch.tensor([[random.Random(0).randrange(3, 90) for _ in range(20)]])
    with torch.inference_mode():
        a, b = packed(ids).logits, model(ids).logits
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8


@pytest.mark.parametrize("family", ("mistral", "gemma2"))
def test_sliding_window_rows_see_only_their_window(packed_families, family):
    """Every row of a forward over the whole prompt (windows read from transformers' mask) gives
    what a one-token step on a cache gives (windows from the cache's own trimming)."""
    from ragspec.decoding.packed import step_forward

    model, _ = packed_families[family]
    assert model.config.sliding_window == WINDOW
    prompt = [3 + (i * 7) % 90 for i in range(3 * WINDOW)]
    with torch.inference_mode(), step_forward():
        full = model(input_ids=torch.tensor([prompt])).logits[0]
        cache = new_cache(model)
        model(input_ids=torch.tensor([prompt[:-3]]), cache=cache, use_cache=True)
        steps = [model(input_ids=torch.tensor([[t]]), cache=cache, use_cache=True).logits[0, -1]
                 for t in prompt[-3:]]
    assert torch.equal(full[-3:], torch.stack(steps))
