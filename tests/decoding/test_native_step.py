"""The native decode step (ragspec.decoding.native_step, native/step.cpp) against its oracle.

For each family it covers, as a tiny random model packed to int8 / int4 / bf16: the logits and
cache contents of the native step equal the module-based packed forward's (the same kernels
under transformers' modules) within float rounding, which a quantised model's int8 activations
amplify only where an input sits on a rounding tie (one row at most: TIE_TOLERANCE); a verify
forward is bit-identical to one-token steps, also after a rollback; greedy speculation gives the same tokens as plain decoding; and a
model or a call the native step does not cover runs the module path unchanged.
"""

from __future__ import annotations

import pytest
import torch
from conftest import _COMMON, MODEL_CACHE, make_family_model
from test_arch_matrix import matrix_prompts
from test_packed import packed_copy

from ragspec.decoding import native, native_step
from ragspec.decoding.cache import crop_cache, new_cache
from ragspec.decoding.engine import Generator
from ragspec.decoding.packed import STEP_ROWS
from ragspec.decoding.types import DraftConfig, GenerationConfig

# family -> config overrides: each family's trait on, sliding windows off (those keep modules)
COVERED = {
    "llama": dict(attention_bias=False),
    "mistral": dict(sliding_window=None),
    "qwen2": dict(use_sliding_window=False),  # q/k/v biases
    "qwen3": {},  # per-head q/k norms
    "granite": dict(embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2,
                    logits_scaling=4.0),
    # layer 0 takes no rotary positions; untied, as a tied random model repeats its last token
    # (every draft would be accepted)
    "smollm3": dict(no_rope_layers=[0, 1], tie_word_embeddings=False),
}
WEIGHTS = ("int8", "int4", "bf16")
# |native - module| over the logits' scale; float rounding in norms, rotary and activations
# (the products and attention are the same kernels) stays far below this
TOLERANCE = 1e-4
# int8/int4 products quantise their inputs to int8 per group of 32 (round to nearest): an input
# sitting on a rounding tie (x/d = 22.5 in the tiny Qwen3's last o_proj) that one ulp of float
# rounding moves changes by a whole step, and that row's later values by ~2e-3 of their scale.
# Ties are rare, so a quantised model may have ONE row of a call past TOLERANCE, none past this;
# a fault in the step (a wrong rotary position, say) moves several rows.
TIE_TOLERANCE = 1e-2


@pytest.fixture(scope="module", autouse=True)
def kernels(one_thread):
    native.ops(MODEL_CACHE)


def _model(family: str, vocab: int, seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM


    torch.manual_seed(seed)
    config = AutoConfig.for_model(family, vocab_size=vocab, **{**_COMMON, **COVERED[family]})
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module")
def pairs(tiny_tokenizer, tmp_path_factory):
    """family -> (packed model with the native step, its module forward, weights)."""
    built = {}
    for i, family in enumerate(COVERED):
        weights = WEIGHTS[i % len(WEIGHTS)]
        model = packed_copy(_model(family, len(tiny_tokenizer)), weights,
                            tmp_path_factory.mktemp(family))
        module_forward = model.forward
        assert native_step.install(model) is None
        built[family] = model, module_forward, weights
    return built


def _assert_close(a: torch.Tensor, b: torch.Tensor, weights: str, row_dim: int = 0) -> None:
    """a equals b to float rounding, row by row along row_dim (a token's logits, a cache position),
    allowing a quantised model one row moved by an activation rounding tie (TIE_TOLERANCE).
    fp16 tensors (the cache's storage) may also differ by the one ulp that float rounding before
    the store can move a value across a rounding boundary."""
    assert a.dtype == b.dtype
    half = a.dtype == torch.float16
    a, b = a.float(), b.float()
    diff = (a - b).abs()
    if half:
        diff = (diff - torch.finfo(torch.float16).eps * b.abs()).clamp_min(0)
    diff = diff.movedim(row_dim, 0).reshape(a.shape[row_dim], -1).amax(-1)
    errors = diff / b.abs().max().clamp_min(1e-6)
    if weights == "bf16":
        assert float(errors.max()) < TOLERANCE, (weights, errors.tolist())
        return
    assert float(errors.max()) < TIE_TOLERANCE and int((errors >= TOLERANCE).sum()) <= 1, (
        weights, errors.tolist())


def _inputs(model, seed: int, length: int, count: int = 1):
    """A test prompt and `count` random runs of `length` tokens for `model`."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    runs = [torch.randint(3, vocab, (1, length), generator=g) for _ in range(count)]
    return next(matrix_prompts(vocab, 1, seed=seed + 1)), runs


def _layer_kv(cache, length: int):
    return [(layer.keys[..., :length, :], layer.values[..., :length, :]) for layer in cache.layers]


@pytest.mark.parametrize("family", COVERED)
def test_native_logits_and_cache_match_the_module_forward(pairs, family):
    model, module_forward, weights = pairs[family]
    prompt, (draft,) = _inputs(model, 1, 5)
    native_step.reset_stats(model)
    with torch.inference_mode():
        ours, theirs = new_cache(model), new_cache(model)
        ids = torch.tensor([prompt])
        a = model(input_ids=ids, cache=ours, use_cache=True).logits[0]  # a short prefill: a step
        b = module_forward(input_ids=ids, cache=theirs, use_cache=True).logits[0]
        _assert_close(a, b, weights)
        a = model(input_ids=draft, cache=ours, use_cache=True).logits[0]
        b = module_forward(input_ids=draft, cache=theirs, use_cache=True).logits[0]
        _assert_close(a, b, weights)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        length = len(prompt) + draft.shape[1]
        assert ours.get_seq_length() == theirs.get_seq_length() == length
        for (ka, va), (kb, vb) in zip(_layer_kv(ours, length), _layer_kv(theirs, length), strict=True):
            _assert_close(ka, kb, weights, row_dim=-2)
            _assert_close(va, vb, weights, row_dim=-2)
    assert native_step.stats(model)["forwards"] == 2  # both went through the native step


@pytest.mark.parametrize("pages", [False, True])
def test_a_long_prefill_runs_the_modules_or_their_pages_and_the_steps_after_it_are_native(
        pairs, monkeypatch, pages):
    """bf16/fp32 prompt reads (packed.prefill_precision) de-quantise on the modules: the whole
    forward, or with RAGSPEC_PROMPT_PAGES=1 a page at a time, the piece holding the last token
    being the native step's (native_step._read_in_pages). The steps after it are native."""
    from ragspec.decoding.packed import (
        PAGES_ENV,
        PREFILL_ENV,
        PROMPT_PAGE,
        prefill_precision,
        prompt_pages,
        reads_in_pages,
    )

    model, module_forward, weights = pairs["llama"]
    vocab = model.config.vocab_size
    prompt = torch.randint(3, vocab, (1, STEP_ROWS + 6), generator=torch.Generator().manual_seed(3))
    monkeypatch.setenv(PREFILL_ENV, "fp32")
    monkeypatch.setenv(PAGES_ENV, "1" if pages else "0")
    prefill_precision.cache_clear()
    reads_in_pages.cache_clear()
    native_step.reset_stats(model)
    try:
        with torch.inference_mode():
            ours, theirs = new_cache(model), new_cache(model)
            a = model(input_ids=prompt, cache=ours, use_cache=True, logits_to_keep=1).logits[0]
            if pages:
                assert native_step.stats(model)["forwards"] == 1  # the last piece
                with prompt_pages():  # the first page, as a forward of its own on the modules
                    module_forward(input_ids=prompt[:, :PROMPT_PAGE], cache=theirs, use_cache=True)
                for (ka, va), (kb, vb) in zip(_layer_kv(ours, PROMPT_PAGE),
                                              _layer_kv(theirs, PROMPT_PAGE), strict=True):
                    assert torch.equal(ka, kb) and torch.equal(va, vb)
                b = module_forward(input_ids=prompt[:, PROMPT_PAGE:], cache=theirs,
                                   use_cache=True, logits_to_keep=1).logits[0]
                _assert_close(a, b, weights)
            else:
                b = module_forward(input_ids=prompt, cache=theirs, use_cache=True,
                                   logits_to_keep=1).logits[0]
                assert torch.equal(a, b) and native_step.stats(model)["forwards"] == 0
            token = a.argmax(-1, keepdim=True)
            for _ in range(3):
                a = model(input_ids=token, cache=ours, use_cache=True).logits[0]
                b = module_forward(input_ids=token, cache=theirs, use_cache=True).logits[0]
                _assert_close(a, b, weights)
                token = a.argmax(-1, keepdim=True)
    finally:
        prefill_precision.cache_clear()
        reads_in_pages.cache_clear()
    assert native_step.stats(model)["forwards"] == 3 + pages


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_an_int8_prompt_read_gives_every_row_what_one_token_steps_give(pairs, monkeypatch, family):
    """int8 prompt reads run the native step in pieces of PIECE_ROWS rows; row invariance makes
    each row's logits and cached keys and values those of one-token steps, bit for bit."""
    from ragspec.decoding.packed import PREFILL_ENV, prefill_precision

    model, _, _ = pairs[family]
    vocab = model.config.vocab_size
    rows = STEP_ROWS + 30
    prompt = torch.randint(3, vocab, (1, rows), generator=torch.Generator().manual_seed(5))
    monkeypatch.setenv(PREFILL_ENV, "int8")
    monkeypatch.setattr(native_step, "PIECE_ROWS", 40)
    prefill_precision.cache_clear()
    native_step.reset_stats(model)
    try:
        with torch.inference_mode():
            whole, stepped = new_cache(model), new_cache(model)
            a = model(input_ids=prompt, cache=whole, use_cache=True).logits[0]
            assert native_step.stats(model)["forwards"] == 3  # 40 + 40 + 14 rows
            b = torch.cat([model(input_ids=prompt[:, i:i + 1], cache=stepped,
                                 use_cache=True).logits[0] for i in range(rows)])
            assert a.shape == (rows, vocab) and torch.equal(a, b)
            for (ka, va), (kb, vb) in zip(_layer_kv(whole, rows), _layer_kv(stepped, rows),
                                          strict=True):
                assert torch.equal(ka, kb) and torch.equal(va, vb)
            last = model(input_ids=prompt, cache=new_cache(model), use_cache=True,
                         logits_to_keep=3).logits[0]
            assert torch.equal(last, b[-3:])
    finally:
        prefill_precision.cache_clear()


@pytest.mark.parametrize("family", COVERED)
def test_a_verify_is_bit_identical_to_one_token_steps_and_after_a_rollback(pairs, family):
    model, _, _ = pairs[family]
    prompt, (draft, other) = _inputs(model, 0, 7, count=2)
    with torch.inference_mode():
        cache = new_cache(model)
        model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        base = cache.get_seq_length()
        steps = torch.cat([model(input_ids=draft[:, i:i + 1], cache=cache, use_cache=True).logits[0]
                           for i in range(draft.shape[1])])
        crop_cache(cache, base)
        together = model(input_ids=draft, cache=cache, use_cache=True).logits[0]
        assert torch.equal(together, steps)
        # a rejected draft: roll back 4 positions and verify other tokens there
        crop_cache(cache, base + 3)
        rolled = model(input_ids=other[:, :4], cache=cache, use_cache=True).logits[0]
        # the same tokens one step at a time on a cache that never held the rejected ones
        fresh = new_cache(model)
        model(input_ids=torch.tensor([prompt]), cache=fresh, use_cache=True)
        alone = torch.cat([model(input_ids=t[:, i:i + 1], cache=fresh, use_cache=True).logits[0]
                           for t, n in ((draft, 3), (other, 4)) for i in range(n)])[3:]
        assert torch.equal(rolled, alone)


@pytest.mark.parametrize("family", COVERED)
def test_greedy_speculation_on_the_native_step_equals_plain_decoding(pairs, tiny_tokenizer, family):
    model, _, _ = pairs[family]
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[2])
    spec = GenerationConfig(max_new_tokens=32, draft=DraftConfig(adaptive=False))
    plain = GenerationConfig(max_new_tokens=32, draft=DraftConfig(enabled=False))
    accepted, rejected = 0, 0
    native_step.reset_stats(model)
    for prompt in matrix_prompts(model.config.vocab_size, 4):
        on, off = gen.generate(prompt, spec), gen.generate(prompt, plain)
        assert on.token_ids == off.token_ids
        accepted += on.stats.accepted_tokens
        rejected += on.stats.drafted_tokens - on.stats.accepted_tokens
    assert accepted > 0 and rejected > 0  # drafts were accepted and rolled back
    assert native_step.stats(model)["forwards"] > 0


def test_families_and_layers_it_does_not_cover_keep_the_modules(tiny_tokenizer, tmp_path,
                                                                 monkeypatch):
    windowed = packed_copy(make_family_model("mistral", len(tiny_tokenizer)), "int8", tmp_path / "m")
    assert "sliding-window" in native_step.install(windowed)
    gemma = packed_copy(make_family_model("gemma3_text", len(tiny_tokenizer)), "int8", tmp_path / "g")
    assert "not a family" in native_step.install(gemma)
    llama = packed_copy(_model("llama", len(tiny_tokenizer)), "int8", tmp_path / "l")
    monkeypatch.setenv(native_step.ENV, "0")
    assert "turned off" in native_step.install(llama)
    for model in (windowed, gemma, llama):
        assert not native_step.installed(model) and "forward" not in vars(model)


def test_the_cache_stores_fp16_by_default_and_fp32_when_asked(tiny_tokenizer, tmp_path, monkeypatch):
    logits, storages, first_layer = {}, {}, {}
    for choice in ("", "fp32"):
        monkeypatch.setenv(native_step.KV_ENV, choice)
        model = packed_copy(_model("llama", len(tiny_tokenizer)), "bf16", tmp_path / (choice or "default"))
        assert native_step.install(model) is None
        prompt, (draft,) = _inputs(model, 1, 5)
        cache = new_cache(model)
        with torch.inference_mode():
            model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
            logits[choice] = model(input_ids=draft, cache=cache, use_cache=True).logits[0]
        storages[choice] = {layer.keys.dtype for layer in cache.layers} | {
            layer.values.dtype for layer in cache.layers}
        first_layer[choice] = cache.layers[0].keys, cache.layers[0].values
    assert storages == {"": {torch.float16}, "fp32": {torch.float32}}
    # the first layer's keys and values come from the tokens alone, so both models compute the
    # same fp32 values; the fp16 cache holds them rounded to nearest, as torch rounds them
    for stored, exact in zip(first_layer[""], first_layer["fp32"], strict=True):
        assert torch.equal(stored, exact.half())
    # the same model: the stored keys' rounding moves the logits a little, no more
    change = (logits[""] - logits["fp32"]).abs().max() / logits["fp32"].abs().max()
    assert 0 < float(change) < 1e-2
    monkeypatch.setenv(native_step.KV_ENV, "int4")
    with pytest.raises(ValueError, match="fp16 or fp32"):
        native_step.install(model)


def test_transformers_generate_takes_the_native_step_and_gives_the_engine_s_tokens(
        pairs, tiny_tokenizer):
    from test_arch_matrix import hf_greedy

    model, _, _ = pairs["qwen3"]
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[2])
    for prompt in matrix_prompts(model.config.vocab_size, 2, seed=5):
        native_step.reset_stats(model)
        want = hf_greedy(model, prompt, 16)
        assert native_step.stats(model)["forwards"] >= 15  # generate's decode steps ran natively
        got = gen.generate(prompt, GenerationConfig(max_new_tokens=16, draft=DraftConfig(adaptive=False)))
        assert got.token_ids == want


def test_a_ragged_forward_with_the_native_step_equals_each_sequence_alone(pairs):
    """Three sequences of different lengths in one batched (ragged) forward give, bit for bit,
    the logits and caches each gives alone, and the decode blocks run as one native call."""
    from ragspec.decoding.ragged import Block, packed_forward

    model, _, _ = pairs["qwen3"]
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (STEP_ROWS + 9, 5, 23)]
    steps = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (3, 1, 6)]
    with torch.inference_mode():
        alone, batched = [new_cache(model) for _ in prompts], [new_cache(model) for _ in prompts]
        want = [model(input_ids=torch.tensor([p]), cache=c, use_cache=True, logits_to_keep=1).logits[0]
                for p, c in zip(prompts, alone, strict=True)]
        got = packed_forward(model, [Block(c, p, 0, "last") for p, c in zip(prompts, batched, strict=True)])
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
        starts = [len(p) for p in prompts]
        want = [model(input_ids=torch.tensor([s]), cache=c, use_cache=True).logits[0]
                for s, c in zip(steps, alone, strict=True)]
        native_step.reset_stats(model)
        got = packed_forward(model, [Block(c, s, n) for s, c, n in zip(steps, batched, starts, strict=True)])
        assert native_step.stats(model)["forwards"] == 1  # all three blocks in one native call
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
        for a, b in zip(alone, batched, strict=True):
            length = a.get_seq_length()
            assert b.get_seq_length() == length
            for (ka, va), (kb, vb) in zip(_layer_kv(a, length), _layer_kv(b, length), strict=True):
                assert torch.equal(ka, kb) and torch.equal(va, vb)


@pytest.mark.parametrize("family", ["qwen3", "granite"])
def test_one_native_call_over_several_sequences_equals_each_alone(pairs, family):
    """forward_many over 3 sequences with different cache lengths, row counts and kept rows
    gives each sequence's logits and K/V bit for bit as its own forward alone, twice in a row
    (the second call on caches the first grew), and after one sequence's draft is rolled back."""
    model, _, _ = pairs[family]
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(21)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (9, 30, 2)]

    def caches():
        out = [new_cache(model) for _ in prompts]
        with torch.inference_mode():
            for p, c in zip(prompts, out, strict=True):
                model(input_ids=torch.tensor([p]), cache=c, use_cache=True)
        return out

    alone, together = caches(), caches()
    with torch.inference_mode():
        for rows, keeps in (((3, 1, 6), (3, 1, 1)), ((1, 5, 2), (1, 0, 2))):
            tokens = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in rows]
            want = [model(input_ids=torch.tensor([t]), cache=c, use_cache=True).logits[0][len(t) - k:]
                    for t, c, k in zip(tokens, alone, keeps, strict=True)]
            for t, c in zip(tokens, together, strict=True):
                assert native_step.start_of(model, len(t), c) == c.get_seq_length()
            native_step.reset_stats(model)
            got = native_step.forward_many(model, list(zip(tokens, together, keeps, strict=True)))
            assert native_step.stats(model)["forwards"] == 1
            for a, b, k in zip(got, want, keeps, strict=True):
                assert a.shape[0] == k and torch.equal(a, b)
            for a, b in zip(alone, together, strict=True):
                length = a.get_seq_length()
                assert b.get_seq_length() == length
                for (ka, va), (kb, vb) in zip(_layer_kv(a, length), _layer_kv(b, length), strict=True):
                    assert torch.equal(ka, kb) and torch.equal(va, vb)
            # the second sequence's draft is rejected: both roll it back the same way
            for c in (alone[1], together[1]):
                crop_cache(c, c.get_seq_length() - 1)


def test_served_beside_others_a_request_gives_its_solo_answer_on_the_native_step(pairs, tiny_tokenizer):
    from ragspec.decoding.scheduler import Scheduler

    model, _, _ = pairs["llama"]
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[2])
    configs = [GenerationConfig(max_new_tokens=24 + 4 * i, draft=DraftConfig(adaptive=False))
               for i in range(3)]
    requests = list(zip(matrix_prompts(model.config.vocab_size, 3), configs, strict=True))
    native_step.reset_stats(model)
    want = [gen.generate(p, c).token_ids for p, c in requests]
    solo_calls = native_step.stats(model)["forwards"]
    scheduler = Scheduler(gen, max_active=3)
    native_step.reset_stats(model)
    try:
        handles = [scheduler.submit(p, c) for p, c in requests]
        got = [h.result().token_ids for h in handles]
    finally:
        scheduler.close()
    assert got == want
    # the sequences decoded together share native calls (one per step, not one per sequence)
    assert native_step.stats(model)["forwards"] < solo_calls


def test_prompt_pieces_ride_in_the_decoding_sequences_native_call_with_the_solo_answers(
        pairs, tiny_tokenizer, monkeypatch):
    """With int8 prompt reads (the native step reads prompts, so a piece reads as the whole), a
    newcomer's prompt is read a few rows per step inside the running answers' native call:
    every step is one call, no answer waits for a prompt forward of its own, and every answer
    is its solo answer. With bf16 prompt reads (prompts on the modules) nothing is shared.

    Machine-independent: the newcomers arrive from the first answer's listener (on the
    scheduler's thread, right after its first step), and the first answer decodes one token a
    step (no drafts) with no end-of-sequence token it can reach, so it is still decoding for
    its 39 remaining steps however fast or busy the machine is."""
    from ragspec.decoding.packed import PREFILL_ENV, prefill_precision
    from ragspec.decoding.scheduler import Scheduler

    model, _, _ = pairs["llama"]
    vocab = model.config.vocab_size
    # eos: an id no logit can pick; no prompt cache, so that the newcomers' prompts are read
    # here, beside the first answer, not restored from their solo runs' pages
    gen = Generator(model, tiny_tokenizer, eos_token_ids=[vocab], prompt_cache_bytes=0)
    configs = [GenerationConfig(max_new_tokens=40, draft=DraftConfig(enabled=False)),
               *(GenerationConfig(max_new_tokens=40 - 5 * i,
                                  draft=DraftConfig(adaptive=i % 2 == 0)) for i in range(1, 4))]
    requests = list(zip(matrix_prompts(vocab, 4, seed=4), configs, strict=True))
    pieces = len(requests[1][0]) // 5  # steps the first newcomer's prompt takes, 5 rows a step
    assert pieces < configs[0].max_new_tokens - 1  # all of them beside the first answer's rows
    try:
        monkeypatch.setenv(PREFILL_ENV, "bf16")
        prefill_precision.cache_clear()
        assert not native_step.reads_prompts(model) and not Scheduler(gen).shared
        monkeypatch.setenv(PREFILL_ENV, "int8")
        prefill_precision.cache_clear()
        want = [gen.generate(p, c).token_ids for p, c in requests]
        assert len(want[0]) == configs[0].max_new_tokens
        scheduler = Scheduler(gen, max_active=4, prefill_chunk=5)
        assert scheduler.shared
        native_step.reset_stats(model)
        newcomers = []

        def arrive():  # on the scheduler's thread, after each of the first answer's steps
            if not newcomers:
                newcomers.extend(scheduler.submit(p, c) for p, c in requests[1:])

        try:
            first = scheduler.submit(*requests[0], listener=arrive)
            got = [first.result().token_ids]
            got += [h.result().token_ids for h in newcomers]
        finally:
            scheduler.close()
    finally:
        prefill_precision.cache_clear()
    assert got == want
    times = scheduler.times
    # the first newcomer's prompt alone takes len // 5 shared steps
    assert times.shared_steps >= pieces
    assert times.stalled_seconds == 0 and native_step.stats(model)["forwards"] == times.steps


def test_attention_over_several_key_chunks_is_the_same_for_prompt_reads_verifies_and_steps(
        tiny_tokenizer, tmp_path, monkeypatch):
    """Over 600 cached positions a prompt read (runs of rows
    sharing key loads), a verify (runs of its rows with the query heads of their key head, on 2
    threads) and one-token steps (one task per query head) all give a row the same bits, at head size 64,
    and the logits stay those of the module forward to float rounding."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ragspec.decoding.packed import PREFILL_ENV, prefill_precision

    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", vocab_size=len(tiny_tokenizer), hidden_size=256,
                                  intermediate_size=256, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
    model = packed_copy(AutoModelForCausalLM.from_config(config).eval(), "int8", tmp_path)
    module_forward = model.forward
    assert native_step.install(model) is None
    vocab = config.vocab_size
    ids = torch.randint(3, vocab, (1, 600), generator=torch.Generator().manual_seed(9))
    monkeypatch.setenv(PREFILL_ENV, "int8")
    prefill_precision.cache_clear()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the task split the verify and the steps take depends on it
    try:
        with torch.inference_mode():
            read, stepped = new_cache(model), new_cache(model)
            whole = model(input_ids=ids[:, :590], cache=read, use_cache=True).logits[0]
            steps = torch.cat([model(input_ids=ids[:, i:i + 1], cache=stepped,
                                     use_cache=True).logits[0] for i in range(590)])
            assert torch.equal(whole, steps)
            verify = model(input_ids=ids[:, 590:], cache=read, use_cache=True).logits[0]
            after = torch.cat([model(input_ids=ids[:, i:i + 1], cache=stepped,
                                     use_cache=True).logits[0] for i in range(590, 600)])
            assert torch.equal(verify, after)
            theirs = module_forward(input_ids=ids, cache=new_cache(model), use_cache=True).logits[0]
            # rows to float rounding; an activation rounding tie (see TIE_TOLERANCE) moves a row
            # and the rows after it a little: over 600 rows, a handful
            errors = (torch.cat([whole, verify]) - theirs).abs().amax(-1) / theirs.abs().max()
            assert float(errors.max()) < TIE_TOLERANCE
            assert int((errors >= TOLERANCE).sum()) <= 6 and float(errors.median()) < 1e-6
    finally:
        torch.set_num_threads(threads)
        prefill_precision.cache_clear()
