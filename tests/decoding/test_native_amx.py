"""The AMX prompt-read kernel (ragspec/decoding/native/amx.cpp) against its oracles.

On a CPU with AMX (and Linux granting the tile state), products of 65 rows or more with tiled
weights run on the tile unit. For every tileable format: the product equals a float64 product of
the de-quantised weights and the int8 activations the kernel says it used (the tolerance of the
other kernel tests), it equals the AVX-512 VNNI kernel's bits (the AMX path switched off in the
same process), and each row's result does not depend on the rows or threads beside it. Skipped,
saying why, where this machine cannot run AMX.
"""

from __future__ import annotations

import pytest
import torch
from conftest import MODEL_CACHE
from test_native_kernels import as_layout, random_packed, reference_rows

from ragspec.decoding import native
from ragspec.decoding.packed import FORMATS, TILEABLE


@pytest.fixture(scope="module")
def ops():
    ops = native.ops(MODEL_CACHE)
    before = ops.set_amx(True)  # off by default (RAGSPEC_AMX=1 turns it on)
    try:
        if not ops.amx_available():
            pytest.skip("no AMX here: the CPU lacks AMX-TILE/AMX-INT8, Linux refused the tile "
                        "state, or the kernels were built without AMX")
        yield ops
    finally:
        ops.set_amx(before)


def without_amx(ops, f):
    before = ops.set_amx(False)
    try:
        return f()
    finally:
        ops.set_amx(before)


@pytest.mark.parametrize("fmt", TILEABLE)
def test_amx_product_is_the_float64_product_and_the_vnni_kernels_bits(ops, fmt):
    n, k, m = 45, 512, 83  # 83 rows: AMX's 16-row blocks and a padded tail; 45 columns: edge tiles
    raw = torch.from_numpy(random_packed(fmt, n, k, seed=11))
    w = torch.from_numpy(reference_rows(fmt, raw.numpy(), k)).double()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(12))
    data, code = as_layout(fmt, raw, k, "tiled")
    y = ops.qmatmul(x, data, code, k)
    q, d, _ = ops.quantize_activations(x, FORMATS[fmt][0])
    xs = (q.double().reshape(m, -1, 32) * d.double()[..., None]).reshape(m, k)
    want = xs @ w.T
    assert ((y.double() - want).abs() <= 1e-5 * want.abs().max() + 1e-6).all()
    assert torch.equal(y, without_amx(ops, lambda: ops.qmatmul(x, data, code, k)))


@pytest.mark.parametrize("fmt", ("Q4_0", "Q4_K", "Q6_K", "Q8_0"))
def test_amx_rows_do_not_depend_on_the_rows_or_threads_beside_them(ops, fmt):
    n, k = 67, 768  # 24 groups; 67 columns
    data, code = as_layout(fmt, torch.from_numpy(random_packed(fmt, n, k, seed=13)), k, "tiled")
    x = torch.randn(300, k, generator=torch.Generator().manual_seed(14))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        full = ops.qmatmul(x, data, code, k)
        for m, start in ((65, 0), (65, 235), (100, 17), (299, 1)):
            assert torch.equal(ops.qmatmul(x[start:start + m], data, code, k), full[start:start + m])
        # a few rows (the VNNI kernel) give the same bits as the same rows inside a long prompt
        assert torch.equal(ops.qmatmul(x[40:43], data, code, k), full[40:43])
        torch.set_num_threads(1)
        assert torch.equal(ops.qmatmul(x, data, code, k), full)
    finally:
        torch.set_num_threads(threads)


def test_a_long_forward_of_a_tiled_linear_takes_the_amx_kernel(ops):
    from ragspec.decoding.packed import PackedLinear, PackedWeight, tile

    n, k = 70, 512
    w = tile(PackedWeight(torch.from_numpy(random_packed("Q6_K", n, k, seed=15)), "Q6_K", k))
    layer = PackedLinear(w)
    x = torch.randn(1, 150, k, generator=torch.Generator().manual_seed(16))
    long = layer(x)  # a prompt's 150 rows: no longer de-quantised for a bf16/fp32 matmul
    assert torch.equal(long[0], ops.qmatmul(x[0], w.data, w.code, k))
    # and so the same bits as steps of at most 64 rows over the same inputs
    assert torch.equal(long, torch.cat([layer(x[:, i:i + 50]) for i in range(0, 150, 50)], dim=1))


def test_greedy_after_a_long_prompt_is_the_same_with_speculation_on_and_off(ops, tiny_tokenizer, tmp_path):
    import random

    from conftest import make_family_model
    from test_packed import packed_copy

    from ragspec.decoding.engine import Generator
    from ragspec.decoding.types import DraftConfig, GenerationConfig

    model = packed_copy(make_family_model("llama", len(tiny_tokenizer)), "int4", tmp_path)
    assert model.model.layers[0].mlp.up_proj.packed.tiled
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[2])
    rng = random.Random(5)
    pattern = [rng.randrange(3, model.config.vocab_size) for _ in range(7)]
    prompt = (pattern * 30)[:150]  # 150 rows: the prompt is read on the AMX kernel
    on = gen.generate(prompt, GenerationConfig(max_new_tokens=24, draft=DraftConfig(adaptive=False)))
    off = gen.generate(prompt, GenerationConfig(max_new_tokens=24, draft=DraftConfig(enabled=False)))
    assert on.token_ids == off.token_ids and on.stats.accepted_tokens > 0
