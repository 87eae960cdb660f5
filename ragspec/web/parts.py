"""The Streamlit pieces of the chat page: saved and live answers, and the sidebar's sections.

Contract: every user-controlled string (questions, answers, passages, file names, chat titles,
model names, error text) reaches Streamlit through `ragspec.web.page_html.escape_text` — inside our own
HTML blocks, or with `inline=True` for Markdown elements, labels and tooltips (a selectbox's
options are the exception: Streamlit shows them as plain text, so model names go in as they
are). No tooltip holds a server path. The page (ragspec/web/page.py) only calls these in its order: sidebar, session state,
history, live answer, chat input.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from ragspec import describe
from ragspec.accounts import audit, policy
from ragspec.decoding.types import DraftConfig
from ragspec.highlights import shown_spans
from ragspec.pipeline import PipelineConfig
from ragspec.retrieval.records import SEARCH_MODES
from ragspec.search import DEFAULT_MIN_SCORE, DEFAULT_SEARCH, NOT_IN_DOCUMENTS
from ragspec.web import page_html as rd
from ragspec.web import uploads
from ragspec.web.answering import ACTIVE, AnswerSettings
from ragspec.web.chats import ChatError, ChatStore
from ragspec.web.public_errors import public_message

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
        speedup = describe.seconds_speedup(baseline["stats"].seconds, s.seconds)
        line += f" \u00b7 {speedup:.2f}\u00d7 speculation off"
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
            row += f" {describe.seconds_speedup(baseline['stats'].seconds, s.seconds):.2f}× |"
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


# -- sidebar ------------------------------------------------------------------------------------


def sidebar_chats(chats: ChatStore, current: str | None, who: policy.Principal) -> None:
    """New chat, and the saved chats this user may see (most recent first), each to open or
    delete."""
    st.header("Chats")
    if st.button("New chat", icon=":material/add:", key="new-chat", use_container_width=True):
        st.query_params.clear()
        st.rerun()
    summaries = chats.list()
    if not summaries:
        st.caption("No saved chats yet.")
    for c in summaries:
        left, right = st.columns([5, 1])
        label = md(c.title)
        if left.button(label, key=f"chat-{c.id}", use_container_width=True,
                       type="primary" if c.id == current else "secondary"):
            st.query_params["chat"] = c.id
            st.rerun()
        if right.button("", icon=":material/close:", key=f"delete-chat-{c.id}",
                        help=f"Delete the chat “{label}”"):
            st.session_state[_CONFIRM_DELETE_CHAT] = c.id  # asked, not done: see below
        if st.session_state.get(_CONFIRM_DELETE_CHAT) == c.id:
            _confirm_delete_chat(chats, c, label, current, who)


def _confirmed(question: str, action: str, key: str, pending: str) -> bool:
    """The question, with `action` and Cancel under it (keys confirm-KEY and cancel-KEY); True
    once `action` is clicked. Either click ends the question (session_state[pending])."""
    st.warning(md(question), icon=":material/delete:")
    yes, no = st.columns(2)
    if no.button("Cancel", key=f"cancel-{key}", use_container_width=True):
        st.session_state.pop(pending, None)
        st.rerun()
    if not yes.button(action, key=f"confirm-{key}", type="primary", use_container_width=True):
        return False
    st.session_state.pop(pending, None)
    return True


# The chat whose deletion waits for its confirmation (one at a time, per browser session).
_CONFIRM_DELETE_CHAT = "confirm_delete_chat"


def _confirm_delete_chat(chats: ChatStore, c, label: str, current: str | None,
                         who: policy.Principal) -> None:
    """The question under a chat whose close button was clicked: a deleted chat cannot be
    brought back, and its button sits beside the one that opens it, so deleting takes a
    second, explicit click (as removing a document does)."""
    if not _confirmed(f"Delete the chat “{c.title}”? It cannot be brought back.", "Delete",
                      f"delete-chat-{c.id}", _CONFIRM_DELETE_CHAT):
        return
    try:
        chats.delete(c.id)  # refused for a chat this user may not see
    except ChatError as exc:
        st.error(md(public_message(exc, "Deleting the chat")))
        return
    job = ACTIVE.get(c.id)
    if job is not None:
        job.stop()
    audit.record("chat-delete", who.label, chat=c.id)
    if c.id == current:
        st.query_params.clear()
    st.rerun()


def choose_collection(who: policy.Principal) -> str:
    """The collection this session asks and shows: the shared documents, or the user's own
    (offered only when the owner granted them an upload quota)."""
    names = policy.collections(who)
    if len(names) == 1:
        return names[0]
    labels = {policy.SHARED: "Shared documents", who.name: "My documents"}
    return st.radio("Collection", names, format_func=labels.get, key="collection",
                    horizontal=True,
                    help="Questions search this collection. Your own documents are seen only "
                         "by you.")


def sidebar_documents(store, lock, upload_root: Path, who: policy.Principal,
                      collection: str = policy.SHARED) -> None:
    """Upload box (each new file stored by content and ingested) and the indexed documents;
    the upload box and the remove buttons only for whoever may manage this collection."""
    from ragspec.retrieval.ingest import SUPPORTED_SUFFIXES

    st.header("Documents")
    try:
        policy.require_manage(who, collection)
        manages = True
    except policy.Denied:
        manages = False
    if manages:
        # No `type=` filter: Streamlit would reject other files with an exception before this
        # script runs; checking here turns them into a visible message instead.
        files = st.file_uploader(
            "Add documents", accept_multiple_files=True, key="uploader",
            help="Supported: " + ", ".join(sorted(SUPPORTED_SUFFIXES))
                 + ". Ingested into the same index as `ragspec ingest`.",
        )
        done = st.session_state.setdefault("ingested_ids", set())
        for f in files or []:
            if f.file_id not in done:
                done.add(f.file_id)
                _ingest_one(f, store, lock, upload_root, who, collection)
    docs = store.documents()
    if not docs:
        st.caption("No documents yet.")
    for doc in docs:
        name = Path(doc.source).name
        left, right = st.columns([4, 1])
        left.markdown(f"<div>{rd.escape_text(name, inline=True)} <small>({doc.passages} "
                      f"passages)</small></div>", unsafe_allow_html=True)
        if manages and right.button("", icon=":material/close:", key=f"remove-{doc.doc_id}",
                                    help=f"Remove {md(name)} ({doc.doc_id[:8]}) from the index"):
            st.session_state[_CONFIRM_REMOVE] = doc.doc_id  # asked, not done: see below
        if manages and st.session_state.get(_CONFIRM_REMOVE) == doc.doc_id:
            _confirm_remove(store, lock, upload_root, who, collection, doc, name)


# The document whose removal waits for its confirmation (one at a time, per browser session).
_CONFIRM_REMOVE = "confirm_remove"


def _confirm_remove(store, lock, upload_root: Path, who: policy.Principal, collection: str, doc,
                    name: str) -> None:
    """The question under a document whose remove button was clicked: removing it deletes its passages
    from the index for everyone who searches this collection, and cannot be undone here (the
    file has to be uploaded again), so it takes a second, explicit click."""
    if not _confirmed(f"Remove {name} from the index? Its {doc.passages} passages are deleted "
                      f"for everyone; to get them back, upload the file again.", "Remove",
                      f"remove-{doc.doc_id}", _CONFIRM_REMOVE):
        return
    try:
        policy.require_manage(who, collection)  # checked again where it happens
        uploads.remove_document(store, doc.doc_id, doc.source, upload_root, lock=lock)
    except Exception as exc:  # a store error names the index folder: log it, say less
        st.error(md(f"Could not remove {name}: "
                    f"{public_message(exc, 'Removing the document')}"))
    else:
        audit.record("remove", who.label, collection=collection, doc_id=doc.doc_id, name=name)
        st.rerun()


def _ingest_one(f, store, lock, upload_root: Path, who: policy.Principal,
                collection: str) -> None:
    shown = uploads.safe_name(f.name)
    try:
        policy.require_manage(who, collection)
        if who.quotas.upload_bytes is not None:
            policy.check_upload(who, policy.folder_bytes(upload_root), f.size)
    except policy.Denied as exc:
        st.error(md(f"{shown}: {exc}"))
        return
    bar = st.progress(0.0, text=f"Ingesting {md(shown)}...")

    def progress(event) -> None:
        if event.kind == "passages" and event.passages_total:
            bar.progress(event.passages_done / event.passages_total,
                         text=f"{md(shown)}: {event.passages_done}/{event.passages_total} "
                              f"passages embedded")

    try:
        outcome = uploads.ingest_upload(upload_root, f.name, f.getvalue(), store, lock=lock,
                                        progress=progress)
    finally:
        bar.empty()
    message = outcome.message
    if outcome.failed and str(store.index_dir) in message:
        message = public_message(RuntimeError(message), "Adding the document")
    text = md(f"{outcome.name}: {message}")
    if outcome.failed:
        st.error(text)
    elif outcome.status == "unchanged":
        st.info(text)
    else:
        audit.record("upload", who.label, collection=collection, name=outcome.name,
                     status=outcome.status, bytes=f.size, passages=outcome.passages)
        st.success(text)


DEFAULT_ANSWER_TOKENS = 256
MAX_ANSWER_TOKENS = 1024


def model_names_for(who: policy.Principal, names: list[str], loaded: list[str]) -> list[str]:
    """The models this user may pick: all for an owner; the first and the loaded ones for a
    member (loading another is the owner's call; ragspec.accounts.policy)."""
    return [n for n in names if policy.may_use_model(who, n, names[0], loaded)]


def sidebar_settings(model_names: list[str], who: policy.Principal | None = None,
                     loaded: list[str] = ()) -> AnswerSettings:
    """The model and the speculation toggles in view; the engine's other settings under
    "Advanced", at the defaults `ragspec bench` measures with (DraftConfig, PipelineConfig)."""
    who = who or policy.Principal.single_user()
    draft, pipe = DraftConfig(), PipelineConfig()
    st.header("Settings")
    model = st.selectbox("Model", model_names_for(who, model_names, list(loaded)), key="model",
                         help="The models this server offers (set by whoever started it).")
    speculate = st.toggle("Speculation", value=draft.enabled, help="Copy drafts from the passages.",
                          key="speculate")
    side_by_side = st.toggle("Side by side (speculation off vs on)", value=False,
                             key="side_by_side")
    token_cap = min(MAX_ANSWER_TOKENS, who.quotas.answer_tokens or MAX_ANSWER_TOKENS)
    with st.expander("Advanced"):
        max_ngram = st.slider("Maximum n-gram size", 1, 8, draft.max_ngram, key="max_ngram")
        max_draft = st.slider("Maximum draft length", 1, 32, draft.max_draft, key="max_draft")
        adaptive = st.toggle("Adaptive drafting", value=draft.adaptive,
                             help="Choose each draft's length from acceptance so far and the "
                                  "measured cost of a forward.", key="adaptive")
        temperature = st.slider("Temperature (0 = greedy)", 0.0, 1.5, 0.0, step=0.1,
                                key="temperature")
        k = st.slider("Passages per question", 1, 8, pipe.k, key="k")
        search = st.selectbox(
            "Search", SEARCH_MODES, index=SEARCH_MODES.index(DEFAULT_SEARCH), key="search",
            help="dense: embedding similarity only; hybrid: fused with keyword (BM25) ranking, "
                 "which finds exact names, codes and numbers.")
        min_score = st.slider(
            "Relevance floor", 0.0, 0.9, DEFAULT_MIN_SCORE, step=0.05, key="min_score",
            help="When no passage is at least this similar to the question, the answer says "
                 "that your documents do not appear to contain it and shows the closest "
                 "passages, without asking the model. 0 turns this off.")
        max_new_tokens = st.number_input("Maximum answer tokens", 8, token_cap,
                                         min(DEFAULT_ANSWER_TOKENS, token_cap), step=8,
                                         key="max_new_tokens")
    return AnswerSettings(model=model, k=k, max_new_tokens=int(max_new_tokens), search=search,
                          min_score=float(min_score),
                          temperature=float(temperature), speculate=speculate,
                          side_by_side=side_by_side, max_ngram=max_ngram, max_draft=max_draft,
                          adaptive=adaptive)
