"""The Streamlit pieces of the chat page's main column: saved and live answers (the sidebar is
ragspec.web.sidebar).

Contract: every user-controlled string (questions, answers, passages, file names, chat titles,
model names, error text) reaches Streamlit through `ragspec.web.page_html.escape_text` — inside our own
HTML blocks, or with `inline=True` for Markdown elements, labels and tooltips (a selectbox's
options are the exception: Streamlit shows them as plain text, so model names go in as they
are). No tooltip holds a server path. The page (ragspec/web/page.py) calls these in its
order: the history, then the live answer.
"""

from __future__ import annotations

import streamlit as st

from ragspec import describe
from ragspec.highlights import shown_spans
from ragspec.search import NOT_IN_DOCUMENTS
from ragspec.web import page_html as rd
from ragspec.web.answering import ACTIVE

LIVE_REFRESH_SECONDS = 0.5


def md(text: str) -> str:
    """Shorthand for text shown in a Markdown element, label or tooltip."""
    return rd.escape_text(str(text), inline=True)


def show_question(text: str, searched: str | None = None) -> None:
    """The user's question; under a follow-up, what was searched for (the question made
    standalone, ragspec.search.standalone_question), so the reader sees the chat was used."""
    st.markdown(f"<div>{rd.escape_text(text)}</div>", unsafe_allow_html=True)
    if searched and searched.strip() != text.strip():
        st.caption(f"Searched for: {md(searched)}")


# -- answers ------------------------------------------------------------------------------------

# The side-by-side verdict (describe.identical_verdict): how it is shown, with which icon. Icons
# from Streamlit's Material set, never emoji: a browser without an emoji font (Debian's
# Chromium) shows emoji as empty boxes.
_VERDICTS = {True: (st.success, ":material/check_circle:"), False: (st.error, ":material/cancel:"),
             None: (st.info, ":material/info:")}

_INTERRUPTED = ("This answer was interrupted (the server stopped while it was being written); "
                "what was written is kept.")


def show_answer(record: dict, href=None) -> None:
    """A saved answer: its run(s), stats, identity mark, provenance, passages, and status.
    href: passage index -> the address of its source view (copied spans and passages link)."""
    status, runs = record["status"], record["runs"]
    if status == "failed":
        st.error(md(record["error"] or "The answer failed."))
    elif status in ("waiting", "generating"):
        st.warning(_INTERRUPTED)
    if record.get("note"):
        st.info(md(record["note"]))
    if record.get("refused"):
        show_refusal(record["passages"], record["scores"], record.get("absent_words") or [])
        return
    if not runs:
        if status == "stopped":
            st.caption("Stopped before it started.")
        return
    passages = record["passages"]
    cols = st.columns(len(runs)) if len(runs) > 1 else [st.container()]
    for col, run in zip(cols, runs, strict=True):
        with col:
            if len(runs) > 1:
                st.subheader(run["label"])
            st.markdown(rd.spans_html(run["spans"], passages, href), unsafe_allow_html=True)
            show_stats(run, runs[0] if len(runs) > 1 and run is runs[-1] else None)
    note = describe.stop_note(runs[-1]["stats"].stop_reason)
    if note and status != "stopped":
        st.caption(md(note))
    if status == "stopped":
        st.caption(":material/stop: Stopped: the answer ends where Stop was pressed.")
    elif len(runs) > 1:
        ok, message = describe.identical_verdict(runs[0]["token_ids"], runs[1]["token_ids"],
                                           record["greedy"])
        show, icon = _VERDICTS[ok]
        show(message, icon=icon)
    show_sources(runs[-1]["spans"], passages, record["scores"], href)


def show_refusal(passages, scores, absent_words=()) -> None:
    """The "not in your documents" reply: no answer was generated; why (the words of the
    question the documents never use, when that was the reason); the closest passages."""
    st.info(NOT_IN_DOCUMENTS, icon=":material/search:")
    if absent_words:
        words = ", ".join(f"“{md(w)}”" for w in absent_words)
        st.caption(f"Your documents never use {words}, a specific word of the question.")
    st.caption("The relevance floor is in the sidebar's Advanced settings (0 turns it and the "
               "words check off).")
    for i, p in enumerate(passages):
        score = f" · score {scores[i]:.2f}" if i < len(scores) and scores[i] is not None else ""
        st.markdown(f"<div class=\"rs-closest\"><b>{rd.escape_text(describe.passage_label(i, p))}</b>"
                    f"{score} · char {p.start}</div>", unsafe_allow_html=True)
        st.markdown(rd.passage_html(p.text, []), unsafe_allow_html=True)


def speed_line(run: dict, baseline: dict | None) -> str:
    """The answer's speed in one line: tokens/s, tokens and seconds, and against speculation
    off when the answer was run side by side."""
    s = run["stats"]
    line = f":material/bolt: {s.tokens_per_s:.1f} tokens/s \u00b7 {s.new_tokens} tokens in {s.seconds:.2f} s"
    if baseline:
        speedup, note = describe.toggle_speedup(baseline["stats"], s)
        line += f" \u00b7 {speedup:.2f}\u00d7 speculation off" + (f" ({note})" if note else "")
    elif s.drafted_tokens:
        line += f" \u00b7 {100 * s.accept_rate:.0f}% of drafted tokens accepted"
    return line


def show_stats(run: dict, baseline: dict | None) -> None:
    """The speed line under the answer; the whole table in the "Speculation stats" expander."""
    s = run["stats"]
    st.caption(speed_line(run, baseline))
    with st.expander("Speculation stats"):
        row = ("| tokens/s | seconds | forward passes | drafted | accepted |"
               + (" speedup |" if baseline else "") + "\n|---|---|---|---|---|"
               + ("---|" if baseline else "") + "\n"
               + f"| {s.tokens_per_s:.1f} | {s.seconds:.2f} | {s.forward_passes} | "
                 f"{s.drafted_tokens} | {s.accepted_tokens} |")
        if baseline:
            row += f" {describe.toggle_speedup(baseline['stats'], s)[0]:.2f}× |"
        st.markdown(row)
        if s.drafted_tokens:
            st.markdown(f"Acceptance rate **{100 * s.accept_rate:.0f}%** · mean accepted draft "
                        f"length **{s.mean_accepted_length:.2f}** tokens · "
                        f"{s.new_tokens} tokens in {s.forward_passes + 1} forwards")
            if s.accepted_per_step:
                st.caption("Accepted draft tokens per decoding step")
                st.bar_chart({"accepted tokens": s.accepted_per_step}, height=160)


def show_sources(spans, passages, scores, href=None) -> None:
    shown = shown_spans(spans)  # as the answer marks them: merged, the too-short ones plain
    copies = [sp for sp in shown if describe.draft_source(sp) == describe.PASSAGE]
    if any(sp.drafted for sp in shown):
        with st.expander(f"Where the highlighted spans came from ({len(copies)})"):
            st.markdown(rd.sources_html(spans, passages), unsafe_allow_html=True)
    copied = describe.copied_ranges(shown)
    quoted = describe.copied_ranges(spans, quoted=True)
    if quoted:
        st.markdown(rd.legend_html(quoted=True), unsafe_allow_html=True)
    with st.expander(f"Passages used ({len(passages)})"):
        for i, p in enumerate(passages):
            score = f" · score {scores[i]:.2f}" if i < len(scores) and scores[i] is not None else ""
            link = ("" if href is None else f' · <a class="rs-open-passage" target="_self" '
                    f'href="{rd.escape_text(href(i))}">open in the document</a>')
            st.markdown(f"<div><b>{rd.escape_text(describe.passage_label(i, p))}</b>{score} · "
                        f"char {p.start}{link}</div>", unsafe_allow_html=True)
            st.markdown(rd.passage_html(p.text, copied.get(i, []), quoted.get(i, [])),
                        unsafe_allow_html=True)


def _minutes(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60:02d} s"


def _waiting_text(snap: dict) -> str:
    phase, ahead = snap["phase"], snap["ahead"]
    if phase == "waiting":
        return f":material/hourglass_top: Waiting for {ahead} answer{'s' if ahead != 1 else ''} ahead"
    if phase == "loading" and not snap["model_loaded"]:
        # A first start builds the CPU kernels and converts the model once: a minute or two on
        # an idle 2-core machine, several times that on a busy one, so the wait counts up.
        first = (" (its first start on this machine builds the CPU kernels and converts it, "
                 "once: minutes, longer on a busy machine)") if snap["bundled"] else ""
        waited = snap.get("loading_s")
        so_far = "" if waited is None else f" {_minutes(waited)} so far"
        return f"Loading the model {md(snap['model'])}{first}...{so_far}"
    if phase in ("loading", "retrieving"):
        return "Finding passages..."
    return "Waiting for the first token..."


@st.fragment(run_every=LIVE_REFRESH_SECONDS)
def live_answer(chat_id: str) -> None:
    """The answer being written for this chat, refreshed from its job, with a Stop button.
    When the job is gone, the whole page reruns and shows the saved answer instead."""
    job = ACTIVE.get(chat_id)
    if job is None:
        st.rerun()
    snap = job.snapshot()
    runs = snap["runs"]
    if snap["note"]:
        st.info(md(snap["note"]))
    if not runs or not any(r["spans"] for r in runs):
        st.info(_waiting_text(snap))
    if runs:
        cols = st.columns(snap["configs"]) if snap["configs"] > 1 else [st.container()]
        for col, run in zip(cols, runs, strict=False):
            with col:
                if snap["configs"] > 1:
                    st.subheader(run["label"])
                st.markdown(rd.spans_html(run["spans"], snap["passages"]), unsafe_allow_html=True)
    if job.stop_requested:
        st.caption("Stopping...")
    else:
        st.button("Stop", icon=":material/stop:", key="stop-answer", on_click=job.stop,
                  help="End this answer at the next step and keep what was written.")
