"""Turning logits into tokens, and the accept rule for drafts.

Greedy (temperature 0): a draft token is accepted while it equals the argmax; the first
disagreement is replaced by the argmax. Output is the model's own greedy sequence.

Sampling: the draft is a point mass on token t, so the speculative rule reduces to: accept t with
probability p(t); on rejection draw from p with t removed and renormalised. Accepting with p(t)
and otherwise drawing from (p - p(t)·δ_t)/(1 - p(t)) gives t with probability p(t) and any other
x with (1 - p(t))·p(x)/(1 - p(t)) = p(x): the target distribution, exactly.

p is the *processed* target: temperature, then top-k, then top-p (the order transformers uses).
"""

from __future__ import annotations

import torch

from decoding.types import SamplingConfig


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


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """probs: (vocab,) -> one token id."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def accept_greedy(logits: torch.Tensor, draft: list[int]) -> tuple[int, int]:
    """logits: (len(draft)+1, vocab). Returns (accepted draft tokens, next token)."""
    best = logits.argmax(dim=-1).tolist()
    n = 0
    while n < len(draft) and draft[n] == best[n]:
        n += 1
    return n, best[n]


def accept_sampled(
    logits: torch.Tensor, draft: list[int], cfg: SamplingConfig, generator: torch.Generator | None
) -> tuple[int, int]:
    """logits: (len(draft)+1, vocab). Point-mass speculative sampling; see module docstring."""
    probs = target_probs(logits, cfg)
    if draft:
        # one uniform per draft position, drawn together (same generator stream either way)
        u = torch.rand(len(draft), generator=generator, dtype=torch.float64).tolist()
        picked = probs[torch.arange(len(draft)), torch.tensor(draft)].tolist()
        for i, t in enumerate(draft):
            if u[i] < picked[i]:
                continue
            residual = probs[i].clone()
            residual[t] = 0.0
            total = float(residual.sum())
            if total <= 0.0:  # p(t) rounds to 1: nothing else can be drawn, keep t
                continue
            return i, sample(residual / total, generator)
    return len(draft), sample(probs[len(draft)], generator)


def next_token(logits_row: torch.Tensor, cfg: SamplingConfig, generator) -> int:
    """logits_row: (vocab,). The first token after prefill, or any step with no draft."""
    if cfg.greedy:
        return int(logits_row.argmax().item())
    return sample(target_probs(logits_row[None, :], cfg)[0], generator)
