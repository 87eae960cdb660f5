"""The one owner of a loaded model: requests join and leave between steps (continuous batching).

Contract:
  * `Scheduler(gen)` starts one thread that alone calls the model. `submit(prompt_ids, config,
    sources)` returns a `Request` at once, or raises `QueueFull` when `max_waiting` requests
    already wait (the caller answers "busy", e.g. HTTP 429) and `SchedulerClosed` after
    `close()`. A request that the engine refuses (empty prompt, too long for the context) fails
    with its ValueError message as the request's `error`, like any other failure.
  * Between steps the thread admits waiting requests, oldest first, while fewer than
    `max_active` generate; a request whose `cancel()` was called (a client that went away) is
    dropped before the next step, so its slot and its cache are freed within one step.
  * Each step runs `ragspec.decoding.batch.batch_step`: every active sequence's rows in one
    forward, a newcomer's prompt in a forward of its own: whole by default (one newcomer per
    step), or in chunks of at most `prefill_chunk` rows per step. Where the native step reads
    the model's prompts (`shared`, native_step.reads_prompts) the prompt pieces go into the
    decoding rows' one native call instead: at most `prefill_chunk` rows a step (default
    batch.SHARED_CHUNK) while anything decodes, bit for bit what a whole prompt read gives.
  * A `Request` is read from any thread: iterate it for Spans (blocking), or poll `drain()`
    after the `listener` it was given is called (from the scheduler thread, after each event: an
    asyncio server wakes its coroutine with it). When it ends, `stats`, `token_ids`, `text`,
    `spans` and `error` are final and `done` is set.
  * A forward that raises fails the requests in that step (each gets the message) and the
    thread goes on with the others; the model is never left to a second thread.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator, Sequence

from ragspec.decoding import native_step, prefix_cache
from ragspec.decoding.batch import BatchSequence, StepTimes, batch_step
from ragspec.decoding.engine import Generator
from ragspec.decoding.ragged import packing_problem
from ragspec.decoding.types import GenerationConfig, GenerationResult, SourceRegion, Span

logger = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """Too many requests are waiting; try again later."""


class SchedulerClosed(RuntimeError):
    """The scheduler is shutting down and takes no more requests."""


class Request:
    """One generation submitted to the scheduler (see the module docstring)."""

    def __init__(self, prompt_ids: Sequence[int], config: GenerationConfig,
                 sources: Sequence[SourceRegion], listener: Callable[[], None] | None):
        self.prompt_ids = [int(t) for t in prompt_ids]
        self.config = config
        self.sources = tuple(sources)
        self.listener = listener
        self.spans: list[Span] = []
        self.token_ids: list[int] = []
        self.text = ""
        self.stats = None  # GenerationStats once admitted
        self.error: str | None = None
        # why it failed: "invalid" (the engine refused it), "cancelled", "unavailable"
        # (shutting down) or "internal" (a forward raised)
        self.error_kind: str | None = None
        self.cancelled = False
        self.done = threading.Event()
        self._events: collections.deque = collections.deque()
        self._ended = False  # the reader has seen the end
        self._cond = threading.Condition()
        self.sequence: BatchSequence | None = None

    def cancel(self) -> None:
        """Stop generating; the scheduler frees the slot before its next step."""
        self.cancelled = True

    def stop(self) -> None:
        """End at the next step and keep what was written (stop_reason "stopped")."""
        if self.sequence is not None:
            self.sequence.stop()
        else:
            self.cancelled = True

    # -- the scheduler's side ---------------------------------------------------------------------

    def _push(self, spans: list[Span], final: bool = False) -> None:
        with self._cond:
            self._events.extend(spans)
            if final:
                self._events.append(None)
            self._cond.notify_all()
        if final:
            self.done.set()
        if self.listener is not None:
            try:
                self.listener()
            except RuntimeError:  # the listener's event loop has closed: nobody is reading
                self.cancelled = True

    def _finish(self, error: str | None = None, kind: str = "internal") -> None:
        seq = self.sequence
        if seq is not None:
            self.stats = seq.stats
            self.token_ids = list(seq.stream.token_ids)
            self.text = seq.stream.text
        self.error = error
        self.error_kind = kind if error is not None else None
        self._push([], final=True)

    # -- the reader's side ------------------------------------------------------------------------

    def drain(self) -> tuple[list[Span], bool]:
        """The spans that arrived since the last call, and whether the request has ended."""
        out = []
        with self._cond:
            while self._events:
                item = self._events.popleft()
                if item is None:
                    self._ended = True
                else:
                    out.append(item)
            ended = self._ended
        self.spans.extend(out)
        return out, ended

    def __iter__(self) -> Iterator[Span]:
        """The spans not yet read, as they come; ends with the request (at once when it has
        ended and everything was read)."""
        while True:
            with self._cond:
                while not self._events and not self._ended:
                    self._cond.wait()
            spans, ended = self.drain()
            yield from spans
            if ended:
                return

    def result(self) -> GenerationResult:
        """Wait for the end; raises RuntimeError with the message when the request failed."""
        for _ in self:
            pass
        if self.error is not None:
            raise RuntimeError(self.error)
        return GenerationResult(prompt_token_ids=list(self.prompt_ids),
                                token_ids=list(self.token_ids), text=self.text,
                                spans=list(self.spans), stats=self.stats)


class Scheduler:
    """See the module docstring."""

    def __init__(self, gen: Generator, *, max_active: int = 16, max_waiting: int = 64,
                 prefill_chunk: int | None = None, name: str = "ragspec-scheduler",
                 idle_exit_s: float | None = None):
        """idle_exit_s: the thread ends after this long with nothing to do (and starts again
        with the next request), so nothing keeps an unused model alive; None: it stays."""
        if max_active < 1:
            raise ValueError(f"max_active must be >= 1, got {max_active}")
        if max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {max_waiting}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 (or None: each prompt whole), "
                             f"got {prefill_chunk}")
        self.gen = gen
        self.max_active, self.max_waiting = max_active, max_waiting
        self.packing_problem = packing_problem(gen.model)
        # a model whose cache cannot be rolled back is prefilled in one piece, as the engine does
        self.prefill_chunk = prefill_chunk if gen.speculation_off_reason is None else None
        # prompt pieces ride in the decoding rows' forward where a piece reads as the whole
        self.shared = self.packing_problem is None and native_step.reads_prompts(gen.model)
        # every prompt read in one forward, as the engine reads it, or read where pieces read as
        # the whole (prefixes reused): an identical prompt kept whole may be recalled
        # (prefix_cache.PrefixCache.recall)
        self.reads_whole = ((self.prefill_chunk is None and not self.shared)
                            or prefix_cache.problem(gen.model) is None)
        if self.packing_problem:
            logger.info("one forward per request per step: %s", self.packing_problem)
        self._waiting: collections.deque[Request] = collections.deque()
        self._active: list[Request] = []
        self._cond = threading.Condition()
        self._closed = False
        self.steps = 0
        self.times = StepTimes()  # where the steps' time went (ragspec.decoding.batch)
        self.name, self.idle_exit_s = name, idle_exit_s
        self._thread: threading.Thread | None = None
        with self._cond:
            self._ensure_thread()

    def _ensure_thread(self) -> None:
        """Start the owner thread unless it runs (the caller holds the lock)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()

    @property
    def packed(self) -> bool:
        return self.packing_problem is None

    def submit(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None, *,
               sources: Sequence[SourceRegion] = (),
               listener: Callable[[], None] | None = None) -> Request:
        request = Request(prompt_ids, config or GenerationConfig(), sources, listener)
        with self._cond:
            if self._closed:
                raise SchedulerClosed("the server is shutting down")
            if len(self._waiting) >= self.max_waiting and len(self._active) >= self.max_active:
                raise QueueFull(f"{len(self._waiting)} requests are already waiting; "
                                f"try again shortly")
            self._waiting.append(request)
            self._ensure_thread()
            self._cond.notify_all()
        return request

    def load(self) -> dict:
        """How busy it is: active and waiting requests, the limits, where the steps' time
        went since it started ("steps": ragspec.decoding.batch.StepTimes) and the prompt
        cache's counters ("prompt_cache": Generator.prompt_cache_stats)."""
        with self._cond:
            return {"active": len(self._active), "waiting": len(self._waiting),
                    "max_active": self.max_active, "max_waiting": self.max_waiting,
                    "steps": self.times.as_dict(),
                    "prompt_cache": self.gen.prompt_cache_stats()}

    def close(self, timeout: float = 10.0) -> None:
        """Take no more requests, stop the running ones at their next step (what was written is
        kept) and fail the waiting ones; wait up to `timeout` seconds for the thread."""
        with self._cond:
            self._closed = True
            waiting, self._waiting = list(self._waiting), collections.deque()
            for request in self._active:
                request.stop()
            self._cond.notify_all()
        for request in waiting:
            request._finish("the server is shutting down", "unavailable")
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    # -- the owner thread ---------------------------------------------------------------------

    def _admit(self) -> bool:
        """Move waiting requests in; False when the thread should end (idle, or closed)."""
        with self._cond:
            while not self._active and not self._waiting and not self._closed:
                if not self._cond.wait(self.idle_exit_s) and not self._active \
                        and not self._waiting:
                    self._thread = None  # idle: a later submit starts a new thread
                    return False
            if self._closed and not self._active and not self._waiting:
                return False
            admitted = []
            while self._waiting and len(self._active) + len(admitted) < self.max_active:
                admitted.append(self._waiting.popleft())
        for request in admitted:
            if request.cancelled:
                request._finish("cancelled", "cancelled")
                continue
            try:
                request.sequence = BatchSequence(self.gen, request.prompt_ids, request.config,
                                                 request.sources, recall=self.reads_whole)
            except ValueError as exc:
                request._finish(str(exc), "invalid")
                continue
            request.stats = request.sequence.stats
            with self._cond:
                self._active.append(request)
        return True

    def _retire(self, request: Request, error: str | None = None, kind: str = "internal") -> None:
        with self._cond:
            if request in self._active:
                self._active.remove(request)
        if request.sequence is not None:
            request.sequence.teach()
        request._finish(error, kind)
        request.sequence = None  # its cache goes with it

    def _loop(self) -> None:
        while True:
            if not self._admit():
                return
            with self._cond:
                active = list(self._active)
            for request in active:
                if request.cancelled:
                    self._retire(request, "cancelled", "cancelled")
            active = [r for r in active if not r.cancelled]
            if not active:
                continue
            self._step(active)

    def _step(self, active: list[Request]) -> None:
        by_sequence = {r.sequence: r for r in active}
        try:
            outcomes = batch_step(self.gen, list(by_sequence), self.prefill_chunk,
                                  packed=self.packed, shared=self.shared, times=self.times)
        except Exception as exc:  # noqa: BLE001 - one bad step must not end the server
            logger.exception("a generation step failed")
            for request in active:
                self._retire(request, f"generation failed ({exc.__class__.__name__}: {exc})")
            return
        self.steps += 1
        ended = False
        for seq, outcome in outcomes.items():
            request = by_sequence[seq]
            if outcome.done:
                request._push(outcome.spans)
                self._retire(request)
                ended = True
            elif outcome.spans:
                request._push(outcome.spans)
        if ended:
            self.gen.review_cost()  # as the engine does after a generation
            if not self._active and not self._waiting:
                self.gen.recalibrate_if_due()  # between generations, never while one runs


_shared_lock = threading.Lock()


def scheduler_for(gen: Generator, **kwargs) -> Scheduler:
    """The scheduler every in-process client of `gen` shares (the chat's answers, the CLI),
    created on first use; its thread ends after a minute idle, so a generator its owner drops
    can be freed. kwargs configure it when it is created."""
    with _shared_lock:
        scheduler = getattr(gen, "_scheduler", None)
        if scheduler is None or scheduler._closed:
            scheduler = Scheduler(gen, idle_exit_s=60.0, **kwargs)
            gen._scheduler = scheduler
        return scheduler
