"""From an API request to a scheduled generation, and the `ragspec` extension of its answer.

Contract:
  * `Service` knows what the server offers: the plain model id (answers the messages as they
    are, through the model's chat template), one retrieval model id per index (`ragspec` for
    the first, `ragspec:NAME` for the others) and the embedder's id.
  * `prepare_chat` / `prepare_completion` (blocking: retrieval embeds the question and builds
    the prompt, so the app runs them in a worker thread) return a `Job`: the prompt ids, the
    passages' SourceRegions and the GenerationConfig — or, for a retrieval question no passage
    is relevant enough for (ragspec.search's relevance floor), a refusal that never reaches the
    model. Retrieval and prompt building are ragspec.pipeline's, unchanged.
  * `submit(job, listener)` hands the job to the scheduler; a full queue is a 429, a closed
    scheduler a 503 (ragspec.serve.errors).
  * `extension(job, request)` is the top-level `ragspec` object: `passages` (as `ask --json`
    lists them, with the character ranges the answer copied), `spans` (Span.to_dict: text,
    drafted, and for drafts the origin: passage index and character range; a span copied from
    a passage also its `page`, and from a PDF its `page_size`, `rotation` and `boxes`, as
    ragspec.citations gives them), `stats`, and for
    retrieval ids `refused` and `standalone_question`. Nothing is re-derived here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from ragspec.citations import Citer
from ragspec.decoding.scheduler import QueueFull, Request, Scheduler, SchedulerClosed
from ragspec.decoding.types import GenerationConfig, SourceRegion
from ragspec.describe import passage_label
from ragspec.models.load import chat_prompt_ids
from ragspec.pipeline import NoDocumentsError, Pipeline, PipelineConfig, passages_to_dicts
from ragspec.search import NOT_IN_DOCUMENTS, hits_to_dicts, refusal_reason
from ragspec.serve.errors import APIError
from ragspec.serve.requests import ChatRequest, CompletionRequest, _Generation

RETRIEVAL_ID = "ragspec"


def model_id_for(spec: str | None) -> str:
    """The plain model's id: the bundled model's short name, else the folder, file or hub id."""
    if spec in (None, "", "bundled"):
        return "smollm2-135m-instruct"
    path = Path(spec)
    return spec if not path.exists() else path.name


@dataclass
class Job:
    """One request ready for the scheduler (or a refusal: `refusal` set, no prompt)."""

    model: str
    prompt_ids: list[int] = field(default_factory=list)
    config: GenerationConfig | None = None
    sources: list[SourceRegion] = field(default_factory=list)
    prepared: object | None = None  # PreparedPrompt for retrieval ids
    refusal: object | None = None  # ragspec.search.Retrieval when the floor refused
    retrieval: bool = False


class Service:
    """What the server offers and how a request becomes a Job (see the module docstring)."""

    def __init__(self, scheduler: Scheduler, *, model_id: str, stores: dict[str, object],
                 pipeline_config: PipelineConfig, embedder=None, created: int = 0):
        self.scheduler = scheduler
        self.generator = scheduler.gen
        self.model_id = model_id
        self.stores = dict(stores)  # retrieval model id -> PassageStore
        self.pipeline_config = pipeline_config
        self.embedder = embedder
        self.created = created
        self._prepare_lock = threading.Lock()  # one embedding/tokenising at a time

    @property
    def embedding_id(self) -> str | None:
        return None if self.embedder is None else Path(str(self.embedder.name)).name

    def models(self) -> list[dict]:
        ids = [self.model_id, *self.stores]
        if self.embedding_id:
            ids.append(self.embedding_id)
        return [{"id": i, "object": "model", "created": self.created, "owned_by": "ragspec"}
                for i in ids]

    def _check_model(self, model: str) -> None:
        if model != self.model_id and model not in self.stores:
            known = ", ".join([self.model_id, *self.stores])
            raise APIError(404, f"the model {model!r} does not exist here; this server answers "
                                f"with: {known}", param="model", code="model_not_found")

    def _default_max_tokens(self, prompt_length: int) -> int:
        room = self.generator.context_length - prompt_length
        if room < 1:
            raise APIError(400, f"the prompt takes {prompt_length} tokens, the whole context of "
                                f"{self.generator.context_length}", code="context_length_exceeded")
        return min(self.pipeline_config.max_new_tokens, room)

    # -- requests -------------------------------------------------------------------------------

    def prepare_chat(self, req: ChatRequest) -> Job:
        req.check()
        self._check_model(req.model)
        messages = req.plain_messages()
        if req.model in self.stores:
            if messages[-1]["role"] != "user":
                raise APIError(400, "messages: the last message must be the user's question",
                               param="messages")
            history = [m for m in messages[:-1] if m["role"] in ("user", "assistant")]
            return self._retrieval_job(req, messages[-1]["content"], history)
        with self._prepare_lock:
            ids = chat_prompt_ids(self.generator.tokenizer, messages)
        return self._plain_job(req, ids)

    def prepare_completion(self, req: CompletionRequest) -> Job:
        req.check()
        self._check_model(req.model)
        if req.model in self.stores:
            return self._retrieval_job(req, req.text(), [])
        if not req.text():
            raise APIError(400, "prompt: the prompt is empty", param="prompt")
        with self._prepare_lock:
            ids = self.generator.tokenizer(req.text())["input_ids"]
        return self._plain_job(req, ids)

    def _plain_job(self, req: _Generation, ids: list[int]) -> Job:
        config = req.generation_config(self._default_max_tokens(len(ids)))
        if len(ids) + config.max_new_tokens > self.generator.context_length:
            raise APIError(400, f"the prompt ({len(ids)} tokens) plus max_tokens "
                                f"({config.max_new_tokens}) exceeds the model's context of "
                                f"{self.generator.context_length} tokens",
                           param="max_tokens", code="context_length_exceeded")
        return Job(model=req.model, prompt_ids=list(ids), config=config)

    def _retrieval_job(self, req: _Generation, question: str, history: list[dict]) -> Job:
        options = req.ragspec
        base = self.pipeline_config
        max_new = req.max_tokens or base.max_new_tokens
        try:
            config = PipelineConfig(
                k=options.k if options and options.k else base.k,
                max_new_tokens=max_new,
                search=options.search if options and options.search else base.search,
                min_score=(options.min_score if options and options.min_score is not None
                           else base.min_score))
            pipeline = Pipeline(self.stores[req.model], self.generator, config)
            with self._prepare_lock:
                self._check_fits(pipeline, question)
                retrieval = pipeline.retrieve(question, history)
                if retrieval.refused:
                    return Job(model=req.model, refusal=retrieval, retrieval=True)
                prepared = pipeline.prepare_retrieved(retrieval)
        except NoDocumentsError as exc:
            raise APIError(400, str(exc), code="no_documents") from exc
        except ValueError as exc:  # an empty or over-long question, a bad setting
            raise APIError(400, str(exc)) from exc
        return Job(model=req.model, prompt_ids=prepared.prompt_ids,
                   config=pipeline.answer_config(req.generation_config(max_new)),
                   sources=list(prepared.sources), prepared=prepared, retrieval=True)

    def _check_fits(self, pipeline: Pipeline, question: str) -> None:
        """Refuse before searching what could never be answered: max_tokens that leave no room
        for a prompt, a question longer than the prompt budget (the refusal path of the
        relevance floor would otherwise answer it)."""
        try:
            budget = pipeline.prompt_budget
        except ValueError as exc:
            raise APIError(400, str(exc), param="max_tokens",
                           code="context_length_exceeded") from exc
        length = len(self.generator.tokenizer(question, add_special_tokens=False)["input_ids"])
        if length > budget:
            raise APIError(400, f"the question takes {length} tokens, more than the {budget} a "
                                f"prompt may have here; ask a shorter question",
                           param="messages", code="context_length_exceeded")

    def submit(self, job: Job, listener=None) -> Request:
        try:
            return self.scheduler.submit(job.prompt_ids, job.config, sources=job.sources,
                                         listener=listener)
        except QueueFull as exc:
            raise APIError(429, f"the server is busy: {exc}", code="queue_full",
                           headers={"Retry-After": "1"}) from exc
        except SchedulerClosed as exc:
            raise APIError(503, str(exc), code="shutting_down") from exc

    # -- answers ------------------------------------------------------------------------------

    @staticmethod
    def refusal_text(job: Job) -> str:
        """A refusal as a client that shows only the message reads it: the sentence (which ends
        "These are the closest passages found:"), then those passages by name and similarity
        (their text and sources are in the `ragspec` object), then why it was refused."""
        found = [f"{passage_label(i, h.passage)} (similarity {h.score:.2f})"
                 for i, h in enumerate(job.refusal.hits)] or ["(none)"]
        return "\n".join([NOT_IN_DOCUMENTS, *found, f"({refusal_reason(job.refusal)})"])

    def extension(self, job: Job, request: Request | None) -> dict:
        """The top-level `ragspec` object of an answer (see the module docstring)."""
        if job.refusal is not None:
            return {"refused": True, "message": NOT_IN_DOCUMENTS,
                    "passages": hits_to_dicts(job.refusal.hits), "spans": [],
                    "best_score": job.refusal.best_score, "min_score": job.refusal.min_score,
                    "absent_words": list(job.refusal.absent_words),
                    "standalone_question": job.refusal.standalone_question, "stats": None}
        spans = list(request.spans) if request is not None else []
        out = {"spans": ([s.to_dict() for s in spans] if job.prepared is None else
                         Citer(self.stores[job.model]).span_dicts(spans, job.prepared.passages)),
               "stats": request.stats.to_dict() if request is not None and request.stats
               else None}
        if job.retrieval:
            out.update(refused=False, passages=passages_to_dicts(job.prepared, spans),
                       standalone_question=job.prepared.standalone_question)
        else:
            out["passages"] = []
        return out
