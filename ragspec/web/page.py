"""The ragspec chat page (Streamlit): `ragspec ui`, or `streamlit run ragspec/web/page.py`.

Page order as in Streamlit's examples: resources, sidebar (chats, documents, settings), session
state, history replay, the answer being written, then the chat input. The logic lives in
ragspec.web.answering (the queued answer), ragspec.web.chats (saved chats), ragspec.web.uploads, ragspec.web.model_choice (the
offered models), ragspec.web.parts and ragspec.web.sidebar (what each piece shows); this file lays out the page.

The open chat is in the address (`?chat=<id>`), so reloading the page reopens it. Answers run
in the process's answer queue, not in the page: a rerun, a reload or a closed tab does not end
one, and it is saved into its chat as it grows.

With accounts, nothing runs before the sign-in gate (ragspec.web.signin), and every action is
checked for the signed-in principal where it happens (ragspec.accounts.policy): the chat store
only sees that user's chats (a chat id from someone else's address finds nothing), only those
who may manage a collection get its upload box and remove buttons, and `answering.ask` applies
the model rule and the quotas.

Environment: RAGSPEC_HOME (data: index/, uploads/, chats/, users/, accounts.json, sessions.json,
audit.jsonl), RAGSPEC_UI_INDEX (index dir override), RAGSPEC_UI_MODELS (the offered models, set
by `ragspec ui --model`), RAGSPEC_UI_MAX_LOADED (most models kept loaded), RAGSPEC_AUTH (the
sign-in mode, set by `ragspec ui`), RAGSPEC_MODEL_CACHE (converted models), RAGSPEC_EMBEDDER
(embedding model).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from pathlib import Path

if __package__ in (None, ""):  # streamlit puts ragspec/web/, not the checkout, on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import streamlit as st

from ragspec import paths
from ragspec.accounts import policy
from ragspec.web import answering, sidebar, signin, source_panel
from ragspec.web import model_choice as ui_models
from ragspec.web import page_html as rd
from ragspec.web import parts as parts
from ragspec.web.answer_queue import shared_queue
from ragspec.web.chats import ChatError, ChatStore, answer_record
from ragspec.web.public_errors import public_message

# -- resources shared by every browser session of this process ---------------------------------


@st.cache_resource(max_entries=4)
def get_store(index_dir: str, commit: str | None, embedder_name: str | None):
    # Keyed by the commit on disk, so an ingest by the CLI (or another app process) shows up on
    # the next page run; opening reads the index files, no embedding.
    from ragspec.loading import cached_embedder
    from ragspec.retrieval.backends import open_index

    return open_index(index_dir, cached_embedder(embedder_name))


def current_store(index_dir: str):
    from ragspec.loading import EMBEDDER_ENV
    from ragspec.retrieval.backends import current_commit

    with st.spinner("Loading the embedding model..."):
        return get_store(index_dir, current_commit(index_dir),
                         os.environ.get(EMBEDDER_ENV) or None)


def warm_embedder() -> None:
    """Load the embedder the page's store will use (its model loads on first use)."""
    from ragspec.loading import EMBEDDER_ENV, cached_embedder

    cached_embedder(os.environ.get(EMBEDDER_ENV) or None).model  # noqa: B018 - loads it


@st.cache_resource
def get_index_lock(index_dir: str) -> threading.Lock:
    # Uploads, removals and searches share one in-memory store per index: one at a time.
    return threading.Lock()


def open_chat(chats: ChatStore) -> dict | None:
    """The chat named in the address, if it exists; a stale or malformed id opens a new one."""
    chat_id = st.query_params.get("chat")
    if not chat_id:
        return None
    try:
        return chats.load(chat_id)
    except ChatError:
        st.query_params.clear()
        st.warning("That chat no longer exists; this is a new one.")
        return None


# -- page ---------------------------------------------------------------------------------------

st.set_page_config(page_title="ragspec", page_icon=":material/description:", layout="wide")
st.markdown(rd.STYLE, unsafe_allow_html=True)
who = signin.gate()  # the sign-in form ends the run here for a visitor who has not signed in
chats = ChatStore(paths.home() / "chats", user=who.name,
                  can_see=functools.partial(policy.may_see_chat, who))
choices = ui_models.from_env()
models = ui_models.registry_for(choices, ui_models.max_loaded_from_env(choices))
ui_models.warm_default(models, warm_embedder)  # once per process: the first question waits less

chat = open_chat(chats)
chat_id = chat["id"] if chat else None

with st.sidebar:
    signin.account_box(who)
    sidebar.sidebar_chats(chats, chat_id, who)
    collection = sidebar.choose_collection(who)

index_path, upload_root = policy.collection_dirs(collection, os.environ.get("RAGSPEC_UI_INDEX"))
index_dir = str(index_path)
index_lock = get_index_lock(index_dir)
store = None
try:
    store = current_store(index_dir)
except Exception as exc:  # a damaged index, a missing embedder: say so, keep the page alive
    st.error(parts.md(public_message(exc, "Opening the document index")))

with st.sidebar:
    if store is not None:
        sidebar.sidebar_documents(store, index_lock, upload_root, who, collection)
    settings = sidebar.sidebar_settings(models.names, who, models.loaded_names())

job = answering.ACTIVE.get(chat_id)

st.title("ragspec")
st.markdown(rd.legend_html(), unsafe_allow_html=True)
if store is not None and store.passage_count() == 0:
    st.info("No documents yet. Upload files in the sidebar (PDF, text, Markdown, HTML, Word), "
            "or run `ragspec ingest PATH...` in a terminal, then ask a question.")

# A source opened from an answer (a link in the address) sits beside the chat.
opened = source_panel.requested() if chat is not None and store is not None else None
chat_column, source_column = st.columns([1, 1]) if opened else (st.container(), None)

with chat_column:
    for i, message in enumerate(chat["messages"] if chat else []):
        if job is not None and i == job.message_index:
            continue  # the answer being written: shown live below
        with st.chat_message(message["role"]):
            if message["role"] == "user":
                parts.show_question(message.get("content", ""), message.get("standalone"))
            else:
                parts.show_answer(answer_record(message), href=functools.partial(
                    source_panel.href, chat_id, i))

    if job is not None:
        with st.chat_message("assistant"):
            parts.live_answer(chat_id)

if opened:
    message_index, passage_index, page_number = opened
    messages = chat["messages"]
    with source_column:
        record = (answer_record(messages[message_index])
                  if 0 <= message_index < len(messages)
                  and messages[message_index]["role"] == "assistant" else None)
        source_panel.show(store, chat_id, record, passage=passage_index,
                          message=message_index, page=page_number)

if question := st.chat_input("Ask a question about your documents", disabled=job is not None):
    if not question.strip():
        st.warning("The question is empty: type a question about your documents.")
    elif store is None:
        st.error("The index could not be opened (see the message above).")
    else:
        try:
            answering.check_request(who, settings, models)  # before a new chat is made for it
            if chat is None:
                chat = chats.create()
                st.query_params["chat"] = chat["id"]
            answering.ask(chats, chat["id"], question, settings, store=store, models=models,
                          queue=shared_queue(), index_lock=index_lock, principal=who)
        except (ValueError, OSError) as exc:  # a refusal, a chat error, a chat not saved
            st.error(parts.md(public_message(exc, "Asking")))
        else:
            st.rerun()
