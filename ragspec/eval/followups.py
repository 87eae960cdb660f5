"""Follow-up questions: does the standalone rule make a chat's follow-up find its passage?

Usage:  PYTHONPATH=. python -m ragspec.eval.followups [--json OUT]

data/followups/pairs.jsonl holds pairs over data/corpus (the Larkspur documents): a previous
question, then a question that leans on it ("followup": true, "And can I change it?") or one
that stands alone ("followup": false), each with the corpus file and a verbatim snippet that
holds the second question's answer. The corpus is ingested once (bundled embedder, default
splitter) and every second question is searched as a chat searches it (hybrid, k = 4), its
history the previous question, once per rule:

  old         ragspec.search's rule before "then" counted: a continuation opener, a referring
              word or three words or fewer; the standalone text is "<previous> <question>";
  new         the shipped rule (ragspec.search.standalone_question): the same, and a question
              ending on "then" is a follow-up too;
  substitute  the new detection, but the first referring word is replaced by the previous
              question's content words and the opener dropped ("can I change default port
              larkspur http api?");
  fused       the new rule's search and the follow-up's own search, fused by reciprocal rank.

A pair is found at rank r when the r-th passage is of the right file and contains the snippet
whole (ragspec/bench/realdocs.py's rule). Per rule and kind: found at rank 1, found in the top
4, the share of the top 4 from the right file, and (non-follow-ups) how many questions were
left unchanged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from ragspec.bench import realdocs
from ragspec.eval.retrieval import REPO, ingested, read_jsonl
from ragspec.retrieval.absent_words import content_words
from ragspec.retrieval.fusion import fuse
from ragspec.retrieval.records import Hit
from ragspec.search import FOLLOWUP_OPENERS, REFERRING, standalone_question

K = 4
PAIRS = REPO / "data" / "followups" / "pairs.jsonl"
CORPUS = REPO / "data" / "corpus"


def _history(pair: dict) -> list[dict]:
    return [{"role": "user", "content": pair["previous"]}]


def old_rule(pair: dict) -> str:
    """The rule as it was: a question ending on "then" did not count as a follow-up."""
    return standalone_question(pair["question"], _history(pair), endings=frozenset())


def new_rule(pair: dict) -> str:
    return standalone_question(pair["question"], _history(pair))


def substitute_rule(pair: dict) -> str:
    """A follow-up's first referring word becomes the previous question's content words."""
    q = pair["question"]
    if new_rule(pair) == q:
        return q
    lowered = q.lower()
    opener = next((o for o in FOLLOWUP_OPENERS if lowered.startswith(o)), "")
    q = q[len(opener):]
    subject = " ".join(content_words(pair["previous"]))
    pieces = re.split(r"([a-z']+)", q, flags=re.IGNORECASE)
    for i, piece in enumerate(pieces):
        if piece.lower() in REFERRING:
            pieces[i] = subject
            return "".join(pieces)
    return f"{q} {subject}"


def search(store, rule: str, pair: dict) -> tuple[str, list[Hit]]:
    """The standalone text and the top K hits under `rule`."""
    if rule != "fused":
        text = {"old": old_rule, "new": new_rule, "substitute": substitute_rule}[rule](pair)
        return text, store.retrieve(text, k=K, mode="hybrid").hits
    text = new_rule(pair)
    both = [store.retrieve(t, k=4 * K, mode="hybrid").hits for t in (text, pair["question"])]
    by_id = {h.passage.id: h for hits in both for h in hits}
    ranked = fuse([[h.passage.id for h in hits] for hits in both], K)
    return text, [by_id[pid] for pid, _ in ranked]


RULES = ("old", "new", "substitute", "fused")


def measure(pairs: list[dict]) -> list[dict]:
    texts = realdocs.loaded_texts(CORPUS, sorted(p.name for p in CORPUS.iterdir()))
    rows = []
    with ingested("followups", CORPUS) as store:
        for pair in pairs:
            row = {"id": pair["id"], "followup": pair["followup"], "question": pair["question"]}
            for rule in RULES:
                text, hits = search(store, rule, pair)
                rank = realdocs.rank_hits(pair, hits, texts, CORPUS).get("contains")
                row[rule] = {"standalone": text, "rank": rank,
                             "right_file": sum(Path(h.passage.source).name == pair["source"]
                                               for h in hits)}
            rows.append(row)
    return rows


def summarise(rows: list[dict]) -> dict:
    out = {}
    for rule in RULES:
        for kind, chosen in (("followups", [r for r in rows if r["followup"]]),
                             ("standalone", [r for r in rows if not r["followup"]])):
            ranks = [r[rule]["rank"] for r in chosen]
            out[f"{rule}/{kind}"] = {
                "pairs": len(chosen),
                "found_at_1": sum(r == 1 for r in ranks),
                "found_in_top_4": sum(1 <= r <= K for r in ranks),
                "right_file_share": round(sum(r[rule]["right_file"] for r in chosen)
                                          / (K * len(chosen)), 3),
            }
            if kind == "standalone":
                out[f"{rule}/{kind}"]["unchanged"] = sum(
                    r[rule]["standalone"] == r["question"] for r in chosen)
    return out


@click.command()
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also write every pair's standalone text and rank here.")
def main(json_out: Path | None) -> None:
    """Hit rates of the follow-up rules on data/followups/pairs.jsonl."""
    rows = measure(read_jsonl(PAIRS))
    summary = summarise(rows)
    click.echo("| rule | questions | found at rank 1 | found in top 4 | top 4 from the right "
               "file | left unchanged |")
    click.echo("|---|---|---|---|---|---|")
    for key, s in summary.items():
        click.echo(f"| {key.replace('/', ' | ')} | {s['found_at_1']}/{s['pairs']} | "
                   f"{s['found_in_top_4']}/{s['pairs']} | {s['right_file_share']:.2f} | "
                   f"{s.get('unchanged', '–')}{'/' + str(s['pairs']) if 'unchanged' in s else ''} |")
    if json_out:
        json_out.write_text(json.dumps({"summary": summary, "pairs": rows}, indent=1) + "\n",
                            encoding="utf-8")


if __name__ == "__main__":
    main()
