"""The ragspec chat page (Streamlit): `ragspec ui`, or `streamlit run app/ui.py`.

Page order as in Streamlit's examples: resources, sidebar (documents, settings), session state,
history replay, then the chat input. Logic lives in app.pipeline and app.render; this file only
lays out the page. Environment: RAGSPEC_HOME (data), RAGSPEC_UI_INDEX (index dir override),
RAGSPEC_UI_MODEL (model preselected in the sidebar), RAGSPEC_MODEL_CACHE (converted models).
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # `streamlit run app/ui.py` puts app/, not the repo, on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import streamlit as st

from app import paths
from app import render as rd
from app.loading import load_generator
from app.pipeline import NoDocumentsError, Pipeline, PipelineConfig
from decoding.types import DraftConfig, GenerationConfig, SamplingConfig

# -- resources shared by every browser session of this process ---------------------------------


@st.cache_resource(show_spinner="Loading the embedding model...")
def get_embedder():
    from retrieval.embeddings import Embedder

    return Embedder()


@st.cache_resource(show_spinner="Loading the language model (the first start converts it, ~30 s)...")
def get_generator(spec: str):
    return load_generator(spec or None)


@st.cache_resource(max_entries=4)
def get_store(index_dir: str, commit: str | None):
    # Keyed by the commit on disk, so an ingest by the CLI (or another app process) shows up on
    # the next page run; opening reads the index files, no embedding.
    from retrieval.store import PassageStore

    return PassageStore.open(index_dir, get_embedder())


def current_store(index_dir: str):
    from retrieval import persist

    return get_store(index_dir, persist.current_commit(Path(index_dir)))


@st.cache_resource
def get_locks() -> dict[str, threading.Lock]:
    # One model for all sessions: generations run one at a time. Index writes and searches
    # share the in-memory store, so they are serialised too (separately, so an upload does not
    # wait for an answer).
    return {"generate": threading.Lock(), "index": threading.Lock()}


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def upload_dir() -> Path:
    return paths.home() / "uploads"


def ingest_uploads(files, store, locks) -> None:
    """Save new uploads under $RAGSPEC_HOME/uploads and ingest them, with progress."""
    from retrieval.errors import RetrievalError
    from retrieval.ingest import SUPPORTED_SUFFIXES, default_max_file_bytes, ingest_paths

    done = st.session_state.setdefault("ingested_ids", set())
    limit = default_max_file_bytes()
    for f in files:
        if f.file_id in done:
            continue
        done.add(f.file_id)
        name = Path(f.name).name
        suffix = Path(name).suffix.lower()
        if suffix not in SUPPORTED_SUFFIXES:
            st.error(f"{name}: unsupported type {suffix or '(none)'}; supported are "
                     f"{', '.join(sorted(SUPPORTED_SUFFIXES))}")
            continue
        if f.size > limit:
            st.error(f"{name}: {_size(f.size)} is over the upload limit of {_size(limit)} "
                     f"(RAGSPEC_MAX_FILE_MB raises it)")
            continue
        target = upload_dir() / name
        target.parent.mkdir(parents=True, exist_ok=True)
        previous = target.read_bytes() if target.is_file() else None
        target.write_bytes(f.getvalue())
        bar = st.progress(0.0, text=f"Ingesting {name}...")

        def progress(event, bar=bar, name=name):
            if event.kind == "passages" and event.passages_total:
                bar.progress(event.passages_done / event.passages_total,
                             text=f"{name}: {event.passages_done}/{event.passages_total} "
                                  f"passages embedded")

        try:
            with locks["index"]:
                report = ingest_paths([target], store, progress=progress)
        except (RetrievalError, OSError, ValueError) as exc:
            report, error = None, str(exc)
        else:
            error = report.failed[0][1] if report.failed else None
        bar.empty()
        if error is not None:
            # Put back what was there: the index still holds the previous version's passages.
            if previous is None:
                target.unlink(missing_ok=True)
            else:
                target.write_bytes(previous)
            st.error(f"{name}: {error}")
        elif report.unchanged:
            st.info(f"{name}: already indexed, unchanged")
        else:
            st.success(f"{name}: {'updated' if report.updated else 'added'} "
                       f"({report.passages_added} passages)")


# -- page ---------------------------------------------------------------------------------------

st.set_page_config(page_title="ragspec", page_icon="📄", layout="wide")
st.markdown(rd.STYLE, unsafe_allow_html=True)
locks = get_locks()
index_dir = str(paths.index_dir(os.environ.get("RAGSPEC_UI_INDEX")))

store = None
try:
    store = current_store(index_dir)
except Exception as exc:  # a damaged index, a missing embedder: say so, keep the page alive
    st.error(f"Cannot open the index in {index_dir}: {exc}")

with st.sidebar:
    st.header("Documents")
    if store is not None:
        from retrieval.ingest import SUPPORTED_SUFFIXES

        # No `type=` filter: Streamlit would reject other files with an exception before this
        # script runs; checking here turns them into a visible message instead.
        uploads = st.file_uploader(
            "Add documents", accept_multiple_files=True, key="uploader",
            help="Supported: " + ", ".join(sorted(SUPPORTED_SUFFIXES))
                 + ". Ingested into the same index as `ragspec ingest`.",
        )
        if uploads:
            ingest_uploads(uploads, store, locks)
        docs = store.documents()
        if not docs:
            st.caption("No documents yet.")
        for doc in docs:
            left, right = st.columns([4, 1])
            left.markdown(f"{rd.escape_text(Path(doc.source).name)} "
                          f"<small>({doc.passages} passages)</small>", unsafe_allow_html=True)
            if right.button("✕", key=f"remove-{doc.doc_id}", help=f"Remove {doc.source}"):
                from retrieval.errors import RetrievalError

                try:
                    with locks["index"]:
                        store.remove(doc.doc_id)
                except RetrievalError as exc:
                    st.error(f"Could not remove {Path(doc.source).name}: {exc}")
                else:
                    source = Path(doc.source)
                    if source.parent == upload_dir().resolve():
                        source.unlink(missing_ok=True)  # our copy of an upload; not user files
                    st.rerun()

    st.header("Settings")
    speculate = st.toggle("Speculation", value=True, help="Copy drafts from the passages.", key="speculate")
    side_by_side = st.toggle("Side by side (speculation off vs on)", value=False, key="side_by_side")
    max_ngram = st.slider("Maximum n-gram size", 1, 8, 4, key="max_ngram")
    max_draft = st.slider("Maximum draft length", 1, 32, 16, key="max_draft")
    adaptive = st.toggle("Adaptive drafting", value=True,
                         help="Choose each draft's length from acceptance so far and the "
                              "measured cost of a forward.", key="adaptive")
    temperature = st.slider("Temperature (0 = greedy)", 0.0, 1.5, 0.0, step=0.1, key="temperature")
    k = st.slider("Passages per question", 1, 8, 4, key="k")
    max_new_tokens = st.number_input("Maximum answer tokens", 8, 1024, 256, step=8,
                                     key="max_new_tokens")
    model_spec = st.text_input("Model (folder or Hugging Face id; empty = bundled SmolLM2)",
                               value=os.environ.get("RAGSPEC_UI_MODEL", ""), key="model")

if "messages" not in st.session_state:
    st.session_state.messages = []


def show_runs(record: dict) -> None:
    """A finished answer: its run(s), stats, identity mark, provenance and passages."""
    passages = record["passages"]
    runs = record["runs"]
    cols = st.columns(len(runs)) if len(runs) > 1 else [st.container()]
    for col, run in zip(cols, runs, strict=True):
        with col:
            if len(runs) > 1:
                st.subheader(run["label"])
            st.markdown(rd.spans_html(run["spans"], passages), unsafe_allow_html=True)
            show_stats(run, runs[0] if len(runs) > 1 and run is runs[-1] else None)
    if len(runs) > 1:
        ok, message = rd.identical_verdict(runs[0]["token_ids"], runs[1]["token_ids"],
                                           record["greedy"])
        {True: st.success, False: st.error, None: st.info}[ok](message)
    show_sources(runs[-1]["spans"], passages, record.get("scores", []))


def show_stats(run: dict, baseline: dict | None) -> None:
    s = run["stats"]
    row = ("| tokens/s | seconds | forward passes | drafted | accepted |"
           + (" speedup |" if baseline else "") + "\n|---|---|---|---|---|"
           + ("---|" if baseline else "") + "\n"
           + f"| {s.tokens_per_s:.1f} | {s.seconds:.2f} | {s.forward_passes} | "
             f"{s.drafted_tokens} | {s.accepted_tokens} |")
    if baseline:
        row += f" {rd.seconds_speedup(baseline['stats'].seconds, s.seconds):.2f}× |"
    st.markdown(row)
    if s.drafted_tokens:
        with st.expander("Speculation stats"):
            st.markdown(f"Acceptance rate **{100 * s.accept_rate:.0f}%** · mean accepted draft "
                        f"length **{s.mean_accepted_length:.2f}** tokens · "
                        f"{s.new_tokens} tokens in {s.forward_passes + 1} forwards")
            steps = s.accepted_per_step
            if steps:
                st.caption("Accepted draft tokens per decoding step")
                st.bar_chart({"accepted tokens": steps}, height=160)


def show_sources(spans, passages, scores) -> None:
    drafted = [sp for sp in spans if sp.drafted]
    if drafted:
        with st.expander(f"Where the highlighted spans came from ({len(drafted)})"):
            lines = [f"<li><mark class=\"rs-draft\" style=\"background:{rd.DRAFT_COLOUR}\">"
                     f"{rd.escape_text(sp.text)}</mark> ← {rd.escape_text(rd.span_title(sp, passages))}"
                     f"</li>" for sp in drafted]
            st.markdown(f"<div><ul>{''.join(lines)}</ul></div>", unsafe_allow_html=True)
    copied = rd.copied_ranges(spans)
    with st.expander(f"Passages used ({len(passages)})"):
        for i, p in enumerate(passages):
            score = f" · score {scores[i]:.2f}" if i < len(scores) else ""
            st.markdown(f"<div><b>{rd.escape_text(rd.passage_label(i, p))}</b>{score} · "
                        f"char {p.start}</div>", unsafe_allow_html=True)
            st.markdown(rd.passage_html(p.text, copied.get(i, [])), unsafe_allow_html=True)


st.title("ragspec")
st.markdown(rd.legend_html(), unsafe_allow_html=True)
if store is not None and store.passage_count() == 0:
    st.info("No documents yet. Upload files in the sidebar (PDF, text, Markdown, HTML, Word), "
            "or run `ragspec ingest PATH...` in a terminal, then ask a question.")

for message in st.session_state.messages:
    with st.chat_message(message["role"]):
        if message["role"] == "user":
            st.markdown(f"<div>{rd.escape_text(message['content'])}</div>",
                        unsafe_allow_html=True)
        elif "error" in message:
            st.error(message["error"])
        else:
            show_runs(message["record"])


def generation_configs() -> list[tuple[str, GenerationConfig]]:
    config = GenerationConfig(
        max_new_tokens=int(max_new_tokens),
        sampling=SamplingConfig(temperature=float(temperature)),
        draft=DraftConfig(enabled=speculate, max_ngram=max_ngram, min_ngram=1,
                          max_draft=max_draft, adaptive=adaptive),
    )
    if not side_by_side:
        return [("Speculation on" if speculate else "Speculation off", config)]
    on = replace(config, draft=replace(config.draft, enabled=True))
    off = replace(config, draft=replace(config.draft, enabled=False))
    return [("Speculation off", off), ("Speculation on", on)]


def answer(question: str) -> dict:
    """Run the question (streaming into the page); returns the record kept in history."""
    from decoding.model import ModelNotFound

    if store is None:
        raise ValueError("the index could not be opened (see the message above)")
    try:
        _, generator = get_generator(model_spec.strip())
    except ModelNotFound as exc:
        raise ValueError(f"Cannot load the model: {exc}") from exc
    pipeline = Pipeline(store, generator,
                        PipelineConfig(k=k, max_new_tokens=int(max_new_tokens)))
    history = [{"role": m["role"], "content": m["content"], "standalone": m.get("standalone")}
               for m in st.session_state.messages[:-1]]  # the last one is this question
    with locks["index"]:
        prepared = pipeline.prepare(question, history)
    configs = generation_configs()
    runs = []
    cols = st.columns(len(configs)) if len(configs) > 1 else [st.container()]
    with locks["generate"]:
        for col, (label, config) in zip(cols, configs, strict=True):
            with col:
                if len(configs) > 1:
                    st.subheader(label)
                placeholder = st.empty()
                placeholder.caption("Waiting for the first token...")
                stream = pipeline.stream(prepared, config)
                spans = []
                for span in stream:
                    spans.append(span)
                    placeholder.markdown(rd.spans_html(spans, prepared.passages),
                                         unsafe_allow_html=True)
                placeholder.empty()
                result = stream.result()
                runs.append({"label": label, "spans": result.spans, "stats": result.stats,
                             "token_ids": result.token_ids, "text": result.text})
    return {"runs": runs, "passages": prepared.passages, "scores": prepared.scores,
            "greedy": configs[-1][1].sampling.greedy, "standalone": prepared.standalone_question}


if question := st.chat_input("Ask a question about your documents"):
    if not question.strip():
        st.warning("The question is empty: type a question about your documents.")
    else:
        st.session_state.messages.append({"role": "user", "content": question})
        with st.chat_message("user"):
            st.markdown(f"<div>{rd.escape_text(question)}</div>", unsafe_allow_html=True)
        with st.chat_message("assistant"):
            live = st.empty()
            try:
                with live.container():
                    record = answer(question)
            except (NoDocumentsError, ValueError) as exc:
                live.empty()
                st.error(str(exc))
                st.session_state.messages.append({"role": "assistant", "content": "",
                                                  "error": str(exc)})
            except Exception as exc:  # model failure mid-generation: report, keep serving
                live.empty()
                message = f"Generation failed ({exc.__class__.__name__}: {exc})"
                st.error(message)
                st.session_state.messages.append({"role": "assistant", "content": "",
                                                  "error": message})
            else:
                live.empty()
                st.session_state.messages[-1]["standalone"] = record["standalone"]
                st.session_state.messages.append(
                    {"role": "assistant", "content": record["runs"][-1]["text"],
                     "record": record})
                show_runs(record)
