"""What one HTTP request does with the engine (``http_api.server`` routes to it): the OpenAI handlers
(:class:`OpenAiApi`), the request they build, the generation it streams or answers, the prediction
tokens it counts.

:class:`HttpDoor` builds engine requests with the service's request builders (the ones every door uses) and
holds the count of running generations. :class:`Generation` is the response, an ASGI app of its
own: it listens for the client's ``http.disconnect`` while the job runs (a client that goes away
cancels its job, which stops at its next cycle), and a streamed response's headers wait for the
first text (or the end), so an error the engine finds at its first cycle (a prompt longer than
the context) is still a plain 400.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from codespec.core.errors import CodespecError, ContextLengthError, InvalidRequestError, ServiceClosedError
from codespec.core.finish import FinishReason
from codespec.core.next_edit_prompts import zeta_edits, zeta_excerpt
from codespec.http_api.bodies import BODIES_IN_FLIGHT, BodyBudget
from codespec.http_api.bodies import read_json as read_body
from codespec.http_api.schema import (
    ALIAS,
    COMPLETION_DEFAULT_MAX_TOKENS,
    ApiError,
    ChatBody,
    CompletionBody,
    Envelope,
    chat_response,
    completion_response,
    error_body,
    json_text,
    models_response,
    new_id,
    parse_chat,
    parse_completion,
    rewrite_parts,
    sse,
    text_chunk,
    usage_body,
    usage_chunk,
)
from codespec.service.doors.predictions import DoorTokenizer
from codespec.service.engine.jobs import AsyncJob, JobResult
from codespec.service.engine.service import EngineService
from codespec.service.requests.edit import edit_request, plan_text_edit
from codespec.service.requests.inline import completion_request
from codespec.service.requests.options import HttpLimits, ServerOptions
from codespec.service.requests.schema import GenerationRequest, prompt_request

log = logging.getLogger(__name__)
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class HttpDoor:
    """The engine service as the HTTP handlers see it: request building, prediction counting,
    the count of running generations."""

    def __init__(
        self, service: EngineService, options: ServerOptions, limits: HttpLimits, draft: str | None = None
    ) -> None:
        self.service = service
        self.options = options
        self.limits = limits
        self.model_id = str(getattr(service.target, "name", "") or "codespec")
        self.draft_id = draft
        self.created = int(time.time())
        self.running = 0
        self.budget = BodyBudget(BODIES_IN_FLIGHT * limits.max_body_bytes)  # all bodies being read at once
        self.tokenizer = DoorTokenizer(service)  # the door's own copy, used off the event loop

    # ---- requests ---------------------------------------------------------------------------
    async def read_json(self, request) -> dict:
        """A request's body as a JSON object, within the body limit and the budget of all bodies."""
        return await read_body(request, self.limits.max_body_bytes, self.budget)

    def served_models(self) -> tuple[str, ...]:
        """The ``model`` names a request may ask for: the loaded target and the ``codespec`` alias."""
        return tuple(dict.fromkeys([self.model_id, ALIAS]))

    def check_model(self, name: str | None) -> None:
        """A name this server does not serve is OpenAI's 404 ``model_not_found`` (unless ``any_model``)."""
        if name is None or self.limits.any_model or name in self.served_models():
            return
        served = ", ".join(repr(served) for served in self.served_models())
        draft = f"; {self.draft_id!r} is the draft model, which only drafts" if name == self.draft_id else ""
        raise ApiError(
            404,
            f"the model {name!r} is not served here (served: {served}{draft}); "
            "start the server with --http-any-model to serve every name with the loaded model",
            "model",
            "model_not_found",
        )

    def completion(self, body: CompletionBody) -> GenerationRequest:
        """``suffix`` given: fill-in-the-middle over the model's FIM format, windowed around the
        cursor as the editors' completions are. No suffix: ``prompt`` is sent as it is (OpenAI's
        plain continuation; an editor that renders its own FIM prompt, as Zed does, gets exactly
        that prompt)."""
        call, sampling = body.call, body.call.sampling
        self.check_model(call.model)
        key = f"http:{call.path}" if call.path else None
        if body.suffix is None:
            budget = sampling.max_tokens or COMPLETION_DEFAULT_MAX_TOKENS
            excerpt = zeta_excerpt(body.prompt) if body.prediction is None else None
            if excerpt is not None:
                # A next-edit prompt (Zed's Zeta layout): the answer rewrites the excerpt, so the
                # excerpt is the draft and the diffs it shows are the edits to repeat (docs/next-edit.md)
                return prompt_request(
                    body.prompt,
                    budget,
                    chat=True,
                    sampling=sampling,
                    reference=excerpt,
                    edits=call.edits or zeta_edits(body.prompt),
                    cache_key=key,
                    uri=call.path,
                    origin="http",
                )
            return prompt_request(
                body.prompt,
                budget,
                sampling=sampling,
                reference=body.prediction,
                edits=call.edits,
                cache_key=key,
                uri=call.path,
                origin="http",
            )
        request, _ = completion_request(
            body.prompt + body.suffix,
            len(body.prompt),
            self.options,
            self.service.target,
            invoked=True,
            uri=call.path,
            cache_key=key,
            reference=body.prediction,
            sampling=sampling,
            deadline=False,
            origin="http",
        )
        return request

    async def chat(self, body: ChatBody) -> GenerationRequest:
        """With a chat template: ``messages`` rendered by it, sent as they are. Without one:
        codespec's rewrite format over the last user message's fenced code block."""
        call, sampling = body.call, body.call.sampling
        self.check_model(call.model)
        key = f"http-chat:{call.path}" if call.path else None
        max_tokens = sampling.max_tokens or self.service.target.max_context  # the service caps it at the context
        if self.service.prompts.chat:
            prompt = await self._render_chat(body.messages)
            return prompt_request(
                prompt,
                max_tokens,
                chat=True,
                sampling=sampling,
                reference=body.prediction,
                edits=call.edits,
                cache_key=key,
                uri=call.path,
                origin="http",
            )
        region, instruction = rewrite_parts(body.messages, body.prediction)
        plan = plan_text_edit(region, instruction, body.prediction, max_tokens)
        return edit_request(
            plan, sampling=sampling, cache_key=key, uri=call.path, whole_budget=True, edits=call.edits, origin="http"
        )

    async def _render_chat(self, messages) -> str:
        def render(tokenizer) -> str | Exception:
            try:
                return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
            except Exception as error:  # the template refuses these messages (roles, order)
                return error

        rendered = await self.tokenizer.run(render)
        if isinstance(rendered, Exception):
            raise ApiError(
                400, f"the model's chat template refused these messages: {rendered}", "messages", "invalid_value"
            )
        return rendered

    async def prediction_tokens(self, prediction: str, text: str) -> tuple[int, int]:
        """(accepted, rejected) as OpenAI defines them: the prediction's tokens that appear in the
        completion (aligned in order, as a diff aligns them), and those that do not."""
        return await self.tokenizer.prediction_counts(prediction, text)

    def check_fits(self, request: GenerationRequest, prompt_param: str) -> None:
        """A request that surely cannot fit the context is a 400 now (lengths only, no tokenizing),
        before it counts as running or waits for anything; ``prompt_param``: the endpoint's prompt field."""
        refusal = self.service.refusal(request)
        if refusal is not None:
            param = "prediction" if refusal.field == "reference" else prompt_param
            raise ApiError(400, refusal.message, param, "context_length_exceeded")

    # ---- the limit on running generations ---------------------------------------------------
    def acquire(self) -> None:
        if self.running >= self.limits.max_requests:
            raise ApiError(
                429,
                f"{self.running} requests are running, the most this server takes at once "
                f"(--http-max-requests); retry shortly",
                None,
                "rate_limit_exceeded",
                kind="rate_limit_error",
                headers={"retry-after": "1"},
            )
        self.running += 1

    def release(self) -> None:
        self.running -= 1


class OpenAiApi:
    """The OpenAI handlers over one :class:`HttpDoor`: read the body, build the engine request,
    answer with a :class:`Generation`."""

    def __init__(self, door: HttpDoor) -> None:
        self.door = door

    def routes(self) -> list:
        from starlette.routing import Route

        return [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
        ]

    async def models(self, request):
        from starlette.responses import JSONResponse

        door = self.door
        return JSONResponse(models_response(door.model_id, door.draft_id, door.created))

    async def completions(self, request):
        body = parse_completion(await self.door.read_json(request))
        return self.generation(self.door.completion(body), body, "prompt", "cmpl", "text_completion")

    async def chat_completions(self, request):
        body = parse_chat(await self.door.read_json(request))
        return self.generation(await self.door.chat(body), body, "messages", "chatcmpl", "chat.completion")

    def generation(self, generation, body, field: str, id_prefix: str, kind: str) -> Generation:
        """The job that answers ``body``: refused at once when its prompt (``field``) cannot fit, before
        it counts as running (never a 429), then given its place in the door."""
        door = self.door
        door.check_fits(generation, field)
        door.acquire()
        envelope = Envelope(new_id(id_prefix), door.model_id, kind)
        return Generation(door, generation, envelope, body.call.stream, body.call.include_usage, body.prediction)


class JobRun:
    """One engine job answered over HTTP, as an ASGI app of its own (so it hears the client leave
    while the engine works): started (a 503 when the service is closed), answered by the subclass's
    ``answer``, cancelled when it ends early or the client goes away, and its place released.
    Each API (OpenAI, llama.cpp server, Ollama) writes only ``answer`` and ``unavailable``."""

    door: HttpDoor
    request: GenerationRequest

    def on_delta(self, deltas: asyncio.Queue) -> Callable[[str], None]:
        """What receives each text delta (on the event loop): the queue ``answer`` reads."""
        return deltas.put_nowait

    async def unavailable(self, send, error: CodespecError) -> None:
        await send_json(send, 503, error_body(str(error), "server_error", None, "unavailable"))

    async def answer(
        self, send, job: AsyncJob, deltas: asyncio.Queue, result: asyncio.Future, gone: asyncio.Future
    ) -> None:
        raise NotImplementedError

    async def __call__(self, scope, receive, send) -> None:
        deltas: asyncio.Queue = asyncio.Queue()
        try:
            job = AsyncJob(self.door.service, self.request, self.on_delta(deltas))
        except CodespecError as error:  # the service is closed
            self.door.release()
            await self.unavailable(send, error)
            return
        result = asyncio.ensure_future(job.result())
        result.add_done_callback(lambda _: deltas.put_nowait(None))  # after every delta (same loop queue)
        gone = asyncio.ensure_future(disconnected(receive))
        try:
            await self.answer(send, job, deltas, result, gone)
        except OSError:  # the client went away while we were sending
            pass
        finally:
            if not result.done():
                job.cancel()  # stops at the job's next cycle
                await asyncio.wait({result})
            gone.cancel()
            self.door.release()


class Generation(JobRun):
    """One generation, sent as JSON or as server-sent events (an ASGI app of its own, so it can
    listen for the client's disconnect while the engine works)."""

    def __init__(
        self,
        door: HttpDoor,
        request: GenerationRequest,
        envelope: Envelope,
        stream: bool,
        include_usage: bool,
        prediction: str | None,
    ) -> None:
        self.door = door
        self.request = request
        self.envelope = envelope
        self.stream = stream
        self.include_usage = include_usage
        self.prediction = prediction
        self.prompt_param = (
            "prompt" if envelope.object == "text_completion" else "messages"
        )  # where a prompt error points
        self._role_sent = False

    async def answer(self, send, job, deltas: asyncio.Queue, result: asyncio.Future, gone: asyncio.Future) -> None:
        if self.stream:
            await self._stream(send, deltas, result, gone)
        else:
            await self._respond(send, result, gone)

    async def _respond(self, send, result: asyncio.Future, gone: asyncio.Future) -> None:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not result.done():
            return  # the client is gone; the finally cancels the job
        failure = job_failure(result, self.prompt_param)
        if failure is not None:
            await send_json(send, failure.status, failure.body())
            return
        job_result = result.result()
        usage, extra = await self._usage(job_result)
        build = completion_response if self.envelope.object == "text_completion" else chat_response
        await send_json(send, 200, build(self.envelope, job_result.text, job_result.reason, usage, extra))

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
            while True:  # everything already there goes out as one chunk
                if item is None:
                    ended = True
                    break
                texts.append(item)
                if deltas.empty():
                    break
                item = deltas.get_nowait()
            if ended and not started:
                failure = job_failure(result, self.prompt_param)
                if failure is not None:
                    await send_json(send, failure.status, failure.body())
                    return
            if not started:
                await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                started = True
            text = "".join(texts)
            if text:
                await send({"type": "http.response.body", "body": sse(self._chunk(text)), "more_body": True})
            if ended:
                await self._finish_stream(send, result)
                return

    def _chunk(self, text: str) -> dict:
        first, self._role_sent = not self._role_sent, True  # a chat stream's first chunk names the role
        return text_chunk(self.envelope, text, first=first)

    async def _finish_stream(self, send, result: asyncio.Future) -> None:
        failure = job_failure(result, self.prompt_param)
        body = b""
        if failure is not None:
            body += sse(failure.body())
        else:
            job_result = result.result()
            if not self._role_sent and self.envelope.object != "text_completion":
                body += sse(self._chunk(""))
            body += sse(text_chunk(self.envelope, "", job_result.reason))
            if self.include_usage:
                usage, extra = await self._usage(job_result)
                body += sse(usage_chunk(self.envelope, usage, extra))
        body += sse("[DONE]")
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _usage(self, job_result: JobResult) -> tuple[dict, dict]:
        accepted = rejected = None
        if self.prediction is not None:
            accepted, rejected = await self.door.prediction_tokens(self.prediction, job_result.text)
        usage = usage_body(job_result.usage, accepted, rejected)
        extra = {
            "finish_reason": job_result.reason,
            "proposer": job_result.proposer,
            # Every drafted token, whatever proposed it (context lookup, the index, a draft model, the
            # prediction); usage.completion_tokens_details counts the prediction's alone (docs/http.md).
            "speculation": job_result.speculation(),
            "stats": job_result.stats,
        }
        return usage, extra


def job_failure(result: asyncio.Future, prompt_param: str) -> ApiError | None:
    """The error response for a job that failed, or that was cancelled while its client still
    waits (the service is shutting down); None: it succeeded. ``prompt_param``: the endpoint's
    field that holds the prompt (``prompt`` or ``messages``), which a prompt error names. The one
    mapping from the engine's typed errors to a status and code; each API dresses it in its shape."""
    error = result.exception()
    if error is None:
        if result.result().reason == FinishReason.CANCELLED:
            return ApiError(
                503, "the server is shutting down; the request was cancelled", None, "unavailable", kind="server_error"
            )
        return None
    if isinstance(error, InvalidRequestError):
        code = "context_length_exceeded" if isinstance(error, ContextLengthError) else "invalid_value"
        return ApiError(400, str(error), prompt_param, code)
    if isinstance(error, CodespecError):
        return ApiError(
            503 if isinstance(error, ServiceClosedError) else 500, str(error), None, None, kind="server_error"
        )
    log.error("HTTP generation failed", exc_info=error)
    return ApiError(
        500, f"internal error ({type(error).__name__}); see the server log", None, None, kind="server_error"
    )


async def disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def send_json(send, status: int, body: dict, headers: dict | None = None) -> None:
    payload = json_text(body).encode()
    extra = [(key.encode(), value.encode()) for key, value in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*JSON_HEADERS, (b"content-length", str(len(payload)).encode()), *extra],
        }
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})
