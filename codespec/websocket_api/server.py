"""The websocket endpoint (`codespec serve --ws`): the same engine service as the language server.

One connection = one session: requests run concurrently (up to a per-connection limit), each
streams ``delta`` messages and ends with exactly one of ``done``, ``cancelled`` or ``error``. All
outgoing messages of a connection go through one writer task, so a request's deltas always
precede its final message. A bad message gets an ``error`` (with its id when it can be read) and
the connection stays open; a failure inside the server is an ``internal`` error for that request,
never the connection's end; a closed connection cancels its requests. Protocol: docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from codespec.core.errors import CodespecError
from codespec.service.doors.auth import Listen, refusal
from codespec.service.doors.logsafe import clip
from codespec.service.doors.predictions import DoorTokenizer
from codespec.service.engine.jobs import AsyncJob
from codespec.service.engine.service import EngineService
from codespec.service.requests.edit import edit_request, plan_text_edit
from codespec.service.requests.inline import completion_request, trim_completion
from codespec.service.requests.options import ServerOptions, WsLimits
from codespec.websocket_api.protocol import (
    CancelMessage,
    CompleteMessage,
    EditMessage,
    ProtocolError,
    StatsMessage,
    error_message,
    parse_message,
)

log = logging.getLogger(__name__)


class Session:
    """One client connection."""

    def __init__(
        self,
        connection,
        service: EngineService,
        options: ServerOptions,
        limits: WsLimits,
        tokenizer: DoorTokenizer | None = None,
    ) -> None:
        self.connection = connection
        self.service = service
        self.tokenizer = tokenizer or DoorTokenizer(service)  # counts prediction tokens (the HTTP door's way)
        self.options = options
        self.limits = limits
        self.jobs: dict[Any, AsyncJob | None] = {}  # request id -> job (None while being set up)
        self.cancel_early: set = set()  # ids cancelled while their job was being set up
        self.tasks: set[asyncio.Task] = set()
        self.outbox: asyncio.Queue = asyncio.Queue()

    async def run(self) -> None:
        import websockets

        writer = asyncio.create_task(self._write())
        try:
            async for raw in self.connection:
                self.dispatch(raw)
        except websockets.ConnectionClosed:
            pass  # the client left without a clean close (it crashed, the network dropped): not our error
        finally:
            for job in self.jobs.values():
                if job is not None:
                    job.cancel()
            for task in list(self.tasks):
                task.cancel()
            writer.cancel()

    def send(self, message: dict) -> None:
        self.outbox.put_nowait(message)

    async def _write(self) -> None:
        import websockets

        while True:
            message = await self.outbox.get()
            try:
                text = json.dumps(message)
            except (TypeError, ValueError) as error:  # must not end the writer: the connection would go deaf
                log.error("a websocket message could not be serialized: %s", clip(error))
                text = json.dumps(
                    error_message(
                        "internal",
                        f"the reply could not be serialized: {clip(error)}",
                        message.get("id") if isinstance(message, dict) else None,
                    )
                )
            try:
                await self.connection.send(text)
            except websockets.ConnectionClosed:
                return

    def dispatch(self, raw: str | bytes) -> None:
        try:
            message = parse_message(raw, self.limits.max_message_bytes)
        except ProtocolError as error:
            self.send(error_message(error.code, error.message, error.request_id))
            return
        except Exception as error:  # a bug in parsing: report it, keep the connection
            log.error(
                "could not parse a websocket message: %s", clip(f"{type(error).__name__}: {error}"), exc_info=True
            )
            self.send(error_message("internal", clip(f"{type(error).__name__}: {error}")))
            return
        try:
            self._route(message)
        except Exception as error:
            log.error(
                "websocket message %s failed: %s",
                clip(getattr(message, "id", None), 60),
                clip(f"{type(error).__name__}: {error}"),
                exc_info=True,
            )
            self.jobs.pop(getattr(message, "id", None), None)
            self.send(error_message("internal", clip(f"{type(error).__name__}: {error}"), getattr(message, "id", None)))

    def _route(self, message) -> None:
        if isinstance(message, CancelMessage):
            job = self.jobs.get(message.id)
            if message.id not in self.jobs:
                self.send(error_message("unknown_id", f"no request {message.id!r} is running", message.id))
            elif job is not None:
                job.cancel()  # the request itself answers with "cancelled"
            else:
                self.cancel_early.add(message.id)  # its job does not exist yet: cancel it on creation
            return
        if isinstance(message, StatsMessage):
            self._spawn(self._stats(message))
            return
        if message.id in self.jobs:
            self.send(error_message("duplicate_id", f"request {message.id!r} is still running", message.id))
            return
        if len(self.jobs) >= self.limits.max_in_flight:
            self.send(
                error_message(
                    "too_many_requests",
                    f"at most {self.limits.max_in_flight} requests may run at once on one connection",
                    message.id,
                )
            )
            return
        self.jobs[message.id] = None
        self._spawn(self._generate(message))

    def _spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _stats(self, message: StatsMessage) -> None:
        try:
            snapshot = await self.service.acall(self.service.stats_snapshot)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.error("websocket stats %s failed", clip(message.id, 60), exc_info=True)
            self.send(error_message("internal", clip(f"{type(error).__name__}: {error}"), message.id))
            return
        self.send({"type": "stats", "id": message.id, "stats": snapshot})

    async def _generate(self, message: CompleteMessage | EditMessage) -> None:
        request_id = message.id
        try:
            request, context = self._request(message)

            def on_delta(text: str) -> None:
                self.send({"type": "delta", "id": request_id, "text": text})

            job = AsyncJob(self.service, request, on_delta)
            self.jobs[request_id] = job
            if request_id in self.cancel_early:
                job.cancel()
            result = await job.result()
            text = trim_completion(result.text, context) if context is not None else result.text
            usage = result.usage.as_dict()
            accepted = rejected = 0  # as the HTTP door counts them: 0 without a prediction
            if message.prediction is not None:
                accepted, rejected = await self.tokenizer.prediction_counts(message.prediction, result.text)
            usage["accepted_prediction_tokens"], usage["rejected_prediction_tokens"] = accepted, rejected
            body = {
                "id": request_id,
                "text": text,
                "finish_reason": result.reason,
                "usage": usage,
                "speculation": result.speculation(),
                "stats": result.stats,
                "proposer": result.proposer,
            }
            self.send({"type": "cancelled" if result.reason == "cancelled" else "done", **body})
        except CodespecError as error:
            self.send(error_message("invalid_request", clip(str(error), 500), request_id))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # report, keep the connection and the server alive
            log.exception("websocket request %s failed", clip(request_id, 60))
            self.send(error_message("internal", clip(f"{type(error).__name__}: {error}", 500), request_id))
        finally:
            self.jobs.pop(request_id, None)
            self.cancel_early.discard(request_id)

    def _request(self, message: CompleteMessage | EditMessage):
        options = self.options
        key = f"ws:{message.path}" if message.path else None
        if isinstance(message, EditMessage):
            plan = plan_text_edit(
                message.text,
                message.instruction,
                message.prediction,
                message.sampling.max_tokens or options.completion.edit_tokens,
            )
            return edit_request(
                plan,
                sampling=message.sampling,
                cache_key=f"edit:{key}" if key else None,
                uri=message.path,
                edits=message.edits,
                origin="websocket",
            ), None
        return completion_request(
            message.prefix + message.suffix,
            len(message.prefix),
            options,
            self.service.target,
            invoked=True,
            uri=message.path,
            cache_key=key,
            reference=message.prediction,
            sampling=message.sampling,
            origin="websocket",
        )


async def start_ws_server(
    service: EngineService, listen: Listen, options: ServerOptions = ServerOptions(), limits: WsLimits = WsLimits()
):
    """Start serving; returns the websockets Server (``server.sockets[0].getsockname()`` has the port)."""
    token = listen.token
    from websockets.asyncio.server import serve

    from codespec.service.doors import logsafe

    logsafe.install()

    def process_request(connection, request):
        refused = refusal(request.path, request.headers, token, limits.allowed_origins)
        if refused is not None:
            status, reason = refused
            return connection.respond(status, reason)
        return None

    def process_response(connection, request, response):
        return None if response.status_code == 101 else json_refusal(response)

    tokenizer = DoorTokenizer(service)  # one private copy for every connection

    async def handler(connection) -> None:
        await Session(connection, service, options, limits, tokenizer).run()

    return await serve(
        handler,
        listen.host,
        listen.port,
        process_request=process_request,
        process_response=process_response,
        max_size=limits.max_frame_bytes,
        max_queue=64,
    )


HANDSHAKE_CODES = {401: "unauthorized", 403: "origin_not_allowed", 503: "unavailable"}


def json_refusal(response):
    """A refused handshake (a missing token, a foreign origin, a request that is not a websocket
    upgrade) as this door's JSON ``error`` message instead of the library's text/plain."""
    from websockets.datastructures import Headers
    from websockets.http11 import Response

    text = response.body.decode("utf-8", "replace").strip() or response.reason_phrase
    code = HANDSHAKE_CODES.get(response.status_code, "invalid_handshake")
    body = json.dumps(error_message(code, text)).encode()
    headers = Headers(
        [(name, value) for name, value in response.headers.raw_items() if name.lower() not in _BODY_HEADERS]
    )
    headers["Content-Type"] = "application/json"
    headers["Content-Length"] = str(len(body))
    return Response(response.status_code, response.reason_phrase, headers, body)


_BODY_HEADERS = {"content-type", "content-length"}


def bound_port(server) -> int:
    return server.sockets[0].getsockname()[1]
