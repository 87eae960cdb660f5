"""Drafting replayed offline against a known greedy answer: what each step could have copied,
what it did, and why the difference was lost.

Under greedy decoding the answer does not depend on the drafts (they only change how many
forwards it takes), so an answer recorded once with speculation off is the answer every drafting
strategy produces. Walking a strategy over it says exactly which drafts the engine would have
verified and how many tokens each would have accepted, with no timing noise; a step is then
costed by a measured forward-cost curve c(n).

At every step of a walk (the answer written up to `pos`, `rest` the tokens the model writes
next) three lengths bound each other:

    best_any     the longest prefix of `rest` found anywhere earlier in the sequence (prompt and
                 answer so far), chosen with hindsight: what any copying drafter could take;
    best_suffix  the same over the places that follow an earlier occurrence of the last token,
                 the only places a suffix-matching drafter can find;
    proposed     how far the drafter's own proposal (its chosen occurrence) agrees with `rest`;
    accepted     how many draft tokens the step verified and kept.

so the tokens the step did not take, best_any - accepted, split into
    quote_start     best_any - best_suffix: the copy begins where the last token does not lead
                    (the model starts quoting a new place);
    wrong_place     best_suffix - proposed: another occurrence of the suffix would have given more;
    too_short       proposed - accepted: the proposal was right further than the draft length
                    the policy chose (0 drafted: the policy declined).
A step whose best_any is 0 wrote a token that is nowhere earlier (`not_in_context`). Draft
tokens verified but rejected (`wasted`) cost forward time without yielding.

Torch-free: token ids in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ragspec.decoding.ngram import NgramIndex
from ragspec.decoding.policy import DraftGovernor, DraftPolicy, DraftShadow, ForwardCost
from ragspec.decoding.types import DraftConfig


def agree(draft, truth) -> int:
    """Length of the common prefix of two sequences."""
    n = 0
    while n < len(draft) and n < len(truth) and draft[n] == truth[n]:
        n += 1
    return n


def longest_copies(seq: list[int], rest: list[int], cap: int = 64) -> tuple[int, int]:
    """(best_any, best_suffix): the longest prefix of `rest` (at most cap tokens: a step
    verifies at most max_draft) copied from anywhere in `seq`, and from a place right after an
    earlier occurrence of seq's last token."""
    best_any = best_suffix = 0
    if not rest or not seq:
        return 0, 0
    last, first, length = seq[-1], rest[0], len(seq)
    for start in range(length):
        if seq[start] != first:
            continue
        n = agree(seq[start : start + cap], rest)
        best_any = max(best_any, n)
        if start >= 1 and start - 1 < length - 1 and seq[start - 1] == last:
            best_suffix = max(best_suffix, n)
    return best_any, best_suffix


@dataclass
class StepTrace:
    """One forward of a walk (see the module docstring for the lengths)."""

    pos: int
    drafted: int
    accepted: int
    best_any: int
    best_suffix: int
    proposed: int
    matched: bool  # the drafter found a suffix at all
    seconds: float

    @property
    def cause(self) -> str:
        """Where most of the step's missed tokens went ('' when it missed none)."""
        missed = {"quote_start": self.best_any - self.best_suffix,
                  "wrong_place": self.best_suffix - self.proposed,
                  "too_short": self.proposed - self.accepted}
        if self.best_any == 0:
            return "not_in_context"
        top = max(missed, key=missed.get)
        return top if missed[top] > 0 else ""


@dataclass
class Walk:
    """A strategy over one answer: its steps and the decode seconds after the first token."""

    steps: list[StepTrace] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def forwards(self) -> int:
        return len(self.steps)

    def summary(self) -> dict:
        """Steps by cause (`steps_*`: each step counted once, under the cause that lost it the
        most tokens; `steps_full`: it took all it could), per-step missed tokens by cause (a
        copy missed at one step may be taken at the next, so these add up potentials, not
        answer tokens), rejected draft tokens (`wasted`) and steps whose draft was rejected
        before its end (`steps_rejected`) or that drafted nothing though the proposal was
        right (`steps_declined`)."""
        out = {"forwards": self.forwards, "accepted": 0, "wasted": 0, "steps_full": 0,
               "steps_not_in_context": 0, "steps_quote_start": 0, "steps_wrong_place": 0,
               "steps_too_short": 0, "steps_declined": 0, "steps_rejected": 0,
               "missed_quote_start": 0, "missed_wrong_place": 0, "missed_too_short": 0}
        for s in self.steps:
            out["accepted"] += s.accepted
            out["wasted"] += s.drafted - s.accepted
            out["steps_rejected"] += s.drafted > s.accepted
            out["steps_" + (s.cause or "full")] += 1
            if s.best_any == 0:
                continue
            out["missed_quote_start"] += s.best_any - s.best_suffix
            out["missed_wrong_place"] += s.best_suffix - s.proposed
            out["missed_too_short"] += s.proposed - s.accepted
            out["steps_declined"] += s.drafted == 0 and s.proposed > 0
        return out


def walk(prompt: list[int], truth: list[int], cost: ForwardCost, draft_cfg: DraftConfig,
         policy: DraftPolicy | None, *, trace: bool = False, alternatives: int = 0,
         alt_tokens: int = 2, governor: DraftGovernor | None = None,
         occurrences: int = 1, keys=None, learn_declined: bool = True) -> Walk:
    """Walk the engine's drafter and policy over `truth` (greedy's answer to `prompt`).

    policy None drafts each proposal cut exactly where it diverges from `truth` (hindsight:
    the best any length policy can do with these proposals). alternatives > 0 also verifies,
    in the same forward, that many other occurrences' continuations (alt_tokens each) as a
    token tree and costs the step by the tree's size: a projection, the engine verifies one
    draft. governor: this generation's DraftGovernor, applied as the engine does. occurrences:
    the drafter's NgramIndex setting. keys: the engine's word keys (Generator.word_keys), used
    when draft_cfg.variants. trace: compute the hindsight bounds of every step. A policy learns
    from declined proposals as the engine's does (DraftShadow; learn_declined=False: not)."""
    index = NgramIndex(prompt, min_n=draft_cfg.min_ngram, max_n=draft_cfg.max_ngram,
                       occurrences=occurrences, follow=draft_cfg.follow,
                       keys=keys if draft_cfg.variants else None)
    shadow = DraftShadow(policy) if policy is not None and learn_declined else None
    index.append(truth[0])
    out = Walk()
    pos = 1
    while pos < len(truth):
        rest = truth[pos:]
        room = len(rest) - 1  # the step's own token must stay within the answer
        context = len(index) - 1
        match = index.propose(draft_cfg.max_draft)
        proposal = match.tokens[:room] if match else []
        if policy is None:
            k = agree(proposal, rest)
        else:
            k = policy.choose(match, len(rest), context)
        if governor is not None and k:
            allowed = governor.limit(k, context)
            if not allowed:
                governor.shadow(proposal[:k], context)
            k = allowed
        if k == 0 and shadow is not None:
            shadow.follow(match)
        draft = proposal[:k]
        accepted = agree(draft, rest)
        verified = len(draft)
        if policy is not None and draft:
            policy.observe(match, len(draft), accepted)
        if alternatives and match is not None:
            for alt in index.alternatives(draft[0] if draft else None, alternatives,
                                          alt_tokens):
                alt = alt[:room]
                verified += len(alt)
                accepted = max(accepted, agree(alt, rest))
        seconds = cost(verified + 1, context)
        if governor is not None and draft:
            governor.record(len(draft), agree(draft, rest), context)
        best_any = best_suffix = 0
        if trace:
            best_any, best_suffix = longest_copies(index.tokens, rest[:room] if room else [],
                                                   draft_cfg.max_draft)
        out.steps.append(StepTrace(pos, verified, accepted, best_any, best_suffix,
                                   agree(proposal, rest[:room]), match is not None, seconds))
        for token in rest[: accepted + 1]:
            index.append(token)
            if governor is not None:
                governor.push(token)
            if shadow is not None:
                shadow.push(token)
        pos += accepted + 1
    return out


def oracle_seconds(truth: list[int], cost: ForwardCost, max_draft: int,
                   context: int = 0) -> float:
    """Decode seconds when every draft is the true continuation, max_draft at a time."""
    pos, seconds = 1, 0.0
    while pos < len(truth):
        k = min(max_draft, len(truth) - pos - 1)
        seconds += cost(k + 1, context + pos)
        pos += k + 1
    return seconds


def plain_seconds(truth: list[int], cost: ForwardCost, context: int = 0) -> float:
    """Decode seconds of greedy without drafts: one forward per token after the first."""
    return sum(cost(1, context + pos) for pos in range(1, len(truth)))
