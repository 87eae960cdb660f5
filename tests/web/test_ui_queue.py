"""One answer at a time, a visible place in the queue, and Stop.

The queue on its own (order, places, stopping waiting and running turns, a failing turn), then
the page with two AppTest sessions (two browser users of one server): the second user sees how
many answers are ahead of theirs, updated while they wait; Stop ends an answer at its next step
and keeps what was written, also across a reload; a side-by-side answer is one turn.

The tiny model writes a token in about a millisecond; to give a person (here: the test) time
to press Stop, the engine's forward is slowed down by a fixed sleep. Nothing else is changed.
"""

from __future__ import annotations

import threading
import time

import pytest
from ui_support import (
    new_session,
    saved_chat,
    settle,
    texts,
    tiny_page,
    wait_for,
)

from ragspec.web.answer_queue import Turn, TurnQueue, shared_queue
from ragspec.web.answering import ACTIVE


class Recorder(Turn):
    def __init__(self, log: list, name: str, gate: threading.Event | None = None,
                 fail: bool = False) -> None:
        super().__init__()
        self.log, self.name, self.gate, self.fail = log, name, gate, fail

    def run(self) -> None:
        self.log.append(("start", self.name))
        if self.gate is not None:
            while not self.gate.wait(0.01):
                if self.stop_requested:
                    self.log.append(("stopped", self.name))
                    break
        self.log.append(("end", self.name))
        if self.fail:
            raise RuntimeError("boom")

    def cancelled(self) -> None:
        self.log.append(("cancelled", self.name))


def test_turns_run_one_at_a_time_in_order_and_report_their_place():
    queue, log, gate = TurnQueue("test"), [], threading.Event()
    first = queue.submit(Recorder(log, "a", gate))
    wait_for(lambda: first.state == "running", what="the first turn to start")
    b, c = queue.submit(Recorder(log, "b")), queue.submit(Recorder(log, "c"))
    assert [queue.ahead(t) for t in (first, b, c)] == [0, 1, 2]
    assert log == [("start", "a")]  # nothing else runs while the first holds the model
    gate.set()
    assert c.wait(10)
    assert log == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b"),
                   ("start", "c"), ("end", "c")]
    assert len(queue) == 0 and queue.ahead(c) == 0


def test_stopping_a_waiting_turn_moves_the_others_up_and_never_runs_it():
    queue, log, gate = TurnQueue("test"), [], threading.Event()
    first = queue.submit(Recorder(log, "a", gate))
    wait_for(lambda: first.state == "running", what="the first turn to start")
    b, c = queue.submit(Recorder(log, "b")), queue.submit(Recorder(log, "c"))
    b.stop()
    assert b.finished and ("cancelled", "b") in log
    assert queue.ahead(c) == 1
    gate.set()
    assert c.wait(10)
    assert ("start", "b") not in log


def test_stopping_a_running_turn_calls_its_hook_and_frees_the_queue():
    queue, log, gate = TurnQueue("test"), [], threading.Event()
    hooked = threading.Event()
    first = queue.submit(Recorder(log, "a", gate))
    first.on_stop(hooked.set)
    wait_for(lambda: first.state == "running", what="the first turn to start")
    after = queue.submit(Recorder(log, "b"))
    first.stop()
    assert hooked.is_set()
    assert after.wait(10)
    assert log[:3] == [("start", "a"), ("stopped", "a"), ("end", "a")]


def test_shutdown_stops_the_running_turn_and_cancels_the_waiting_ones():
    queue, log, gate = TurnQueue("test"), [], threading.Event()
    first = queue.submit(Recorder(log, "a", gate))
    wait_for(lambda: first.state == "running", what="the first turn to start")
    queue.submit(Recorder(log, "b"))
    queue.shutdown(timeout=10)
    assert first.finished and len(queue) == 0
    assert log == [("start", "a"), ("cancelled", "b"), ("stopped", "a"), ("end", "a")]


def test_a_failing_turn_does_not_stop_the_worker():
    queue, log = TurnQueue("test"), []
    queue.submit(Recorder(log, "a", fail=True))
    after = queue.submit(Recorder(log, "b"))
    assert after.wait(10)
    assert ("end", "b") in log


# -- the page, two sessions -------------------------------------------------------------------

def slowed(forward):
    def slow_forward(*args, **kwargs):
        time.sleep(0.01)
        return forward(*args, **kwargs)

    return slow_forward


@pytest.fixture
def two_users(tmp_path, monkeypatch):
    from ragspec.decoding import batch, engine
    from ragspec.web import answer_queue

    monkeypatch.setattr(engine, "forward", slowed(engine.forward))
    monkeypatch.setattr(batch, "packed_forward", slowed(batch.packed_forward))
    # waiting for a turn: one answer at a time here (tests/web/test_ui_batched.py: several)
    monkeypatch.setattr(answer_queue, "_shared", TurnQueue("test", workers=1))
    a = tiny_page(tmp_path, monkeypatch)
    b = new_session()
    for at in (a, b):
        at.toggle(key="speculate").set_value(False)  # one forward per token: a steady pace
        at.slider(key="k").set_value(1)
    a.number_input(key="max_new_tokens").set_value(1024)
    b.number_input(key="max_new_tokens").set_value(16)
    yield a, b
    for job in list(ACTIVE._jobs.values()):
        job.stop()
    settle()


def job_of(at):
    return ACTIVE.get(at.query_params.get("chat"))


def test_second_user_sees_their_place_and_stop_keeps_what_was_written(two_users):
    a, b = two_users
    gate, log = threading.Event(), []
    holder = shared_queue().submit(Recorder(log, "someone else", gate))  # an answer in progress
    wait_for(lambda: holder.state == "running", what="the other answer to start")

    a.chat_input[0].set_value("On which port does the metrics endpoint listen?").run()
    assert any("Waiting for 1 answer ahead" in t for t in texts(a.info)), texts(a.info)
    assert a.chat_input[0].proto.disabled  # one question at a time per chat
    b.chat_input[0].set_value("How long are job logs kept?").run()
    assert any("Waiting for 2 answers ahead" in t for t in texts(b.info)), texts(b.info)

    gate.set()  # the other answer ends; A's starts; B's place updates on its next refresh
    job_a = job_of(a)
    wait_for(lambda: sum(len(r["spans"]) for r in job_a.snapshot()["runs"]) >= 5,
             what="A's first tokens")
    b.run()
    assert any("Waiting for 1 answer ahead" in t for t in texts(b.info)), texts(b.info)
    a.run()
    assert any(m.value.startswith('<div class="rs-answer">') for m in a.markdown)

    a.button(key="stop-answer").click().run()  # Stop, while the answer is being written
    assert job_a.wait(30)
    settle(a, b)
    saved = saved_chat(a)
    answer = saved["messages"][-1]
    assert answer["status"] == "stopped"
    run = answer["runs"][0]
    assert run["stats"]["stop_reason"] == "stopped"
    assert 5 <= len(run["token_ids"]) < 1024
    assert run["text"] == "".join(s["text"] for s in run["spans"]) and run["text"]
    shown = [m.value for m in a.markdown if m.value.startswith('<div class="rs-answer">')]
    assert len(shown) == 1 and any("Stopped" in t for t in texts(a.caption))
    # B's answer ran after A's, to its own limit
    b_answer = saved_chat(b)["messages"][-1]
    assert b_answer["status"] == "done" and len(b_answer["runs"][0]["token_ids"]) == 16


def test_a_side_by_side_answer_is_one_turn(two_users, monkeypatch):
    a, b = two_users
    from ragspec.web.answering import AnswerJob

    order, run = [], AnswerJob.run

    def recorded(self):
        order.append(("start", self.chat_id))
        try:
            run(self)
        finally:
            order.append(("end", self.chat_id))

    monkeypatch.setattr(AnswerJob, "run", recorded)
    a.toggle(key="side_by_side").set_value(True)
    a.number_input(key="max_new_tokens").set_value(64)
    a.chat_input[0].set_value("On which port does the metrics endpoint listen?").run()
    job_a = job_of(a)
    wait_for(lambda: job_a.phase == "generating", what="A to start generating")
    b.chat_input[0].set_value("How long are job logs kept?").run()
    assert any("Waiting for 1 answer ahead" in t for t in texts(b.info)), texts(b.info)
    settle(a, b)
    ca, cb = a.query_params["chat"], b.query_params["chat"]
    assert order == [("start", ca), ("end", ca), ("start", cb), ("end", cb)]
    runs = [m for m in a.markdown if m.value.startswith('<div class="rs-answer">')]
    assert len(runs) == 2
    assert any("Token-identical" in t for t in texts(a.success))


def test_stop_while_waiting_ends_the_answer_before_it_starts(two_users):
    a, _ = two_users
    gate = threading.Event()
    holder = shared_queue().submit(Recorder([], "someone else", gate))
    wait_for(lambda: holder.state == "running", what="the other answer to start")
    try:
        a.chat_input[0].set_value("On which port does the metrics endpoint listen?").run()
        a.button(key="stop-answer").click().run()
        settle(a)
    finally:
        gate.set()
    assert any("Stopped before it started" in t for t in texts(a.caption))
    assert not a.chat_input[0].proto.disabled
