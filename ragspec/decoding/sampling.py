"""Turning logits into tokens, and the accept rule for drafts.

Greedy (temperature 0): a draft token is accepted while it equals the argmax; the first
disagreement is replaced by the argmax. Output is the model's own greedy sequence.

Sampling: the draft is a point mass on token t, so the speculative rule reduces to: accept t with
probability p(t); on rejection draw from p with t removed and renormalised. Accepting with p(t)
and otherwise drawing from (p - p(t)·δ_t)/(1 - p(t)) gives t with probability p(t) and any other
x with (1 - p(t))·p(x)/(1 - p(t)) = p(x): the target distribution, exactly.

p is the *processed* target: temperature, then top-k, then top-p (the order transformers uses).

How the rule is drawn: output position j gets one uniform u_j that depends on the seed and j
alone (`Uniforms`), and the token at j is p's inverse CDF at u_j. A draft token is accepted when
it is that token, so it is accepted with probability p(t), and after a rejection the token is
distributed as p without t, renormalised: the rule above. Because u_j does not depend on how
many tokens were drafted, verified or accepted before j, a seed gives the same answer with
speculation on or off and whatever the draft policy has learned (where the verify forward's
rows equal one-token steps, as on the native step; elsewhere up to the rounding that also
moves greedy output). Worked example: p = (0.5, 0.3, 0.2) over tokens (0, 1, 2), u_j = 0.6:
the CDF is (0.5, 0.8, 1.0), so token 1 is written; a draft of 1 is accepted, a draft of 0 or 2
is rejected and 1 is written in its place.

Device contract: probabilities, the inverse CDF and the accept rule run where the logits are
(the step's uniforms go there as one small tensor); each function hands back plain ints
through one small transfer, [accepted count, next token], per step. Greedy picks on the CPU
are read as plain ints in one call (`greedy_picks`: the native kernels' argmax where they are
loaded) and compared in Python: there a handful of dispatched tensor ops cost more than the
comparison itself, and nothing is transferred.
"""

from __future__ import annotations

import torch

from ragspec.decoding import native
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


_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a 64-bit integer to a well-scrambled 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class Uniforms:
    """The sampling stream of one generation: u_j in [0, 1) for output position j (0 = the
    first new token), a function of (seed, j) alone, with 53 random bits."""

    def __init__(self, seed: int):
        self._key = _mix(seed & _MASK)

    def at(self, position: int) -> float:
        return (_mix((self._key + position) & _MASK) >> 11) * 2.0 ** -53

    def take(self, start: int, count: int) -> list[float]:
        """u_start .. u_(start+count-1)."""
        return [self.at(start + i) for i in range(count)]


def draw(probs: torch.Tensor, uniforms: list[float]) -> torch.Tensor:
    """probs: (n, vocab), rows not necessarily normalised; one uniform per row -> (n,) token
    ids, row i the inverse CDF of probs[i] at uniforms[i] (on probs' device). A token of zero
    weight is never drawn: the search lands on the first token whose running sum exceeds
    u·total, kept below the total (u < 1, but the product may round up to it)."""
    cdf = probs.double().cumsum(-1)  # (n, vocab); fp64 so that a 49k-token sum keeps its tail
    u = torch.tensor(uniforms, dtype=torch.float64, device=probs.device)[:, None]
    total = cdf[:, -1:]
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0]


def sample(probs: torch.Tensor, u: float) -> int:
    """probs: (vocab,) -> the token at uniform u."""
    return int(draw(probs[None, :], [u])[0].item())


def _draft_tensor(draft: list[int], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(draft, dtype=torch.long, device=like.device)


def _read(accepted: torch.Tensor, token: torch.Tensor) -> tuple[int, int]:
    """The step's one device-to-host transfer: (accepted count, next token)."""
    n, t = torch.stack([accepted.reshape(()), token.reshape(())]).tolist()
    return int(n), int(t)


def greedy_picks(logits: torch.Tensor) -> list[int]:
    """logits (rows, vocab) on the CPU -> each row's argmax as ints, exactly torch.argmax's (the
    first index of the largest value; a row with a NaN picks its first NaN)."""
    if logits.dtype == torch.float32 and logits.dim() == 2 and native.loaded():
        return torch.ops.ragspec.argmax_rows(logits)
    return logits.argmax(dim=-1).tolist()


def accept_greedy(logits: torch.Tensor, draft: list[int]) -> tuple[int, int]:
    """logits: (len(draft)+1, vocab). Returns (accepted draft tokens, next token)."""
    if logits.device.type == "cpu":
        return accept_greedy_picks(greedy_picks(logits), draft)
    return accept_greedy_on_device(logits, draft)


def accept_greedy_picks(picks: list[int], draft: list[int]) -> tuple[int, int]:
    """The accept rule on the rows' picks (len(draft)+1 ints)."""
    accepted = 0
    while accepted < len(draft) and picks[accepted] == draft[accepted]:
        accepted += 1
    return accepted, picks[accepted]


def accept_greedy_on_device(logits: torch.Tensor, draft: list[int]) -> tuple[int, int]:
    """The accept rule as tensor ops where the logits are, one transfer back."""
    best = logits.argmax(dim=-1)  # (k+1,) on the logits' device
    if not draft:
        return 0, int(best[0].item())
    # agree: (k,) 1 up to the first disagreement, then 0; its sum is the accepted count
    agree = (best[:-1] == _draft_tensor(draft, best)).long().cumprod(0)
    accepted = agree.sum()
    return _read(accepted, best[accepted])


def accept_sampled(logits: torch.Tensor, draft: list[int], cfg: SamplingConfig,
                   uniforms: list[float]) -> tuple[int, int]:
    """logits: (len(draft)+1, vocab); uniforms: u_j for the positions of those rows (the first
    row predicts the next output position). Point-mass speculative sampling; see the module
    docstring."""
    probs = target_probs(logits, cfg)  # (k+1, vocab)
    k = len(draft)
    if len(uniforms) != k + 1:
        raise ValueError(f"{k + 1} rows need {k + 1} uniforms, got {len(uniforms)}")
    chosen = draw(probs, uniforms)  # (k+1,): the token each row writes if it is reached
    if not k:
        return 0, int(chosen[0].item())
    # a draft token is kept while it is the token its row writes; the first that is not is
    # replaced by that row's token (a rejection: distributed as p without the draft token)
    agree = (chosen[:-1] == _draft_tensor(draft, chosen)).long().cumprod(0)
    accepted = agree.sum()  # 0-d, on the device
    return _read(accepted, chosen[accepted])


def next_token(logits_row: torch.Tensor, cfg: SamplingConfig, uniforms: Uniforms | None,
               position: int = 0) -> int:
    """logits_row: (vocab,). The first token after prefill (position 0), or any step with no
    draft; `uniforms` is None for greedy."""
    if cfg.greedy:
        if logits_row.device.type == "cpu":
            return greedy_picks(logits_row[None, :])[0]
        return int(logits_row.argmax().item())
    return sample(target_probs(logits_row[None, :], cfg)[0], uniforms.at(position))


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
