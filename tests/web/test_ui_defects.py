"""The chat's server side under failure and contention: no server path reaches the browser or
the chat file, a failed model load keeps the working model, two tabs asking in one chat leave
no orphaned answer, saving a streaming answer costs what the answer costs (not the chat) under
a lock of its own, a busy chat is a ChatBusy, and the answer worker stops cleanly when the
interpreter exits."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from filelock import FileLock

from ragspec.retrieval.errors import IndexCorruptError
from ragspec.retrieval.records import Hit, Passage
from ragspec.search import Retrieval
from ragspec.web import answering
from ragspec.web import chats as ch
from ragspec.web.answer_queue import TurnQueue
from ragspec.web.model_choice import ModelChoice, ModelRegistry

REPO = Path(__file__).resolve().parents[2]
PASSAGE = Passage(id="d-1", doc_id="d", source="notes.md", page=None, start=0,
                  text="The metrics endpoint listens on port 7432.")


def found(store, question, *args, **kwargs):
    return Retrieval(question, question, [Hit(0.9, PASSAGE)], 0.9, 0.0, False)


def run_job(chats, chat_id, registry, monkeypatch, retrieve=found):
    monkeypatch.setattr(answering, "retrieve", retrieve)
    job = answering.ask(chats, chat_id, "Which port?", answering.AnswerSettings(model="m"),
                        store=object(), models=registry, queue=TurnQueue("test"))
    assert job.wait(30)
    return chats.load(chat_id)["messages"][-1]


# -- server paths --------------------------------------------------------------------------------

def test_a_failure_mid_answer_shows_a_short_message_and_logs_the_detail(tmp_path, monkeypatch,
                                                                         caplog):
    secret = tmp_path / "srv" / "models" / "m"

    def loader(spec):
        raise RuntimeError(f"cannot map {secret}/model.safetensors")

    chats = ch.ChatStore(tmp_path / "chats")
    chat = chats.create()
    with caplog.at_level(logging.ERROR):
        answer = run_job(chats, chat["id"], ModelRegistry([ModelChoice("m", str(secret))],
                                                          loader=loader), monkeypatch)
    assert answer["status"] == "failed"
    assert answer["error"] == "Generation failed; the server's log has the details."
    assert str(tmp_path) not in json.dumps(chats.load(chat["id"]))
    assert str(secret) in caplog.text  # the detail is in the log


def test_a_store_error_does_not_show_the_index_folder(tmp_path, monkeypatch):
    index = tmp_path / "home" / "index"

    def damaged(*args, **kwargs):
        raise IndexCorruptError(f"The index in {index} is damaged: bad header.")

    chats = ch.ChatStore(tmp_path / "chats")
    chat = chats.create()
    answer = run_job(chats, chat["id"], ModelRegistry([ModelChoice("m", "x")]), monkeypatch,
                     retrieve=damaged)
    assert answer["status"] == "failed" and "damaged" in answer["error"]
    assert str(tmp_path) not in answer["error"]


def test_chat_errors_name_the_chat_not_the_folder(tmp_path):
    chats = ch.ChatStore(tmp_path / "secret-chats")
    with pytest.raises(ch.ChatError) as missing:
        chats.load("0123456789ab")
    with pytest.raises(ch.ChatError) as gone:
        chats.delete("0123456789ab")
    for exc in (missing.value, gone.value):
        assert "0123456789ab" in str(exc) and "secret-chats" not in str(exc)


# -- models --------------------------------------------------------------------------------------

def test_a_failed_model_load_keeps_the_working_model():
    def loader(spec):
        if spec == "/m/broken":
            raise OSError("no such file")
        return ("loaded", spec)

    reg = ModelRegistry([ModelChoice("good", "/m/good"), ModelChoice("bad", "/m/broken")],
                        max_loaded=1, loader=loader)
    reg.get("good")
    with pytest.raises(OSError):
        reg.get("bad")
    assert reg.loaded_names() == ["good"]
    assert reg.get("good") == ("loaded", "/m/good")


# -- two tabs ------------------------------------------------------------------------------------

def test_two_tabs_asking_in_one_chat_leave_no_orphaned_answer(tmp_path, monkeypatch):
    """Tab 1 has checked that the chat is idle and is about to append its question when tab 2
    asks in the same chat: one of them is refused, and every answer in the chat has a job."""
    chats = ch.ChatStore(tmp_path / "chats")
    chat_id = chats.create()["id"]
    gate = threading.Event()
    update = ch.ChatStore.update
    calls = []

    def slow_first_update(self, cid, change):
        calls.append(cid)
        if len(calls) == 1:
            gate.wait(5)  # tab 1 is here when tab 2 asks
        return update(self, cid, change)

    monkeypatch.setattr(ch.ChatStore, "update", slow_first_update)
    hold = threading.Event()

    class Hold(TurnQueue):  # keep the jobs queued: what matters is what was appended
        def submit(self, turn):
            turn._queue = self
            turn.state = "waiting"
            return turn

    queue, settings = Hold("test"), answering.AnswerSettings(model="m")
    registry = ModelRegistry([ModelChoice("m", "x")])
    outcomes = []

    def tab(name):
        try:
            answering.ask(chats, chat_id, f"question from {name}", settings, store=object(),
                          models=registry, queue=queue)
            outcomes.append((name, "asked"))
        except ValueError as exc:
            outcomes.append((name, str(exc)))

    one = threading.Thread(target=tab, args=("tab 1",))
    one.start()
    time.sleep(0.2)
    tab("tab 2")
    gate.set()
    one.join(10)
    hold.set()
    try:
        assert sorted(o[1] == "asked" for o in outcomes) == [False, True], outcomes
        messages = chats.load(chat_id)["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"], messages
        job = answering.ACTIVE.get(chat_id)
        assert job is not None and job.message_index == 1
    finally:
        for job in list(answering.ACTIVE._jobs.values()):
            answering.ACTIVE.discard(job)


# -- saving --------------------------------------------------------------------------------------

def test_saving_a_streaming_answer_writes_the_answer_not_the_whole_chat(tmp_path, monkeypatch):
    """A chat with a long history, an answer of 60 spans saved after every span: the chat file
    is rewritten a fixed number of times (queued, generating, done), not once per save."""
    from ragspec.decoding.types import GenerationStats, Span

    chats = ch.ChatStore(tmp_path / "chats")
    chat_id = chats.create()["id"]
    history = [ch.user_message("x" * 2000), {"role": "assistant", "content": "y" * 2000,
                                             "status": "done", "runs": [], "passages": []}] * 50
    chats.update(chat_id, lambda c: c["messages"].extend(history))
    writes = []
    write = ch.ChatStore._write
    monkeypatch.setattr(ch.ChatStore, "_write",
                        lambda self, chat: (writes.append(chat["id"]), write(self, chat)))
    seen_partial = []

    class Stream:
        stats = GenerationStats(prompt_tokens=5, new_tokens=60)
        spans: list = []  # the final spans, as a GenerationStream keeps them

        def __iter__(self):
            for i in range(60):
                if i == 30:  # mid-answer, a reader sees the answer so far
                    seen_partial.append(chats.load(chat_id)["messages"][-1])
                span = Span(f"t{i} ", [i], False)
                self.spans.append(span)
                yield span

        def stop(self):
            pass

    class FakePipeline:
        # a generator that streams through the pipeline (as a server's does), so the answer is
        # this test's 60 spans rather than a scheduler's
        generator = SimpleNamespace(remote=True)

        def __init__(self, *args):
            pass

        def answer_config(self, config):
            return config

        def prepare_retrieved(self, retrieval):
            return SimpleNamespace(passages=[PASSAGE], scores=[0.9], standalone_question=None)

        def stream(self, prepared, config):
            return Stream()

    monkeypatch.setattr(answering, "pipeline_for", FakePipeline)
    monkeypatch.setattr(answering, "retrieve", found)
    registry = ModelRegistry([ModelChoice("m", "x")],
                             loader=lambda spec: (SimpleNamespace(speculation_note=None), None))
    job = answering.AnswerJob(chats=chats, chat_id=chat_id, message_index=0, question="q",
                              history=[], settings=answering.AnswerSettings(model="m"),
                              store=object(), models=registry, save_every=0.0)
    chats.update(chat_id, lambda c: c["messages"].extend(
        [ch.user_message("q"), {"role": "assistant", "status": "waiting", "runs": []}]))
    job.message_index = len(chats.load(chat_id)["messages"]) - 1
    writes.clear()
    answering.ACTIVE.start(job, TurnQueue("test"))
    assert job.wait(30)
    assert len(writes) <= 3, f"the whole chat was rewritten {len(writes)} times"
    assert seen_partial and seen_partial[0]["status"] == "generating"
    assert seen_partial[0]["runs"][0]["text"].startswith("t0 t1 ")
    final = chats.load(chat_id)["messages"][-1]
    assert final["status"] == "done" and final["runs"][0]["text"].count(" ") == 60
    assert not (tmp_path / "chats" / ch.PARTIAL / f"{chat_id}.json").exists()


def test_one_busy_chat_does_not_hold_up_saving_another(tmp_path):
    chats = ch.ChatStore(tmp_path, lock_timeout=0.5)
    busy, free = chats.create(), chats.create()
    with FileLock(str(tmp_path / ch.LOCKS / f"{busy['id']}.lock")):
        chats.update(free["id"], lambda c: c.update(title="saved"))  # does not wait
        with pytest.raises(ch.ChatBusy, match="busy"):
            chats.update(busy["id"], lambda c: c.update(title="never"))
    assert chats.load(free["id"])["title"] == "saved"
    assert chats.load(busy["id"])["title"] == ""


# -- shutdown ------------------------------------------------------------------------------------

SHUTDOWN_SCRIPT = r"""
import logging, sys, threading, time
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from types import SimpleNamespace
from ragspec.retrieval.records import Hit, Passage
from ragspec.search import Retrieval
from ragspec.web import answering, chats as ch
from ragspec.web.answer_queue import shared_queue
from ragspec.web.model_choice import ModelChoice, ModelRegistry

passage = Passage(id="d-1", doc_id="d", source="notes.md", page=None, start=0, text="port 7432")
answering.retrieve = lambda s, q, *a, **k: Retrieval(q, q, [Hit(0.9, passage)], 0.9, 0.0, False)

def slow_load(spec):
    # A model load ignores Stop for a while, then, like transformers importing
    # concurrent.futures for the first time, registers an interpreter-exit hook.
    time.sleep(1.0)
    threading._register_atexit(lambda: None)
    raise SystemExit("not reached in this test")

chats = ch.ChatStore(sys.argv[1])
registry = ModelRegistry([ModelChoice("m", "x")], loader=slow_load)
ids = []
for _ in range(2):
    chat = chats.create()
    ids.append(chat["id"])
    answering.ask(chats, chat["id"], "Which port?", answering.AnswerSettings(model="m"),
                  store=object(), models=registry, queue=shared_queue())
while answering.ACTIVE.get(ids[0]).phase != "loading":
    time.sleep(0.01)
print(" ".join(ids))
"""


def test_the_answer_worker_stops_cleanly_when_the_interpreter_exits(tmp_path):
    """The page's script ends (here: the process's main thread) while one answer is loading its
    model and another waits: both are saved as stopped, and nothing fails in a dying
    interpreter (before: "can't register atexit after shutdown", logged as a failed answer)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SHUTDOWN_SCRIPT, str(tmp_path / "chats")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "can't register atexit" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    chats = ch.ChatStore(tmp_path / "chats")
    statuses = [chats.load(i)["messages"][-1]["status"] for i in proc.stdout.split()]
    assert statuses == ["stopped", "stopped"], statuses


def test_deleting_a_chat_someone_else_deleted_shows_a_short_message(tmp_path, monkeypatch):
    """The sidebar lists a chat; another process deletes its file just before this session's
    delete does: a short message, no traceback, no chats folder on the page."""
    from ui_support import element_strings, fast_page, new_session

    fast_page(monkeypatch, tmp_path / "home")
    chat = ch.ChatStore(tmp_path / "home" / "chats").create("A question")
    delete = ch.ChatStore.delete

    def raced(self, chat_id):
        self.path(chat_id).unlink()  # the other process wins
        return delete(self, chat_id)

    at = new_session()
    monkeypatch.setattr(ch.ChatStore, "delete", raced)
    at.button(key=f"delete-chat-{chat['id']}").click().run()
    at.button(key=f"confirm-delete-chat-{chat['id']}").click().run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] and "no chat" in at.error[0].value
    assert not [t for _, t in element_strings(at) if str(tmp_path) in t]
