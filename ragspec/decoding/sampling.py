"""Turning logits into tokens, and the accept rule for drafts.

Greedy (temperature 0): a draft token is accepted while it equals the argmax; the first
disagreement is replaced by the argmax. Output is the model's own greedy sequence.

Sampling: the draft is a point mass on token t, so the speculative rule reduces to: accept t with
probability p(t); on rejection draw from p with t removed and renormalised. Accepting with p(t)
and otherwise drawing from (p - p(t)·δ_t)/(1 - p(t)) gives t with probability p(t) and any other
x with (1 - p(t))·p(x)/(1 - p(t)) = p(x): the target distribution, exactly.

p is the *processed* target: temperature, then top-k, then top-p (the order transformers uses).

Device contract: everything runs where the logits are (argmax, probabilities, the uniforms and
the draw, with a torch.Generator created on that device); each function hands back plain ints
through one small transfer, [accepted count, next token], per step.
"""

from __future__ import annotations

import torch

from ragspec.decoding.types import SamplingConfig


def target_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """logits: (n, vocab) -> probabilities (n, vocab) in fp32 after temperature/top-k/top-p."""
    scores = logits.float() / cfg.temperature
    if cfg.top_k and cfg.top_k < scores.shape[-1]:
        kth = torch.topk(scores, cfg.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        # drop the low tail whose total mass is <= 1 - top_p; always keep the top token
        drop_sorted = cum <= (1.0 - cfg.top_p)
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """weights: (vocab,), not necessarily normalised -> (1,) token id, on weights' device."""
    return torch.multinomial(weights, 1, generator=generator)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """probs: (vocab,) -> one token id."""
    return int(_draw(probs, generator).item())


def _draft_tensor(draft: list[int], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(draft, dtype=torch.long, device=like.device)


def _read(accepted: torch.Tensor, token: torch.Tensor) -> tuple[int, int]:
    """The step's one device-to-host transfer: (accepted count, next token)."""
    n, t = torch.stack([accepted.reshape(()), token.reshape(())]).tolist()
    return int(n), int(t)


def accept_greedy(logits: torch.Tensor, draft: list[int]) -> tuple[int, int]:
    """logits: (len(draft)+1, vocab). Returns (accepted draft tokens, next token)."""
    best = logits.argmax(dim=-1)  # (k+1,) on the logits' device
    if not draft:
        return 0, int(best[0].item())
    # agree: (k,) 1 up to the first disagreement, then 0; its sum is the accepted count
    agree = (best[:-1] == _draft_tensor(draft, best)).long().cumprod(0)
    accepted = agree.sum()
    return _read(accepted, best[accepted])


def accept_sampled(
    logits: torch.Tensor, draft: list[int], cfg: SamplingConfig, generator: torch.Generator | None
) -> tuple[int, int]:
    """logits: (len(draft)+1, vocab). Point-mass speculative sampling; see module docstring."""
    probs = target_probs(logits, cfg)  # (k+1, vocab)
    k = len(draft)
    if not k:
        return 0, sample(probs[0], generator)
    tokens = _draft_tensor(draft, probs)
    rows = torch.arange(k, device=probs.device)
    picked = probs[rows, tokens]  # (k,) p(t_i)
    # one uniform per draft position, drawn together (same generator stream either way)
    u = torch.rand(k, generator=generator, device=probs.device, dtype=probs.dtype)
    # p(t) rounds to the whole mass: nothing else could be drawn, so t is kept
    nothing_else = (probs[:k].sum(-1) - picked) <= 0
    accepted = ((u < picked) | nothing_else).long().cumprod(0).sum()  # 0-d, on the device
    # the next token: drawn from row `accepted` (the residual p - p(t)·δ_t after a rejection,
    # p itself after a fully accepted draft); multinomial normalises the weights
    row = probs[accepted]
    rejected = torch.cat([tokens, tokens.new_zeros(1)])[accepted]
    remove = (torch.arange(row.shape[-1], device=row.device) == rejected) & (accepted < k)
    token = _draw(row.masked_fill(remove, 0.0), generator)
    return _read(accepted, token)


def next_token(logits_row: torch.Tensor, cfg: SamplingConfig, generator) -> int:
    """logits_row: (vocab,). The first token after prefill, or any step with no draft."""
    if cfg.greedy:
        return int(logits_row.argmax().item())
    return sample(target_probs(logits_row[None, :], cfg)[0], generator)


def apply_repeat_penalty(logits: torch.Tensor, windows, penalty: float) -> torch.Tensor:
    """logits (rows, vocab) -> a penalised copy: in row i, the logits of the tokens in
    windows[i] (ragspec.decoding.repetition.penalty_windows) are divided by `penalty` when
    positive and multiplied by it when negative (the rule llama.cpp and Ollama use). The same
    operations on the same values whether a row comes from a verify forward or a plain step."""
    out = logits.clone()
    for row, tokens in enumerate(windows):
        if tokens:
            index = torch.tensor(sorted(tokens), dtype=torch.long, device=logits.device)
            values = out[row, index]
            out[row, index] = torch.where(values > 0, values / penalty, values * penalty)
    return out
