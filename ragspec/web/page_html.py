"""Spans and passages to safe HTML for the Streamlit page (and small helpers the UI and CLI share).

Contract: every user-controlled string (document and model text, file names, error messages,
model names) goes through `escape_text` before any Streamlit element that renders Markdown. It
makes the text inert both as HTML (`<`, `>`, `&`, quotes) and as the Markdown Streamlit applies
(`*`, `_`, `#`, `[`, `$`, `:` ... become character references), so a passage containing
"<script>" or "**bold**" shows exactly those characters. Two modes:
  * block (default), for text inside our own one-line HTML that starts with a <div> (answers,
    passages): Markdown passes such a line through as a raw HTML block; newlines become <br>.
  * `inline=True`, for Markdown elements (st.error/info/success/warning/caption, button labels
    and `help=` tooltips, expander labels, progress text): control characters are shown escaped
    (`\n`, `\x00`), and "://", "www." and "@" get an invisible word joiner, because Streamlit's
    GitHub-flavoured Markdown turns URL- and e-mail-like text into links after decoding the
    character references.

Accepted drafts copied from a passage are <mark class="rs-draft"> (highlighted) with a `title`
(shown on hover) naming the passage and character range they were copied from; passages are
rendered with their copied ranges marked the same way. Accepted drafts copied from the answer's
own earlier text or from other prompt text (the question, the instruction) are not sources: they
are <mark class="rs-echo"> (a dotted underline, no highlight) and their title says where they
repeat from (ragspec.describe.draft_source). Both are marked only as ragspec.highlights shows
them: adjacent drafts merged, a draft too short to show copying left plain (the legend says so).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from ragspec.describe import PASSAGE, draft_source, merge_ranges, passage_label
from ragspec.highlights import RULE, shown_spans
from ragspec.terminal import printable

DRAFT_COLOUR = "#ffe38a"
OWN_COLOUR = "#d5ecff"
ECHO_STYLE = "background:none;text-decoration:underline dotted #8a8a8a;text-underline-offset:3px"
QUOTE_COLOUR = "#c8f0d8"  # quoted: found word for word in a passage, not a draft

# Characters Markdown (and Streamlit's extensions: :emoji:, :red[...], $math$) would interpret.
_MARKDOWN_CHARS = "\\`*_{}[]()#+-.!|~$:<>&\"'="
_ENTITIES = {ord(c): f"&#{ord(c)};" for c in _MARKDOWN_CHARS}
_ENTITIES[ord("\n")] = "<br>"
_ENTITIES[ord("\r")] = ""

STYLE = f"""<style>
mark.rs-draft {{ background: {DRAFT_COLOUR}; padding: 0 1px; border-radius: 3px; }}
mark.rs-echo {{ {ECHO_STYLE}; color: inherit; }}
mark.rs-quote {{ background: {QUOTE_COLOUR}; padding: 0 1px; border-radius: 3px; }}
.rs-answer, .rs-passage {{ line-height: 1.6; }}
.rs-passage {{ font-size: 0.9em; border-left: 3px solid #ddd; padding-left: 0.6em; }}
.rs-legend {{ font-size: 0.85em; color: #555; }}
a.rs-open {{ color: inherit; text-decoration: none; }}
</style>"""


# What GitHub-flavoured Markdown autolinks in plain text: a scheme's "://", "www." and e-mail
# addresses. A word joiner (U+2060, invisible, no line break) splits each pattern.
_AUTOLINK = re.compile(r"(?<=:)(?=//)|(?i:(?<=www)(?=\.))|(?<=@)")
_JOINER = "\u2060"


def escape_text(text: str, *, inline: bool = False) -> str:
    """Text as inert markup: no tag, entity, link, Markdown or Streamlit directive survives.

    inline=False: for our own HTML blocks (newlines become <br>). inline=True: for Markdown
    elements and tooltips (control characters shown escaped, autolinks defused).
    """
    if inline:
        text = _AUTOLINK.sub(_JOINER, printable(text))
    return text.translate(_ENTITIES)


def _mark(inner: str, title: str, kind: str = "draft") -> str:
    """A highlighted copy from a passage ("draft"), a quoted span ("quote"), or an underlined
    repeat of the answer's own text or of the question ("echo": any other draft source)."""
    if kind == "echo":
        return (f'<mark class="rs-echo" style="{ECHO_STYLE}" '
                f'title="{escape_text(title)}">{inner}</mark>')
    colour = QUOTE_COLOUR if kind == "quote" else DRAFT_COLOUR
    return (f'<mark class="rs-{kind}" style="background:{colour}" '
            f'title="{escape_text(title)}">{inner}</mark>')


_LINE_BREAKS = re.compile(r"(\s*\n\s*)")


def _mark_lines(text: str, title: str, kind: str) -> str:
    """`text` marked as _mark does, line by line: the line breaks (and the blank space around
    them) stay outside the marks, so a draft that runs over a blank line shows no highlighted
    sliver on the empty line, which reads as a whitespace source."""
    pieces = _LINE_BREAKS.split(text)
    return "".join(escape_text(piece) if i % 2 else _mark(escape_text(piece), title, kind)
                   for i, piece in enumerate(pieces) if piece)


def quote_title(span, passages: Sequence = ()) -> str:
    """The hover text of a quoted span: which passage holds it word for word."""
    o = span.origin
    if o is not None and isinstance(o.source, int) and 0 <= o.source < len(passages):
        return (f"quoted: found word for word in {passage_label(o.source, passages[o.source])}, "
                f"characters {o.char_start}-{o.char_end} (the server reports no drafts)")
    return "quoted: found word for word in a passage"


def span_title(span, passages: Sequence = ()) -> str:
    """The hover text of a drafted span: where it was copied from."""
    o = span.origin
    if o is None:
        return "accepted draft"
    if o.source is not None and isinstance(o.source, int) and 0 <= o.source < len(passages):
        p = passages[o.source]
        excerpt = p.text[o.char_start : o.char_end]
        if len(excerpt) > 160:
            excerpt = excerpt[:157] + "..."
        return (f"accepted draft copied from {passage_label(o.source, p)}, "
                f"characters {o.char_start}-{o.char_end}: \u201c{excerpt}\u201d")
    if o.in_prompt:
        return (f"accepted draft repeating the question or instruction (prompt token "
                f"{o.position}), not a passage")
    return (f"accepted draft repeating the answer's own earlier text (token {o.position}), "
            f"not a source")


def spans_html(spans: Iterable, passages: Sequence = (),
               href: Callable[[int], str] | None = None) -> str:
    """The answer as one HTML line: drafted spans marked, with provenance on hover; with
    `href` (passage index -> address), a span copied from a passage links to its source view."""
    out = []
    for span in shown_spans(spans):
        inner = escape_text(span.text)
        if not inner:
            continue
        source = draft_source(span)
        if source is not None:
            inner = _mark_lines(span.text, span_title(span, passages),
                                "draft" if source == PASSAGE else "echo")
            o = span.origin
            if (href is not None and source == PASSAGE and isinstance(o.source, int)
                    and 0 <= o.source < len(passages)):
                inner = (f'<a class="rs-open" href="{escape_text(href(o.source))}" '
                         f'target="_self">{inner}</a>')
        elif getattr(span, "quoted", False):
            inner = _mark_lines(span.text, quote_title(span, passages), "quote")
        out.append(inner)
    return f'<div class="rs-answer">{"".join(out)}</div>'


def sources_html(spans: Iterable, passages: Sequence = ()) -> str:
    """The "where the highlighted spans came from" list: each copy from a passage with its
    source; repeats of the answer's own text or of the question are counted, not listed as
    sources."""
    items, repeats = [], 0
    for span in shown_spans(spans):
        source = draft_source(span)
        if source == PASSAGE:
            items.append(f"<li>{_mark(escape_text(span.text), span_title(span, passages))} "
                         f"&#8592; {escape_text(span_title(span, passages))}</li>")
        elif source is not None and span.text:
            repeats += 1
    note = ""
    if repeats:
        note = (f"<p>{repeats} accepted draft{'s' if repeats != 1 else ''} "
                f"(<mark class=\"rs-echo\" style=\"{ECHO_STYLE}\">underlined</mark>) "
                f"{'repeat' if repeats != 1 else 'repeats'} the answer's own earlier text or "
                f"the question: not sources.</p>")
    listed = f"<ul>{''.join(items)}</ul>" if items else "<p>No span was copied from a passage.</p>"
    return f"<div>{listed}{note}</div>"


def passage_html(text: str, ranges: Sequence[tuple[int, int]] = (),
                 quoted: Sequence[tuple[int, int]] = ()) -> str:
    """A passage as one HTML line with the given character ranges marked (copied by accepted
    drafts; `quoted`: found word for word in the answer, in the quote colour)."""
    out, pos = [], 0
    marks = [(s, e, "draft") for s, e in merge_ranges(list(ranges))]
    marks += [(s, e, "quote") for s, e in merge_ranges(list(quoted))]
    for start, end, kind in sorted(marks):
        start, end = max(start, pos), min(end, len(text))
        if end <= start:
            continue
        out.append(escape_text(text[pos:start]))
        title = "copied into the answer" if kind == "draft" else "quoted in the answer"
        out.append(_mark(escape_text(text[start:end]), title, kind))
        pos = end
    out.append(escape_text(text[pos:]))
    return f'<div class="rs-passage">{"".join(out)}</div>'


def legend_html(quoted: bool = False) -> str:
    """The legend; `quoted` for an answer from a server that reports no drafts."""
    if quoted:
        return (f'<div class="rs-legend"><mark class="rs-quote-legend" style="background:'
                f'{QUOTE_COLOUR}">quoted</mark> = found word for word in a passage. This '
                f'server does not report its drafts, so none are shown. Hover a quote to see '
                f'its passage.</div>')
    return (f'<div class="rs-legend"><mark class="rs-draft-legend" style="background:'
            f'{DRAFT_COLOUR}">highlighted</mark> = accepted draft copied from a passage by the '
            f'n-gram drafter and confirmed by the model in one forward pass (hover it to see '
            f'the passage); <mark class="rs-echo-legend" style="{ECHO_STYLE}">underlined</mark>'
            f' = accepted draft repeating the answer\'s own earlier text or the question: not '
            f'a source; plain text = written by the model token by token. Adjacent drafts are '
            f'marked as one; {RULE}.</div>')



