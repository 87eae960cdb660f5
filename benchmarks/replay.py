"""Replay recorded greedy answers through drafting strategies offline: what drafting gains, and
why it misses what it misses.

Usage:
  PYTHONPATH=. python benchmarks/replay.py record --corpus DIR --questions FILE.jsonl --out A.json
  PYTHONPATH=. python benchmarks/replay.py walk A.json [--cost-ms 1:22.5,2:24.3,...] [--trace]
        [--json out.json]

`record` builds each question's prompt with the real pipeline (as `ragspec bench` does) and
answers it once with the engine's greedy decoding and the product's repetition stop rule (the
bench's), keeping prompt and answer token ids. Under greedy the answer is the same whatever is
drafted, so `walk` can then replay every strategy against it with no model and no timing noise
(ragspec.decoding.draftsim): forwards per answer, accepted draft tokens per forward, and the
decode phase's time from a forward-cost curve c(n) — by default the one measured on this
project's machine (Xeon family 6 model 207, 2 cores, bundled SmolLM2-135M Q4_1, 800 cached
tokens, quiet); pass another with --cost-ms. Ratios are plain decoding's decode time over the
strategy's (the first token is the same for all and is left out).

Strategies (one draft policy shared across the questions of a set, as in `ragspec bench`):
  engine-before  the drafter as it was: latest occurrence, no governor;
  occurrences    the drafter comparing the latest 8 occurrences (ragspec's default now);
  governed       occurrences + the DraftGovernor (what the engine does now);
  tree-A-m       governed + A other occurrences' continuations of m tokens verified in the
                 same forward (a token tree: a projection, the engine verifies one draft);
  followed       governed + the copy follower (DraftConfig.follow);
  variants       followed + drafts matched across word variants (DraftConfig.variants);
  shadowed       variants + the policy learning from declined proposals (DraftShadow):
                 ragspec's default now;
  perfect        each proposal cut exactly where the model diverges (the best length policy);
  perfect-followed, perfect-variants  the same with those strategies' proposals;
  oracle         the true continuation, max_draft tokens at a time.
--trace adds, for engine-before and governed, the count of missed tokens by cause.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace

from ragspec.decoding import draftsim
from ragspec.decoding.policy import DraftGovernor, DraftPolicy, ForwardCost
from ragspec.decoding.types import DraftConfig

QUOTED_COST_MS = "1:22.5,2:24.3,4:30.6,8:52.7,16:92.6"
STRATEGIES = ("engine-before", "occurrences", "governed", "tree-1-2", "tree-2-2", "followed",
              "variants", "shadowed", "perfect", "perfect-followed", "perfect-variants", "oracle")
FOLLOWING = ("followed", "variants", "shadowed", "perfect-followed", "perfect-variants")
VARIANTS = ("variants", "shadowed", "perfect-variants")
OCCURRENCES = 8


def parse_cost(text: str, max_tokens: int) -> ForwardCost:
    """'n:ms,n:ms,...' -> a curve for n = 1..max_tokens, linear between the given points."""
    points = sorted((int(n), float(ms) / 1000) for n, ms in (p.split(":") for p in text.split(",")))
    if points[0][0] != 1:
        raise SystemExit("--cost-ms must give n=1")
    curve = []
    for n in range(1, max_tokens + 1):
        lo = max((p for p in points if p[0] <= n), key=lambda p: p[0])
        hi = min((p for p in points if p[0] >= n), key=lambda p: p[0], default=None)
        if hi is None:  # beyond the last point: the last segment's slope
            (n0, s0), (n1, s1) = points[-2], points[-1]
            curve.append(s1 + (s1 - s0) / (n1 - n0) * (n - n1))
        elif hi[0] == lo[0]:
            curve.append(lo[1])
        else:
            curve.append(lo[1] + (hi[1] - lo[1]) * (n - lo[0]) / (hi[0] - lo[0]))
    return ForwardCost(curve)


def record(args) -> None:
    from ragspec.bench import runner as core
    from ragspec.decoding import calibrate
    from ragspec.decoding.types import GenerationConfig
    from ragspec.pipeline import ANSWER_REPEAT

    # greedy answers do not depend on the forward-cost curve: skip measuring it (minutes on a
    # busy machine, and a busy machine's curve is not cached)
    calibrate.load_or_measure = lambda *args, **kwargs: None

    questions = core.load_questions(args.questions, args.limit)
    setup = core.build_setup(None, args.corpus, None, questions, args.max_new_tokens,
                             methods=("ragspec",), llamacpp=False, llama_server=False)
    rows, texts = [], {}
    for item in setup.prepared:
        run = setup.generator.generate(item.prompt_ids, GenerationConfig(
            args.max_new_tokens, draft=DraftConfig(enabled=False), repeat=ANSWER_REPEAT))
        for token in {*item.prompt_ids, *run.token_ids}:
            texts.setdefault(str(token), setup.generator.tokenizer.decode([token]))
        rows.append({"id": item.question.id, "kind": item.question.kind,
                     "prompt_ids": list(item.prompt_ids), "answer_ids": run.token_ids,
                     "stop_reason": run.stats.stop_reason, "text": run.text})
        print(item.question.id, len(run.token_ids), run.stats.stop_reason, file=sys.stderr)
        with open(args.out, "w", encoding="utf-8") as fh:  # after every answer: usable early
            json.dump({"model": setup.model_name, "max_new_tokens": args.max_new_tokens,
                       "questions": rows, "failures": setup.failures, "token_text": texts}, fh)


def word_keys(data: dict):
    """The engine's word keys over a recording's token texts (recorded by `record`), or over
    the bundled model's tokenizer for recordings made before they were kept."""
    from ragspec.decoding.ngram import WordKeys

    texts = data.get("token_text")
    if texts is not None:
        return WordKeys(lambda ids: texts[str(ids[0])])
    from transformers import AutoTokenizer

    from ragspec import paths
    from ragspec.models.load import resolve

    folder, _, _ = resolve(None, paths.models_dir(), packed=True)
    return WordKeys(AutoTokenizer.from_pretrained(folder).decode)


def run_strategy(name: str, rows: list[dict], cost: ForwardCost, cfg: DraftConfig,
                 trace: bool, budget: float = 1.0, keys=None) -> list[draftsim.Walk]:
    if name == "oracle":
        return [None] * len(rows)
    cfg = replace(cfg, follow=name in FOLLOWING, variants=name in VARIANTS)
    policy = None if name.startswith("perfect") else DraftPolicy(cfg, cost)
    walks = []
    for row in rows:
        prompt, truth = row["prompt_ids"], row["answer_ids"]
        before = name == "engine-before"
        alternatives = int(name.split("-")[1]) if name.startswith("tree-") else 0
        alt_tokens = int(name.split("-")[2]) if alternatives else 0
        governor = (DraftGovernor(cost, budget=budget)
                    if name.startswith(("governed", "tree-", "followed", "variants", "shadowed"))
                    else None)
        walks.append(draftsim.walk(prompt, truth, cost, cfg, policy, trace=trace,
                                   alternatives=alternatives, alt_tokens=alt_tokens,
                                   governor=governor,
                                   occurrences=1 if before else OCCURRENCES, keys=keys,
                                   learn_declined=name == "shadowed"))
    return walks


def answer_quality(rows: list[dict], questions_file: str) -> list[dict]:
    """ragspec eval's per-answer measures (ragspec.eval.quality) of the recorded answers."""
    from ragspec.bench.questions import load_questions
    from ragspec.eval import quality

    snippets = {q.id: q for q in load_questions(questions_file)}
    out = []
    for row in rows:
        q = snippets.get(row["id"])
        if q is not None and q.answers:
            out.append(quality.measure(answers=q.answers, unanswerable=False,
                                       floor_refused=False, text=row.get("text", ""),
                                       token_ids=row["answer_ids"],
                                       stop_reason=row.get("stop_reason", "")))
    return out


def walk_command(args) -> None:
    data = json.load(open(args.answers, encoding="utf-8"))
    cfg = DraftConfig()
    cost = parse_cost(args.cost_ms, cfg.max_draft + 1 + 2 * 2)
    rows = [r for r in data["questions"] if len(r["answer_ids"]) > 1]
    table: dict[str, list[dict]] = {}
    causes: dict[str, dict] = {}
    keys = word_keys(data)
    for name in STRATEGIES:
        traced = args.trace and name in ("engine-before", "governed", "followed", "shadowed")
        walks = run_strategy(name, rows, cost, cfg, traced, args.budget, keys)
        out = []
        for row, w in zip(rows, walks, strict=True):
            truth = row["answer_ids"]
            plain = draftsim.plain_seconds(truth, cost)
            seconds = (draftsim.oracle_seconds(truth, cost, cfg.max_draft) if w is None
                       else w.seconds)
            forwards = w.forwards if w is not None else None
            out.append({"id": row["id"], "kind": row["kind"], "tokens": len(truth),
                        "decode_ratio": plain / seconds, "forwards": forwards,
                        "accepted_per_forward": ((len(truth) - 1 - forwards) / forwards
                                                 if forwards else None)})
        table[name] = out
        if traced:
            total: dict[str, int] = {}
            for w in walks:
                for key, value in w.summary().items():
                    total[key] = total.get(key, 0) + value
            causes[name] = total
    print(f"{len(rows)} answers from {args.answers}; cost c(1..) ms: "
          + " ".join(f"{s * 1000:.1f}" for s in cost.seconds[:17]))
    print("| strategy | decode ratio median | worst | forwards/answer | accepted/forward |")
    print("|---|---|---|---|---|")
    for name in STRATEGIES:
        out = table[name]
        ratios = [r["decode_ratio"] for r in out]
        fw = [r["forwards"] for r in out if r["forwards"] is not None]
        apf = [r["accepted_per_forward"] for r in out if r["accepted_per_forward"] is not None]
        worst = min(out, key=lambda r: r["decode_ratio"])
        print(f"| {name} | {statistics.median(ratios):.2f}× | {worst['decode_ratio']:.2f}× "
              f"({worst['id']}) | {statistics.median(fw) if fw else '-'} | "
              f"{statistics.mean(apf) if apf else float('nan'):.2f} |")
    for kind in ("copy", "open", "unanswerable"):
        chosen = [i for i, r in enumerate(rows) if r["kind"] == kind]
        if chosen:
            cells = " ".join(f"{n}={statistics.median(table[n][i]['decode_ratio'] for i in chosen):.2f}"
                             for n in STRATEGIES)
            print(f"  {kind} (n={len(chosen)}): {cells}")
    for name, total in causes.items():
        print(f"  trace, {name} (summed over answers): "
              + ", ".join(f"{k}={v}" for k, v in total.items()))
    quality_rows = answer_quality(rows, args.questions) if args.questions else []
    if quality_rows:
        present = sum(q["present"] for q in quality_rows)
        loops = sum(q["loops"] or q["repetition_stop"] for q in quality_rows)
        print(f"  answer quality (the same with speculation on or off: greedy): snippet present "
              f"{present}/{len(quality_rows)}, looping or stopped for repetition {loops}")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump({"cost_seconds": cost.seconds, "strategies": table, "causes": causes}, fh,
                      indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="answer every question once with greedy decoding")
    rec.add_argument("--corpus", required=True)
    rec.add_argument("--questions", required=True)
    rec.add_argument("--out", required=True)
    rec.add_argument("--limit", type=int, default=None)
    rec.add_argument("--max-new-tokens", type=int, default=128)
    wk = sub.add_parser("walk", help="replay the strategies over recorded answers")
    wk.add_argument("answers")
    wk.add_argument("--cost-ms", default=QUOTED_COST_MS,
                    help="forward cost curve, n:milliseconds pairs (default: %(default)s)")
    wk.add_argument("--trace", action="store_true", help="count missed tokens by cause")
    wk.add_argument("--budget", type=float, default=1.0,
                    help="the governor's budget, in plain steps (default: %(default)s)")
    wk.add_argument("--questions", help="the question file: report the answers' quality too")
    wk.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    record(args) if args.command == "record" else walk_command(args)


if __name__ == "__main__":
    main()
