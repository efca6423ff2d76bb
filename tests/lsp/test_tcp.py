"""`codespec serve --tcp`: a web page's HTTP request to the port is refused, an LSP client is served."""

from __future__ import annotations

import asyncio
import contextlib
import json

from codespec.lsp.server import build_server
from codespec.lsp.tcp import serve_tcp, speaks_lsp

WAIT_S = 60  # a hang guard only


def lsp_message(payload: dict) -> bytes:
    body = json.dumps(payload).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def test_first_line_rule():
    assert speaks_lsp(b"Content-Length: 52\r\n") and speaks_lsp(b"content-type: application/vscode-jsonrpc\r\n")
    assert not speaks_lsp(b"POST / HTTP/1.1\r\n") and not speaks_lsp(b"GET /?x HTTP/1.1\r\n")


async def test_an_http_post_is_refused_and_an_lsp_client_is_still_served():
    server = build_server()
    port: asyncio.Future = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(serve_tcp(server, "127.0.0.1", 0, port.set_result))
    try:
        number = await asyncio.wait_for(port, WAIT_S)
        shutdown = lsp_message({"jsonrpc": "2.0", "id": 1, "method": "shutdown"})
        body = shutdown.split(b"\r\n\r\n", 1)[1]
        # What fetch("http://127.0.0.1:PORT", {method: "POST", mode: "no-cors", body}) sends.
        http = (
            b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://evil.example\r\n"
            b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", number)
        writer.write(http)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""  # closed, nothing answered
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", number)
        writer.write(shutdown)
        await writer.drain()
        header = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        length = int(header.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        response = json.loads(await asyncio.wait_for(reader.readexactly(length), WAIT_S))
        assert response["id"] == 1 and "error" not in response
        writer.close()
        await asyncio.wait_for(serving, WAIT_S)  # the LSP connection ended: so does the server
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(serving, WAIT_S)


async def test_cancelling_the_server_closes_its_open_connection():
    server = build_server()
    port: asyncio.Future = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(serve_tcp(server, "127.0.0.1", 0, port.set_result))
    number = await asyncio.wait_for(port, WAIT_S)
    reader, writer = await asyncio.open_connection("127.0.0.1", number)
    writer.write(lsp_message({"jsonrpc": "2.0", "id": 1, "method": "shutdown"}))
    await writer.drain()
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)  # served: the connection is live
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(serving, WAIT_S)
    await asyncio.wait_for(reader.read(), WAIT_S)  # EOF: the server closed it rather than leaving it open
    assert reader.at_eof()
    writer.close()
