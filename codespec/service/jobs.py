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
from typing import Any, Protocol

from codespec.core.prompts import Prompt
from codespec.service.schema import RequestKind, Sampling

DeltaCallback = Callable[[str], None]


@dataclass(frozen=True)
class GenerationRequest:
    """One completion or rewrite, built by :func:`request_of` (through ``service.inline`` for
    completions, ``service.edit`` for rewrites, ``service.next_edit`` for next edits); the service
    renders its prompt."""

    prompt: Prompt  # what is asked (codespec.prompts.Fim / Rewrite), or a plain string
    max_tokens: int
    kind: RequestKind = RequestKind.COMPLETE  # each kind's rules: service.schema.RequestKind
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    reference: str | None = None  # reference draft: the text being rewritten, a prediction, a shown suggestion
    cache_key: str | None = None  # document whose KV cache to reuse
    uri: str | None = None  # for the index proposer's locality ranking
    cursor: int | None = None  # code point offset of the cursor in ``uri``
    edits: tuple[tuple[str, str], ...] = ()  # the user's recent edits (next-edit drafting), oldest first
    # the target's token ids of text sent beside the prompt to draft from (llama.vim's input_extra chunks)
    material: tuple[tuple[int, ...], ...] = ()
    deadline_s: float | None = None
    proposer: str | None = None  # None: the service default
    origin: str = ""  # who asked: lsp, websocket, http (the request log names it)
    ahead: bool = False  # asked ahead of the user (a speculated next edit): background, whatever its kind

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", RequestKind(self.kind))  # a kind's name is accepted too

    @property
    def interactive(self) -> bool:
        """A user waits on it now (``RequestKind.interactive``, unless asked ahead): the scheduler
        admits it first and has the other requests mostly sit out beside it."""
        return self.kind.interactive and not self.ahead


def request_of(
    prompt: Prompt, max_tokens: int, kind: RequestKind, sampling: Sampling, stop: tuple[str, ...], **where: Any
) -> GenerationRequest:
    """The one place a client's request is built from a prompt and the client's sampling;
    ``where``: reference, edits, cache_key, uri, cursor, deadline_s, origin (``GenerationRequest``'s fields)."""
    return GenerationRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        kind=kind,
        stop=tuple(stop),
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        proposer=sampling.proposer,
        **where,
    )


def prompt_request(
    prompt: str,
    max_tokens: int,
    *,
    chat: bool = False,
    sampling: Sampling = Sampling(),
    reference: str | None = None,
    edits: tuple[tuple[str, str], ...] = (),
    cache_key: str | None = None,
    uri: str | None = None,
    origin: str = "",
) -> GenerationRequest:
    """A prompt the client rendered itself (an OpenAI plain completion, a chat rendered by the
    model's template), sent as it is; ``chat`` ends it without the completion's loop stop;
    ``edits``: the user's recent edits the prompt shows (a next-edit prompt)."""
    kind = RequestKind.CHAT if chat else RequestKind.COMPLETE
    return request_of(
        prompt,
        max_tokens,
        kind,
        sampling,
        sampling.stop or (),
        reference=reference,
        edits=edits,
        cache_key=cache_key,
        uri=uri,
        origin=origin,
    )


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
    reason: str  # "eos" | "stop" | "repetition" | "length" | "context" | "deadline" | "cancelled"
    usage: Usage
    stats: dict  # RequestStats.summary(), docs/design.md §3 names
    proposer: str
    elapsed_s: float


class Job:
    """A submitted request: cancel it, wait for it (thread or asyncio)."""

    def __init__(self, request: GenerationRequest, on_delta: DeltaCallback | None) -> None:
        self.request = request
        self.on_delta = on_delta
        self.future: concurrent.futures.Future[JobResult] = concurrent.futures.Future()
        self._cancel = threading.Event()
        self.submitted_s = time.perf_counter()
        # worker-thread state
        self.decoding: Any = None  # codespec.decode.Decoding: the request's steps
        self.prefill_ids: list[int] = []  # a background prefill's prompt (service.engine)
        self.last_rows = 0  # rows its last cycle's plan put in the forward (what a batch prices drafts with)
        self.yielded = 0  # cycles in a row it sat out beside an interactive request (service.scheduler)
        self.prepared: Any = None  # service.engine.PreparedPrompt, or the error preparing it raised
        self.proposer: Any = None  # codespec.draft.Proposer
        self.cache: Any = None  # codespec.target.Cache
        self.prompt_len = 0
        self.cached_len = 0

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
