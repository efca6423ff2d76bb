"""Requests, results and jobs of the engine service (the values the doors and the service exchange).

A ``Job`` is cancelled through a threading.Event the decode loop checks once per cycle; an
``AsyncJob`` is the same job seen from an event loop (deltas as loop callbacks, an awaitable
result that cancels the job when the awaiting task is cancelled).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from codespec.core.decode import Decoding
from codespec.core.draft import Proposer
from codespec.core.finish import FinishReason
from codespec.core.prompts import RenderedPrompt
from codespec.core.stats import RequestStats
from codespec.core.target import Cache
from codespec.service.requests.schema import GenerationRequest

DeltaCallback = Callable[[str], None]


@dataclass(frozen=True)
class Usage:
    """Token counts in the style of OpenAI's usage.completion_tokens_details."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens whose KV state was reused (no prefill)
    completion_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class JobResult:
    text: str
    reason: FinishReason
    usage: Usage
    stats: dict  # RequestStats.summary(), docs/design.md §3 names
    proposer: str
    elapsed_s: float

    def speculation(self) -> dict:
        """How the drafting went, as every door reports it: every drafted token whatever proposed
        it, the verification forwards, and the reference draft's own tokens as the engine verified them."""
        return {
            "drafted_tokens": self.stats.get("drafted_tokens", 0),
            "accepted_tokens": self.stats.get("accepted_tokens", 0),
            "target_forwards": self.stats.get("target_forwards", 0),
            "accepted_prediction_tokens": self.usage.accepted_prediction_tokens,
            "rejected_prediction_tokens": self.usage.rejected_prediction_tokens,
        }


@dataclass(frozen=True)
class PreparedPrompt:
    """A request's prompt as the engine runs it, made on the preparing thread."""

    rendered: RenderedPrompt | None  # None for a background prefill
    prompt_ids: list[int]
    reference_tokens: int  # a rewrite's reference, in tokens (its budget grows by that much)


class Job:
    """A submitted request: cancel it, wait for it (thread or asyncio)."""

    def __init__(self, request: GenerationRequest, on_delta: DeltaCallback | None) -> None:
        self.request = request
        self.on_delta = on_delta
        self.future: concurrent.futures.Future[JobResult] = concurrent.futures.Future()
        self._cancel = threading.Event()
        self.submitted_s = time.perf_counter()
        # worker-thread state
        self.decoding: Decoding | None = None  # the request's steps
        self.prefill_ids: list[int] = []  # a background prefill's prompt (service.engine)
        self.yielded = 0  # cycles in a row it sat out beside an interactive request (service.scheduler)
        self.prepared: PreparedPrompt | Exception | None = None  # or the error preparing it raised
        self.proposer: Proposer | None = None
        self.cache: Cache | None = None
        self.prompt_len = 0
        self.cached_len = 0

    @property
    def steps(self) -> Decoding:
        """The request's decoding, once the engine started it (a decoding request in the batch)."""
        assert self.decoding is not None, f"{self.request.kind} request not started"
        return self.decoding

    @property
    def kv(self) -> Cache:
        """The request's KV cache, once the engine started it."""
        assert self.cache is not None, f"{self.request.kind} request not started"
        return self.cache

    def cancel(self) -> None:
        """Stop at the next cycle (or before starting); the result's reason becomes "cancelled"."""
        self._cancel.set()

    def is_set(self) -> bool:  # the engine's Cancellation protocol
        # A caller may also cancel ``future`` itself (nobody will read the result): stop working too.
        return self._cancel.is_set() or self.future.cancelled()

    @property
    def cancelled(self) -> bool:
        return self.is_set()

    def wait(self, timeout: float | None = None) -> JobResult:
        return self.future.result(timeout)


class Submitter(Protocol):
    """What runs jobs (``service.engine.EngineService``)."""

    def submit(self, request: GenerationRequest, on_delta: DeltaCallback | None = None) -> Job: ...


class AsyncJob:
    """A Job seen from an event loop: deltas arrive as loop callbacks, the result is awaitable."""

    def __init__(self, service: Submitter, request: GenerationRequest, on_delta: DeltaCallback | None = None) -> None:
        loop = asyncio.get_running_loop()

        def deliver(text: str) -> None:
            if on_delta is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(on_delta, text)
                except RuntimeError:  # the loop closed meanwhile (client gone)
                    pass

        self.job = service.submit(request, deliver)

    def cancel(self) -> None:
        self.job.cancel()

    async def result(self) -> JobResult:
        """The result; if the awaiting task is cancelled, the job is cancelled too."""
        try:
            return await asyncio.shield(asyncio.wrap_future(self.job.future))
        except asyncio.CancelledError:
            self.job.cancel()
            raise


class NewestJobs:
    """The newest job per key (a document): a newer request cancels the one before it, as an
    editor's newer completion supersedes the one the user typed over."""

    def __init__(self) -> None:
        self._jobs: dict[str, AsyncJob] = {}

    async def run(self, service: Submitter, key: str, request: GenerationRequest) -> JobResult:
        self.cancel(key)
        job = AsyncJob(service, request)
        self._jobs[key] = job
        try:
            return await job.result()
        finally:
            if self._jobs.get(key) is job:
                del self._jobs[key]

    def cancel(self, key: str) -> None:
        job = self._jobs.pop(key, None)
        if job is not None:
            job.cancel()


class JobEnding(Protocol):
    """What a ``Generation`` hands its jobs back to (``EngineService``)."""

    stop_token_ids: frozenset[int]  # the ids every prompt kind ends at

    def finish_job(self, job: Job, text: str, reason: FinishReason, stats: RequestStats) -> None: ...

    def fail_job(self, job: Job, error: Exception) -> None: ...


class Generation(Protocol):
    """Where a request's tokens are made when not by this process's target: a served engine
    (``engine.served``, ``serve --engine-url``). The engine thread still renders and tokenizes the
    prompt, orders the index calls, and keeps the stats and history; ``start`` takes the job from
    there and ends it through ``EngineService.finish_job`` or ``fail_job``."""

    def attach(self, engine: JobEnding) -> None: ...

    def start(self, job: Job, prepared: PreparedPrompt) -> None: ...

    def close(self) -> None: ...
