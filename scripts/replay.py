"""Replay the true greedy answers through drafting strategies offline: what could drafting gain?

Usage:  PYTHONPATH=. python scripts/replay.py --corpus data/corpus --questions data/questions.jsonl
        [--max-new-tokens 128] [--json out.json]

Builds each question's prompt with the real pipeline (as `ragspec bench` does), runs the engine's
greedy decoding once per question (the truth, and the measured prefill time), then walks every
strategy below over the true answer. A step's time is this machine's measured forward cost
c(n) for the n tokens it verifies (ragspec.decoding.calibrate), so the strategies are compared without
timing noise. Speedup = (prefill + (N-1)·c(1)) / (prefill + Σ c(step)), the bench's end-to-end
figure; medians are printed per question kind.

Strategies:
  policy       ragspec's drafter and adaptive policy: what the engine does (one policy shared
               across questions, as in `ragspec bench`).
  perfect      ragspec's proposals, each cut exactly where the model diverges: the best any
               length policy can do with these proposals.
  alt-A-m      the policy's draft plus A alternative continuations of m tokens (other earlier
               occurrences of the suffix, each with a different next token), verified in the
               same forward as a tree: does offering more than one candidate pay for its tokens?
  any-copy     the longest prefix of the true continuation found anywhere in the prompt or the
               output so far, chosen with hindsight: the ceiling for copying drafters.
  oracle       the true continuation, max_draft tokens at a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from ragspec.bench import runner as core
from ragspec.bench.runner import build_setup
from ragspec.decoding.ngram import NgramIndex
from ragspec.decoding.policy import DraftPolicy
from ragspec.decoding.types import DraftConfig, GenerationConfig


def agree(draft, truth) -> int:
    n = 0
    while n < len(draft) and n < len(truth) and draft[n] == truth[n]:
        n += 1
    return n


def alternatives(seq: list[int], skip: int | None, count: int, length: int,
                 max_n: int = 4) -> list[list[int]]:
    """Continuations of earlier occurrences of the current suffix (longest n first, latest
    first), one per distinct next token, other than `skip`."""
    found, seen = [], {skip}
    end = len(seq)
    for n in range(min(max_n, end - 1), 0, -1):
        suffix = seq[end - n:]
        for last in range(end - 2, n - 2, -1):
            if seq[last - n + 1 : last + 1] == suffix and seq[last + 1] not in seen:
                seen.add(seq[last + 1])
                found.append(seq[last + 1 : last + 1 + length])
                if len(found) == count:
                    return found
    return found


def longest_copy(seq: list[int], truth: list[int], cap: int) -> int:
    best = 0
    for start, token in enumerate(seq):
        if token == truth[0]:
            best = max(best, agree(seq[start : start + cap], truth))
    return best


def walk(prompt, truth, cost, draft_cfg, strategy: str, policy=None, alts=(0, 0)) -> float:
    """Seconds of decoding (after the first token) for one strategy over one true answer."""
    index = NgramIndex(prompt, min_n=draft_cfg.min_ngram, max_n=draft_cfg.max_ngram)
    index.append(truth[0])
    pos, seconds = 1, 0.0
    while pos < len(truth):
        rest = truth[pos:]
        room = len(rest) - 1  # the step's own token must stay within the answer
        verified, accepted = 0, 0
        if strategy == "oracle":
            verified = accepted = min(draft_cfg.max_draft, room)
        elif strategy == "any-copy":
            verified = accepted = min(longest_copy(index.tokens, rest, draft_cfg.max_draft), room)
        else:
            match = index.propose(draft_cfg.max_draft)
            if strategy == "perfect":
                draft = match.tokens[:room] if match else []
                verified = accepted = agree(draft, rest)
            else:
                k = policy.choose(match, len(rest))
                draft = match.tokens[:k] if k else []
                accepted = agree(draft, rest)
                if draft:
                    policy.observe(match, len(draft), accepted)
                verified = len(draft)
                count, length = alts
                skip = draft[0] if draft else None
                for alt in alternatives(index.tokens, skip, count, length) if count else []:
                    alt = alt[:room]
                    verified += len(alt)
                    accepted = max(accepted, agree(alt, rest))
        seconds += cost(verified + 1)
        index.extend(rest[: accepted + 1])
        pos += accepted + 1
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--questions", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()

    questions = core.load_questions(args.questions)
    setup = build_setup(None, args.corpus, None, questions, args.max_new_tokens)
    gen, draft_cfg = setup.generator, DraftConfig()
    cost = gen.cost
    strategies = {"policy": (0, 0), "perfect": None, "alt-1-1": (1, 1), "alt-1-2": (1, 2),
                  "alt-2-1": (2, 1), "alt-3-2": (3, 2), "any-copy": None, "oracle": None}
    policies = {name: DraftPolicy(draft_cfg, cost) for name, a in strategies.items() if a}
    rows = []
    for item in setup.prepared:
        run = gen.generate(item.prompt_ids, GenerationConfig(
            args.max_new_tokens, draft=DraftConfig(enabled=False)))
        truth, prefill = run.token_ids, run.stats.prefill_seconds
        base = prefill + cost(1) * (len(truth) - 1)
        row = {"id": item.question.id, "kind": item.question.kind, "tokens": len(truth)}
        for name, alts in strategies.items():
            seconds = walk(item.prompt_ids, truth, cost, draft_cfg, name,
                           policies.get(name), alts or (0, 0))
            row[name] = base / (prefill + seconds)
        rows.append(row)
        print(item.question.id, " ".join(f"{n}={row[n]:.2f}" for n in strategies),
              file=sys.stderr)
    print("| kind | " + " | ".join(strategies) + " |")
    print("|---|" + "---|" * len(strategies))
    for kind in ("copy", "open"):
        chosen = [r for r in rows if r["kind"] == kind]
        if chosen:
            cells = [f"{statistics.median(r[n] for r in chosen):.2f}×" for n in strategies]
            print(f"| {kind} (n={len(chosen)}) | " + " | ".join(cells) + " |")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump({"cost_seconds": cost.seconds, "questions": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
