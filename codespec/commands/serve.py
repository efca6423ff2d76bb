"""`codespec serve`: LSP over stdio or TCP, the websocket endpoint, the HTTP API, on one engine service.

Heavy imports (torch, transformers, pygls) happen inside ``run`` so `codespec --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import NoReturn

from codespec.core.config import SERVE_MAX_DRAFT
from codespec.core.prompts import FORMAT_NAMES
from codespec.service.requests.options import DEFAULT_MAX_BATCH, DEFAULT_MAX_CACHED_TOKENS


def model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="local model directory, cached hub id, FILE.gguf or ollama:NAME[:TAG] (default: the shipped model)",
    )
    parser.add_argument("--draft", default=None, help="draft model sharing the target's tokenizer")
    parser.add_argument(
        "--engine-url",
        default=None,
        metavar="URL",
        help="generate on a served engine's OpenAI-compatible API (vLLM: http://HOST:8000) instead of "
        "a local model; --model then names the engine's tokenizer (default: the shipped model's). "
        "An API key for it is read from CODESPEC_ENGINE_API_KEY",
    )
    parser.add_argument("--engine-model", default=None, help="the engine's model name (default: the first it serves)")
    parser.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), or a torch device")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--prompt-format",
        default="auto",
        choices=("auto", *FORMAT_NAMES),
        help="how the model spells fill-in-the-middle and rewrites (default: detected from "
        "its tokenizer's special tokens; plain = no FIM tokens)",
    )
    parser.add_argument(
        "--proposer", default="auto", help="auto (policy), context, index, reference, draft, early-exit, or none"
    )
    parser.add_argument(
        "--max-draft",
        type=int,
        default=SERVE_MAX_DRAFT,
        help=f"K: most draft tokens verified per forward (default {SERVE_MAX_DRAFT})",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch, or llama.cpp for a GGUF model (default: half the cores for torch, every core for llama.cpp; at most 8)",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        help=f"requests decoding at once, verified in one forward per step (default {DEFAULT_MAX_BATCH}; "
        "more wait in order)",
    )
    parser.add_argument(
        "--max-cached-tokens",
        type=int,
        default=DEFAULT_MAX_CACHED_TOKENS,
        help="KV cache positions the requests decoding at once may hold together "
        f"(default {DEFAULT_MAX_CACHED_TOKENS})",
    )


def add_serve_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="language server (stdio; --tcp), websocket endpoint (--ws), OpenAI-compatible HTTP API (--http)",
        description="Serve completions and edits. Default: LSP over stdio (editors launch this). "
        "--ws: the websocket protocol of docs/protocol.md; --http: the OpenAI-compatible HTTP API of "
        "docs/http.md (both: token required, loopback only by default). --ws and --http combine with "
        "each other and with the LSP (--stdio or --tcp): one process, one model, one index.",
    )
    model_arguments(parser)
    lsp = parser.add_mutually_exclusive_group()
    lsp.add_argument(
        "--stdio",
        action="store_true",
        help="LSP over stdio (the default without --ws / --http; accepted because LSP clients such "
        "as vscode-languageclient pass it; with --ws / --http it runs the LSP beside them)",
    )
    lsp.add_argument("--tcp", action="store_true", help="LSP over TCP instead of stdio")
    # Transports other LSP clients may ask for: refused with a message instead of argparse's usage line.
    for flag in ("--node-ipc", "--pipe", "--socket"):
        lsp.add_argument(flag, nargs="?", const=True, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ws", action="store_true", help="websocket endpoint (docs/protocol.md)")
    parser.add_argument("--http", action="store_true", help="OpenAI-compatible HTTP API (docs/http.md)")
    parser.add_argument(
        "--clientProcessId",
        "--client-process-id",
        dest="client_process_id",
        type=int,
        default=None,
        metavar="PID",
        help="the editor's process id (LSP clients pass it): the server exits when it is gone",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="port of the one network endpoint asked for (--http default 8000, --ws 8765, "
        "--tcp 2087; 0 = any free port)",
    )
    parser.add_argument("--http-port", type=int, default=None, help="--http port when several endpoints run")
    parser.add_argument("--ws-port", type=int, default=None, help="--ws port when several endpoints run")
    parser.add_argument(
        "--token", default=None, help="--ws / --http token (default: $CODESPEC_TOKEN, else generated into a 0600 file)"
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="the token's file: its token is reused by every later serve; created 0600 with a new token "
        "when absent (default: $XDG_RUNTIME_DIR/codespec-ws-token, else ~/.cache/codespec/codespec-ws-token)",
    )
    parser.add_argument(
        "--new-token",
        action="store_true",
        help="replace the token file's token with a new one (written once the server listens)",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        help="browser Origin allowed to call --ws / --http (repeatable; none by default)",
    )
    parser.add_argument("--max-message-bytes", type=int, default=1 << 20)
    parser.add_argument("--max-in-flight", type=int, default=4, help="concurrent requests per --ws connection")
    parser.add_argument(
        "--quiet", action="store_true", help="no log line per request on stderr (warnings and errors still)"
    )
    parser.add_argument(
        "--http-max-body-bytes",
        type=int,
        default=4 << 20,
        help="--http: largest request body (default 4 MiB; larger: 413)",
    )
    parser.add_argument(
        "--http-max-requests",
        type=int,
        default=64,
        help="--http: generations in flight, decoding or waiting for the batch (default 64; one more: 429)",
    )
    parser.add_argument(
        "--http-any-model",
        action="store_true",
        help="--http: serve every model name with the loaded model (default: an unknown name is a 404; "
        "the loaded model's name and 'codespec' are served)",
    )
    parser.add_argument(
        "--workspace",
        type=Path,
        action="append",
        default=[],
        help="--ws / --http without the LSP: folder to index at start (repeatable; the LSP "
        "indexes its editor's workspace folders)",
    )
    parser.add_argument(
        "--index-max-tokens",
        type=int,
        default=None,
        help="resident tokens the index keeps before evicting least recently used documents "
        "(about 26 bytes each; default 32 M; clients may set index.maxTokens)",
    )
    parser.set_defaults(run=run_serve)


def unsupported_transport(args) -> str | None:
    """The message for a transport flag codespec does not speak, or None."""
    for flag in ("node_ipc", "pipe", "socket"):
        if getattr(args, flag, None) is not None:
            return (
                f"--{flag.replace('_', '-')}: codespec serve speaks LSP over stdio (the default, "
                f"or --stdio) or --tcp; configure the client's transport as stdio"
            )
    return None


@dataclasses.dataclass(frozen=True)
class Endpoints:
    """What one `codespec serve` runs: the LSP (stdio or TCP) and the network endpoints, with ports."""

    lsp: str | None  # "stdio" | "tcp" | None
    tcp_port: int
    ws_port: int | None  # None: no websocket endpoint
    http_port: int | None  # None: no HTTP API


def engine_options(args):
    """The engine options of the flags ``model_arguments`` adds (``serve`` and ``complete``)."""
    from codespec.service.requests.options import EngineOptions

    return EngineOptions(
        model=args.model,
        draft=args.draft,
        device=args.device,
        dtype=args.dtype,
        prompt_format=args.prompt_format,
        proposer=args.proposer,
        max_draft=args.max_draft,
        threads=args.threads,
        max_batch=args.max_batch,
        max_cached_tokens=args.max_cached_tokens,
        engine_url=args.engine_url,
        engine_model=args.engine_model,
    )


def plan_endpoints(args) -> Endpoints:
    from codespec.core.errors import CodespecError

    lsp = "tcp" if args.tcp else "stdio" if (args.stdio or not (args.ws or args.http)) else None
    network = [name for name, wanted in (("--tcp", lsp == "tcp"), ("--ws", args.ws), ("--http", args.http)) if wanted]
    if args.port is not None and len(network) > 1:
        raise CodespecError(
            f"--port is ambiguous with {' and '.join(network)}: use --http-port / --ws-port "
            f"(--tcp then listens on 2087)"
        )
    if args.port is not None and not network:
        raise CodespecError("--port needs --tcp, --ws or --http")
    port = args.port

    def pick(explicit, default):
        chosen = explicit if explicit is not None else port if port is not None else default
        if not 0 <= chosen <= 65535:
            raise CodespecError(f"port {chosen} is out of range")
        return chosen

    return Endpoints(
        lsp,
        pick(None, 2087) if lsp == "tcp" else 2087,
        pick(args.ws_port, 8765) if args.ws else None,
        pick(args.http_port, 8000) if args.http else None,
    )


def run_serve(args) -> int:
    from codespec.core.errors import CodespecError
    from codespec.service.requests.options import ServerOptions

    refused = unsupported_transport(args)
    if refused:
        raise CodespecError(refused)
    from codespec.service.doors import logsafe

    if args.quiet:
        logsafe.quiet_requests()
    logsafe.install()  # warnings, errors and the line per request, on stderr, for every door
    endpoints = plan_endpoints(args)
    if args.http_max_body_bytes < 1 or args.http_max_requests < 1:
        raise CodespecError("--http-max-body-bytes and --http-max-requests must be >= 1")
    if args.client_process_id is not None:
        from codespec.lsp.parent import exit_when_gone

        exit_when_gone(args.client_process_id)

    if args.index_max_tokens is not None and args.index_max_tokens < 1:
        raise CodespecError(f"--index-max-tokens must be >= 1, got {args.index_max_tokens}")
    options = ServerOptions(engine=engine_options(args))
    if args.index_max_tokens is not None:
        options = options.replace(index_max_tokens=args.index_max_tokens)
    if endpoints.lsp is None:  # network endpoints only: one event loop here
        import asyncio

        exit_at_once(asyncio.run(_serve_network(args, options, endpoints)))
    if endpoints.ws_port is None and endpoints.http_port is None:
        return _serve_lsp(args, options, endpoints)
    return _serve_lsp_and_network(args, options, endpoints)


def _serve_lsp(args, options, endpoints: Endpoints) -> int:
    from codespec.lsp.server import build_server

    server = build_server(options)
    if endpoints.lsp == "tcp":
        from codespec.lsp.tcp import start_tcp

        print(f"codespec: LSP on tcp://{args.host}:{endpoints.tcp_port}", file=sys.stderr)
        start_tcp(server, args.host, endpoints.tcp_port)  # refuses HTTP (a web page) on the port, unlike pygls's own
    else:
        server.start_io()
    return 0


def _serve_lsp_and_network(args, options, endpoints: Endpoints) -> int:
    """The LSP on this thread, the websocket / HTTP endpoints on an event loop thread, one service:
    loaded now from the command line and shared, so the LSP's initialize takes it instead of
    loading a second model (service.runtime.share_service)."""
    from codespec.service.engine.runtime import LoopThread, close_service, load_service, share_service

    service = load_service(options)
    share_service(service, options)
    loop = LoopThread()
    servers: list = []
    try:
        servers = loop.run(_start_network(args, options, endpoints, service, index=False))
        _serve_lsp(args, options, endpoints)  # returns (or raises SystemExit) at the LSP's exit
    finally:
        try:
            loop.run(_stop_network(servers), timeout=30)
        finally:
            loop.stop()
            close_service(service)
    return 0


async def _start_network(args, options, endpoints: Endpoints, service, index: bool) -> list:
    """Start the websocket and HTTP endpoints on the running loop; returns what to stop. The token
    file is written (when its token is new) only once every endpoint listens."""
    from codespec.service.doors.auth import resolve_token

    source = resolve_token(args.token, args.token_file, new=getattr(args, "new_token", False))
    if index and args.workspace:
        import asyncio

        from codespec.service.engine.indexing import index_folders

        await asyncio.to_thread(index_folders, service, args.workspace, options)
    servers: list = []
    listening: list[str] = []  # said once every endpoint listens and the token file is written
    try:
        await _start_endpoints(args, options, endpoints, service, source, servers, listening)
    except BaseException:
        await _stop_network(servers)  # the ones that started (a later port was in use)
        raise
    source.keep()  # every endpoint listens: only now may a new token replace the file's
    for line in listening:
        print(line, file=sys.stderr, flush=True)
    return servers


async def _start_endpoints(
    args, options, endpoints: Endpoints, service, source, servers: list, listening: list
) -> None:
    """Start each endpoint asked for, appending it to ``servers`` and its line to ``listening``."""
    from codespec.service.doors.auth import Listen

    where = source.describe()
    if endpoints.ws_port is not None:
        from codespec.service.requests.options import WsLimits
        from codespec.websocket_api.server import bound_port, start_ws_server

        ws_limits = WsLimits(
            max_message_bytes=args.max_message_bytes,
            max_in_flight=args.max_in_flight,
            allowed_origins=tuple(args.allow_origin),
        )
        ws = await start_ws_server(service, Listen(source.token, args.host, endpoints.ws_port), options, ws_limits)
        servers.append(ws)
        listening.append(f"codespec: websocket on ws://{_url_host(args.host)}:{bound_port(ws)}/  token {where}")
    if endpoints.http_port is not None:
        from codespec.http_api import start_http_server
        from codespec.service.requests.options import HttpLimits

        http_limits = HttpLimits(
            max_body_bytes=args.http_max_body_bytes,
            max_requests=args.http_max_requests,
            allowed_origins=tuple(args.allow_origin),
            any_model=args.http_any_model,
        )
        http = await start_http_server(
            service,
            Listen(source.token, args.host, endpoints.http_port),
            options,
            http_limits,
            draft=_draft_name(options),
        )
        servers.append(http)
        listening.append(f"codespec: HTTP API on http://{_url_host(args.host)}:{http.port}/v1  token {where}")


async def _stop_network(servers: list) -> None:
    from codespec.http_api.server import HttpServer

    for server in servers:
        if isinstance(server, HttpServer):
            await server.stop()
        else:
            server.close()
            await server.wait_closed()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _draft_name(options) -> str | None:
    """The draft model /v1/models lists: the one named, else the shipped one beside the shipped target."""
    if options.engine.draft:
        return options.engine.draft
    if options.engine.model is None and options.engine.proposer in ("auto", "draft"):
        from codespec.core.default_model import draft_path

        return str(draft_path()) if draft_path().is_dir() else None
    return None


async def _serve_network(args, options, endpoints: Endpoints) -> int:
    import asyncio
    import signal

    from codespec.service.engine.runtime import close_service, start_service

    service = await asyncio.to_thread(start_service, options)
    try:
        servers = await _start_network(args, options, endpoints, service, index=True)
        stop = asyncio.Event()
        received: list[str] = []
        loop = asyncio.get_running_loop()

        def on_signal(signum: signal.Signals) -> None:
            received.append(signum.name)
            stop.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal, signum)
        await stop.wait()
        started = time.monotonic()
        print(
            f"codespec: stopping ({received[0]}): closing the endpoints and their connections, then the index",
            file=sys.stderr,
            flush=True,
        )
        await _stop_network(servers)
    finally:
        await asyncio.to_thread(close_service, service)
    print(f"codespec: stopped in {(time.monotonic() - started) * 1e3:.0f} ms", file=sys.stderr, flush=True)
    return 0


def exit_at_once(status: int) -> NoReturn:
    """End the process once a server has stopped cleanly (endpoints closed, index flushed and
    closed): the interpreter's own teardown (torch's and transformers' modules) takes seconds on a
    small machine and does nothing a stopped server needs, so skip it, as servers' workers do."""
    import logging
    import os

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
