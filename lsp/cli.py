"""`codespec serve` (LSP over stdio or TCP, or the websocket endpoint) and `codespec complete`.

Heavy imports (torch, transformers, pygls) happen inside ``run`` so `codespec --help` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from codespec.prompts import FORMAT_NAMES


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="local model directory or cached hub id (default: the shipped model)")
    parser.add_argument("--draft", default=None, help="draft model sharing the target's tokenizer")
    parser.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), or a torch device")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--prompt-format", default="auto", choices=("auto", *FORMAT_NAMES),
                        help="how the model spells fill-in-the-middle and rewrites (default: detected from "
                             "its tokenizer's special tokens; plain = no FIM tokens)")
    parser.add_argument("--proposer", default="auto",
                        help="auto (policy), context, index, reference, draft, early-exit, or none")
    parser.add_argument("--max-draft", type=int, default=32, help="K: most draft tokens verified per forward (default 32)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: half the cores, at most 8)")


def add_serve_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="language server (stdio; --tcp) or websocket endpoint (--ws)",
        description="Serve completions and edits. Default: LSP over stdio (editors launch this). "
                    "--ws: the websocket protocol of docs/protocol.md (token required, loopback only by default).")
    _model_arguments(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--stdio", action="store_true",
                      help="LSP over stdio (the default; accepted because LSP clients such as "
                           "vscode-languageclient pass it)")
    mode.add_argument("--tcp", action="store_true", help="LSP over TCP instead of stdio")
    mode.add_argument("--ws", action="store_true", help="websocket endpoint instead of LSP")
    # Transports other LSP clients may ask for: refused with a message instead of argparse's usage line.
    for flag in ("--node-ipc", "--pipe", "--socket"):
        mode.add_argument(flag, nargs="?", const=True, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--clientProcessId", "--client-process-id", dest="client_process_id", type=int,
                        default=None, metavar="PID",
                        help="the editor's process id (LSP clients pass it): the server exits when it is gone")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=None, help="port (--ws default 8765, --tcp default 2087; 0 = any)")
    parser.add_argument("--token", default=None,
                        help="--ws token (default: $CODESPEC_TOKEN, else generated into a 0600 file)")
    parser.add_argument("--token-file", type=Path, default=None, help="where a generated token is written")
    parser.add_argument("--allow-origin", action="append", default=[],
                        help="browser Origin allowed to connect to --ws (repeatable; none by default)")
    parser.add_argument("--max-message-bytes", type=int, default=1 << 20)
    parser.add_argument("--max-in-flight", type=int, default=4, help="concurrent requests per --ws connection")
    parser.add_argument("--workspace", type=Path, action="append", default=[],
                        help="--ws: folder to index at start (repeatable)")
    parser.add_argument("--index-max-tokens", type=int, default=None,
                        help="resident tokens the index keeps before evicting least recently used documents "
                             "(about 26 bytes each; default 32 M; clients may set index.maxTokens)")
    parser.set_defaults(run=run_serve)


def unsupported_transport(args) -> str | None:
    """The message for a transport flag codespec does not speak, or None."""
    for flag in ("node_ipc", "pipe", "socket"):
        if getattr(args, flag, None) is not None:
            return (f"--{flag.replace('_', '-')}: codespec serve speaks LSP over stdio (the default, "
                    f"or --stdio) or --tcp; configure the client's transport as stdio")
    return None


def run_serve(args) -> int:
    from codespec.errors import CodespecError
    from lsp.options import ServerOptions

    refused = unsupported_transport(args)
    if refused:
        raise CodespecError(refused)
    if args.client_process_id is not None:
        from lsp.parent import exit_when_gone

        exit_when_gone(args.client_process_id)

    if args.index_max_tokens is not None and args.index_max_tokens < 1:
        raise CodespecError(f"--index-max-tokens must be >= 1, got {args.index_max_tokens}")
    options = ServerOptions(model=args.model, draft=args.draft, device=args.device, dtype=args.dtype,
                            prompt_format=args.prompt_format, proposer=args.proposer, max_draft=args.max_draft,
                            threads=args.threads)
    if args.index_max_tokens is not None:
        options = dataclasses.replace(options, index_max_tokens=args.index_max_tokens)
    if args.ws:
        import asyncio

        return asyncio.run(_serve_ws(args, options))
    from lsp.server import build_server

    server = build_server(options)
    if args.tcp:
        port = 2087 if args.port is None else args.port
        from lsp.tcp import start_tcp

        print(f"codespec: LSP on tcp://{args.host}:{port}", file=sys.stderr)
        start_tcp(server, args.host, port)  # refuses HTTP (a web page) on the port, unlike pygls's own
    else:
        server.start_io()
    return 0


async def _serve_ws(args, options) -> int:
    import asyncio
    import signal

    from lsp.auth import resolve_token
    from lsp.options import WsLimits
    from lsp.runtime import start_service
    from lsp.ws import bound_port, start_ws_server

    source = resolve_token(args.token, args.token_file)
    service = await asyncio.to_thread(start_service, options)
    if args.workspace:
        from lsp.indexing import index_folders

        index_folders(service, args.workspace, options)
    limits = WsLimits(max_message_bytes=args.max_message_bytes, max_in_flight=args.max_in_flight,
                      allowed_origins=tuple(args.allow_origin))
    server = await start_ws_server(service, source.token, args.host, 8765 if args.port is None else args.port,
                                   options, limits)
    port = bound_port(server)
    where = f"written to {source.file} (readable by you only)" if source.file else f"from {source.origin}"
    print(f"codespec: websocket on ws://{args.host}:{port}/  token {where}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.close()
    await server.wait_closed()
    from lsp.runtime import close_service

    close_service(service)
    return 0


def add_complete_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "complete", help="complete at FILE:LINE:COL once, end to end, with stats and speedup",
        description="Index the workspace, complete at the position through the same engine service the "
                    "servers use, then decode the same prompt plainly to measure the speedup. "
                    "LINE and COL count from 1; COL counts characters.")
    parser.add_argument("location", help="FILE:LINE:COL (1-based)")
    _model_arguments(parser)
    parser.add_argument("--workspace", type=Path, default=None,
                        help="folder to index first (default: none; the completion drafts from its context)")
    parser.add_argument("--max-tokens", type=int, default=None, help="token budget (default: by context)")
    parser.add_argument("--mode", choices=("auto", "line", "block"), default="auto",
                        help="finish the line, write lines, or decide by the cursor's line (default)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain-decoding comparison")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each configuration, alternating, cold caches; the median is reported")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run_complete)


def run_complete(args) -> int:
    from lsp.demo import complete_once

    return complete_once(args)
