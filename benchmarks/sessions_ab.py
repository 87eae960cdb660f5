"""Chat sessions read as before and as now, side by side in one process, session by session.

Usage: python benchmarks/sessions_ab.py --corpus /tmp/realdocs-heldout \
           --questions data/realdocs/heldout/questions.jsonl [--rounds 3] [--max-new-tokens 128]
           [--out docs/results/NAME.json]

`ragspec bench --sessions` runs one setting per process, one after another, and on a shared
2-core machine the speed moves from run to run by more than the differences asked about. This
script asks every session of a question set (one per document, turn after turn with its
history, as `ragspec.bench.sessions.ask_session` asks them) in three arms, the arms taking turns
session by session in a rotated order, each round:

  * "before": prompts as the product built and read them before prompts were read once —
    whole passages (trim 0), bf16 prompt reads (RAGSPEC_PREFILL_DTYPE=bf16: the default of a
    CPU with AMX then), no prompt cache;
  * "now, cache off": this machine's default prompt read for the model, passages cut to 128
    tokens (the product's default), no prompt cache;
  * "now": the same with the prompt cache on (a fresh cache each round, shared by the round's
    sessions, as a chat server's is).

Prints and records per arm the median time to the first token and to the whole answer over
turn 1 and over turns 2 and later (each turn one clock around the stream), the median of the
per-turn ratios "now" / "before", and whether every "now" answer equals its "now, cache off"
answer token for token (the cache is exact or off).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import record  # noqa: E402

ARMS = ("before", "now, cache off", "now")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--questions", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    record.out_option(parser)
    args = parser.parse_args()

    import torch

    from ragspec.bench import sessions as core
    from ragspec.bench.prepare import ingest_corpus
    from ragspec.bench.questions import load_questions
    from ragspec.decoding import native_step, packed
    from ragspec.decoding.engine import Generator
    from ragspec.decoding.types import GenerationConfig
    from ragspec.loading import load_generator, open_store
    from ragspec.pipeline import Pipeline, PipelineConfig
    from ragspec.retrieval.trim import DEFAULT_TRIM

    _, gen = load_generator(None)
    groups = core.group_sessions(load_questions(args.questions))
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    cold = core.without_prompt_cache(gen)

    def precision(value: str | None) -> None:
        if value is None:
            os.environ.pop(packed.PREFILL_ENV, None)
        else:
            os.environ[packed.PREFILL_ENV] = value
        packed.prefill_precision.cache_clear()

    turns: dict[str, list[dict]] = {a: [] for a in ARMS}
    with tempfile.TemporaryDirectory(prefix="sessions-ab-") as scratch, torch.inference_mode():
        store = open_store(scratch)
        ingest_corpus(store, args.corpus)
        whole = PipelineConfig(max_new_tokens=args.max_new_tokens, trim=0)
        cut = PipelineConfig(max_new_tokens=args.max_new_tokens, trim=DEFAULT_TRIM)
        now_read = native_step.prompt_precision(gen.model)
        for r in range(args.rounds):
            warm = Generator(gen.model, gen.tokenizer, eos_token_ids=sorted(gen.eos_token_ids),
                             cost=gen.cost, speculation_off_reason=gen.speculation_off_reason)
            pipes = {"before": (Pipeline(store, cold, whole), "bf16"),
                     "now, cache off": (Pipeline(store, cold, cut), None),
                     "now": (Pipeline(store, warm, cut), None)}
            for s, session in enumerate(groups):
                k = (r * len(groups) + s) % len(ARMS)
                for arm in ARMS[k:] + ARMS[:k]:
                    pipe, read = pipes[arm]
                    precision(read)
                    for t in core.ask_session(pipe, session, config):
                        turns[arm].append({"round": r, "source": session.source,
                                           "turn": t["turn"], "ttft_s": t["ttft_seconds"],
                                           "seconds": t["seconds"],
                                           "prompt_tokens": t["prompt_tokens"],
                                           "cached": t["cached_prompt_tokens"],
                                           "token_ids": t["token_ids"], "recall": t["recall"]})
                precision(None)
            later = [t for t in turns["now"] if t["round"] == r and t["turn"] > 1]
            print(f"round {r + 1}/{args.rounds} load {os.getloadavg()[0]:.1f}: later turns' first "
                  "token " + ", ".join(
                      f"{a} {statistics.median(t['ttft_s'] for t in turns[a] if t['round'] == r and t['turn'] > 1):.3f} s"
                      for a in ARMS) + f" ({len(later)} turns)", flush=True)

    def median(arm: str, key: str, later: bool) -> float:
        return statistics.median(t[key] for t in turns[arm] if (t["turn"] > 1) == later)

    pairs = list(zip(turns["before"], turns["now"], strict=True))
    off_pairs = list(zip(turns["now, cache off"], turns["now"], strict=True))
    summary = {
        "now_prompt_read": now_read,
        "arms": {a: {part: {"first_token_s": median(a, "ttft_s", later),
                            "answer_s": median(a, "seconds", later),
                            "prompt_tokens": median(a, "prompt_tokens", later),
                            "recall_mean": statistics.mean(
                                t["recall"] for t in turns[a] if (t["turn"] > 1) == later
                                and t["recall"] is not None),
                            "turns": sum(1 for t in turns[a] if (t["turn"] > 1) == later)}
                     for part, later in (("turn 1", False), ("turns 2+", True))}
                 for a in ARMS},
        "now_over_before_turns_2plus": {
            "first_token_paired_median": statistics.median(
                n["ttft_s"] / b["ttft_s"] for b, n in pairs if n["turn"] > 1),
            "answer_paired_median": statistics.median(
                n["seconds"] / b["seconds"] for b, n in pairs if n["turn"] > 1)},
        "now_identical_to_cache_off": sum(o["token_ids"] == n["token_ids"] for o, n in off_pairs),
        "now_answers": len(off_pairs),
    }
    for a in ARMS:
        print(f"{a:15s} turns 2+: first token {summary['arms'][a]['turns 2+']['first_token_s']:.3f} s, "
              f"answer {summary['arms'][a]['turns 2+']['answer_s']:.3f} s, prompt "
              f"{summary['arms'][a]['turns 2+']['prompt_tokens']:.0f} tokens")
    print(f"now / before, turns 2+, paired: first token "
          f"{summary['now_over_before_turns_2plus']['first_token_paired_median']:.3f}, answer "
          f"{summary['now_over_before_turns_2plus']['answer_paired_median']:.3f}; identical to cache "
          f"off: {summary['now_identical_to_cache_off']} of {summary['now_answers']}")
    for arm_turns in turns.values():
        for t in arm_turns:
            t.pop("token_ids")
    record.add_run(args.out, {"rounds": args.rounds, "max_new_tokens": args.max_new_tokens,
                              "questions": args.questions, "summary": summary, "turns": turns})


if __name__ == "__main__":
    main()
