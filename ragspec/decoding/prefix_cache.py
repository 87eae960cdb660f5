"""Prompts read once: the keys and values of prompt prefixes already read, reused by later reads.

Contract: a `PrefixCache` belongs to one loaded model (a Generator owns it). It holds pages of
`PAGE_TOKENS` prompt positions, each keyed by a hash of ALL token ids up to the page's end and
holding copies of that page's keys and values in every layer. `restore(prompt, cache)` writes
the longest run of cached pages that prefixes `prompt` into a fresh cache and returns how many
positions it wrote (a multiple of PAGE_TOKENS, always short of the prompt's last token, so the
first token's logits come from a real forward); the caller reads the rest. `store(prompt,
cache)` copies the prompt's whole pages before the one holding its last token (that one is
read by the step kernels on every path: native_step._read_in_pages) out of a cache that holds
(at least) the prompt. Memory
stays within `budget_bytes`: least recently used pages go first, deepest pages of a chain
before their prefixes (a lookup touches a chain from its end back to its start), so what is
dropped is always a suffix and never strands reachable pages. A page that would not fit is not
stored: a full budget costs misses, nothing else.

Exact by construction, not by luck: a page is used only when its tokens equal the prompt's
tokens at its place AND its parent is the very page (by serial number, not by hash) that
matched the positions before it, so a hit is a prompt prefix equal token for token. Reuse is
only switched on where reading a prompt after its cached pages leaves the cache and the logits
bit for bit as one read does (`problem(model)` is None): where the native step is installed, its
int8 prompt reads, which compute every row from that row alone (native_step.reads_prompts), and
its bf16 and fp32 prompt reads when they run in pages (RAGSPEC_PROMPT_PAGES=1,
native_step._read_in_pages: the rest after cached pages is read by the very calls a whole read
makes there). The test suite checks the cache and logits after a reuse against one whole read,
on each. Elsewhere `problem` says why the cache is off — bf16 and fp32 prompt reads of the
model's whole forward multiply a long prompt with de-quantised weights but a short rest with
the int8 step kernels, and the module forward rounds a prompt's rows with the shapes of its
forward — and GenerationStats.prompt_cache_off carries that line.

Identical prompts: `keep_whole(prompt, cache, logits, mark)` keeps a prompt read in ONE forward
(or, where pages are exact, in pieces that read as one) — every position's keys and values and
its last token's logits — and `recall(prompt, cache, mark)` writes them into a fresh cache and
returns the logits when the very same tokens come again (the chat's toggle, "ask again", a
repeated request to `serve`), so no forward runs at all. Exact because nothing is computed: the
cache and the logits are the bits the earlier whole read of the same tokens produced, and `mark`
(the prompt-read precision, pages or not, torch's thread count) must match, so an entry is only
used where the same call would have run. Used wherever the native step reads prompts on the CPU
(`whole_problem(model)` is None), beside the pages where those are exact too (an identical
prompt then needs no forward, not even for its last page); the module forward keeps it off (the
scheduler reads prompts there through another attention than the engine's). Entries share the
pages' budget and least-recently-used order.

Budget: `budget_bytes(model)`, the one reader of RAGSPEC_PROMPT_CACHE_MB (the CLI's
--prompt-cache-mb sets it; 0 turns the cache off); default min(RAM / 16, 8 full contexts of the
model's keys and values).
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
from array import array
from dataclasses import dataclass

import torch

from ragspec import cpuinfo
from ragspec.decoding.packed import PROMPT_PAGE

PAGE_TOKENS = PROMPT_PAGE  # a bf16 or fp32 prompt read's pieces end at these pages' ends
ENV = "RAGSPEC_PROMPT_CACHE_MB"
_ROOT = b"ragspec-prefix"


@dataclass
class Page:
    """One page: `tokens` at positions [index * PAGE_TOKENS, +PAGE_TOKENS); `kv` is
    (layers, 2, kv_heads, PAGE_TOKENS, head_dim), keys then values, as the cache stores them."""

    key: bytes
    serial: int
    parent: int  # the serial of the page before it (-1 for a prompt's first page)
    tokens: tuple[int, ...]
    kv: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


@dataclass
class WholePrompt:
    """A prompt read in one forward: `kv` (layers, 2, kv_heads, len(tokens), head_dim) and the
    last token's `logits` (1, vocab), as that read left them; `mark` says how it was read."""

    key: bytes
    tokens: tuple[int, ...]
    mark: tuple
    kv: torch.Tensor
    logits: torch.Tensor

    @property
    def nbytes(self) -> int:
        return (self.kv.numel() * self.kv.element_size()
                + self.logits.numel() * self.logits.element_size())


@dataclass
class PrefixStats:
    """Counters since the cache was made. A lookup is a prompt that could have been reused."""

    budget_bytes: int = 0
    bytes: int = 0
    pages: int = 0
    lookups: int = 0
    hits: int = 0  # lookups that reused at least one page
    prompt_tokens: int = 0  # over all lookups
    cached_tokens: int = 0  # of those, read from the cache
    stored_pages: int = 0
    evicted_pages: int = 0
    prompts: int = 0  # whole prompts held (recall), beside the pages
    recalled: int = 0  # lookups answered by a whole prompt: no forward at all

    @property
    def hit_rate(self) -> float:
        """The share of looked-up prompt tokens that came from the cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "bytes": self.bytes, "pages": self.pages,
                "lookups": self.lookups, "hits": self.hits, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "hit_rate": round(self.hit_rate, 4),
                "stored_pages": self.stored_pages, "evicted_pages": self.evicted_pages,
                "prompts": self.prompts, "recalled": self.recalled}


def _key(parent: bytes, tokens) -> bytes:
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()


def _layers(cache) -> list:
    return cache.layers


def _whole_key(tokens) -> bytes:
    return b"whole:" + hashlib.blake2b(array("q", tokens).tobytes(), digest_size=16).digest()


def _copy_out(layers, start: int, end: int) -> torch.Tensor:
    """Positions [start, end) of every layer's keys and values, copied into one
    (layers, 2, kv_heads, end - start, head_dim) tensor (a page's or a whole prompt's)."""
    k0 = layers[0]._key_buf
    kv = torch.empty((len(layers), 2, k0.shape[1], end - start, k0.shape[-1]), dtype=k0.dtype)
    for i, layer in enumerate(layers):
        kv[i, 0].copy_(layer._key_buf[0, :, start:end])
        kv[i, 1].copy_(layer._value_buf[0, :, start:end])
    return kv


def _write(cache, blocks: list[torch.Tensor], positions: int) -> None:
    """Write `blocks` ((layers, 2, kv_heads, n, head_dim) each, in order) into the fresh
    `cache`'s first `positions` positions."""
    at = 0
    for i, layer in enumerate(_layers(cache)):
        first = blocks[0][i, 0].unsqueeze(0)
        if not layer.is_initialized:
            layer.lazy_initialization(first, first)
        layer._reserve(positions, first, first)
        at = 0
        for block in blocks:
            n = block.shape[-2]
            layer._key_buf[0, :, at:at + n].copy_(block[i, 0])
            layer._value_buf[0, :, at:at + n].copy_(block[i, 1])
            at += n
        layer._length = positions
    assert at == positions, (at, positions)


class PrefixCache:
    """See the module docstring. Thread-safe (the chat's and the server's scheduler thread and a
    command's own calls may share one generator's cache, one at a time or not)."""

    def __init__(self, budget_bytes: int, page_tokens: int = PAGE_TOKENS):
        if budget_bytes < 0:
            raise ValueError(f"the prompt cache budget must be >= 0 bytes, got {budget_bytes}")
        self.page_tokens = page_tokens
        self._pages: collections.OrderedDict[bytes, Page] = collections.OrderedDict()
        self._stats = PrefixStats(budget_bytes=budget_bytes)
        self._serial = 0
        self._lock = threading.Lock()

    @property
    def budget_bytes(self) -> int:
        return self._stats.budget_bytes

    def stats(self) -> PrefixStats:
        with self._lock:
            return PrefixStats(**vars(self._stats))

    def clear(self) -> None:
        with self._lock:
            self._pages.clear()
            self._stats.bytes = self._stats.pages = self._stats.prompts = 0

    # -- lookup ---------------------------------------------------------------------------------

    def _chain(self, prompt: list[int], limit: int) -> list[Page]:
        """The cached pages prefixing prompt[:limit], first to last (lock held)."""
        size, chain = self.page_tokens, []
        key, parent = _ROOT, -1
        for start in range(0, limit - size + 1, size):
            tokens = prompt[start:start + size]
            key = _key(key, tokens)
            page = self._pages.get(key)
            if page is None or page.parent != parent or page.tokens != tuple(tokens):
                break
            chain.append(page)
            parent = page.serial
        return chain

    def _touch(self, chain: list[Page]) -> None:
        for page in reversed(chain):  # the chain's start ends most recent: evicted last
            self._pages.move_to_end(page.key)

    def restore(self, prompt, cache) -> int:
        """Write the longest cached prefix of `prompt` (never its last token) into `cache`, a
        fresh cache of GrowingLayer layers; returns the positions written (0: a miss)."""
        prompt = [int(t) for t in prompt]
        with self._lock:
            chain = self._chain(prompt, len(prompt) - 1)
            self._touch(chain)
            self._stats.lookups += 1
            self._stats.prompt_tokens += len(prompt)
            if not chain:
                return 0
            self._stats.hits += 1
            positions = len(chain) * self.page_tokens
            self._stats.cached_tokens += positions
            kv = [page.kv for page in chain]  # the pages stay alive if evicted meanwhile
        _write(cache, kv, positions)
        return positions

    # -- whole prompts --------------------------------------------------------------------------

    def recall(self, prompt, cache, mark: tuple, count_miss: bool = True) -> torch.Tensor | None:
        """If `prompt` was kept whole (keep_whole) under the same `mark`: write all its
        positions into `cache`, a fresh cache, and return its last token's logits (1, vocab);
        else None (nothing written). Counted as a lookup when it hits, and when it misses
        unless not `count_miss` (the pages are looked up next: one lookup a prompt)."""
        prompt = [int(t) for t in prompt]
        key = _whole_key(prompt)
        with self._lock:
            entry = self._pages.get(key)
            hit = (isinstance(entry, WholePrompt) and entry.tokens == tuple(prompt)
                   and entry.mark == mark)
            if hit or count_miss:
                self._stats.lookups += 1
                self._stats.prompt_tokens += len(prompt)
            if not hit:
                return None
            self._pages.move_to_end(key)
            self._stats.hits += 1
            self._stats.recalled += 1
            self._stats.cached_tokens += len(prompt)
        _write(cache, [entry.kv], len(prompt))
        return entry.logits.clone()

    def keep_whole(self, prompt, cache, logits: torch.Tensor, mark: tuple) -> bool:
        """Keep `prompt`, which `cache` holds from ONE forward that returned `logits` for its
        last token, for recall under `mark`; False when it does not fit the budget."""
        prompt = [int(t) for t in prompt]
        layers = _layers(cache)
        n = len(prompt)
        if n == 0 or layers[0].get_seq_length() != n:
            return False
        k0 = layers[0]._key_buf
        last = logits[-1:].detach().float()
        size = (len(layers) * 2 * k0.shape[1] * n * k0.shape[-1] * k0.element_size()
                + last.numel() * last.element_size())
        if size > self.budget_bytes:
            return False
        entry = WholePrompt(_whole_key(prompt), tuple(prompt), mark, _copy_out(layers, 0, n),
                            last.clone())
        with self._lock:
            old = self._pages.pop(entry.key, None)
            if old is not None:
                self._forget(old)
            self._pages[entry.key] = entry
            self._stats.bytes += entry.nbytes
            self._stats.prompts += 1
            self._evict()
        return True

    # -- store ----------------------------------------------------------------------------------

    def store(self, prompt, cache) -> int:
        """Keep the whole pages of `prompt` that `cache` holds and the cache does not yet have;
        returns how many pages were added."""
        prompt = [int(t) for t in prompt]
        size = self.page_tokens
        layers = _layers(cache)
        full = min(len(prompt) - 1, layers[0].get_seq_length()) // size  # not the last token's
        if full == 0 or self.budget_bytes == 0:
            return 0
        with self._lock:
            chain = self._chain(prompt, full * size)
        # a page's bytes, from the cache's own layout; a prompt keeps the pages that fit
        k0 = layers[0]._key_buf
        per_page = len(layers) * 2 * k0.shape[1] * size * k0.shape[-1] * k0.element_size()
        full = min(full, self.budget_bytes // per_page)
        new: list[tuple[int, torch.Tensor]] = []
        for index in range(len(chain), full):
            new.append((index, _copy_out(layers, index * size, (index + 1) * size)))
        with self._lock:
            chain = self._chain(prompt, full * size)  # again: another thread may have stored
            key = chain[-1].key if chain else _ROOT
            parent = chain[-1].serial if chain else -1
            added = []
            for index, kv in new:
                if index < len(chain):
                    continue
                if index != len(chain) + len(added):  # a page before it went meanwhile: what
                    break  # follows would be keyed and parented as if it stood in that place
                tokens = tuple(prompt[index * size:(index + 1) * size])
                key = _key(key, tokens)
                self._serial += 1
                page = Page(key, self._serial, parent, tokens, kv)
                old = self._pages.pop(key, None)
                if old is not None:  # a stale page under this key (its parent was dropped)
                    self._forget(old)
                self._pages[key] = page
                self._stats.bytes += page.nbytes
                self._stats.pages += 1
                parent = page.serial
                added.append(page)
            self._touch([*chain, *added])
            self._stats.stored_pages += len(added)
            self._evict()
        return len(added)

    def _forget(self, page: Page | WholePrompt) -> None:
        self._stats.bytes -= page.nbytes
        if isinstance(page, WholePrompt):
            self._stats.prompts -= 1
        else:
            self._stats.pages -= 1

    def _evict(self) -> None:
        while self._stats.bytes > self.budget_bytes and self._pages:
            _, page = self._pages.popitem(last=False)
            self._forget(page)
            self._stats.evicted_pages += 1


# -- when and how much ----------------------------------------------------------------------------

def problem(model) -> str | None:
    """Why reusing read prompts would not be exact on this model's prompt reads (None: it is)."""
    from ragspec.decoding import native_step
    from ragspec.decoding.packed import PAGES_ENV, reads_in_pages

    if native_step.installed(model):
        precision = native_step.prompt_precision(model)
        if precision == "int8" or reads_in_pages():
            return None
        return (f"prompt reads run in {precision} (de-quantised weights), a short rest in the "
                f"int8 step kernels: a prompt read in two pieces would round otherwise than one "
                f"read; {PAGES_ENV}=1 reads them in pages, exactly")
    return ("this model's prompt reads run transformers' modules (the native step is not "
            "installed), whose rounding depends on the shape of the forward")


def whole_problem(model) -> str | None:
    """Why identical prompts are not recalled whole on this model (None: they are; see the
    module docstring)."""
    from ragspec.decoding import native_step

    if native_step.installed(model) and model.device.type == "cpu":
        return None
    return ("this model's prompt reads run transformers' modules (the native step is not "
            "installed), which the scheduler and the engine run with different attention")


def read_mark(model) -> tuple:
    """How a prompt read of `model` runs in this process now (see recall): precision, pages,
    threads."""
    from ragspec.decoding import native_step
    from ragspec.decoding.packed import reads_in_pages

    return native_step.prompt_precision(model), reads_in_pages(), torch.get_num_threads()


def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one position takes in every layer of the cache."""
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    dtype = getattr(model, "_ragspec_kv_dtype", None) or torch.float32
    return cfg.num_hidden_layers * 2 * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def budget_bytes(model) -> int:
    """The cache's budget for `model`: RAGSPEC_PROMPT_CACHE_MB if set (0: off), else
    min(RAM / 16, 8 full contexts). Raises ValueError for a value that is not a whole number >= 0."""
    raw = os.environ.get(ENV, "").strip()
    if raw:
        try:
            mb = int(raw)
        except ValueError:
            mb = -1
        if mb < 0:
            raise ValueError(f"{ENV} must be a whole number of MB >= 0 (0 turns the prompt cache "
                             f"off), got {raw!r}")
        return mb << 20
    context = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
    return min(cpuinfo.ram_bytes() // 16, 8 * context * kv_bytes_per_token(model))
