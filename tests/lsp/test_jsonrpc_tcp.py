"""`codespec serve --tcp` reads frames as stdio does (lsp.framing): bad ones are answered, the
connection keeps serving. No model: requests before initialize get ServerNotInitialized."""

from __future__ import annotations

import asyncio
import contextlib
import json

from codespec.lsp.server import build_server
from codespec.lsp.tcp import serve_tcp

WAIT_S = 60  # a hang guard only


def frame(payload: dict | bytes, length: int | None = None) -> bytes:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length) + body


async def read_message(reader: asyncio.StreamReader) -> dict:
    header = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    length = int(header.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    return json.loads(await asyncio.wait_for(reader.readexactly(length), WAIT_S))


async def test_bad_frames_over_tcp_are_answered_and_the_connection_keeps_serving():
    server = build_server()
    port: asyncio.Future = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(serve_tcp(server, "127.0.0.1", 0, port.set_result))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", await asyncio.wait_for(port, WAIT_S))
        stats = {"jsonrpc": "2.0", "id": "early", "method": "codespec/stats", "params": {}}
        writer.write(frame(stats))  # the first line must be a header: this one is
        writer.write(b"Content-Length: lots\r\n\r\n" + json.dumps({**stats, "id": "bad-length"}).encode())
        writer.write(json.dumps({**stats, "id": "bare"}).encode())  # no header at all
        writer.write(b"content-length: 1000000000000\r\n\r\n" + json.dumps({**stats, "id": "huge"}).encode())
        writer.write(frame(b"[" * 3000 + b"]" * 3000))
        writer.write(frame({"jsonrpc": "2.0", "id": "bye", "method": "shutdown"}))
        await writer.drain()
        replies = [await read_message(reader) for _ in range(6)]
        by_id = {reply["id"]: reply for reply in replies}
        assert by_id["early"]["error"]["code"] == -32002  # not initialized: still an answer
        assert by_id["bad-length"]["error"]["code"] == -32700
        assert by_id["bare"]["error"]["code"] == -32700
        assert by_id["huge"]["error"]["code"] == -32600
        assert by_id[None]["error"]["code"] == -32700  # nested too deeply to decode: no id to read
        assert by_id["bye"] == {"jsonrpc": "2.0", "id": "bye", "result": None}
        writer.close()
        await asyncio.wait_for(serving, WAIT_S)  # the LSP connection ended: so does the server
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(serving, WAIT_S)
