"""Text for a terminal: answers with accepted drafts highlighted, one-line stats, and
`printable`, which every human-readable output passes user-controlled strings through.

File names and document text may hold control characters: a newline in a name would fake a
row of `ragspec list`, an ESC sequence in a passage would recolour or clear the user's terminal.
`printable` shows them escaped (`\\n`, `\\x1b`); `--json` output keeps the exact text.
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls; tab and (optionally) newline are kept as layout.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_AND_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    char = match.group()
    return _NAMED.get(char) or f"\\x{ord(char):02x}"


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """text with control characters escaped, safe to print; newlines kept when asked (passage
    bodies), escaped otherwise (names and one-line fields)."""
    return (_CONTROL if keep_newlines else _CONTROL_AND_NEWLINE).sub(_escape, text)


DRAFT_STYLE = "black on green"
QUOTE_STYLE = "black on cyan"
# Accepted drafts copied from a passage are highlighted; those repeating the answer's own text
# or the question are underlined: they are not sources (ragspec.describe.draft_source).
DRAFT_STYLES = {"passage": DRAFT_STYLE, "answer": "underline", "prompt": "underline"}


def render_spans(spans, console) -> None:
    """Print spans with accepted drafts marked by where they were copied from (DRAFT_STYLES)
    and quoted spans (found word for word in a passage by a server that reports no drafts) in
    another colour; drafts as ragspec.highlights shows them (merged, the too-short ones plain:
    a live answer feeds its spans through highlights.ShownStream first)."""
    from rich.text import Text

    from ragspec.describe import draft_source
    from ragspec.highlights import shown_spans

    text = Text()
    for span in shown_spans(spans):
        source = draft_source(span)
        style = DRAFT_STYLES[source] if source else QUOTE_STYLE if getattr(span, "quoted", False) \
            else ""
        text.append(printable(span.text, keep_newlines=True), style=style)
    console.print(text, end="")


def legend(spans) -> str:
    """The rich-markup legend for what `render_spans` highlighted in these spans."""
    from ragspec.describe import draft_source
    from ragspec.highlights import RULE

    parts = []
    if any(s.drafted for s in spans) or not any(getattr(s, "quoted", False) for s in spans):
        parts.append(f"[{DRAFT_STYLE}]highlighted[/] = accepted drafts copied from the passages")
    if any(draft_source(s) not in (None, "passage") for s in spans):
        parts.append("[underline]underlined[/] = accepted drafts repeating the answer's own "
                     "text or the question (not sources)")
    if any(getattr(s, "quoted", False) for s in spans):
        parts.append(f"[{QUOTE_STYLE}]quoted[/] = found word for word in a passage (the "
                     "server reports no drafts)")
    if any(s.drafted for s in spans):
        parts.append(f"adjacent drafts are marked as one; {RULE}")
    return " · ".join(parts)


def stats_line(stats) -> str:
    return (
        f"{stats.new_tokens} tokens in {stats.seconds:.2f} s ({stats.tokens_per_s:.1f} tok/s, "
        f"first token {stats.ttft_seconds:.2f} s) · {stats.forward_passes} forwards · drafted "
        f"{stats.drafted_tokens}, accepted {stats.accepted_tokens} "
        f"({100 * stats.accept_rate:.0f}%)"
    )
