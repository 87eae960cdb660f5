"""4-bit linears (ragspec.decoding.quant): exact recovery of Q4_1 weights, the kernel against a
de-quantised matmul, the fp32 path for long inputs, and greedy identity of the engine against
transformers' generate on the same quantised model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ragspec.decoding import quant
from ragspec.decoding.engine import Generator
from ragspec.decoding.types import DraftConfig, GenerationConfig

pytestmark = pytest.mark.skipif(not quant.supported(), reason="no CPU int4-pack kernel in torch")


def q4_1_weight(out_f: int, in_f: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight as a Q4_1 GGUF de-quantises: 4-bit q with an fp16 scale d and minimum m per 32
    values, every group using 0 and 15 (Q4_1 maps the group's min and max there)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out_f, in_f // 32, 32), generator=g)
    q[..., 0], q[..., 1] = 0, 15
    d = (torch.rand(out_f, in_f // 32, 1, generator=g) * 0.05 + 0.005).half().float()
    # weights centred near zero, as in trained layers: the minimum sits about 7.5 steps below
    m = (-d * (6 + 3 * torch.rand(out_f, in_f // 32, 1, generator=g))).half().float()
    return (q * d + m).reshape(out_f, in_f), q.reshape(out_f, in_f)


def test_q4_1_weights_are_recovered_exactly():
    w, q = q4_1_weight(48, 96)
    got, scales_and_zeros = quant.quantize_weight(w)
    assert torch.equal(got, q.to(torch.int32))  # the file's own 4-bit values
    # only the scales' dtype changed: within bf16 rounding of scale and zero
    scale = scales_and_zeros[..., 0].float().transpose(0, 1).repeat_interleave(32, dim=1)
    assert ((quant.dequantize(got, scales_and_zeros) - w).abs() / scale).max() < 0.1


def test_short_inputs_run_the_int4_kernel_long_ones_the_fp32_weight():
    w, _ = q4_1_weight(64, 128, seed=1)
    linear = nn.Linear(128, 64, bias=True)
    with torch.no_grad():
        linear.weight.copy_(w)
    layer = quant.Int4Linear(linear, max_int4_tokens=4)
    reference = quant.dequantize(*quant.quantize_weight(w))
    x = torch.randn(1, 3, 128)
    want = (x.to(torch.bfloat16).float() @ reference.t()).to(torch.bfloat16).float() + linear.bias
    assert torch.allclose(layer(x), want, atol=0.05, rtol=0.02)
    long = torch.randn(1, 9, 128)
    assert torch.equal(layer(long), linear(long))
    # one token at a time or several at once: the same numbers (the kernel is batch-invariant)
    rows = torch.cat([layer(x[:, i : i + 1]) for i in range(3)], dim=1)
    assert torch.equal(rows, layer(x))


def test_quantize_linears_swaps_eligible_layers_only(tiny_tokenizer):
    from conftest import make_tiny_model

    model = make_tiny_model(len(tiny_tokenizer))
    linears = sum(type(m) is nn.Linear for m in model.modules())
    swapped = quant.quantize_linears(model)
    # the LM head (101 outputs) does not fit the kernel's blocks of 16: it stays fp32
    assert swapped == linears - 1 and type(model.lm_head) is nn.Linear
    assert all(type(m) is not nn.Linear for m in model.model.layers.modules())


def hf_greedy(model, prompt, max_new_tokens):
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("draft", [DraftConfig(enabled=False), DraftConfig(max_draft=32),
                                   DraftConfig(adaptive=False, max_draft=8)],
                         ids=["off", "adaptive", "k8"])
def test_greedy_on_the_quantised_model_is_identical_to_its_generate(tiny_tokenizer, draft):
    import random

    from conftest import make_tiny_model

    model = make_tiny_model(len(tiny_tokenizer), seed=2, max_position_embeddings=256)
    quant.quantize_linears(model, max_int4_tokens=33)  # prompts prefill on fp32, steps on int4
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[2])
    rng = random.Random(0)
    accepted = 0
    for i in range(10):
        base = [rng.randrange(3, len(tiny_tokenizer)) for _ in range(rng.randrange(4, 12))]
        prompt = (base * 8)[: rng.randrange(34, 60)] if i % 2 else base * 4
        result = gen.generate(prompt, GenerationConfig(max_new_tokens=32, draft=draft))
        assert result.token_ids == hf_greedy(model, prompt, 32), prompt
        accepted += result.stats.accepted_tokens
    assert accepted > 0 or not draft.enabled


def test_a_draft_too_long_for_the_int4_side_is_refused(tiny_tokenizer):
    from conftest import make_tiny_model

    model = make_tiny_model(len(tiny_tokenizer))
    quant.quantize_linears(model, max_int4_tokens=8)
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[2])
    with pytest.raises(ValueError, match="max_draft <= 7"):
        gen.stream([5, 6, 7], GenerationConfig(draft=DraftConfig(max_draft=8)))
    gen.stream([5, 6, 7], GenerationConfig(draft=DraftConfig(max_draft=7)))  # fits



def test_4bit_weights_are_opt_in(tmp_path, tiny_model, tiny_tokenizer, monkeypatch):
    from conftest import save_model_folder

    from ragspec.decoding.model import INT4_ENV, load_model

    folder = save_model_folder(tiny_model, tiny_tokenizer, tmp_path / "llama")
    monkeypatch.delenv(INT4_ENV, raising=False)
    assert not load_model(str(folder), tmp_path / "cache").int4
    monkeypatch.setenv(INT4_ENV, "1")
    loaded = load_model(str(folder), tmp_path / "cache")
    assert loaded.int4 and quant.int4_token_limit(loaded.model) is not None
    assert not load_model(str(folder), tmp_path / "cache", exact=True).int4
