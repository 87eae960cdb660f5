"""One answer at a time on the shared model: a first-come, first-served queue of turns.

Contract:
  * `TurnQueue.submit(turn)` puts a turn at the back; one worker thread per queue runs the
    turns in order, one at a time (`Turn.run`). The worker, not the browser session, runs the
    answer: a page that reruns, reloads or closes does not end it, and the queue slot is
    released in `finally` however the turn ends.
  * `ahead(turn)`: how many turns will run before it (the running one included); 0 once it
    runs. Sessions poll it to show "waiting for 2 answers ahead".
  * `turn.stop()` from any thread: a waiting turn leaves the queue at once (its `cancelled`
    hook runs in the caller's thread, and the turns behind it move up); a running turn is
    asked to end at its next step (`stop_requested`, and the hook set with `on_stop`, e.g. a
    GenerationStream's stop).
  * A turn that raises is logged and finished; the worker goes on with the next.
  * `shutdown(timeout)` closes the queue: no turn starts after it (a turn submitted later is
    cancelled at once), every waiting turn is cancelled, the running one is asked to stop, and
    the worker thread is joined, so a server that is stopped mid-answer saves what was written
    instead of dying inside a forward. The shared queue registers it to run as soon as the
    interpreter starts shutting down (when the main thread ends, before atexit handlers), so
    the worker is not left starting work in an interpreter that is being torn down.
"""

from __future__ import annotations

import atexit
import logging
import secrets
import threading

logger = logging.getLogger(__name__)


class Turn:
    """A piece of work that needs the shared model. Subclasses implement `run` and may
    override `cancelled` (called instead of `run` when stopped while waiting)."""

    def __init__(self) -> None:
        self.id = secrets.token_hex(6)
        self.state = "new"  # new -> waiting -> running -> finished
        self._queue: TurnQueue | None = None
        self._stop = threading.Event()
        self._finished = threading.Event()
        self._stop_hook = None
        self._hook_lock = threading.Lock()

    def run(self) -> None:
        raise NotImplementedError

    def cancelled(self) -> None:
        """Stopped before it ran; nothing to undo by default."""

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the turn has finished (True) or `timeout` seconds passed (False)."""
        return self._finished.wait(timeout)

    def on_stop(self, hook) -> None:
        """Call `hook()` when a stop is requested (at once if it already was); None clears it."""
        with self._hook_lock:
            self._stop_hook = hook
            already = self._stop.is_set()
        if hook is not None and already:
            hook()

    def stop(self) -> None:
        if self._queue is not None and self._queue._drop_waiting(self):
            return
        with self._hook_lock:
            self._stop.set()
            hook = self._stop_hook
        if hook is not None:
            hook()


class TurnQueue:
    """See the module docstring."""

    def __init__(self, name: str = "ragspec-answers") -> None:
        self.name = name
        self._turns: list[Turn] = []  # waiting turns in order, the running one first
        self._cond = threading.Condition()
        self._worker: threading.Thread | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, turn: Turn) -> Turn:
        if turn.state != "new":
            raise ValueError("a turn can be submitted once")
        with self._cond:
            if self._closed:
                turn._stop.set()
                turn.state = "finished"
        if turn.state == "finished":  # the server is stopping: never started, saved as stopped
            try:
                turn.cancelled()
            finally:
                turn._finished.set()
            return turn
        with self._cond:
            turn._queue = self
            turn.state = "waiting"
            self._turns.append(turn)
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._worker.start()
            self._cond.notify_all()
        return turn

    def ahead(self, turn: Turn) -> int:
        with self._cond:
            try:
                return self._turns.index(turn)
            except ValueError:
                return 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._turns)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Close the queue, stop every turn (waiting ones first, so none starts) and wait for
        the running one and the worker thread."""
        with self._cond:
            self._closed = True
            turns = list(self._turns)
            self._cond.notify_all()
        for turn in reversed(turns):
            turn.stop()
        if turns:
            turns[0].wait(timeout)
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout)

    def _drop_waiting(self, turn: Turn) -> bool:
        with self._cond:
            if turn.state != "waiting" or turn not in self._turns:
                return False
            self._turns.remove(turn)
            turn._stop.set()
            turn.state = "finished"
            self._cond.notify_all()
        try:
            turn.cancelled()
        finally:
            turn._finished.set()
        return True

    def _next(self) -> Turn | None:
        with self._cond:
            while not self._turns and not self._closed:
                self._cond.wait()
            if self._closed and (not self._turns or self._turns[0].state == "waiting"):
                return None  # shutting down: start nothing new
            turn = self._turns[0]
            turn.state = "running"
            return turn

    def _work(self) -> None:
        while True:
            turn = self._next()
            if turn is None:
                return
            try:
                turn.run()
            except Exception:  # one failed turn must not stop the worker every session shares
                logger.exception("an answer failed in the queue worker")
            finally:
                with self._cond:
                    self._turns.remove(turn)
                    turn.state = "finished"
                    self._cond.notify_all()
                turn._finished.set()


_shared: TurnQueue | None = None
_shared_lock = threading.Lock()


def shared_queue() -> TurnQueue:
    """The process's queue for the shared model (every browser session of `ragspec ui`)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = TurnQueue()
            _at_shutdown(_shared.shutdown)
        return _shared


def _at_shutdown(func) -> None:
    # threading's own exit hook runs when the main thread ends, before non-daemon threads are
    # joined and before atexit handlers (concurrent.futures uses it for the same reason); after
    # that point libraries may no longer register exit hooks, so a turn still starting work
    # would fail. Older or other Pythons without it fall back to atexit.
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError
        register(func)
    except RuntimeError:
        atexit.register(func)
