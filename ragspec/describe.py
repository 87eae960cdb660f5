"""Facts about an answer that every front end states the same way: passage labels, the character
ranges that drafted spans copied, and how a speculation-off run compares with a speculation-on run.

Contract: plain strings and numbers out; no markup (the web page escapes, the terminal prints).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path


def source_label(passage) -> str:
    """'faq.md, page 3': the file name, and the page for PDFs."""
    name = Path(passage.source).name or passage.source
    page = f", page {passage.page}" if getattr(passage, "page", None) else ""
    return f"{name}{page}"


def passage_label(index: int, passage) -> str:
    """'[2] faq.md, page 3' for the passage at 0-based index."""
    return f"[{index + 1}] {source_label(passage)}"


# Where an accepted draft was copied from, as every front end names it: only "passage" copies
# are sources; the answer's own earlier text and the rest of the prompt (the question, the
# instruction, passage headers) are not.
PASSAGE, ANSWER, PROMPT = "passage", "answer", "prompt"


def draft_source(span) -> str | None:
    """PASSAGE, ANSWER (the answer's own earlier text) or PROMPT (other prompt text) for a
    drafted span; None for the model's own tokens. A draft of unknown origin (a benchmark's
    forced draft) counts as PROMPT: not a source."""
    if not span.drafted:
        return None
    o = getattr(span, "origin", None)
    if o is None:
        return PROMPT
    if not o.in_prompt:
        return ANSWER
    return PASSAGE if o.source is not None else PROMPT


def copied_ranges(spans: Iterable, quoted: bool = False) -> dict[int, list[tuple[int, int]]]:
    """Passage index -> sorted, merged character ranges that drafted spans copied from it
    (quoted=True: that quoted spans match, ragspec.quoting)."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    for span in spans:
        o = getattr(span, "origin", None)
        chosen = getattr(span, "quoted", False) if quoted else span.drafted
        if not chosen or o is None or o.source is None or o.char_start is None:
            continue
        if o.char_end > o.char_start:
            ranges.setdefault(o.source, []).append((o.char_start, o.char_end))
    return {k: merge_ranges(v) for k, v in ranges.items()}


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


# What the user is told about how an answer ended (GenerationStats.stop_reason); the reasons
# not listed need no note here: an end-of-text token or a stop string ends an answer normally,
# and front ends say "stopped" (a Stop button) their own way.
STOP_NOTES = {
    "repetition": "The answer ends here because it started repeating itself (ragspec stops an "
                  "answer that writes the same run of words twice).",
    "max_new_tokens": "The answer reached its length limit and may be cut short.",
}


def stop_note(stop_reason: str) -> str | None:
    return STOP_NOTES.get(stop_reason)


def identical_verdict(baseline_ids: Sequence[int], spec_ids: Sequence[int],
                      greedy: bool) -> tuple[bool | None, str]:
    """(identical?, message) comparing the speculation-off and -on answers. Plain words, no
    emoji (a front end adds its own icon: a browser without an emoji font shows empty boxes)."""
    if list(baseline_ids) == list(spec_ids):
        return True, f"Token-identical: both runs wrote the same {len(spec_ids)} tokens."
    if not greedy:
        return None, ("The answers differ, as expected with sampling "
                      "(temperature > 0): each run draws its own tokens.")
    pairs = zip(baseline_ids, spec_ids, strict=False)
    first = next((i for i, (a, b) in enumerate(pairs) if a != b),
                 min(len(baseline_ids), len(spec_ids)))
    return False, (f"Not identical: the answers diverge at token {first} "
                   f"(a floating-point near-tie; see docs/how-it-works.md, Exactness).")


def seconds_speedup(baseline_seconds: float, spec_seconds: float) -> float:
    return baseline_seconds / spec_seconds if spec_seconds > 0 else 0.0


CACHED_NOTE = "after the first token: the second run's prompt came from the prompt cache"


def toggle_speedup(baseline, spec) -> tuple[float, str]:
    """Speculation on (`spec`) against off (`baseline`), two GenerationStats of one prompt:
    the whole answers' seconds; but where the second run took more of its prompt from the
    prompt cache than the first (the chat's side by side, `ask --compare`: the second run
    reads the same prompt), the time after the first token, the only part speculation changes,
    with a note saying so (else "")."""
    after = baseline.decode_seconds, spec.decode_seconds
    if spec.cached_prompt_tokens > baseline.cached_prompt_tokens and min(after) > 0:
        return seconds_speedup(*after), CACHED_NOTE
    return seconds_speedup(baseline.seconds, spec.seconds), ""
