"""One chat answer as a turn of the shared queue, saved into its chat as it grows.

Contract:
  * `AnswerJob` answers one question of one chat with the settings the user chose: it
    retrieves passages (ragspec.search); when none is relevant enough (the relevance floor) it
    ends there, "refused", with the closest passages and no model loaded or called; otherwise
    it loads the named model (through ModelRegistry: offered names only), builds the prompt
    (ragspec.pipeline), then streams every run (one, or speculation off and on side by side: one
    turn either way) through the model's shared scheduler (ragspec.decoding.scheduler), so
    answers of several users are generated together.
  * Its assistant message in the chat file (ragspec.web.chats) follows it: status "waiting" when
    submitted, then "generating", and finally "done", "stopped" (Stop pressed, or the server
    shutting down: what was written is kept, the stats say stop_reason "stopped") or
    "failed" (with a short message; the details, which may hold server paths, go to the
    server's log only: ragspec.web.public_errors). Those few changes rewrite the chat file;
    while it streams, the answer alone is saved at most every `save_every` seconds
    (ChatStore.save_partial), so the cost of saving does not grow with the chat. A chat that is
    busy elsewhere skips a periodic save; the final save happens before the job leaves
    `ACTIVE`, so a page that no longer finds the job reads the finished answer from disk.
  * `ask` checks, appends and queues in one step per chat: two tabs asking in one chat at
    once get one answer and one "still answering" refusal, never an orphaned message. It also
    applies the asker's limits (ragspec.accounts.policy): answer length, answers queued at
    once, and which models a member may use.
  * `snapshot()` is what a page shows while the job lives: phase, place in the queue, the
    passages and each run's spans so far. Safe to call from any thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, replace

from ragspec.accounts import policy
from ragspec.decoding.scheduler import scheduler_for
from ragspec.decoding.types import DraftConfig, GenerationConfig, SamplingConfig
from ragspec.models.load import ModelNotFound
from ragspec.pipeline import PipelineConfig
from ragspec.remote import pipeline_for
from ragspec.search import DEFAULT_MIN_SCORE, DEFAULT_SEARCH, NOT_IN_DOCUMENTS, retrieve
from ragspec.web import chats as ch
from ragspec.web.answer_queue import Turn, TurnQueue
from ragspec.web.model_choice import ModelNotOffered, ModelRegistry
from ragspec.web.public_errors import public_message

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AnswerSettings:
    """What the user chose in the sidebar. model: an offered model's name. search and
    min_score: the search mode and the relevance floor (see ragspec.search)."""

    model: str
    k: int = 4
    max_new_tokens: int = 256
    search: str = DEFAULT_SEARCH
    min_score: float = DEFAULT_MIN_SCORE
    temperature: float = 0.0
    speculate: bool = True
    side_by_side: bool = False
    max_ngram: int = 4
    max_draft: int = 16
    adaptive: bool = True

    def __post_init__(self) -> None:
        self.pipeline_config()  # raises what is wrong
        self.configs()

    def pipeline_config(self) -> PipelineConfig:
        return PipelineConfig(k=self.k, max_new_tokens=self.max_new_tokens, search=self.search,
                              min_score=self.min_score)

    def configs(self) -> list[tuple[str, GenerationConfig]]:
        """(label, config) per run: one run, or speculation off then on."""
        config = GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            sampling=SamplingConfig(temperature=self.temperature),
            draft=DraftConfig(enabled=self.speculate, max_ngram=self.max_ngram, min_ngram=1,
                              max_draft=self.max_draft, adaptive=self.adaptive),
        )
        if not self.side_by_side:
            return [("Speculation on" if self.speculate else "Speculation off", config)]
        on = replace(config, draft=replace(config.draft, enabled=True))
        off = replace(config, draft=replace(config.draft, enabled=False))
        return [("Speculation off", off), ("Speculation on", on)]


class AnswerJob(Turn):
    """See the module docstring. Create, then `ACTIVE.start(job, queue)`."""

    def __init__(self, *, chats: ch.ChatStore, chat_id: str, message_index: int, question: str,
                 history: list[dict], settings: AnswerSettings, store, models: ModelRegistry,
                 index_lock=None, save_every: float = 1.0, user: str | None = None) -> None:
        super().__init__()
        self.user = user  # who asked (None: the single-user chat), for the queue quota
        self.chats, self.chat_id, self.message_index = chats, chat_id, message_index
        self.question, self.history, self.settings = question, history, settings
        self.store, self.models = store, models
        self.index_lock = index_lock or threading.Lock()
        self.save_every = save_every
        self.phase = "waiting"
        self.error: str | None = None
        self.passages: list = []
        self.scores: list = []
        self.standalone: str | None = None
        self.note: str | None = None  # e.g. why this model generates without drafts
        self.refused = False  # no passage relevant enough: answered with NOT_IN_DOCUMENTS
        self.absent_words: list[str] = []  # the refusal's words the documents never use
        self.runs: list[dict] = []  # {"label", "spans": [Span], "stats": GenerationStats|None}
        self._lock = threading.Lock()
        self._saved_at = 0.0

    # -- what the page shows ------------------------------------------------------------------

    def snapshot(self) -> dict:
        ahead = self._queue.ahead(self) if self._queue is not None else 0
        name = self.settings.model
        loaded, bundled = self.models.is_loaded(name), self.models.is_bundled(name)
        with self._lock:
            runs = [{"label": r["label"], "spans": list(r["spans"])} for r in self.runs]
            return {"phase": self.phase, "ahead": ahead, "runs": runs, "error": self.error,
                    "passages": list(self.passages), "model": name, "model_loaded": loaded,
                    "loading_s": self.models.loading_seconds(name), "bundled": bundled,
                    "configs": len(self.settings.configs()), "note": self.note,
                    "refused": self.refused}

    # -- the work -------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._answer()
        except ModelNotFound as exc:
            logger.error("cannot load model %s: %s", self.settings.model, exc)
            self._fail(f"Cannot load the model {self.settings.model}; the server's log says why.")
        except Exception as exc:  # a model failing mid-answer: report it, keep serving others
            if self.stop_requested and self._queue is not None and self._queue.closed:
                # The server is shutting down: whatever failed was cut off by that (a library
                # refusing new work in a dying interpreter), not by the answer.
                logger.info("answer in chat %s stopped by the server's shutdown", self.chat_id)
                self.phase = "stopped"
            else:
                self._fail(public_message(exc, "Generation"))
        finally:
            self._finish()

    def cancelled(self) -> None:
        self.phase = "stopped"
        self._finish()

    def _answer(self) -> None:
        pipe_config = self.settings.pipeline_config()
        self._set_phase("retrieving")
        with self.index_lock:
            retrieval = retrieve(self.store, self.question, self.history, k=pipe_config.k,
                                 search=pipe_config.search, min_score=pipe_config.min_score)
        self.standalone = retrieval.standalone_question
        if retrieval.refused:
            with self._lock:
                self.passages = [h.passage for h in retrieval.hits]
                self.scores = [h.score for h in retrieval.hits]
                self.absent_words = list(retrieval.absent_words)
                self.refused = True
            self._set_phase("done")
            return
        self._set_phase("loading")
        try:
            loaded, generator = self.models.get(self.settings.model)
        except ModelNotOffered as exc:
            raise policy.Denied(str(exc)) from exc
        self.note = loaded.speculation_note
        if self.stop_requested:
            self._set_phase("stopped")
            return
        pipeline = pipeline_for(self.store, generator, pipe_config)
        prepared = pipeline.prepare_retrieved(retrieval)
        with self._lock:
            self.passages, self.scores = list(prepared.passages), list(prepared.scores)
            self.standalone = prepared.standalone_question
        self._set_phase("generating")
        for label, config in self.settings.configs():
            if self.stop_requested:
                break
            self._stream(pipeline, prepared, label, config)
        self._set_phase("stopped" if self.stop_requested else "done")
        # between generations: re-measure the cost curve if live steps said it is off (a
        # generator on a server has no curve here)
        recalibrate = getattr(generator, "recalibrate_if_due", None)
        if recalibrate is not None:
            recalibrate()

    def _stream(self, pipeline, prepared, label: str, config: GenerationConfig) -> None:
        if getattr(pipeline.generator, "remote", False):  # a server generates (ragspec.remote)
            stream = pipeline.stream(prepared, config)
        else:  # through the model's shared scheduler: answers running at once are batched
            stream = scheduler_for(pipeline.generator).submit(
                prepared.prompt_ids, pipeline.answer_config(config), sources=prepared.sources)
        run = {"label": label, "spans": [], "stats": None}
        with self._lock:
            self.runs.append(run)
        self.on_stop(stream.stop)
        try:
            for span in stream:
                with self._lock:
                    run["spans"].append(span)
                if time.monotonic() - self._saved_at >= self.save_every:
                    self._save_partial()
        finally:
            self.on_stop(None)
            run["stats"] = stream.stats
        error = getattr(stream, "error", None)
        if error is not None and stream.error_kind != "cancelled":
            raise (ValueError if stream.error_kind == "invalid" else RuntimeError)(error)
        with self._lock:  # a server may report its spans at the end (ragspec.remote)
            run["spans"] = list(stream.spans)

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        if phase in ("generating", "stopped", "done"):
            self._save()

    def _fail(self, message: str) -> None:
        self.error = message
        self.phase = "failed"

    def _finish(self) -> None:
        try:
            self._save()
        finally:
            ACTIVE.discard(self)

    # -- saving -----------------------------------------------------------------------------------

    def message(self) -> dict:
        """The assistant message as it stands (see ragspec.web.chats for the layout)."""
        with self._lock:
            runs = [ch.run_dict(r["label"], list(r["spans"]), r["stats"]) for r in self.runs]
            passages = [ch.passage_dict(p, self.scores[i] if i < len(self.scores) else None)
                        for i, p in enumerate(self.passages)]
        status = self.phase if self.phase in ("done", "stopped", "failed", "waiting") \
            else "generating"
        content = NOT_IN_DOCUMENTS if self.refused else runs[-1]["text"] if runs else ""
        return {"role": "assistant", "content": content,
                "status": status, "model": self.settings.model, "error": self.error,
                "greedy": self.settings.temperature == 0, "runs": runs, "passages": passages,
                "note": self.note, "refused": self.refused, "absent_words": self.absent_words}

    def _save(self, attempts: int = 3) -> None:
        message, standalone = self.message(), self.standalone
        index = self.message_index

        def change(chat: dict) -> None:
            if index < len(chat["messages"]):
                chat["messages"][index] = message
                if standalone and index > 0:
                    chat["messages"][index - 1]["standalone"] = standalone

        for attempt in range(attempts):
            try:
                self.chats.update(self.chat_id, change)
                break
            except ch.ChatBusy:
                if attempt == attempts - 1:
                    logger.error("chat %s stayed busy; this state of its answer is not saved",
                                 self.chat_id)
            except ch.ChatError:
                self.stop()  # the chat was deleted meanwhile: nobody will read this answer
                break
        self._saved_at = time.monotonic()

    def _save_partial(self) -> None:
        try:
            self.chats.save_partial(self.chat_id, self.message_index, self.message())
        except ch.ChatBusy:
            pass  # saved again in a moment, and in full at the end
        except ch.ChatError:
            self.stop()  # the chat was deleted meanwhile
        self._saved_at = time.monotonic()


class StillAnswering(policy.Denied):
    """A second question in a chat whose answer is still queued or being written."""

    def __init__(self) -> None:
        super().__init__("this chat is still answering; wait for it or press Stop")


class ActiveJobs:
    """The jobs that are waiting or running, by chat (at most one per chat), and the chats
    whose question is being added right now (`reserve`)."""

    def __init__(self) -> None:
        self._jobs: dict[str, AnswerJob] = {}
        self._reserved: dict[str, str | None] = {}  # chat id -> who is asking
        self._lock = threading.Lock()

    def get(self, chat_id: str | None) -> AnswerJob | None:
        with self._lock:
            return self._jobs.get(chat_id) if chat_id else None

    def count_for(self, user: str | None) -> int:
        """Answers of `user` waiting, running or being submitted."""
        with self._lock:
            return (sum(1 for j in self._jobs.values() if j.user == user)
                    + sum(1 for u in self._reserved.values() if u == user))

    @contextlib.contextmanager
    def reserve(self, chat_id: str, principal: policy.Principal):
        """Hold `chat_id` while a question is appended and its job started (`start`): a second
        ask in the same chat meanwhile is refused, and so is one over the asker's queue quota.
        Released on the way out either way."""
        with self._lock:
            if chat_id in self._jobs or chat_id in self._reserved:
                raise StillAnswering
            if principal.quotas.queued is not None:
                policy.check_queue(principal, (
                    sum(1 for j in self._jobs.values() if j.user == principal.name)
                    + sum(1 for u in self._reserved.values() if u == principal.name)))
            self._reserved[chat_id] = principal.name
        try:
            yield
        finally:
            with self._lock:
                self._reserved.pop(chat_id, None)

    def start(self, job: AnswerJob, queue: TurnQueue) -> AnswerJob:
        with self._lock:
            if job.chat_id in self._jobs:
                raise StillAnswering
            self._jobs[job.chat_id] = job
            self._reserved.pop(job.chat_id, None)
        queue.submit(job)
        return job

    def discard(self, job: AnswerJob) -> None:
        with self._lock:
            if self._jobs.get(job.chat_id) is job:
                del self._jobs[job.chat_id]


ACTIVE = ActiveJobs()


def check_request(principal: policy.Principal, settings: AnswerSettings,
                  models: ModelRegistry) -> None:
    """The asker's limits on one question (see ragspec.accounts.policy); raises Denied."""
    policy.check_answer_tokens(principal, settings.max_new_tokens)
    if settings.model in models.names:
        policy.require_model(principal, settings.model, models.names[0], models.loaded_names())


def ask(chats: ch.ChatStore, chat_id: str, question: str, settings: AnswerSettings, *,
        store, models: ModelRegistry, queue: TurnQueue, index_lock=None,
        principal: policy.Principal | None = None) -> AnswerJob:
    """Append the question and a waiting answer to the chat, and queue the answer; one step per
    chat (see the module docstring). Raises ValueError (Denied, QuotaExceeded, ChatError) with
    a message for the asker."""
    principal = principal or policy.Principal.single_user()
    check_request(principal, settings, models)
    holder: dict = {}

    def append(chat: dict) -> None:
        holder["history"] = ch.history(chat)
        if not chat.get("title"):
            chat["title"] = ch.title_for(question)
        chat["messages"].append(ch.user_message(question))
        chat["messages"].append({"role": "assistant", "content": "", "status": "waiting",
                                 "model": settings.model, "runs": [], "passages": []})
        holder["index"] = len(chat["messages"]) - 1

    with ACTIVE.reserve(chat_id, principal):
        chats.update(chat_id, append)
        job = AnswerJob(chats=chats, chat_id=chat_id, message_index=holder["index"],
                        question=question, history=holder["history"], settings=settings,
                        store=store, models=models, index_lock=index_lock, user=principal.name)
        return ACTIVE.start(job, queue)
