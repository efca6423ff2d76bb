"""LSP over TCP (`codespec serve --tcp`) that refuses anything that is not an LSP stream.

pygls's own TCP loop skips header lines it does not know, so a web page's plain HTTP POST to the
port (a browser sends one to 127.0.0.1 for any page, no questions asked) would be read as an LSP
message: ``initialize`` with options of the page's choosing (an index path, a model directory),
commands, edits. An LSP stream starts with a ``Content-Length`` or ``Content-Type`` header; an
HTTP request starts with its request line (``POST / HTTP/1.1``), so the first line decides. A
refused connection is closed and the server keeps serving (pygls's loop would also shut the
whole server down when such a connection ends).

After the first line the connection is read by ``lsp.framing`` and answered by ``lsp.rpc``, as
stdio is: a bad frame gets an error and the reader skips to the next header.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable

from codespec.lsp.framing import DEFAULT_MAX_MESSAGE_BYTES, FrameReader
from codespec.lsp.held import holdable
from codespec.lsp.rpc import serve_frames
from codespec.lsp.sources import stream_source
from codespec.service.doors import logsafe

log = logging.getLogger(__name__)

LSP_FIRST_LINE = re.compile(rb"^Content-(Length|Type):", re.IGNORECASE)


def speaks_lsp(first_line: bytes) -> bool:
    """Whether a connection's first line is an LSP base-protocol header."""
    return LSP_FIRST_LINE.match(first_line) is not None


async def _first_line(reader: asyncio.StreamReader) -> bytes:
    """The connection's first line; a line over the stream's limit (64 KiB) is not LSP either."""
    try:
        return await reader.readline()
    except (ValueError, asyncio.LimitOverrunError, ConnectionError):
        return b""


async def serve_tcp(server, host: str, port: int, ready: Callable[[int], None] | None = None) -> None:
    """Serve ``server`` (a pygls LanguageServer) on ``host:port`` until its LSP connection ends
    (or this task is cancelled); ``ready(port)`` is called once listening (port 0 picks a free one).

    The read loop is ``lsp.rpc.serve_frames`` over ``lsp.framing``; of pygls only the public
    ``protocol.set_writer`` and ``shutdown`` are used: the stop event and the listener are ours, so
    nothing depends on the private fields pygls's own ``start_tcp`` keeps them in.
    """
    logsafe.install()

    def max_bytes() -> int:  # the client's initializationOptions may set it
        return getattr(getattr(server, "options", None), "max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)

    stop_event = threading.Event()  # ends the read loop
    ended = asyncio.Event()  # the LSP connection is over: as with pygls, the server ends with it
    connections: set[asyncio.StreamWriter] = set()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first_line = await _first_line(reader)
        if not speaks_lsp(first_line):
            log.warning("refused a TCP connection that does not speak LSP (first line %r)", first_line[:60])
            writer.close()
            return
        connections.add(writer)
        server.protocol.set_writer(writer)
        try:
            frames = FrameReader(stream_source(reader), max_bytes, initial=first_line, hold=holdable)
            await serve_frames(frames, server.protocol, stop_event)
        finally:
            connections.discard(writer)
            ended.set()

    listener = await asyncio.start_server(connection, host, port)
    if ready is not None:
        ready(listener.sockets[0].getsockname()[1])
    try:
        async with listener:  # closes the listener on the way out
            await ended.wait()
    finally:
        stop_event.set()
        for writer in list(connections):  # a read loop still waiting for input ends at EOF
            writer.close()
        server.shutdown()  # pygls's own teardown (its thread pool), as its start_tcp does


def start_tcp(server, host: str, port: int) -> None:
    """Blocking: serve until the client disconnects or asks the server to exit."""
    asyncio.run(serve_tcp(server, host, port))
