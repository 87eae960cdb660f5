"""The prompt cache (ragspec.decoding.prefix_cache) is exact or off, on every prompt-read path.

Where the native step is installed — int8 prompt reads, and bf16 and fp32 ones in pages
(RAGSPEC_PROMPT_PAGES=1, native_step._read_in_pages) — a prompt whose prefix comes from the
cache leaves the KV cache and the logits bit for bit as one whole read does, and the answer
equals the uncached engine's and transformers' greedy `generate`'s, alone and through the
scheduler (the chat's toggle: the same prompt twice). bf16 and fp32 reads of the whole forward
(no pages; the test measures that a read in two pieces rounds otherwise) reuse no prefix but
recall an identical prompt whole, bit for bit as its one read left it (engine and scheduler);
the module forward keeps the cache off; the stats say why.
The budget holds; a full one costs only misses; a page is never used after another prefix than
its own, nor the page holding a prompt's last token (a step's read) kept.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import MODEL_CACHE
from cpuinfo_fixtures import cpuinfo as fake_cpuinfo
from test_arch_matrix import hf_greedy
from test_native_step import _model
from test_packed import packed_copy

from ragspec.decoding import native, native_step, prefix_cache
from ragspec.decoding.batch import BatchSequence, batch_step
from ragspec.decoding.cache import new_cache
from ragspec.decoding.engine import Generator
from ragspec.decoding.packed import PAGES_ENV, PREFILL_ENV, prefill_precision, reads_in_pages
from ragspec.decoding.prefix_cache import PAGE_TOKENS, PrefixCache
from ragspec.decoding.scheduler import Scheduler
from ragspec.decoding.types import DraftConfig, GenerationConfig

BIG = 64 << 20
SPEC = GenerationConfig(max_new_tokens=20, draft=DraftConfig(adaptive=False))
PLAIN = GenerationConfig(max_new_tokens=20, draft=DraftConfig(enabled=False))


@pytest.fixture(scope="module", autouse=True)
def kernels(one_thread):
    native.ops(MODEL_CACHE)


@pytest.fixture(scope="module")
def packed(tiny_tokenizer, tmp_path_factory):
    """A tiny Llama packed to int8 with the native step installed."""
    model = packed_copy(_model("llama", len(tiny_tokenizer)), "int8", tmp_path_factory.mktemp("m"))
    assert native_step.install(model) is None
    return model


def _precision(monkeypatch, value: str, pages: bool = True) -> None:
    """Prompt reads in `value`; bf16 and fp32 ones in pages (RAGSPEC_PROMPT_PAGES=1) unless not
    `pages`."""
    monkeypatch.setenv(PREFILL_ENV, value)
    monkeypatch.setenv(PAGES_ENV, "1" if pages else "0")
    prefill_precision.cache_clear()
    reads_in_pages.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_precision():
    yield
    prefill_precision.cache_clear()
    reads_in_pages.cache_clear()


def _prompts(vocab: int, shared: int, tails=(37, 51), seed: int = 3) -> list[list[int]]:
    """Prompts that share their first `shared` tokens and then go their own ways."""
    rng = random.Random(seed)
    head = [rng.randrange(3, vocab) for _ in range(shared)]
    return [head + [rng.randrange(3, vocab) for _ in range(n)] for n in tails]


def _read(model, prompt, cache, start: int = 0) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([prompt[start:]]), cache=cache, use_cache=True,
                     logits_to_keep=1).logits[0]


def _assert_same_cache(a, b, length: int) -> None:
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert la.get_seq_length() == lb.get_seq_length() == length
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def _assert_reuse_is_one_read(model, pages, prompt, cached: int) -> None:
    """Restoring `prompt` from `pages` gives `cached` positions, and reading the rest after them
    leaves the logits and the cache bit for bit as one whole read of the prompt does."""
    whole = new_cache(model)
    want = _read(model, prompt, whole)
    reused = new_cache(model)
    start = pages.restore(prompt, reused)
    assert start == cached
    assert torch.equal(_read(model, prompt, reused, start), want)
    _assert_same_cache(reused, whole, len(prompt))


PRECISIONS = ["int8", "bf16", "fp32"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_read_after_the_cached_prefix_is_bit_identical_to_one_whole_read(
        packed, monkeypatch, precision):
    """bf16/fp32: the rest after one cached page is two de-quantised pages and a step's piece,
    the calls a whole read makes there; a first prompt of exactly two pages keeps only its first
    (its second, holding its last token, was a step's read, not a de-quantised page's)."""
    _precision(monkeypatch, precision)
    first, second = _prompts(packed.config.vocab_size, 2 * PAGE_TOKENS, tails=(0, 70))
    pages = PrefixCache(BIG)
    cache = new_cache(packed)
    _read(packed, first, cache)
    assert pages.store(first, cache) == 1
    whole = new_cache(packed)
    want = _read(packed, second, whole)
    reused = new_cache(packed)
    start = pages.restore(second, reused)
    assert start == PAGE_TOKENS
    got = _read(packed, second, reused, start)
    assert torch.equal(got, want)
    _assert_same_cache(reused, whole, len(second))
    assert pages.store(second, reused) == 2
    # the same prompt again: everything but its last page (the last token is always read)
    again = new_cache(packed)
    start = pages.restore(second, again)
    assert start == (len(second) - 1) // PAGE_TOKENS * PAGE_TOKENS == 3 * PAGE_TOKENS
    assert torch.equal(_read(packed, second, again, start), want)
    _assert_same_cache(again, whole, len(second))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_with_the_cache_the_engine_answers_as_without_it_and_as_transformers_generate(
        packed, tiny_tokenizer, monkeypatch, precision):
    _precision(monkeypatch, precision)
    prompts = _prompts(packed.config.vocab_size, 2 * PAGE_TOKENS + 5, tails=(30, 40, 60))
    cold = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=0)
    warm = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=BIG)
    for i, prompt in enumerate(prompts):
        for config in (PLAIN, SPEC):  # the chat's toggle: speculation off, then on
            want = cold.generate(prompt, config)
            assert want.stats.cached_prompt_tokens == 0
            assert want.stats.prompt_cache_off.startswith("turned off")
            got = warm.generate(prompt, config)
            assert got.token_ids == want.token_ids
            assert got.stats.prompt_cache_off == ""
            cached = got.stats.cached_prompt_tokens
            if config is SPEC:  # the same prompt a second time: recalled whole, no forward
                assert cached == len(prompt)
            elif i > 0:  # the prefix an earlier prompt left
                assert cached == 2 * PAGE_TOKENS
        assert got.token_ids == hf_greedy(packed, prompt, PLAIN.max_new_tokens)[:len(got.token_ids)]
    stats = warm.prompt_cache_stats()
    assert stats["hits"] == 5 and stats["lookups"] == 6 and 0 < stats["hit_rate"] < 1
    assert 0 < stats["bytes"] <= BIG


def test_the_first_token_does_not_wait_for_the_prompt_to_be_kept(packed, tiny_tokenizer,
                                                                  monkeypatch):
    """The prompt read's pages and whole copy are kept once its first token is out, before the
    next forward: the first span comes with nothing kept yet, the next one after it is kept
    whole and in pages; an answer of one token keeps it too (recalled whole next time). The
    same through the scheduler's steps."""
    _precision(monkeypatch, "int8")
    prompt = _prompts(packed.config.vocab_size, 2 * PAGE_TOKENS + 5, tails=(30,))[0]
    warm = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=BIG)
    stream = warm.stream(prompt, PLAIN)
    next(stream)
    assert warm.prompt_cache_stats()["prompts"] == 0 and warm.prompt_cache_stats()["pages"] == 0
    next(stream)
    assert warm.prompt_cache_stats()["prompts"] == 1 and warm.prompt_cache_stats()["pages"] == 2
    want = stream.result().token_ids
    other = _prompts(packed.config.vocab_size, 2 * PAGE_TOKENS + 5, tails=(30,), seed=9)[0]
    one = GenerationConfig(max_new_tokens=1, draft=DraftConfig(enabled=False))
    assert warm.generate(other, one).stats.cached_prompt_tokens == 0
    assert warm.generate(other, PLAIN).stats.cached_prompt_tokens == len(other)
    assert warm.generate(prompt, PLAIN).token_ids == want
    # the scheduler's steps: the step that yields the first token keeps nothing, the next one
    # keeps the prompt before its forward (BatchSequence.plan_decode)
    third = _prompts(packed.config.vocab_size, 2 * PAGE_TOKENS + 5, tails=(30,), seed=11)[0]
    seq = BatchSequence(warm, third, PLAIN, recall=True)
    kept = warm.prompt_cache_stats()["prompts"]
    while not batch_step(warm, [seq])[seq].spans:
        pass
    assert warm.prompt_cache_stats()["prompts"] == kept
    batch_step(warm, [seq])
    assert warm.prompt_cache_stats()["prompts"] == kept + 1


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_scheduler_reuses_prompts_and_gives_the_solo_answers(packed, tiny_tokenizer,
                                                                   monkeypatch, precision):
    """Through the scheduler (the chat and `serve`): a request after another with the same
    prefix reads only past the cached pages, the toggle's second run of one prompt is recalled
    whole (kept whole after its pieces, which read as one); two requests at once share the pages
    the first one left. (bf16 and fp32 prompts are read whole,
    the scheduler's default: a chunk of a prompt reads as its own forward does.)"""
    _precision(monkeypatch, precision)
    prompts = _prompts(packed.config.vocab_size, 2 * PAGE_TOKENS + 2, tails=(20, 33, 70))
    cold = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=0)
    solo = {(i, c is SPEC): cold.generate(p, c).token_ids
            for i, p in enumerate(prompts) for c in (PLAIN, SPEC)}
    warm = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=BIG)
    scheduler = Scheduler(warm, prefill_chunk=16 if precision == "int8" else None)
    # int8 reads: prompt pieces ride in the decoding rows' call
    assert scheduler.shared == (precision == "int8")
    try:
        first = scheduler.submit(prompts[0], PLAIN).result()
        assert first.stats.cached_prompt_tokens == 0 and first.token_ids == solo[0, False]
        toggled = scheduler.submit(prompts[0], SPEC).result()
        assert toggled.stats.cached_prompt_tokens == len(prompts[0])
        assert toggled.token_ids == solo[0, True]
        together = [scheduler.submit(prompts[i], c) for i in (1, 2) for c in (PLAIN, SPEC)]
        for request, key in zip(together, [(i, c is SPEC) for i in (1, 2) for c in (PLAIN, SPEC)],
                                strict=True):
            result = request.result()
            assert result.token_ids == solo[key]
            assert result.stats.cached_prompt_tokens >= 2 * PAGE_TOKENS
    finally:
        scheduler.close()


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_dequantised_prompt_reads_round_otherwise_in_pieces_so_only_identical_prompts_are_reused(
        packed, tiny_tokenizer, monkeypatch, precision):
    """Without pages a bf16 or fp32 prompt read in two pieces rounds otherwise than one read, so
    no prefix is reused; an identical prompt is recalled whole (its cache and last logits as the
    one read left them), and the answer is the uncached one."""
    _precision(monkeypatch, precision, pages=False)
    prompt, other = _prompts(packed.config.vocab_size, 2 * PAGE_TOKENS + 10, tails=(37, 20))
    # measured: the prefix read as a prompt, the rest (a step's rows) as the cache would have it
    whole, pieces = new_cache(packed), new_cache(packed)
    want = _read(packed, prompt, whole)
    _read(packed, prompt[:2 * PAGE_TOKENS], pieces)
    got = _read(packed, prompt, pieces, 2 * PAGE_TOKENS)
    assert not torch.equal(got, want)
    cold = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=0)
    gen = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=BIG)
    for p in (prompt, other):  # a shared prefix is read again: it would round otherwise
        stats = gen.generate(p, PLAIN).stats
        assert stats.cached_prompt_tokens == 0
        assert precision in stats.prompt_cache_off and PAGES_ENV in stats.prompt_cache_off
    for config in (PLAIN, SPEC):  # "ask again", then the chat's toggle: the same tokens
        again = gen.generate(prompt, config)
        assert again.stats.cached_prompt_tokens == len(prompt)
        assert precision in again.stats.prompt_cache_off
        assert again.token_ids == cold.generate(prompt, config).token_ids
    stats = gen.prompt_cache_stats()
    assert stats["recalled"] == 2 and stats["prompts"] == 2 and PAGES_ENV in stats["prefixes_off"]
    assert stats["pages"] == 0 and 0 < stats["bytes"] <= BIG


def test_beside_amx_a_narrow_model_reads_prompts_in_int8_and_reuses_their_prefixes(
        packed, tiny_tokenizer, monkeypatch, tmp_path):
    """On a CPU with AMX-BF16 and VNNI the machine's prompt reads are bf16, but a model up to
    INT8_WIDTH_WITH_AMX wide reads its own in int8: a prompt read in two pieces is then one
    read, bit for bit, and the prompt cache reuses a shared prefix (a wider model's stays off)."""
    from ragspec import cpuinfo
    from ragspec.decoding import packed as packed_module

    monkeypatch.setattr(cpuinfo, "CPUINFO", fake_cpuinfo(tmp_path, "xeon-amx"))
    monkeypatch.delenv(PREFILL_ENV, raising=False)
    monkeypatch.setenv(PAGES_ENV, "0")
    prefill_precision.cache_clear()
    reads_in_pages.cache_clear()
    assert prefill_precision() == "bf16"
    assert native_step.prompt_precision(packed) == "int8" and prefix_cache.problem(packed) is None
    prompt, other = _prompts(packed.config.vocab_size, 2 * PAGE_TOKENS + 10, tails=(37, 20))
    whole, pieces = new_cache(packed), new_cache(packed)
    want = _read(packed, prompt, whole)
    _read(packed, prompt[:2 * PAGE_TOKENS], pieces)
    assert torch.equal(_read(packed, prompt, pieces, 2 * PAGE_TOKENS), want)
    _assert_same_cache(pieces, whole, len(prompt))
    cold = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=0)
    gen = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=BIG)
    gen.generate(prompt, PLAIN)
    answer = gen.generate(other, SPEC)
    assert answer.stats.cached_prompt_tokens == 2 * PAGE_TOKENS
    assert answer.token_ids == cold.generate(other, SPEC).token_ids
    monkeypatch.setattr(packed_module, "INT8_WIDTH_WITH_AMX", packed.config.hidden_size - 1)
    packed_module._model_precision.cache_clear()
    try:
        assert native_step.prompt_precision(packed) == "bf16"
        assert "bf16" in prefix_cache.problem(packed)
    finally:
        packed_module._model_precision.cache_clear()


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_recalled_prompt_is_bit_for_bit_the_one_read_and_only_under_the_same_read(
        packed, monkeypatch, precision):
    _precision(monkeypatch, precision, pages=False)
    prompt, other = _prompts(packed.config.vocab_size, 2 * PAGE_TOKENS + 10, tails=(37, 36))
    whole = new_cache(packed)
    want = _read(packed, prompt, whole)
    kept = PrefixCache(BIG)
    mark = prefix_cache.read_mark(packed)
    assert kept.keep_whole(prompt, whole, want, mark)
    recalled = new_cache(packed)
    logits = kept.recall(prompt, recalled, mark)
    assert torch.equal(logits, want.float())
    _assert_same_cache(recalled, whole, len(prompt))
    # another read, another prompt of the same length, or a prefix of it: nothing is written
    for p, m in ((prompt, ("int8", False, mark[2])), (prompt, (*mark[:2], mark[2] + 1)),
                 (other, mark), (prompt[:-1], mark)):
        fresh = new_cache(packed)
        assert kept.recall(p, fresh, m) is None and fresh.get_seq_length() == 0
    stats = kept.stats()
    assert stats.lookups == 5 and stats.recalled == stats.hits == 1
    assert stats.cached_tokens == len(prompt)


def test_whole_prompts_keep_within_the_budget_least_recently_used_first(packed, monkeypatch):
    _precision(monkeypatch, "bf16", pages=False)
    prompts = [_prompts(packed.config.vocab_size, 40, tails=(1,), seed=s)[0] for s in range(3)]
    mark = prefix_cache.read_mark(packed)
    caches = []
    for p in prompts:
        c = new_cache(packed)
        caches.append((c, _read(packed, p, c)))
    one = PrefixCache(BIG)
    assert one.keep_whole(prompts[0], *caches[0], mark)
    size = one.stats().bytes
    kept = PrefixCache(2 * size)
    assert kept.keep_whole(prompts[0], *caches[0], mark)
    assert kept.keep_whole(prompts[1], *caches[1], mark)
    assert kept.recall(prompts[0], new_cache(packed), mark) is not None  # 0 is now the newer
    assert kept.keep_whole(prompts[2], *caches[2], mark)  # makes room: 1 goes
    assert kept.recall(prompts[1], new_cache(packed), mark) is None
    for p in (prompts[0], prompts[2]):
        assert kept.recall(p, new_cache(packed), mark) is not None
    stats = kept.stats()
    assert stats.bytes <= 2 * size and stats.prompts == 2 and stats.evicted_pages == 1
    assert not PrefixCache(size - 1).keep_whole(prompts[0], *caches[0], mark)  # never fits


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_the_scheduler_recalls_an_identical_prompt_where_it_reads_prompts_whole(
        packed, tiny_tokenizer, monkeypatch, precision):
    """The chat's toggle through the scheduler on whole bf16/fp32 reads: the second run of the
    prompt runs no prompt forward and answers as the solo engine; two identical requests at once
    both get the solo answer. A scheduler that reads prompts in chunks (they round otherwise
    than one read) never recalls."""
    _precision(monkeypatch, precision, pages=False)
    prompt, other = _prompts(packed.config.vocab_size, 2 * PAGE_TOKENS + 2, tails=(20, 33))
    cold = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=0)
    solo = {(i, c is SPEC): cold.generate(p, c).token_ids
            for i, p in enumerate((prompt, other)) for c in (PLAIN, SPEC)}
    warm = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=BIG)
    scheduler = Scheduler(warm)
    assert scheduler.reads_whole
    try:
        first = scheduler.submit(prompt, PLAIN).result()
        assert first.stats.cached_prompt_tokens == 0 and first.token_ids == solo[0, False]
        toggled = scheduler.submit(prompt, SPEC).result()
        assert toggled.stats.cached_prompt_tokens == len(prompt)
        assert toggled.token_ids == solo[0, True]
        together = [scheduler.submit(other, c) for c in (PLAIN, SPEC, PLAIN)]
        results = [r.result() for r in together]
        assert [r.token_ids for r in results] == [solo[1, False], solo[1, True], solo[1, False]]
    finally:
        scheduler.close()
    assert warm.prompt_cache_stats()["recalled"] >= 1
    chunked = Scheduler(Generator(packed, tiny_tokenizer, eos_token_ids=[2],
                                  prompt_cache_bytes=BIG), prefill_chunk=16)
    assert not chunked.reads_whole
    try:
        for c in (PLAIN, SPEC):
            assert chunked.submit(prompt, c).result().stats.cached_prompt_tokens == 0
    finally:
        chunked.close()


def test_the_module_forward_keeps_the_cache_off_and_says_why(tiny_gen):
    prompt = _prompts(tiny_gen.model.config.vocab_size, 2 * PAGE_TOKENS + 5)[0]
    for _ in range(2):
        stats = tiny_gen.generate(prompt, PLAIN).stats
        assert stats.cached_prompt_tokens == 0
        assert "native step is not installed" in stats.prompt_cache_off
        assert stats.to_dict()["prompt_cache_off"] == stats.prompt_cache_off


def test_the_budget_holds_and_a_full_cache_only_misses(packed, tiny_tokenizer, monkeypatch):
    _precision(monkeypatch, "int8")
    vocab = packed.config.vocab_size
    per_page = prefix_cache.kv_bytes_per_token(packed) * PAGE_TOKENS
    prompts = [_prompts(vocab, 3 * PAGE_TOKENS + 1, tails=(2,), seed=s)[0] for s in range(3)]
    gen = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=2 * per_page)
    cold = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=0)
    for prompt in prompts:
        assert gen.generate(prompt, PLAIN).token_ids == cold.generate(prompt, PLAIN).token_ids
        stats = gen.prompt_cache_stats()
        assert stats["bytes"] <= 2 * per_page and stats["pages"] == 2  # its first two pages
    assert stats["evicted_pages"] == 4  # the earlier prompts' pages made room
    again = gen.generate(prompts[-1], PLAIN)
    assert again.stats.cached_prompt_tokens == 2 * PAGE_TOKENS
    assert again.token_ids == cold.generate(prompts[-1], PLAIN).token_ids
    # a budget smaller than one page keeps nothing and answers all the same
    tiny = Generator(packed, tiny_tokenizer, eos_token_ids=[2], prompt_cache_bytes=per_page - 1)
    for _ in range(2):
        result = tiny.generate(prompts[0], PLAIN)
        assert result.stats.cached_prompt_tokens == 0 and result.stats.prompt_cache_off == ""
        assert result.token_ids == cold.generate(prompts[0], PLAIN).token_ids
    assert tiny.prompt_cache_stats()["bytes"] == 0


def test_evicting_drops_the_deepest_pages_of_a_chain_first(packed, monkeypatch):
    _precision(monkeypatch, "int8")
    per_page = prefix_cache.kv_bytes_per_token(packed) * PAGE_TOKENS
    a = _prompts(packed.config.vocab_size, 3 * PAGE_TOKENS + 1, tails=(2,))[0]
    pages = PrefixCache(3 * per_page)
    cache = new_cache(packed)
    _read(packed, a, cache)
    assert pages.store(a, cache) == 3
    other = _prompts(packed.config.vocab_size, PAGE_TOKENS, tails=(1,), seed=9)[0]
    cache = new_cache(packed)
    _read(packed, other, cache)
    assert pages.store(other, cache) == 1  # evicts a's last page, not its first
    assert pages.stats().evicted_pages == 1
    assert pages.restore(a, new_cache(packed)) == 2 * PAGE_TOKENS
    assert pages.restore(other, new_cache(packed)) == PAGE_TOKENS


def test_a_page_is_used_only_after_the_very_prefix_it_was_read_after(packed, monkeypatch):
    """Even when two prefixes' keys collide (here: a key of the page's own tokens only), a page
    read after another prefix is not reused: the cache after the read is the whole read's."""
    _precision(monkeypatch, "int8")
    monkeypatch.setattr(prefix_cache, "_key", lambda parent, tokens: bytes(str(list(tokens)),
                                                                           "ascii"))
    vocab = packed.config.vocab_size
    rng = random.Random(4)
    page = [rng.randrange(3, vocab) for _ in range(PAGE_TOKENS)]
    head_x, head_y = ([rng.randrange(3, vocab) for _ in range(PAGE_TOKENS)] for _ in range(2))
    x, y = head_x + page + [5, 6, 7], head_y + page + [5, 6, 7]
    pages = PrefixCache(BIG)
    for prompt in (x, y):  # y's second page replaces x's under the colliding key
        cache = new_cache(packed)
        _read(packed, prompt, cache)
        pages.store(prompt, cache)
    _assert_reuse_is_one_read(packed, pages, x, PAGE_TOKENS)


def test_a_page_dropped_while_a_prompt_is_stored_leaves_no_page_out_of_place(packed,
                                                                               monkeypatch):
    """store() copies pages outside its lock; if another thread drops a page of the prefix
    meanwhile, the pages copied after it are not kept in its place (a repeated page's tokens
    would match there, with the keys and values of a later position)."""
    _precision(monkeypatch, "int8")
    vocab = packed.config.vocab_size
    rng = random.Random(5)
    head, again = ([rng.randrange(3, vocab) for _ in range(PAGE_TOKENS)] for _ in range(2))
    prompt = head + again + again + [5, 6, 7]
    pages = PrefixCache(BIG)
    cache = new_cache(packed)
    _read(packed, prompt[:2 * PAGE_TOKENS + 1], cache)
    assert pages.store(prompt[:2 * PAGE_TOKENS + 1], cache) == 2
    real, calls = pages._chain, []

    def chain(tokens, limit):
        calls.append(limit)
        if len(calls) == 2:  # between the two looks: the second page goes
            key = next(k for k, page in pages._pages.items() if page.parent != -1)
            pages._forget(pages._pages.pop(key))
        return real(tokens, limit)

    monkeypatch.setattr(pages, "_chain", chain)
    cache = new_cache(packed)
    _read(packed, prompt, cache)
    pages.store(prompt, cache)
    monkeypatch.setattr(pages, "_chain", real)
    _assert_reuse_is_one_read(packed, pages, prompt, PAGE_TOKENS)


def test_the_budget_comes_from_the_environment_or_the_machine(packed, monkeypatch):
    monkeypatch.setenv(prefix_cache.ENV, "3")
    assert prefix_cache.budget_bytes(packed) == 3 << 20
    monkeypatch.setenv(prefix_cache.ENV, "0")
    assert prefix_cache.budget_bytes(packed) == 0
    monkeypatch.setenv(prefix_cache.ENV, "lots")
    with pytest.raises(ValueError, match="whole number"):
        prefix_cache.budget_bytes(packed)
    monkeypatch.delenv(prefix_cache.ENV)
    context = packed.config.max_position_embeddings
    assert 0 < prefix_cache.budget_bytes(packed) <= 8 * context * prefix_cache.kv_bytes_per_token(packed)
