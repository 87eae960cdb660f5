"""Several answers at once in the chat: the shared queue runs as many turns as the scheduler
batches, and two browser users are generated together (one forward per step for both), each
answer the same as when it runs alone."""

from __future__ import annotations

import threading

from test_ui_queue import Recorder, job_of, slowed
from ui_support import new_session, saved_chat, settle, tiny_page, wait_for

from ragspec.web.answer_queue import TurnQueue


def test_a_queue_with_two_workers_runs_two_turns_and_the_third_waits_for_one():
    queue, log, gate = TurnQueue("test", workers=2), [], threading.Event()
    a, b = queue.submit(Recorder(log, "a", gate)), queue.submit(Recorder(log, "b", gate))
    wait_for(lambda: a.state == b.state == "running", what="two turns to run")
    c = queue.submit(Recorder(log, "c"))
    assert [queue.ahead(t) for t in (a, b, c)] == [0, 0, 1]
    assert ("start", "c") not in log
    gate.set()
    assert c.wait(10) and a.wait(10) and b.wait(10)


def test_two_users_are_answered_together_and_as_when_alone(tmp_path, monkeypatch):
    from ragspec.decoding import batch
    from ragspec.web import answer_queue

    monkeypatch.setattr(batch, "packed_forward", slowed(batch.packed_forward))
    monkeypatch.setattr(answer_queue, "_shared", TurnQueue("test", workers=4))
    a = tiny_page(tmp_path, monkeypatch)
    b = new_session()
    for at in (a, b):
        at.slider(key="k").set_value(1)
        at.number_input(key="max_new_tokens").set_value(120)
    questions = ("On which port does the metrics endpoint listen?", "How long are job logs kept?")
    a.chat_input[0].set_value(questions[0]).run()
    b.chat_input[0].set_value(questions[1]).run()
    job_a, job_b = job_of(a), job_of(b)
    wait_for(lambda: job_a.phase == job_b.phase == "generating", what="both to generate")
    scheduler = None

    def both_in_one_step():
        nonlocal scheduler
        _, gen = job_a.models.get("tiny")
        scheduler = getattr(gen, "_scheduler", None)  # made by the first answer's first run
        return scheduler is not None and scheduler.load()["active"] == 2

    wait_for(both_in_one_step, what="both answers in the scheduler at once")
    settle(a, b)
    steps = scheduler.steps
    together = [saved_chat(at)["messages"][-1]["runs"][0] for at in (a, b)]
    assert all(len(run["token_ids"]) == 120 for run in together)
    # fewer steps than the two answers' forwards one after the other (prefills included)
    assert steps < sum(run["stats"]["forward_passes"] + 1 for run in together)
    # each question again, alone: the same tokens
    for question, run in zip(questions, together, strict=True):
        alone = new_session()
        alone.slider(key="k").set_value(1)
        alone.number_input(key="max_new_tokens").set_value(120)
        alone.chat_input[0].set_value(question).run()
        settle(alone)
        assert saved_chat(alone)["messages"][-1]["runs"][0]["token_ids"] == run["token_ids"]
