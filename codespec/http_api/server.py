"""The OpenAI-compatible HTTP API (`codespec serve --http`): Starlette on uvicorn, one engine service.

Endpoints (docs/http.md): ``GET /v1/models``, ``POST /v1/completions`` (a plain continuation of
``prompt``, or fill-in-the-middle with ``suffix``), ``POST /v1/chat/completions`` (``prediction``
is the reference draft: OpenAI's Predicted Outputs). Every request is one engine job
(``http_api.routes``); the service runs all jobs of every door (LSP, websocket, HTTP) round-robin,
one decode cycle each, so a long chat request delays a short completion by one cycle at most.

Security as the websocket endpoint's (``service.auth``): loopback by default, ``Authorization:
Bearer TOKEN`` on every request, a browser ``Origin`` not on the allow-list refused with 403 (so a
web page cannot drive the server), a body limit (413) and a limit on running generations (429).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from codespec.core.errors import CodespecError
from codespec.http_api.llama_server import llama_routes
from codespec.http_api.ollama import ollama_routes
from codespec.http_api.routes import HttpDoor, OpenAiApi, send_json
from codespec.http_api.schema import ApiError, error_body
from codespec.service.doors.auth import Listen, presented_token
from codespec.service.engine.service import EngineService
from codespec.service.requests.options import HttpLimits, ServerOptions

__all__ = ["HttpLimits", "HttpServer", "build_app", "start_http_server"]

log = logging.getLogger(__name__)


# ---- the app ----------------------------------------------------------------------------------
class Guard:
    """ASGI middleware: a foreign browser Origin gets 403, a missing or wrong token 401, before
    any route runs. An allowed origin's CORS preflight is answered here (it carries no token)."""

    def __init__(self, app, token: str, allowed_origins: tuple[str, ...]) -> None:
        self.app = app
        self.token = token.encode()
        self.allowed = allowed_origins
        self.door: HttpDoor | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        origin = headers.get("origin")
        if origin is not None and origin not in self.allowed:
            await send_json(
                send,
                403,
                guard_error(
                    scope["path"], f"origin {origin!r} is not allowed (see --allow-origin)", "origin_not_allowed"
                ),
            )
            return
        cors = {} if origin is None else {"access-control-allow-origin": origin, "vary": "Origin"}
        if origin is not None and scope["method"] == "OPTIONS":
            await send(
                {
                    "type": "http.response.start",
                    "status": 204,
                    "headers": [
                        (key.encode(), value.encode())
                        for key, value in {
                            **cors,
                            "access-control-allow-methods": "GET, POST, OPTIONS",
                            "access-control-allow-headers": "Authorization, Content-Type",
                            "access-control-max-age": "600",
                        }.items()
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        offered = presented_token("", headers.get("authorization"))  # the header only: no token in URLs
        if offered is None or not hmac.compare_digest(offered.encode(), self.token):
            message = (
                "missing token: send Authorization: Bearer TOKEN"
                if offered is None
                else "wrong token (Authorization: Bearer TOKEN)"
            )
            await send_json(
                send,
                401,
                guard_error(scope["path"], message, "invalid_api_key"),
                {**cors, "www-authenticate": "Bearer"},
            )
            return
        if not cors:
            await self.app(scope, receive, send)
            return
        extra = [(key.encode(), value.encode()) for key, value in cors.items()]

        async def send_with_cors(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


def guard_error(path: str, message: str, code: str) -> dict:
    """The guard's refusal in the error shape of the API the path belongs to: Ollama's clients
    read ``{"error": "..."}``; OpenAI's and llama.cpp server's clients read ``error.message``."""
    if path == "/api" or path.startswith("/api/"):
        return {"error": message}
    return error_body(message, "invalid_request_error", None, code)


def build_app(
    service: EngineService,
    token: str,
    options: ServerOptions = ServerOptions(),
    limits: HttpLimits = HttpLimits(),
    draft: str | None = None,
):
    """The ASGI app (Starlette behind :class:`Guard`)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse

    door = HttpDoor(service, options, limits, draft)

    async def api_error(request: Request, error: ApiError):
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    async def http_error(request: Request, error: HTTPException):
        codes = {404: "not_found", 405: "method_not_allowed"}
        message = (
            f"no route {request.method} {request.url.path}"
            if error.status_code == 404
            else f"{request.method} is not allowed on {request.url.path}"
            if error.status_code == 405
            else str(error.detail)
        )
        return JSONResponse(
            error_body(message, "invalid_request_error", None, codes.get(error.status_code)),
            status_code=error.status_code,
            headers=error.headers,
        )

    async def gone(request: Request, error: ClientDisconnect):
        return JSONResponse(error_body("the client went away", "invalid_request_error"), status_code=400)

    async def internal(request: Request, error: Exception):
        log.error("HTTP request failed", exc_info=error)
        return JSONResponse(
            error_body(f"internal error ({type(error).__name__}); see the server log", "server_error"), status_code=500
        )

    # each handler takes the exception it is registered for (Starlette types them all as Exception)
    handlers: dict[Any, Callable[..., Any]] = {
        ApiError: api_error,
        HTTPException: http_error,
        ClientDisconnect: gone,
        Exception: internal,
    }
    app = Starlette(
        routes=[
            *OpenAiApi(door).routes(),  # /v1/models, /v1/completions, /v1/chat/completions (http_api.routes)
            *ollama_routes(door, door.read_json),  # Ollama's API: /api/generate, /api/chat, ... (http_api.ollama)
            *llama_routes(door, door.read_json),  # llama.cpp server's API (llama.vim, llama.vscode)
        ],
        exception_handlers=handlers,
    )
    guard = Guard(app, token, limits.allowed_origins)
    guard.door = door
    return guard


class HttpServer:
    """uvicorn serving the app on a socket bound up front (a busy port is a clear error, and port
    0 gets a free one), on the running event loop."""

    def __init__(self, app, sock: socket.socket) -> None:
        import uvicorn

        from codespec.http_api.uvicorn_adapter import JsonErrorsH11Protocol

        self.socket = sock
        self.port = sock.getsockname()[1]
        self.door: HttpDoor | None = getattr(app, "door", None)
        config = uvicorn.Config(
            app,
            http=JsonErrorsH11Protocol,  # h11, with this door's JSON body for malformed HTTP
            ws="none",
            lifespan="off",
            log_level="warning",
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=5,
        )
        self.server = uvicorn.Server(config)
        self.task: asyncio.Task | None = None

    async def start(self, timeout_s: float = 30.0) -> None:
        self.task = asyncio.create_task(self.server.serve(sockets=[self.socket]))
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if self.task.done():
                self.task.result()
                raise CodespecError("the HTTP server stopped while starting")
            if time.monotonic() > deadline:
                raise CodespecError("the HTTP server did not start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await self.task
        self.socket.close()


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto
    # says TCP, and with Nagle on, a response's body waits ~40 ms behind its headers (delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise CodespecError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    sock.set_inheritable(True)
    return sock


async def start_http_server(
    service: EngineService,
    listen: Listen,
    options: ServerOptions = ServerOptions(),
    limits: HttpLimits = HttpLimits(),
    draft: str | None = None,
) -> HttpServer:
    """Serve the API on ``listen``'s host and port (0: any free port; ``server.port`` says which)."""
    server = HttpServer(build_app(service, listen.token, options, limits, draft), bind(listen.host, listen.port))
    await server.start()
    return server
