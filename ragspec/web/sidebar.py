"""The chat page's sidebar: the user's chats, the collection and its documents, the settings.

Contract: the same escaping rule as ragspec.web.parts (every user-controlled string through
`ragspec.web.page_html.escape_text`, via `parts.md` for Markdown); a destructive click (a chat's
or a document's close button) asks first and acts only on its confirmation; every document
change re-checks the caller's right to manage the collection where it happens and is written
to the audit log. The page (ragspec/web/page.py) calls `sidebar_chats`, `choose_collection`,
`sidebar_documents` and `sidebar_settings` in that order.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from ragspec.accounts import audit, policy
from ragspec.decoding.types import DraftConfig
from ragspec.pipeline import PipelineConfig
from ragspec.retrieval.records import SEARCH_MODES
from ragspec.search import DEFAULT_MIN_SCORE, DEFAULT_SEARCH
from ragspec.web import page_html as rd
from ragspec.web import uploads
from ragspec.web.answering import ACTIVE, AnswerSettings
from ragspec.web.chats import ChatError, ChatStore
from ragspec.web.parts import md
from ragspec.web.public_errors import public_message


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
