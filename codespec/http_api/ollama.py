"""Ollama's API on the HTTP door (docs/http.md, "Ollama's API"): ``POST /api/generate``, ``POST
/api/chat``, ``GET /api/tags``, ``POST /api/show``, ``GET /api/version``, ``GET /api/ps``.

A request becomes an engine job through the same builders as the OpenAI routes
(:class:`~codespec.http_api.routes.HttpDoor`): ``suffix`` is a fill-in-the-middle completion at a
cursor, a ``raw`` prompt is sent as it is, ``messages`` are rendered by the model's chat template (or
codespec's rewrite format without one). :class:`OllamaGeneration` answers as Ollama does: NDJSON by
default, one line per piece of text as the engine yields it, and a last line with ``done: true``,
``done_reason`` and the counts and durations (nanoseconds); or one JSON object with ``stream: false``.
Errors are Ollama's ``{"error": "..."}`` with the status (404 an unknown model, 400 bad input).
The security of the door (token, Origin, body limit) applies as to every route.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from codespec import __version__
from codespec.core.errors import CodespecError
from codespec.http_api import ollama_schema as wire
from codespec.http_api.routes import HttpDoor, JobRun, job_failure
from codespec.http_api.schema import ApiError, CallOptions, ChatBody, CompletionBody, finish_reason, json_text
from codespec.service.engine.jobs import JobResult
from codespec.service.requests.schema import GenerationRequest

log = logging.getLogger(__name__)
NDJSON_HEADERS = [(b"content-type", b"application/x-ndjson"), (b"cache-control", b"no-cache")]
EVERY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
ROUTES = {
    "generate": "POST",
    "chat": "POST",
    "tags": "GET",
    "show": "POST",
    "version": "GET",
    "ps": "GET",
}


def json_response(body: dict, status: int = 200, headers: dict | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse(body, status_code=status, headers=headers)


def ollama_error(status: int, message: str, headers: dict | None = None):
    return json_response({"error": message}, status, headers)


def ollama_shaped(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Errors raised in ``handler`` (its own, and the door's: a bad body, a full queue) in Ollama's shape."""

    @functools.wraps(handler)
    async def wrapped(request):
        try:
            return await handler(request)
        except wire.OllamaError as error:
            return ollama_error(error.status, error.message, error.headers)
        except ApiError as error:
            return ollama_error(error.status, error.message, error.headers)

    return wrapped


class OllamaApi:
    """The Ollama handlers over one :class:`HttpDoor` (``read_json``: the door's body reader, with its limit)."""

    def __init__(self, door: HttpDoor, read_json: Callable[[Any], Awaitable[dict]]) -> None:
        self.door = door
        self.read_json = read_json
        target = door.service.target
        fim = target.prompt_format.fim_tokens is not None
        self.names = wire.OllamaNames.of(
            door.model_id, door.served_models(), target.prompt_format.name if fim else None,
            door.limits.any_model, door.draft_id,
        )  # fmt: skip
        self.facts = wire.ModelFacts.of(target, datetime.fromtimestamp(door.created, UTC))

    def routes(self) -> list:
        from starlette.routing import Route

        return [
            Route("/api/generate", ollama_shaped(self.generate), methods=["POST"]),
            Route("/api/chat", ollama_shaped(self.chat), methods=["POST"]),
            Route("/api/tags", ollama_shaped(self.tags), methods=["GET"]),
            Route("/api/show", ollama_shaped(self.show), methods=["POST"]),
            Route("/api/version", ollama_shaped(self.version), methods=["GET"]),
            Route("/api/ps", ollama_shaped(self.ps), methods=["GET"]),
            Route("/api/{rest:path}", ollama_shaped(self.elsewhere), methods=EVERY_METHOD),  # every other /api request
        ]

    # ---- generation ------------------------------------------------------------------------
    async def generate(self, request):
        started = time.perf_counter_ns()
        body = wire.parse_generate(await self.read_json(request))
        model = self.names.check(body.model)
        if not body.prompt and not body.suffix:
            return self._loaded(model, body.unload, chat=False)
        sampling = body.options.sampling
        if body.suffix:
            if not self.facts.fim:
                raise wire.bad(f'"{model}" does not support insert (its prompt format has no fill-in-the-middle)')
            call = CallOptions(sampling, body.stream, False, None, None)
            job = self.door.completion(CompletionBody(body.prompt, body.suffix, None, call))
        elif not body.raw and self.door.service.prompts.chat:
            messages = [{"role": "system", "content": body.system}] if body.system else []
            call = CallOptions(sampling, body.stream, False, None, None)
            job = await self.door.chat(ChatBody((*messages, {"role": "user", "content": body.prompt}), None, call))
        else:
            if body.system:
                raise wire.bad("system: this model has no chat template to put a system message in")
            budget = sampling.max_tokens or self.door.service.target.max_context  # the service caps it
            call = CallOptions(dataclasses.replace(sampling, max_tokens=budget), body.stream, False, None, None)
            job = self.door.completion(CompletionBody(body.prompt, None, None, call))
        return self._start(job, model, body.stream, chat=False, started=started)

    async def chat(self, request):
        started = time.perf_counter_ns()
        body = wire.parse_chat(await self.read_json(request))
        model = self.names.check(body.model)
        if not body.messages:
            return self._loaded(model, body.unload, chat=True)
        call = CallOptions(body.options.sampling, body.stream, False, None, None)
        job = await self.door.chat(ChatBody(body.messages, None, call))
        return self._start(job, model, body.stream, chat=True, started=started)

    def _start(self, job: GenerationRequest, model: str, stream: bool, chat: bool, started: int):
        self.door.check_fits(job, "messages" if chat else "prompt")  # a 400 at once, never a 429 first
        self.door.acquire()
        return OllamaGeneration(self.door, job, model, stream, chat, started)

    def _loaded(self, model: str, unload: bool, chat: bool):
        """An empty prompt loads the model (Ollama's warm-up call); the model stays loaded while the server runs."""
        if unload:
            raise wire.bad(
                "keep_alive 0: codespec keeps its model loaded while it serves, so it cannot be unloaded; "
                "stop the server to free it"
            )
        head = {"model": model, "created_at": wire.timestamp()}
        text = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
        return json_response({**head, **text, "done": True, "done_reason": "load"})

    # ---- the model -------------------------------------------------------------------------
    async def tags(self, request):
        return json_response(wire.tags_response(self.names, self.facts))

    async def show(self, request):
        self.names.check(wire.show_name(await self.read_json(request)))
        return json_response(wire.show_response(self.facts))

    async def ps(self, request):
        return json_response(wire.ps_response(self.names, self.facts))

    async def version(self, request):
        return json_response({"version": wire.OLLAMA_API_VERSION, "codespec": __version__})

    async def elsewhere(self, request):
        name = request.path_params["rest"].strip("/")
        if name in ROUTES:
            raise wire.OllamaError(
                405, f"{request.method} is not allowed on /api/{name} (use {ROUTES[name]})", {"allow": ROUTES[name]}
            )
        served = ", ".join(f"/api/{route}" for route in ROUTES)
        raise wire.OllamaError(404, f"codespec does not serve /api/{name} (its Ollama API: {served})")


class OllamaGeneration(JobRun):
    """One generation answered as Ollama answers (an ASGI app, so it hears the client leave while the
    engine works; a client that goes away cancels its job). A streamed response's headers wait for the
    first text, so an error the engine finds at its first cycle is still a plain HTTP error."""

    def __init__(
        self, door: HttpDoor, request: GenerationRequest, model: str, stream: bool, chat: bool, started_ns: int
    ) -> None:
        self.door = door
        self.request = request
        self.model = model
        self.stream = stream
        self.chat = chat
        self.started_ns = started_ns
        self.first_text_ns: int | None = None

    def on_delta(self, deltas: asyncio.Queue) -> Callable[[str], None]:
        def delta(text: str) -> None:
            if self.first_text_ns is None:
                self.first_text_ns = time.perf_counter_ns()
            deltas.put_nowait(text)

        return delta

    async def unavailable(self, send, error: CodespecError) -> None:
        await send_ollama(send, 503, {"error": str(error)})

    async def answer(self, send, job, deltas: asyncio.Queue, result: asyncio.Future, gone: asyncio.Future) -> None:
        if self.stream:
            await self._stream(send, deltas, result, gone)
        else:
            await self._respond(send, result, gone)

    async def _respond(self, send, result: asyncio.Future, gone: asyncio.Future) -> None:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not result.done():
            return  # the client is gone; the finally cancels the job
        failure = _failure(result)
        if failure is not None:
            await send_ollama(send, failure.status, {"error": failure.message})
            return
        job_result = result.result()
        await send_ollama(send, 200, self._final(job_result, job_result.text))

    async def _stream(self, send, deltas: asyncio.Queue, result: asyncio.Future, gone: asyncio.Future) -> None:
        started = False
        while True:
            getter = asyncio.ensure_future(deltas.get())
            await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                return  # the client is gone
            texts, ended = [], False
            item = getter.result()
            while True:  # everything already there goes out as one line
                if item is None:
                    ended = True
                    break
                texts.append(item)
                if deltas.empty():
                    break
                item = deltas.get_nowait()
            failure = _failure(result) if ended else None
            if failure is not None and not started:
                await send_ollama(send, failure.status, {"error": failure.message})
                return
            if not started:
                await send({"type": "http.response.start", "status": 200, "headers": NDJSON_HEADERS})
                started = True
            lines = [self._piece("".join(texts))] if texts else []
            if ended:
                lines.append({"error": failure.message} if failure is not None else self._final(result.result(), ""))
            payload = "".join(json_text(line) + "\n" for line in lines).encode()
            await send({"type": "http.response.body", "body": payload, "more_body": not ended})
            if ended:
                return

    def _head(self) -> dict:
        return {"model": self.model, "created_at": wire.timestamp()}

    def _text(self, text: str) -> dict:
        return {"message": {"role": "assistant", "content": text}} if self.chat else {"response": text}

    def _piece(self, text: str) -> dict:
        return {**self._head(), **self._text(text), "done": False}

    def _final(self, job_result: JobResult, text: str) -> dict:
        """The last object: ``text`` (all of it unstreamed, "" streamed), why it ended, the counts and
        durations in nanoseconds (prompt evaluation: until the first text, queueing included)."""
        ended = time.perf_counter_ns()
        first = self.first_text_ns or ended
        usage, stats = job_result.usage, job_result.stats
        return {
            **self._head(),
            **self._text(text),
            "done": True,
            "done_reason": finish_reason(job_result.reason),
            "total_duration": ended - self.started_ns,
            "load_duration": 0,  # the model is loaded when the server starts
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": first - self.started_ns,
            "eval_count": usage.completion_tokens,
            "eval_duration": ended - first,
            "codespec": {
                "finish_reason": job_result.reason,
                "proposer": job_result.proposer,
                "cached_prompt_tokens": usage.cached_prompt_tokens,
                "drafted_tokens": stats.get("drafted_tokens", 0),
                "accepted_tokens": stats.get("accepted_tokens", 0),
                "target_forwards": stats.get("target_forwards", 0),
                "tokens_per_forward": stats.get("tokens_per_forward", 0.0),
            },
        }


def _failure(result: asyncio.Future) -> wire.OllamaError | None:
    """The error for a job that failed, or was cancelled while its client still waits (the service
    is shutting down); None: it succeeded."""
    failure = job_failure(result, "prompt")
    return None if failure is None else wire.OllamaError(failure.status, failure.message)


async def send_ollama(send, status: int, body: dict) -> None:
    payload = json_text(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


def ollama_routes(door: HttpDoor, read_json: Callable[[Any], Awaitable[dict]]) -> list:
    """The routes ``http_api.server`` mounts beside OpenAI's."""
    return OllamaApi(door, read_json).routes()
