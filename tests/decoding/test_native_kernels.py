"""ragspec's CPU kernels (ragspec/decoding/native) against oracles.

Every GGUF format the kernels read, as random packed bytes: de-quantisation equals gguf's own,
bit for bit; the quantised matrix product equals a float64 product of the de-quantised weights
and the int8 activations the kernel says it used; and each row's result is the same bits
whatever rows are computed with it and however many threads share the work (batch invariance,
the property exact speculation rests on). The same for weights stored tiled (16 rows interleaved,
packed.tile), whose bytes give back the GGUF rows and the same de-quantised values. The attention kernel against a float64 softmax, with
causal, sliding and soft-capped variants, and the same invariance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import MODEL_CACHE
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from ragspec.decoding import native
from ragspec.decoding.packed import FORMATS, TILEABLE, PackedWeight, tile, untile

QUANTISED = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
PLAIN = ("F32", "F16", "BF16")


@pytest.fixture(scope="module")
def ops():
    return native.ops(MODEL_CACHE)


# Where each format keeps its fp16 scales (byte offset, typical magnitude): the rest of a block
# is random bits, which is any valid block.
_SCALES = {"Q4_0": [(0, 0.02)], "Q8_0": [(0, 0.02)], "Q5_0": [(0, 0.02)],
           "Q4_1": [(0, 0.01), (2, 0.1)], "Q5_1": [(0, 0.01), (2, 0.1)],
           "Q4_K": [(0, 0.003), (2, 0.003)], "Q5_K": [(0, 0.003), (2, 0.003)],
           "Q6_K": [(208, 0.002)]}


def random_packed(fmt: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if fmt in PLAIN:
        w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32) * 0.1)
        dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[fmt]
        return w.to(dtype).view(torch.uint8).reshape(n, -1).numpy().copy()
    per_block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[fmt]]
    blocks = rng.integers(0, 256, size=(n, k // per_block, block_bytes), dtype=np.uint8)
    for offset, scale in _SCALES[fmt]:
        d = (rng.standard_normal((n, k // per_block)) * scale).astype(np.float16)
        blocks[:, :, offset:offset + 2] = d.view(np.uint8).reshape(n, k // per_block, 2)
    return blocks.reshape(n, -1)


def reference_rows(fmt: str, raw: np.ndarray, k: int) -> np.ndarray:
    if fmt == "BF16":
        return torch.from_numpy(raw).view(torch.bfloat16).float().numpy()
    if fmt == "F32":
        return raw.view(np.float32).reshape(raw.shape[0], k)
    return dequantize(raw, GGMLQuantizationType[fmt]).astype(np.float32).reshape(raw.shape[0], k)


@pytest.mark.parametrize("fmt", QUANTISED + PLAIN)
def test_dequantised_rows_are_ggufs_own_bit_for_bit(ops, fmt):
    k = 512
    raw = random_packed(fmt, 37, k)
    got = ops.dequantize_rows(torch.from_numpy(raw), FORMATS[fmt][0], k, torch.arange(37))
    assert np.array_equal(got.numpy(), reference_rows(fmt, raw, k))
    some = torch.tensor([5, 0, 36, 5])
    assert torch.equal(ops.dequantize_rows(torch.from_numpy(raw), FORMATS[fmt][0], k, some),
                       got[some])


def as_layout(fmt: str, raw: torch.Tensor, k: int, layout: str) -> tuple[torch.Tensor, int]:
    """(bytes, code) of a weight in `layout` ("rows" as GGUF stores it, or "tiled")."""
    weight = PackedWeight(raw, fmt, k)
    if layout == "tiled":
        weight = tile(weight)
        assert weight.tiled
    return weight.data, weight.code


@pytest.mark.parametrize("fmt", TILEABLE)
def test_a_tiled_weight_holds_the_same_rows(ops, fmt):
    n, k = 53, 512  # three tiles and five rows after them
    raw = torch.from_numpy(random_packed(fmt, n, k, seed=6))
    tiled = tile(PackedWeight(raw, fmt, k))
    assert tiled.data.shape == raw.shape and not torch.equal(tiled.data, raw)
    assert torch.equal(untile(tiled).data, raw)
    some = torch.tensor([0, 17, 47, 48, 52, 3])
    assert torch.equal(ops.dequantize_rows(tiled.data, tiled.code, k, torch.arange(n)),
                       ops.dequantize_rows(raw, FORMATS[fmt][0], k, torch.arange(n)))
    assert torch.equal(tiled.rows(some), PackedWeight(raw, fmt, k).rows(some))


@pytest.mark.parametrize("fmt,layout", [(f, "rows") for f in QUANTISED + PLAIN]
                         + [(f, "tiled") for f in TILEABLE])
def test_the_product_is_the_float64_product_of_what_the_kernel_multiplies(ops, fmt, layout):
    n, k, m = 45, 512, 7
    raw = torch.from_numpy(random_packed(fmt, n, k, seed=1))
    w = torch.from_numpy(reference_rows(fmt, raw.numpy(), k)).double()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(2))
    data, code = as_layout(fmt, raw, k, layout)
    y = ops.qmatmul(x, data, code, k)
    if fmt in QUANTISED:  # int8 activations, one scale per 32 values (per 256 for Q4_K, Q5_K)
        q, d, dsum = ops.quantize_activations(x, FORMATS[fmt][0])
        span = 256 if fmt in ("Q4_K", "Q5_K") else 32
        assert torch.equal(d, d[:, ::span // 32].repeat_interleave(span // 32, 1))
        assert torch.equal(d[:, ::span // 32], x.abs().reshape(m, -1, span).amax(-1) / 127)
        xs = (q.double().reshape(m, -1, 32) * d.double()[..., None]).reshape(m, k)
        assert torch.allclose(dsum.double(), (q.double().reshape(m, -1, 32).sum(-1) * d.double()))
        assert (q.abs() <= 127).all() and ((xs - x.double()).abs() <= d.double().repeat_interleave(32, 1) / 2 + 1e-6).all()
    else:
        xs = x.double()
    want = xs @ w.T
    assert ((y.double() - want).abs() <= 1e-5 * want.abs().max() + 1e-6).all()


@pytest.mark.parametrize("fmt,layout", [(f, "rows") for f in ("Q4_0", "Q8_0", "Q4_K", "Q6_K", "Q5_0", "F16")]
                         + [(f, "tiled") for f in TILEABLE])
def test_each_rows_result_does_not_depend_on_the_rows_beside_it(ops, fmt, layout):
    n, k = 67, 512  # an odd column count: the kernel's edge tiles are used too
    raw, code = as_layout(fmt, torch.from_numpy(random_packed(fmt, n, k, seed=3)), k, layout)
    x = torch.randn(35, k, generator=torch.Generator().manual_seed(4))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        full = ops.qmatmul(x, raw, code, k)
        for m in (1, 2, 3, 4, 5, 9, 16, 17, 33):  # tiled rows go 16 at a time
            for start in (0, 35 - m):
                part = ops.qmatmul(x[start:start + m], raw, code, k)
                assert torch.equal(part, full[start:start + m]), (m, start)
        torch.set_num_threads(1)
        assert torch.equal(ops.qmatmul(x, raw, code, k), full)
    finally:
        torch.set_num_threads(threads)


def test_shapes_that_do_not_fit_the_format_are_refused(ops):
    raw = torch.from_numpy(random_packed("Q4_K", 4, 256))
    with pytest.raises(RuntimeError, match="bytes"):
        ops.qmatmul(torch.randn(1, 512), raw, FORMATS["Q4_K"][0], 512)
    with pytest.raises(RuntimeError, match="whole number of blocks"):
        ops.qmatmul(torch.randn(1, 300), raw, FORMATS["Q4_K"][0], 300)
    with pytest.raises(RuntimeError, match="out of range"):
        ops.dequantize_rows(raw, FORMATS["Q4_K"][0], 256, torch.tensor([4]))


# -- attention ---------------------------------------------------------------------------------

def reference_attention(q, k, v, lo, hi, scale, softcap=0.0):
    hq, t, d = q.shape
    group = hq // k.shape[0]
    out = torch.empty(t, hq, d, dtype=torch.float64)
    for h in range(hq):
        for r in range(t):
            keys = k[h // group, lo[r]:hi[r] + 1].double()
            s = keys @ q[h, r].double() * scale
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            p = torch.softmax(s, 0)
            out[r, h] = p @ v[h // group, lo[r]:hi[r] + 1].double()
    return out


# head sizes 40, 64 and 128 (the dimensions in one or several register blocks)
@pytest.mark.parametrize("window,softcap,d", [(None, 0.0, 40), (9, 0.0, 40), (None, 30.0, 40),
                                              (None, 0.0, 64), (9, 0.0, 64), (None, 30.0, 128)])
def test_attention_matches_a_float64_softmax_and_rows_do_not_depend_on_each_other(ops, window,
                                                                                    softcap, d):
    g = torch.Generator().manual_seed(5)
    hq, hkv, length, t = 6, 2, 70, 8
    q = torch.randn(hq, t, d, generator=g)
    k_buf = torch.randn(hkv, 100, d, generator=g)  # a cache buffer with spare room: strided
    v_buf = torch.randn(hkv, 100, d, generator=g)
    k, v = k_buf[:, :length], v_buf[:, :length]
    hi = torch.arange(length - t, length)
    lo = (hi - window + 1).clamp(min=0) if window else torch.zeros(t, dtype=torch.long)
    out = ops.attend(q, k, v, lo, hi, 0.3, softcap)
    want = reference_attention(q, k, v, lo, hi, 0.3, softcap)
    assert torch.allclose(out.double(), want, atol=2e-6)
    for r in range(t):  # each row alone, as a one-token step computes it
        one = ops.attend(q[:, r:r + 1], k[:, :hi[r] + 1], v[:, :hi[r] + 1], lo[r:r + 1],
                         hi[r:r + 1], 0.3, softcap)
        assert torch.equal(one[0], out[r])


@pytest.mark.parametrize("d", [40, 64, 128])
@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("start", [0, 37, 300])
@pytest.mark.parametrize("hq,hkv", [(6, 2), (2, 2), (4, 1)])
def test_a_prompts_rows_read_keys_together_and_each_gets_its_one_row_bits(ops, d, half, start, hq, hkv):
    """Many rows from key 0 (a prompt read, after `start` cached keys) share their key and value
    loads, several rows and query heads at a time (a run of 4 rows: 12, 4 or 16 queries, taken
    in even groups of up to three); each row still gets, bit for bit, what it gets alone (a
    one-token step), and the float64 softmax to rounding."""
    g = torch.Generator().manual_seed(7)
    t = 43  # runs of 4 rows and a short one
    length = start + t
    q = torch.randn(hq, t, d, generator=g)
    k_buf = torch.randn(hkv, length + 9, d, generator=g)
    v_buf = torch.randn(hkv, length + 9, d, generator=g)
    if half:
        k_buf, v_buf = k_buf.half(), v_buf.half()
    k, v = k_buf[:, :length], v_buf[:, :length]
    hi = torch.arange(start, length)
    lo = torch.zeros(t, dtype=torch.long)
    out = ops.attend(q, k, v, lo, hi, 0.3, 0.0)
    want = reference_attention(q, k.float(), v.float(), lo, hi, 0.3, 0.0)
    assert torch.allclose(out.double(), want, atol=2e-6)
    for r in range(t):
        one = ops.attend(q[:, r:r + 1], k[:, :hi[r] + 1], v[:, :hi[r] + 1], lo[r:r + 1],
                         hi[r:r + 1], 0.3, 0.0)
        assert torch.equal(one[0], out[r]), f"row {r}"


@pytest.mark.parametrize("softcap,d", [(0.0, 40), (0.0, 64), (30.0, 128)])
def test_attention_over_an_fp16_cache_is_the_fp32_arithmetic_on_the_widened_values(ops, softcap, d):
    # the fp16 storage only changes how keys and values are read: widened exactly, then the same
    # fp32 arithmetic, so the result is bit for bit the fp32 kernel's on the widened copies
    g = torch.Generator().manual_seed(6)
    hq, hkv, length, t = 6, 2, 70, 8
    q = torch.randn(hq, t, d, generator=g)
    k_buf = torch.randn(hkv, 100, d, generator=g).half()
    v_buf = torch.randn(hkv, 100, d, generator=g).half()
    k, v = k_buf[:, :length], v_buf[:, :length]
    hi = torch.arange(length - t, length)
    lo = torch.zeros(t, dtype=torch.long)
    out = ops.attend(q, k, v, lo, hi, 0.3, softcap)
    assert torch.equal(out, ops.attend(q, k.float(), v.float(), lo, hi, 0.3, softcap))
    for r in range(t):
        one = ops.attend(q[:, r:r + 1], k[:, :hi[r] + 1], v[:, :hi[r] + 1], lo[r:r + 1],
                         hi[r:r + 1], 0.3, softcap)
        assert torch.equal(one[0], out[r])
    with pytest.raises(RuntimeError, match="fp32 or fp16"):
        ops.attend(q, k, v.float(), lo, hi, 0.3, softcap)


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_a_prompts_rows_interleaved_by_eight_give_the_row_by_row_bits(ops, fmt):
    """A prompt's rows (64 or more) are also kept interleaved by 8 for the tiled kernel of the
    formats with groups of 32 (one pointer for 8 rows): every row's result is the one it gets
    in the row-major layout, alone or beside other rows, the rows after the last block of 8
    included."""
    n, k, m = 67, 512, 100  # 12 blocks of 8 rows and 4 more; edge tiles too
    raw, code = as_layout(fmt, torch.from_numpy(random_packed(fmt, n, k, seed=8)), k, "tiled")
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(9))
    try:
        ops.set_interleaved_rows(False)
        rows = ops.qmatmul(x, raw, code, k)
        ops.set_interleaved_rows(True)
        interleaved = ops.qmatmul(x, raw, code, k)
    finally:
        ops.set_interleaved_rows(True)
    assert torch.equal(interleaved, rows)
    for start, count in ((0, 1), (50, 7), (36, 64)):
        assert torch.equal(ops.qmatmul(x[start:start + count], raw, code, k),
                           interleaved[start:start + count]), (start, count)


@pytest.mark.parametrize("d", [40, 64, 128])
@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("softcap,window", [(0.0, None), (30.0, None), (0.0, 9)])
def test_the_sixteen_lane_attention_gives_the_eight_lane_bits(ops, d, half, softcap, window):
    """With AVX-512 attention runs 16 lanes where it ran 8 (two keys' sums a register, the same
    pairs added in the same order): every path — a prompt's shared rows, a verify's rows, one
    row alone, soft-capping, a sliding window, fp16 and fp32 caches — gives the 8-lane loops'
    bits, so caches read before and after stay the same and speculation stays exact."""
    if not ops.set_wide_attention(True):
        pytest.skip("no AVX-512 here: attention runs its 8-lane loops only")
    g = torch.Generator().manual_seed(11)
    hq, hkv = 6, 2
    for start, t in ((0, 43), (300, 43), (517, 5), (70, 1)):
        length = start + t
        q = torch.randn(hq, t, d, generator=g)
        k = torch.randn(hkv, length, d, generator=g)
        v = torch.randn(hkv, length, d, generator=g)
        if half:
            k, v = k.half(), v.half()
        hi = torch.arange(start, length)
        lo = (hi - window + 1).clamp(min=0) if window else torch.zeros(t, dtype=torch.long)
        try:
            wide = ops.attend(q, k, v, lo, hi, 0.3, softcap)
            ops.set_wide_attention(False)
            narrow = ops.attend(q, k, v, lo, hi, 0.3, softcap)
        finally:
            ops.set_wide_attention(True)
        assert torch.equal(wide, narrow), f"{t} rows after {start} keys"
        want = reference_attention(q, k.float(), v.float(), lo, hi, 0.3, softcap)
        assert torch.allclose(wide.double(), want, atol=2e-6)


def test_the_prefetch_distance_is_compiled_from_the_cpus_maker(tmp_path, monkeypatch):
    """AMD parts get weight bytes requested 8 KiB ahead and the products' broadcasts from their
    memory operands (measured faster there), others the 2 KiB and the broadcast loads of
    tiled.h; the choice is part of the build key, so each build is the machine's own."""
    from ragspec import cpuinfo

    keys = {}
    amd = ("-DRS_AHEAD_BYTES=8192", "-DRS_LOAD_BROADCAST=0")
    for vendor, want in (("AuthenticAMD", amd), ("GenuineIntel", ())):
        info = tmp_path / vendor
        info.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu avx2\n")
        monkeypatch.setattr(cpuinfo, "CPUINFO", info)
        assert native.tuning_flags() == want
        keys[vendor] = native.build_key()
    assert keys["AuthenticAMD"] != keys["GenuineIntel"]


def test_every_data_folder_shares_one_kernel_build_and_one_model_cache(tmp_path, monkeypatch):
    """The build depends on the machine, not on RAGSPEC_HOME or the model cache: two homes (a
    checkout's .ragspec-home and a plain shell's ~/.ragspec) find the same folder, in the user's
    cache folder, so a new home never compiles again; RAGSPEC_KERNELS_DIR moves it. The model
    cache (converted weights, forward costs) is shared the same way, except by a home that
    already has its own models/ folder."""
    from ragspec import paths

    monkeypatch.delenv(native.KERNELS_ENV, raising=False)
    monkeypatch.delenv(paths.CACHE_ENV, raising=False)
    monkeypatch.delenv(paths.MODEL_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folders, models = set(), set()
    for home in ("one", "two"):
        monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / home))
        folders.add(native.build_folder(paths.models_dir()))
        models.add(paths.models_dir())
    assert folders == {tmp_path / "cache" / "ragspec" / "kernels" / native.build_key()}
    assert models == {tmp_path / "cache" / "ragspec" / "models"}
    (tmp_path / "two" / "models").mkdir(parents=True)  # a data folder from before keeps its own
    assert paths.models_dir() == tmp_path / "two" / "models"
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "moved"))
    monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / "one"))
    assert paths.models_dir() == tmp_path / "moved" / "models"
    assert native.build_folder().parent == tmp_path / "moved" / "kernels"
    monkeypatch.delenv(paths.CACHE_ENV)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert native.build_folder().parent == tmp_path / "user" / ".cache" / "ragspec" / "kernels"
    monkeypatch.setenv(native.KERNELS_ENV, str(tmp_path / "elsewhere"))
    assert native.build_folder(tmp_path / "one").parent == tmp_path / "elsewhere"


def test_a_killed_builds_mark_does_not_make_the_next_build_wait_forever(tmp_path, monkeypatch):
    """torch waits while its "lock" file is in the build folder; a build killed half way leaves
    it. The next build (under ragspec's own lock, which a dead holder releases) removes it
    before torch looks, instead of hanging every later run."""
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setenv(native.KERNELS_ENV, str(tmp_path / "kernels"))
    folder = native.build_folder(tmp_path)
    folder.mkdir(parents=True)
    (folder / native.TORCH_BATON).touch()  # what a killed build left
    seen = []

    def load(**kwargs):  # torch's load, as far as the baton goes: it would wait while it exists
        seen.append((Path(kwargs["build_directory"]) / native.TORCH_BATON).exists())

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setattr(native, "_built", None)
    native._build(tmp_path)
    assert seen == [False]


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 49152, 49157])
def test_argmax_rows_is_torch_argmax_with_ties_infinities_and_nans(ops, vocab):
    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(12, vocab, generator=gen)
    if vocab > 4:
        x[1, vocab // 3] = x[1, vocab - 2] = x[1].max() + 1  # a tie: the first index wins
        x[2, :] = 0.0  # all equal
        x[3, vocab // 2] = float("inf")
        x[4, vocab - 1] = float("nan")  # torch.argmax picks a NaN, the first one
        x[4, vocab // 4] = float("nan")
        x[5, :] = float("-inf")
        x[6, 0] = -0.0  # -0.0 and +0.0 are equal: the first one
        x[6, 1:] = -1.0
        x[6, vocab - 1] = 0.0
        x[7, vocab - 1] = float("nan")  # a NaN in the tail after the vector part
        x[8] = x[8] * 1e-30  # subnormals
    assert ops.argmax_rows(x) == x.argmax(-1).tolist()
    assert ops.argmax_rows(x[3:9]) == x[3:9].argmax(-1).tolist()
