"""A real `ragspec serve` application for tests: uvicorn on a free loopback port, in a thread of
the test process, over a tiny random model (tests/conftest.py) and an index embedded with the
HashEmbedder (tests/support/fakes.py)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import uvicorn
from servers import free_port

from ragspec.decoding.engine import Generator
from ragspec.decoding.scheduler import Scheduler
from ragspec.pipeline import PipelineConfig
from ragspec.serve.answers import Service
from ragspec.serve.app import create_app

DOC = ("The metrics endpoint of the daemon listens on port 7432 and serves metrics only. "
       "Error E204 means that the queue is full and the request should be sent again later.\n\n"
       "Backups run every night at two and keep fourteen days of history on the spare disk.\n")


@dataclass
class Running:
    url: str  # http://127.0.0.1:PORT
    service: Service
    asgi: object  # the app inside its limits; .app is the FastAPI application
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.service.scheduler.close()


def tiny_store(tmp_path):
    from fakes import HashEmbedder

    from ragspec.retrieval.faiss.store import PassageStore
    from ragspec.retrieval.ingest import ingest_paths

    doc = tmp_path / "daemon.txt"
    doc.write_text(DOC)
    store = PassageStore.open(tmp_path / "index", HashEmbedder())
    assert ingest_paths([doc], store).ok
    return store


def tiny_server_inputs(tmp_path, tokenizer) -> tuple:
    """What the server's measurements (ragspec/bench: load_test, soak) take on a small scale:
    a tiny model folder, a corpus of DOC and two questions about it; (model, corpus,
    questions)."""
    from conftest import make_tiny_model, save_model_folder

    model = save_model_folder(make_tiny_model(len(tokenizer)), tokenizer, tmp_path / "tiny")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "daemon.txt").write_text(DOC)
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question": q, "kind": "copy"}) + "\n" for q in
                                 ("Which port does the metrics endpoint use?",
                                  "When do backups run?")))
    return model, corpus, questions


def start(model, tokenizer, store=None, *, max_active=4, max_waiting=8, prefill_chunk=None,
          max_new_tokens=48, min_score=0.0, k=2, max_body_bytes=1 << 16, eos=2,
          **app_kwargs) -> Running:
    gen = Generator(model, tokenizer, eos_token_ids=[eos] if isinstance(eos, int) else list(eos))
    scheduler = Scheduler(gen, max_active=max_active, max_waiting=max_waiting,
                          prefill_chunk=prefill_chunk)
    stores = {"ragspec": store} if store is not None else {}
    service = Service(scheduler, model_id="tiny", stores=stores,
                      pipeline_config=PipelineConfig(k=k, max_new_tokens=max_new_tokens,
                                                     min_score=min_score),
                      embedder=store.embedder if store is not None else None)
    app = create_app(service, max_body_bytes=max_body_bytes, **app_kwargs)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return Running(f"http://127.0.0.1:{port}", service, app, server, thread)
