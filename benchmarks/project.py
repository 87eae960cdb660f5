"""Project end-to-end speed at other model shapes: the bundled model's measured acceptance,
replayed on each shape's measured forward costs.

Usage:  PYTHONPATH=. python benchmarks/project.py --corpus DIR --questions FILE.jsonl \\
            --costs bench-engine.json [--anchor llama.cpp] [--limit N] [--max-new-tokens 128] \\
            [--json out.json]

Random-weight models at real shapes (`ragspec bench-engine --out bench-engine.json`) give what a
forward costs each engine, but no answers to accept. This takes the answers from the bundled
model instead: each question's prompt is built with the real pipeline and answered once with
greedy decoding (the truth); then ragspec's drafter and adaptive policy walk that answer
(ragspec.decoding.draftsim's `walk`, with the engine's drafter settings and governor) choosing
drafts by the *shape's* cost curve, each step costed by that curve. Per question and shape:

    ragspec  = prefill_r · P/C + Σ c_r(step)          (its policy, its curve)
    greedy   = prefill_r · P/C + (N − 1) · c_r(1)     (ragspec without speculation)
    anchor   = prefill_a · P/C + (N − 1) · c_a(1)     (the --anchor engine's greedy, same file:
                                                       llama.cpp, ik_llama.cpp or llamacpp)

with P the prompt's tokens and C the context the prefill was measured at (prefill scaled
linearly). Printed: medians over copy questions of ragspec ÷ the anchor end to end and on the
decode phase alone, and ragspec ÷ its own greedy. A projection, not a measurement: acceptance
at 1.7B would differ from the 135M model's (larger models quote more).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ragspec.bench import runner as core
from ragspec.decoding.draftsim import walk
from ragspec.decoding.policy import DraftGovernor, DraftPolicy, ForwardCost
from ragspec.decoding.types import DraftConfig, GenerationConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--questions", required=True)
    parser.add_argument("--costs", required=True, help="results of ragspec bench-engine --out")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--anchor", default="llama.cpp",
                        help="the engine of the --costs file to compare with: llama.cpp (native "
                             "mainline build), ik_llama.cpp, or llamacpp (llama-cpp-python)")
    args = parser.parse_args()

    costs = json.loads(Path(args.costs).read_text())
    context = costs["context"]
    anchor = args.anchor
    files = [f for f in costs["files"] if "c" in f.get("ragspec", {}) and "c" in f.get(anchor, {})]
    if not files:
        sys.exit(f"no file in --costs has both a ragspec and an {anchor} curve")
    questions = core.load_questions(args.questions, args.limit)
    setup = core.build_setup(None, args.corpus, None, questions, args.max_new_tokens,
                             methods=("ragspec",), llamacpp=False)
    gen, draft_cfg = setup.generator, DraftConfig()
    truths = []
    for item in setup.prepared:  # the bundled model's own answers: what drafts must match
        run = gen.generate(item.prompt_ids, GenerationConfig(
            args.max_new_tokens, draft=DraftConfig(enabled=False)))
        truths.append((item, run.token_ids))
    rows = []
    for f in files:
        r, ll = f["ragspec"], f[anchor]
        cost = ForwardCost(list(r["c"]))
        policy = DraftPolicy(draft_cfg, cost)  # one policy across questions, as in the bench
        for item, truth in truths:
            scale = len(item.prompt_ids) / context
            decode = walk(item.prompt_ids, truth, cost, draft_cfg, policy,
                          governor=DraftGovernor(cost) if draft_cfg.governed else None,
                          occurrences=draft_cfg.occurrences).seconds
            plain = cost(1) * (len(truth) - 1)
            llama_decode = ll["c"][0] * (len(truth) - 1)
            rows.append({
                "shape": f["shape"], "mix": f["mix"], "id": item.question.id,
                "kind": item.question.kind, "tokens": len(truth),
                "ragspec_s": r["prefill_s"] * scale + decode,
                "greedy_s": r["prefill_s"] * scale + plain,
                "anchor_s": ll["prefill_s"] * scale + llama_decode,
                "decode_ratio": llama_decode / decode if decode > 0 else None,
            })
    print(f"| shape | mix | ragspec ÷ {anchor}, end to end | on decoding | ragspec ÷ own greedy |")
    print("|---|---|---|---|---|")
    for f in files:
        chosen = [x for x in rows if x["shape"] == f["shape"] and x["mix"] == f["mix"]
                  and x["kind"] == "copy"]
        if not chosen:
            continue
        e2e = statistics.median(x["anchor_s"] / x["ragspec_s"] for x in chosen)
        dec = statistics.median(x["decode_ratio"] for x in chosen if x["decode_ratio"])
        own = statistics.median(x["greedy_s"] / x["ragspec_s"] for x in chosen)
        print(f"| {f['shape']} | {f['mix']} | {e2e:.2f}× | {dec:.2f}× | {own:.2f}× |")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"context": context, "anchor": anchor, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
