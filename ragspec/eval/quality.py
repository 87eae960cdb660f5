"""Answer-quality measures for `ragspec eval`: does an answer hold its question's answer snippet,
does it repeat itself, did it refuse — per question, summed per setting, and as a table.

Contract: plain data in (the answer's text and token ids, the question's snippets), plain dicts
and text out; no model, no click. The measures, as docs/answer-quality.md states them:

  * snippet recall: the share of the snippet's distinct content words (lowercased runs of
    letters and digits, English function words left out) that occur anywhere in the answer;
    a question with several snippets pools their words. "snippet present": recall >= 0.6.
  * exact: every snippet occurs in the answer verbatim, up to case and whitespace.
  * loops: some run of 8 of the model's tokens occurs 3 or more times in the answer (overlaps
    count) — in the text the user is shown. Answers the stop rule ended are counted apart
    ("repetition stops"): the model was looping there, and the user saw the start of it.
  * repeated share: the share of an answer's tokens inside an 8-token run it already wrote.
  * refused: the relevance floor refused the question (no answer generated), or the answer
    says it does not know (REFUSAL). Wanted for unanswerable questions; a false refusal for
    answerable ones.
  * snippet shown: some snippet of the question occurs whole in a passage of its prompt (up
    to case and whitespace): whether the model could have quoted it at all.
  * paired: two settings' recall on the same answerable questions, question by question: the
    mean difference, its standard error, and how many were higher and lower. Greedy answers
    repeat exactly run to run, so a difference is the settings', not the run's.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence

from ragspec.decoding.repetition import max_repeats, repeated_share
from ragspec.retrieval.absent_words import FUNCTION_WORDS

LOOP_NGRAM = 8
LOOP_TIMES = 3
PRESENT_RECALL = 0.6

_WORD = re.compile(r"[a-z0-9]+")
# Function words carry no answer content; counting them would credit any fluent sentence.
STOPWORDS = FUNCTION_WORDS
# An answer that declines: what the instruction asks the model to say when the passages do
# not hold the answer, and the usual ways small models say it.
REFUSAL = re.compile(
    r"\b(?:i|we) (?:do not|don't|cannot|can't|could not|couldn't) (?:know|find|answer|say|tell)\b"
    r"|\b(?:passages?|documents?|text|context|sources?) (?:do|does|did) not (?:contain|mention|"
    r"say|include|provide|answer)\b"
    r"|\bno (?:information|mention)\b|\bnot enough information\b"
    r"|\bnot (?:mentioned|provided|given|stated) in the (?:passages?|documents?|text|context)\b"
    r"|\bi(?:'m| am) sorry\b",
    re.IGNORECASE)


def content_words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


def snippet_recall(answer: str, snippets: Sequence[str]) -> float | None:
    """The share of the snippets' distinct content words found in the answer (None: the
    snippets have no content word)."""
    wanted = {w for s in snippets for w in content_words(s)}
    if not wanted:
        return None
    have = set(content_words(answer))
    return len(wanted & have) / len(wanted)


def _squash(text: str) -> str:
    return " ".join(text.lower().split())


def contains_all(answer: str, snippets: Sequence[str]) -> bool:
    """Every snippet occurs in the answer, up to case and whitespace."""
    body = _squash(answer)
    return bool(snippets) and all(_squash(s) in body for s in snippets)


def shown(snippets: Sequence[str], passages: Sequence[str]) -> bool:
    """Some snippet occurs whole in some passage, up to case and whitespace."""
    texts = [_squash(p) for p in passages]
    return any(_squash(s) in t for s in snippets for t in texts)


def says_unknown(answer: str) -> bool:
    return REFUSAL.search(answer) is not None


def measure(*, answers: Sequence[str], unanswerable: bool, floor_refused: bool, text: str,
            token_ids: Sequence[int], stop_reason: str) -> dict:
    """The per-question measures (see the module docstring)."""
    refused = floor_refused or says_unknown(text)
    recall = None
    if answers:
        recall = 0.0 if floor_refused else snippet_recall(text, answers)
    return {
        "recall": recall,
        "present": recall is not None and recall >= PRESENT_RECALL,
        "exact": bool(answers) and not floor_refused and contains_all(text, answers),
        "loops": max_repeats(token_ids, LOOP_NGRAM) >= LOOP_TIMES,
        "repetition_stop": stop_reason == "repetition",
        "repeated_share": repeated_share(token_ids, LOOP_NGRAM),
        "refused": refused,
    }


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def paired(base: Sequence[dict], other: Sequence[dict]) -> dict:
    """`other`'s snippet recall minus `base`'s, over the answerable questions both have (by
    id): {"questions", "mean", "stderr", "higher", "lower"} (mean and stderr None without
    questions; stderr None with one)."""
    before = {r["id"]: r["recall"] for r in base
              if not r["unanswerable"] and r["recall"] is not None}
    diffs = [r["recall"] - before[r["id"]] for r in other
             if not r["unanswerable"] and r["recall"] is not None and r["id"] in before]
    stderr = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
    return {"questions": len(diffs), "mean": statistics.fmean(diffs) if diffs else None,
            "stderr": stderr, "higher": sum(d > 0 for d in diffs),
            "lower": sum(d < 0 for d in diffs)}


def summarize(records: Sequence[dict]) -> dict:
    """One setting's totals over its question records (each: the `measure` keys plus
    "unanswerable", "new_tokens", "accepted_tokens", "from_passages", "from_answer",
    "identical", "prompt_tokens", "seconds", "ttft_seconds"); times and prompt tokens are
    medians over the answers generated."""
    answerable = [r for r in records if not r["unanswerable"]]
    generated = [r for r in records if not r["floor_refused"]]
    recalls = [r["recall"] for r in answerable if r["recall"] is not None]
    tokens = sum(r["new_tokens"] for r in generated)
    compared = [r["identical"] for r in records if r.get("identical") is not None]
    return {
        "questions": len(records),
        "answerable": len(answerable),
        "unanswerable": len(records) - len(answerable),
        "mean_recall": statistics.fmean(recalls) if recalls else None,
        "median_recall": statistics.median(recalls) if recalls else None,
        "present": sum(r["present"] for r in answerable),
        "exact": sum(r["exact"] for r in answerable),
        "generated": len(generated),
        "loops": sum(r["loops"] for r in generated),
        "repetition_stops": sum(r["repetition_stop"] for r in generated),
        "mean_repeated_share": (statistics.fmean(r["repeated_share"] for r in generated)
                                if generated else None),
        "unanswerable_refused": sum(r["refused"] for r in records if r["unanswerable"]),
        "false_refusals": sum(r["refused"] for r in answerable),
        "mean_new_tokens": tokens / len(generated) if generated else None,
        "accepted_share": _share(sum(r["accepted_tokens"] for r in generated), tokens),
        "from_passages_share": _share(sum(r["from_passages"] for r in generated), tokens),
        "from_answer_share": _share(sum(r["from_answer"] for r in generated), tokens),
        "identical": sum(compared) if compared else None,
        "compared": len(compared),
        "snippet_shown": sum(bool(r.get("snippet_shown")) for r in answerable),
        "median_prompt_tokens": _median(r.get("prompt_tokens") for r in generated),
        "median_ttft_seconds": _median(r.get("ttft_seconds") for r in generated),
        "median_seconds": _median(r.get("seconds") for r in generated),
    }


def _pct(part, whole) -> str:
    return "-" if part is None or not whole else f"{part}/{whole}"


def _num(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(results: dict) -> str:
    """One row per model and setting (Markdown-compatible)."""
    header = ("| model | setting | snippet recall mean / median | present (≥0.6) | exact | loops "
              "| repetition stops | unanswerable refused | false refusals | mean tokens "
              "| drafts: passage / own answer | identical on/off | prompt tokens (median) "
              "| snippet in prompt | recall − first row (± se; higher / lower) |")
    lines = [header, "|" + "---|" * 15]
    for run in results["runs"]:
        s, versus = run["summary"], run.get("versus_first")
        lines.append(
            f"| {run['model'].split(' (')[0]} | {run['setting']['label']} "
            f"| {_num(s['mean_recall'], '.2f')} / {_num(s['median_recall'], '.2f')} "
            f"| {_pct(s['present'], s['answerable'])} | {_pct(s['exact'], s['answerable'])} "
            f"| {_pct(s['loops'], s['generated'])} | {_pct(s['repetition_stops'], s['generated'])} "
            f"| {_pct(s['unanswerable_refused'], s['unanswerable'])} "
            f"| {_pct(s['false_refusals'], s['answerable'])} | {_num(s['mean_new_tokens'], '.0f')} "
            f"| {_num(s['from_passages_share'], '.0%')} / {_num(s['from_answer_share'], '.0%')} "
            f"| {_pct(s['identical'], s['compared'])} "
            f"| {_num(s.get('median_prompt_tokens'), '.0f')} "
            f"| {_pct(s.get('snippet_shown'), s['answerable'])} | {_versus(versus)} |")
    return "\n".join(lines)


def _versus(d: dict | None) -> str:
    if not d or d["mean"] is None:
        return "-"
    return (f"{d['mean']:+.3f} ± {_num(d['stderr'], '.3f')}; "
            f"{d['higher']} / {d['lower']}")
