"""The engine service every door and `codespec complete` share.

One worker thread, the engine thread, owns the model, its tokenizer and the KV caches, and runs
every index call the editor drives (document updates, history, the lookups inside decode cycles),
so they are ordered with the cycles. It drives the batch (``service.scheduler``): each cycle one
target forward serves every active request (continuous batching; docs/architecture.md,
"Batching"). This module is everything around that batch: prompts rendered and tokenized on
preparing lanes before they reach the engine (``service.preparing``: one lane for small prompts,
one for large, and a prompt that cannot fit the context refused before either), each request's ``Decoding``
and proposer built when it joins, results, stats and history when it leaves, and calls from other
threads run between cycles. Workspace scans do not run here: they run on the index's own thread
with their own tokenizer (``service.indexing``), so indexing a large workspace delays a cycle at
most by one short locked step of the index, never by the scan. Callers on an event loop get
deltas and results through thread-safe callbacks (``AsyncJob`` wraps them for asyncio).

Prompt caching: each document key keeps the KV cache of its last request; the engine reuses its
longest common token prefix with the next prompt (as llama.cpp's prompt cache), so a keystroke
costs a few tokens of prefill. A cache in use by a running request is not shared: a concurrent
request on the same key gets a fresh one. A document's background prefill (``RequestKind.PREFILL``,
when it is opened) runs ``PREFILL_CHUNK`` tokens per cycle, so it delays other requests by one
chunk at most, and a request on the same document takes its cache over at once, with whatever
it has prefilled so far. Index work for opened and edited documents is an *idle* call: it runs
when no request waits or runs (or after ``IDLE_CALL_MAX_WAIT_S``), never in front of a completion.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from codespec.core.config import SERVE_MAX_DRAFT, GenerationLimits
from codespec.core.decode import Decoding
from codespec.core.errors import CodespecError, ServiceClosedError
from codespec.core.finish import FinishReason
from codespec.core.prompts import PromptRenderer
from codespec.core.stats import RequestStats, json_safe
from codespec.core.target import Target, common_prefix_len
from codespec.proposers.assembly import ProposerAssembly
from codespec.proposers.registry import RequestContext
from codespec.service.engine.bookkeeping import CachePool, ServiceHistory, ServiceStats, prediction_tokens
from codespec.service.engine.jobs import AsyncJob, DeltaCallback, Generation, Job, JobResult, PreparedPrompt, Usage
from codespec.service.engine.preparing import PromptPreparer, Refusal, request_chars
from codespec.service.engine.scheduler import Scheduler, prompt_chunk
from codespec.service.requests.options import DEFAULT_MAX_BATCH, DEFAULT_MAX_CACHED_TOKENS
from codespec.service.requests.schema import REQUEST_LOG, GenerationRequest, RequestKind

__all__ = ["AsyncJob", "EngineService", "GenerationRequest", "Job", "JobResult", "PreparedPrompt", "Usage"]

log = logging.getLogger(__name__)
request_log = logging.getLogger(REQUEST_LOG)
COMPLETION_STOP_REPEATS = 4  # a completion ending in a unit repeated 4 times is a loop: stop it there
LARGE_DOCUMENT_CHARS = 64_000  # an opened document this large is tokenized off the engine thread
IDLE_CALL_MAX_WAIT_S = 0.25  # idle work (indexing an opened / edited document) runs at the latest after this


class EngineService:
    """Owns the target, the caches, the optional index and the scheduler thread."""

    def __init__(
        self,
        target: Target,  # codespec.target: TargetModel, or any backend meeting the contract
        proposer: str = "auto",
        max_draft: int = SERVE_MAX_DRAFT,
        cached_documents: int = 8,
        index=None,
        proposer_config=None,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_cached_tokens: int = DEFAULT_MAX_CACHED_TOKENS,
        generation: Generation | None = None,
    ) -> None:
        self.target = target
        self.generation = generation  # None: the target decodes here; else a served engine does
        self.prompts = PromptRenderer(target.tokenizer, target.prompt_format)
        self.stop_token_ids = self.prompts.stop_token_ids()  # every prompt kind ends at these
        self.default_proposer = proposer
        self.max_draft = max_draft
        self.index = index  # index.WorkspaceIndex, or None: no workspace lookup
        self.indexer: Any = None  # service.indexing.WorkspaceIndexer: the index's scanning thread
        self.stats = ServiceStats()
        # the session's history (the index's, and the earlier outputs auto drafts later requests from)
        self.history = ServiceHistory(self.stats, self.stop_token_ids)
        self._caches = CachePool(target, cached_documents)
        self._cond = threading.Condition()
        self._pending: list[Job] = []
        self._calls: list[tuple[Callable[[], Any], concurrent.futures.Future]] = []
        self._idle_calls: list[tuple[Callable[[], Any], concurrent.futures.Future, float, str | None]] = []
        self.scheduler = Scheduler(
            target, self._caches, self.stats, max_batch, max_cached_tokens, self._complete, self._fail
        )
        self.prompt_chunk = prompt_chunk(target)  # prompt tokens a request prefills per cycle
        self._closed = False

        self._proposers = ProposerAssembly(target, proposer_config)  # a proposers.setup.ProposerConfig
        self._preparing: list[Job] = []  # submitted, their prompts being tokenized
        self._tokenizing: dict[str, list] = {}  # documents being tokenized: their idle calls, held back
        self._doc_adapter: tuple[Any, Any] | None = None  # (index, the large lane's tokenizer adapter)
        # two lanes by prompt size (service.preparing): a big prompt never holds a small one back
        self.preparer = PromptPreparer(target, self.prompts)
        self._thread = threading.Thread(target=self._run, name="codespec-engine", daemon=True)
        self._thread.start()
        if generation is not None:
            generation.attach(self)

    # ---- API (any thread) -------------------------------------------------------------------
    def submit(self, request: GenerationRequest, on_delta: DeltaCallback | None = None) -> Job:
        """Queue ``request``; its prompt is rendered and tokenized on a preparing lane (by its size:
        a huge prompt takes its time there, never from the cycles of the requests decoding
        meanwhile nor from a small prompt's preparing), then it waits for the engine thread. A
        request that cannot fit the context fails at once (:meth:`refusal`), before any of that."""
        job = Job(request, on_delta)
        with self._cond:
            if self._closed:
                raise ServiceClosedError("the engine service is closed")
        refusal = self.refusal(request)
        if refusal is not None:
            self._refuse(job, refusal.error())
            return job
        with self._cond:
            self._preparing.append(job)  # the engine counts it as waiting from now on
        self.preparer.run(request_chars(request), lambda: self._prepare(job))
        return job

    def refusal(self, request: GenerationRequest) -> Refusal | None:
        """Why ``request`` surely cannot fit the model's context, from lengths alone (any thread,
        O(1)): a door asks before it counts the request as running."""
        return self.preparer.refusal(request)

    def _refuse(self, job: Job, error: Exception) -> None:
        """Fail ``job`` now, on this thread: it holds no place, cache or proposer yet."""
        if not isinstance(error, CodespecError):
            log.error("preparing a request failed", exc_info=error)
        if job.future.set_running_or_notify_cancel():
            job.future.set_exception(error)
        self.call(self._count_error)  # the stats belong to the engine thread

    def _count_error(self) -> None:
        self.stats.errors += 1

    def call(self, fn: Callable[[], Any], idle: bool = False, document: str | None = None) -> concurrent.futures.Future:
        """Run ``fn`` on the engine thread between two decode cycles (index updates, stats).
        Keep ``fn`` short: every active request waits for it (a workspace scan is not one).

        ``idle``: work nobody waits for (indexing an opened or edited document): it runs, in order,
        only when no completion or edit is waiting or running (or once it has waited
        ``IDLE_CALL_MAX_WAIT_S``), so it never delays a request on another document; when it
        runs it goes before the ordinary calls of that cycle, which therefore see its effect.
        ``document``: the uri an idle call indexes. A request on that document runs that
        document's idle calls first, in order: its drafts come partly from the document itself,
        so the index should know its current text (a one-line update costs well under a millisecond)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                future.set_exception(ServiceClosedError("the engine service is closed"))
                return future
            if idle and document is not None and document in self._tokenizing:
                self._tokenizing[document].append((fn, future))  # after the document's install, in order
            elif idle:
                self._idle_calls.append((fn, future, time.monotonic(), document))
            else:
                self._calls.append((fn, future))
            self._cond.notify()
        return future

    def index_document(self, uri: str, text: str, version: int) -> concurrent.futures.Future:
        """Index an opened document. A large one is tokenized on the large preparing lane first (with
        its own copy of the tokenizer: a megabyte takes about a second, which would stop every
        decode cycle on the engine thread), then installed by a short idle call; the document's
        later index calls wait for that install, so they apply in order."""
        index = self.index
        if index is None:
            raise CodespecError("no index is attached")
        if len(text) < LARGE_DOCUMENT_CHARS:
            return self.call(lambda: index.add_document(uri, text, version), idle=True, document=uri)
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                done.set_exception(ServiceClosedError("the engine service is closed"))
                return done
            self._tokenizing.setdefault(uri, [])

        def tokenize() -> None:
            try:
                tokens = self._document_adapter(index).encode_array(text)
            except Exception as error:  # installed without them: the index tokenizes it itself
                log.warning("tokenizing %s off the engine thread failed: %s", uri, error)
                tokens = None
            calls = [(lambda: index.add_document(uri, text, version, tokens=tokens), done)]
            with self._cond:  # the install, then what arrived for this document meanwhile, in order
                calls += self._tokenizing.pop(uri, [])
                if not self._closed:
                    now = time.monotonic()
                    self._idle_calls.extend((fn, future, now, uri) for fn, future in calls)
                    self._cond.notify()
                    return
            for _, future in calls:
                future.set_exception(ServiceClosedError("the engine service is closed"))

        self.preparer.run(len(text), tokenize)
        return done

    def _document_adapter(self, index):
        """The large lane's own tokenizer adapter for ``index`` (made once, on first use)."""
        if self._doc_adapter is None or self._doc_adapter[0] is not index:
            from codespec.index.ingest import thread_adapter

            self._doc_adapter = (index, thread_adapter(index.adapter))
        return self._doc_adapter[1]

    async def acall(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.wrap_future(self.call(fn))

    def warm_up(self) -> None:
        """One short request through the default proposer: the first forward of a fresh process is
        slow (allocations, kernel selection) and model proposers load lazily; pay that at start.
        A served engine loads nothing here."""
        if self.generation is not None:
            return
        request = GenerationRequest(
            prompt="def main():\n    return",
            max_tokens=4,
            cache_key="__warm_up__",
            reference="def main():\n    return 0\n",
            kind=RequestKind.WARM,
        )  # not user history
        try:
            self.submit(request).wait()
        except CodespecError as error:
            log.warning("warm-up request failed: %s", error)
        self.call(lambda: self._caches.caches.pop("__warm_up__", None)).result()

    def attach_index(self, index, indexer=None) -> None:
        """Use ``index`` (an ``index.WorkspaceIndex``) for lookups and history from now on, with the
        thread that scans the workspace into it (``service.indexing``). On the engine thread."""
        self.index = index
        self.indexer = indexer

    def snapshot(self) -> dict:
        """Stats as a JSON-safe dict (taken on the engine thread, so it is consistent)."""
        return self.call(self.stats_snapshot).result()

    def record_history(self, kind: str, text: str, uri: str | None = None) -> concurrent.futures.Future:
        return self.call(lambda: self.history.add(kind, text, uri, self.index))

    def clear_history(self) -> concurrent.futures.Future:
        return self.call(lambda: self.history.clear(self.index))

    def _prepare(self, job: Job) -> None:
        """On a preparing lane: the job's prompt ids, then the queue; a prompt that cannot run (too
        long for the context) fails here, without waiting for a place in the batch."""
        try:
            job.prepared = None if job.cancelled else self._prepare_prompt(job.request)
        except Exception as error:
            with self._cond:
                self._preparing.remove(job)
                self._cond.notify()  # the engine may be waiting on it to run idle work
            self._refuse(job, error)
            return
        with self._cond:
            self._preparing.remove(job)
            if not self._closed:
                self._pending.append(job)
                self._cond.notify()
                return
        if job.future.set_running_or_notify_cancel():  # the caller may have cancelled it already
            job.future.set_exception(ServiceClosedError("the engine service is closed"))

    def _prepare_prompt(self, request: GenerationRequest) -> PreparedPrompt:
        return self.preparer.prepare(request)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for job in self._pending + self.scheduler.waiting + self.scheduler.active:
                job.cancel()
            self._cond.notify()
        self._thread.join(timeout=30)
        self.preparer.shutdown()
        if self.generation is not None:
            self.generation.close()

    def finish_job(self, job: Job, text: str, reason: FinishReason, stats: RequestStats) -> None:
        """End ``job`` with its text (any thread: it ends on the engine thread, with its stats and history)."""
        self._end_job(job, lambda: self._complete(job, text, reason, stats))

    def fail_job(self, job: Job, error: Exception) -> None:
        """End ``job`` with ``error`` (any thread)."""
        self._end_job(job, lambda: self._fail(job, error))

    def _end_job(self, job: Job, end: Callable[[], None]) -> None:
        ended = self.call(end)
        if ended.done() and isinstance(ended.exception(), ServiceClosedError):  # stopping: still an answer
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(ServiceClosedError("the engine service is closed"))

    # ---- engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:  # a bug here would hang every caller: fail them all loudly instead
            log.exception("engine thread crashed")
            with self._cond:
                self._closed = True
                jobs = self._pending + self.scheduler.waiting + self.scheduler.active
                self._pending, self.scheduler.waiting, self.scheduler.active = [], [], []
                calls, self._calls = self._calls + [c[:2] for c in self._idle_calls], []
                self._idle_calls = []
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(CodespecError("the engine thread crashed; see the server log"))
            for _, future in calls:
                if not future.done():
                    future.set_exception(CodespecError("the engine thread crashed; see the server log"))

    def _loop(self) -> None:
        while True:
            batch = self.scheduler
            with self._cond:
                while not (
                    self._pending or batch.active or batch.waiting or self._calls or self._idle_calls or self._closed
                ):
                    self._cond.wait()
                if self._closed and not (
                    self._pending or batch.active or batch.waiting or self._calls or self._idle_calls
                ):
                    return
                pending, self._pending = self._pending, []
                calls, self._calls = self._calls, []
                busy = bool(pending or batch.waiting or self._preparing) or batch.decoding
                if self._idle_calls and (not busy or self._closed):
                    # Nothing to yield to: all of them, before the calls (a stats call then sees them done).
                    calls = [c[:2] for c in self._idle_calls] + calls
                    self._idle_calls = []
                elif self._idle_calls and time.monotonic() - self._idle_calls[0][2] > IDLE_CALL_MAX_WAIT_S:
                    calls.insert(0, self._idle_calls.pop(0)[:2])  # beside a long request: one per cycle
                asking = pending + batch.waiting + self._preparing
                wanted = {job.request.uri for job in asking if job.request.uri is not None}
                if wanted and self._idle_calls:  # the documents these requests are about: indexed first
                    calls = [c[:2] for c in self._idle_calls if c[3] in wanted] + calls
                    self._idle_calls = [c for c in self._idle_calls if c[3] not in wanted]
            for fn, future in calls:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as error:  # handed to the caller
                        future.set_exception(error)
            batch.waiting.extend(pending)
            batch.admit(self._start)
            batch.cycle()

    def _start(self, job: Job) -> None:
        request = job.request
        if job.cancelled:
            self._complete(job, "", FinishReason.CANCELLED, RequestStats())
            return
        if self.generation is not None:
            self._start_elsewhere(job, self.generation)
            return
        self.scheduler.take_over_prefill(request.cache_key)
        try:
            prepared = job.prepared if job.prepared is not None else self._prepare_prompt(request)
            if isinstance(prepared, Exception):
                raise prepared
            if not request.kind.decodes:
                self._start_prefill(job, prepared.prompt_ids)
                return
            rendered, prompt_ids = prepared.rendered, prepared.prompt_ids
            assert rendered is not None
            max_tokens = request.max_tokens + prepared.reference_tokens
            max_tokens = max(1, min(max_tokens, self.target.max_context - len(prompt_ids)))
            sampling = request.sampling
            stop = (*request.stop, *rendered.stop, *self.prompts.end_markers)
            limits = GenerationLimits(
                max_tokens,
                stop,
                request.deadline_s,
                self.max_draft,
                self.stop_token_ids,
                COMPLETION_STOP_REPEATS if request.kind.stops_on_repeats else 0,
            )
            job.proposer = self._make_proposer(request)
            job.cache = self._caches.take(request.cache_key)
            job.prompt_len = len(prompt_ids)
            job.cached_len = min(common_prefix_len(job.cache.token_ids, prompt_ids), max(len(prompt_ids) - 1, 0))
            job.decoding = Decoding(
                self.target, prompt_ids, job.proposer, sampling, limits, job, job.cache, prefill_chunk=self.prompt_chunk
            )
        except Exception as error:
            self._fail(job, error)
            return
        self.scheduler.active.append(job)

    def _start_elsewhere(self, job: Job, generation: Generation) -> None:
        try:
            prepared = job.prepared if job.prepared is not None else self._prepare_prompt(job.request)
            if isinstance(prepared, Exception):
                raise prepared
            job.prompt_len = len(prepared.prompt_ids)
            generation.start(job, prepared)
        except Exception as error:
            self._fail(job, error)

    def _start_prefill(self, job: Job, prompt_ids: list[int]) -> None:
        job.cache = self._caches.take(job.request.cache_key)
        job.cached_len = common_prefix_len(job.cache.token_ids, prompt_ids)
        job.cache.rollback(job.cached_len)
        job.prompt_len = len(prompt_ids)
        job.prefill_ids = prompt_ids
        self.scheduler.active.append(job)

    def _complete(self, job: Job, text: str, reason: FinishReason, stats: RequestStats) -> None:
        self._proposers.release(job.proposer)
        request = job.request
        accepted, rejected = prediction_tokens(job.proposer, stats) if request.reference else (0, 0)
        usage = Usage(job.prompt_len, job.cached_len, stats.tokens, accepted, rejected)
        name = getattr(job.proposer, "name", "none") if job.proposer is not None else "none"
        summary = json_safe(stats.summary())
        elapsed_s = time.perf_counter() - job.submitted_s
        if request.kind.is_history:
            request_log.info(
                "%s %s model=%s prompt=%d (cached %d) output=%d tokens/forward=%.2f proposer=%s %s %.0f ms",
                request.origin or "-",
                request.kind.value,
                getattr(self.target, "name", "") or "-",
                usage.prompt_tokens,
                usage.cached_prompt_tokens,
                usage.completion_tokens,
                summary["tokens_per_forward"],
                name,
                reason,
                elapsed_s * 1e3,
            )
        self.stats.record(request.kind, reason, usage, stats, summary, name, elapsed_s)
        if text and reason != "cancelled" and request.kind.is_history:
            self.history.add("generated", text, request.uri, self.index)
            if job.decoding is not None:  # decoded here (a served engine's tokens stay there)
                self.history.add_output(job.decoding.sequence[job.prompt_len :])
        result = JobResult(text, reason, usage, summary, name, elapsed_s)
        if job.future.set_running_or_notify_cancel():  # False: the caller cancelled the future itself
            job.future.set_result(result)

    def _fail(self, job: Job, error: Exception) -> None:
        self._proposers.release(job.proposer)
        self.stats.errors += 1
        if not isinstance(error, CodespecError):
            log.exception("request failed", exc_info=error)
        if job.future.set_running_or_notify_cancel():
            job.future.set_exception(error)

    def stats_snapshot(self) -> dict:
        """The stats as a JSON-safe dict; on the engine thread (``call``/``acall`` it), where they are
        consistent. A door adds its own fields in the same call (``snapshot`` for a plain copy)."""
        snapshot = self.stats.as_dict()
        snapshot["active_requests"] = len(self.scheduler.active)
        snapshot["waiting_requests"] = len(self.scheduler.waiting)
        snapshot["max_batch"] = self.scheduler.max_batch
        snapshot["model"] = getattr(self.target, "name", "")
        snapshot["prompt_format"] = self.prompts.format.name
        snapshot["proposer"] = self.default_proposer
        snapshot["index"] = self.index is not None
        return snapshot

    def _make_proposer(self, request: GenerationRequest):
        context = RequestContext(
            reference=request.reference or None,
            index=self.index,
            uri=request.uri,
            cursor=request.cursor,  # in characters
            edits=request.edits,
            material=request.material,
            outputs=self.history.outputs,
        )
        wanted = request.proposer or self.default_proposer
        return self._proposers.create_with_fallback(
            [wanted, *(["reference"] if request.reference else []), "context"], context
        )
