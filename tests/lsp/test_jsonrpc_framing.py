"""lsp.framing without a server: every bad frame gives one answer and the next message is read."""

from __future__ import annotations

import asyncio
import json

import pytest

from codespec.lsp.framing import ABSENT, FOUND, UNKNOWN, FrameReader, Problem, ends_open, peek_id
from codespec.lsp.params import ParamsTooDeep, describe_structure_error, sanitize

REQUEST = {"jsonrpc": "2.0", "id": 5, "method": "codespec/stats", "params": {"a": "b"}}
BODY = json.dumps(REQUEST).encode()
GOOD = {"jsonrpc": "2.0", "id": 9, "method": "codespec/stats"}


def frame(payload, length: int | None = None, header: bytes = b"Content-Length", end: bytes = b"\r\n") -> bytes:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return header + b": %d" % (len(body) if length is None else length) + end + end + body


OK = frame(GOOD)


async def read_all(chunks: list[bytes], max_bytes: int = 1 << 16) -> list:
    """Every frame from ``chunks``, then the end of input."""
    chunks = list(chunks)

    async def fill() -> bytes:
        return chunks.pop(0) if chunks else b""

    reader = FrameReader(fill, max_bytes, stall_s=0.1)
    frames = []
    while (got := await asyncio.wait_for(reader.next(), 30)) is not None:
        frames.append(got)
    return frames


def summary(frames: list) -> list[tuple]:
    return [
        ("problem", f.code, f.request_id) if isinstance(f, Problem) else ("message", f.value.get("id")) for f in frames
    ]


CASES = {  # bytes before a good frame -> what the reader yields for them
    "lowercase header": (frame(REQUEST, header=b"content-length"), [("message", 5)]),
    "LF-only line ends": (frame(REQUEST, end=b"\n"), [("message", 5)]),
    "Content-Type first": (
        b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n" + frame(REQUEST),
        [("message", 5)],
    ),
    "blank lines between messages": (b"\r\n\r\n" + frame(REQUEST), [("message", 5)]),
    "non-numeric length": (b"Content-Length: abc\r\n\r\n" + BODY, [("problem", -32700, 5)]),
    "negative length": (b"Content-Length: -%d\r\n\r\n" % len(BODY) + BODY, [("problem", -32700, 5)]),
    "missing length": (b"Content-Type: application/vscode-jsonrpc\r\n\r\n" + BODY, [("problem", -32700, 5)]),
    "header line without colon": (b"Content-Length %d\r\n\r\n" % len(BODY) + BODY, [("problem", -32700, 5)]),
    "bare JSON": (BODY, [("problem", -32700, 5)]),
    "two bare JSON messages": (
        BODY + json.dumps({**REQUEST, "id": 6}).encode(),
        [("problem", -32700, 5), ("problem", -32700, 6)],
    ),
    "length too small": (frame(REQUEST, length=10), [("problem", -32700, None)]),
    "length too large": (frame(REQUEST, length=len(BODY) + 40), [("problem", -32700, 5)]),
    "length 10**12": (frame(REQUEST, length=10**12), [("problem", -32600, 5)]),
    "length of 40 digits": (b"Content-Length: " + b"9" * 40 + b"\r\n\r\n" + BODY, [("problem", -32600, 5)]),
    "body not JSON": (frame(b"{not json"), [("problem", -32700, None)]),
    "body not UTF-8": (frame(b'{"jsonrpc": "2.0", "id": 4, "x": "\xff"}'), [("problem", -32700, 4)]),
    "nested deeper than the decoder": (
        frame(b'{"jsonrpc":"2.0","id":3,"method":"x","params":' + b"[" * 5000 + b"]" * 5000 + b"}"),
        [("problem", -32602, 3)],
    ),
    "binary junk": (b"\x00\xff\xfe junk\r\n", [("problem", -32700, None)]),
    "a header line over 8 KiB": (b"x" * 20_000, [("problem", -32700, None)]),
    "empty body": (frame(b""), [("problem", -32700, None)]),
    "too small, then a bad header": (
        frame(REQUEST, length=10) + b"Content-Length: -3\r\n\r\n" + json.dumps({**REQUEST, "id": 77}).encode(),
        [("problem", -32700, None), ("problem", -32700, 77)],
    ),
    "a body not JSON, then no Content-Length": (
        frame(b'{"id": "x\x00, "a": 1}') + b"Content-Type: x\r\n\r\n" + json.dumps({**REQUEST, "id": 79}).encode(),
        [("problem", -32700, None), ("problem", -32700, 79)],
    ),
    "refused, then a bad header": (
        frame(REQUEST, length=10**12) + b"Content-Type: x\r\n\r\n" + json.dumps({**REQUEST, "id": 78}).encode(),
        [("problem", -32600, 5), ("problem", -32700, 78)],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_a_bad_frame_is_answered_once_and_the_next_message_is_read(name):
    sent, expected = CASES[name]
    frames = asyncio.run(read_all([sent + OK]))
    assert summary(frames) == [*expected, ("message", 9)], name
    assert all(frame.message for frame in frames if isinstance(frame, Problem))


@pytest.mark.parametrize("name", ["bare JSON", "length too large", "length 10**12", "missing length"])
def test_the_answer_does_not_wait_for_the_next_message(name):
    """A live pipe with nothing after the bad frame: it is answered once ``stall_s`` passes, and
    the next message, sent only after that answer, is read as usual."""
    sent, expected = CASES[name]

    async def run() -> tuple[list, list]:
        chunks: asyncio.Queue = asyncio.Queue()
        reader = FrameReader(chunks.get, 1 << 16, stall_s=0.1)
        chunks.put_nowait(sent)
        first = [await asyncio.wait_for(reader.next(), 10) for _ in expected]
        chunks.put_nowait(OK)
        return first, [await asyncio.wait_for(reader.next(), 10)]

    first, then = asyncio.run(run())
    assert summary(first) == expected and summary(then) == [("message", 9)]


def test_a_message_split_into_single_bytes_is_read_whole():
    data = OK + frame(REQUEST)
    assert summary(asyncio.run(read_all([data[i : i + 1] for i in range(len(data))]))) == [
        ("message", 9),
        ("message", 5),
    ]


def test_an_oversized_body_is_streamed_past_in_bounded_memory():
    """200 MiB claimed and sent (a valid JSON string): refused with its id, the buffer never
    holds more than a chunk or two, and the message after it is read."""
    total = 200 << 20
    head = b'{"jsonrpc": "2.0", "id": "big", "method": "textDocument/didOpen", "params": {"text": "'
    tail = b'"}}'
    body_left = [total - len(head) - len(tail)]
    peak = [0]
    sent_head = [False]
    reader_ref: list = []

    async def fill() -> bytes:
        if reader_ref:
            peak[0] = max(peak[0], len(reader_ref[0].buf))
        if not sent_head[0]:
            sent_head[0] = True
            return b"Content-Length: %d\r\n\r\n" % total + head
        if body_left[0] > 0:
            size = min(1 << 20, body_left[0])
            body_left[0] -= size
            return b"x" * size
        if body_left[0] == 0:
            body_left[0] = -1
            return tail + OK
        return b""

    async def run() -> list:
        reader = FrameReader(fill, 1 << 20)
        reader_ref.append(reader)
        return [frame async for frame in _frames(reader)]

    frames = asyncio.run(run())
    assert summary(frames) == [("problem", -32600, "big"), ("message", 9)]
    assert peak[0] < 4 << 20


async def _frames(reader):
    while (frame := await reader.next()) is not None:
        yield frame


def test_the_limit_is_read_at_each_header():
    limit = [100]
    frames = asyncio.run(_read_with_limit([frame(REQUEST), OK], limit))
    assert summary(frames) == [("message", 5), ("message", 9)]
    limit[0] = len(json.dumps(GOOD)) + 2  # GOOD fits, REQUEST does not
    frames = asyncio.run(_read_with_limit([frame(REQUEST), OK], limit))
    assert summary(frames) == [("problem", -32600, 5), ("message", 9)]


async def _read_with_limit(chunks, limit):
    async def fill() -> bytes:
        return chunks.pop(0) if chunks else b""

    reader = FrameReader(fill, lambda: limit[0])
    return [frame async for frame in _frames(reader)]


@pytest.mark.parametrize(
    "data, expected",
    [
        (b'{"id": 12,', (FOUND, 12)),
        (b'{"id": 12', (UNKNOWN, None)),  # the number may go on
        (b'{"a": {"id": 1}, "id": "x"}', (FOUND, "x")),  # a nested "id" is not the message's
        (b'{"a": "\\"id\\": 3", "id": 7}', (FOUND, 7)),
        (b'{"id": 1.5}', (FOUND, None)),
        (b'{"id": [1]}', (FOUND, None)),
        (b'{"method": "x"}', (ABSENT, None)),
        (b"[1, 2]", (ABSENT, None)),
        (b'{"params": "' + b"x" * 100_000, (UNKNOWN, None)),
        (b'{"params": ' + b"[" * 10_000 + b"]" * 10_000 + b', "id": "deep"}', (FOUND, "deep")),
    ],
)
def test_peek_id(data, expected):
    assert peek_id(data) == expected
    assert peek_id(data.decode()) == expected


def test_ends_open():
    assert ends_open(b'{"a": "b') and ends_open(b'{"a": [1, 2') and not ends_open(b'{"a": "{["}')


def test_sanitize_replaces_lone_surrogates_and_refuses_deep_params():
    value, replaced = sanitize({"text": "x = \ud800\ny", "list": ["\udfff", "ok", "😀"], "\ud801": 1})
    assert value == {"text": "x = \ufffd\ny", "list": ["\ufffd", "ok", "😀"], "\ufffd": 1} and replaced == 3
    with pytest.raises(ParamsTooDeep):
        sanitize(json.loads("[" * 100 + "]" * 100))


def test_structure_errors_name_the_lsp_field():
    from lsprotocol import types
    from pygls.protocol import default_converter

    converter = default_converter()
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": types.TEXT_DOCUMENT_INLINE_COMPLETION,
        "params": {"textDocument": {"uri": "file:///a"}, "position": {"line": -1, "character": 0}},
    }
    with pytest.raises(Exception) as raised:
        converter.structure(message, types.InlineCompletionRequest)
    text = describe_structure_error(raised.value)
    assert "required field missing @ params.context" in text
    assert "Position.line should be in range" in text and "params.position" in text


def test_shutdown_can_cancel_requests_whose_callbacks_drop_them():
    """pygls's shutdown cancels every running request while iterating them; a cancelled request's
    done callback drops it from the same table (a race a CLI test hit once)."""
    from concurrent.futures import Future

    from codespec.lsp.server import build_server

    futures = build_server().protocol._request_futures
    for msg_id in range(3):
        future: Future = Future()
        future.add_done_callback(lambda _, msg_id=msg_id: futures.pop(msg_id, None))
        futures[msg_id] = future
    for _msg_id, future in futures.items():  # what pygls's lsp_shutdown does
        future.cancel()
    assert not futures


def test_a_body_that_quotes_a_header_is_read_whole_when_the_next_message_follows_it():
    """A document holding the text "Content-Type: application/json" (an HTTP client's tests) is
    JSON-escaped in its didOpen, but the words are there: with the next message's header in the
    same read, they once passed for that header, and the body was cut there (a parse error)."""
    text = 'headers = {"Content-Type: application/json", "content-length: 12"}\nx = 1\n'
    opened = {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"text": text}}
    for chunks in ([frame(opened) + OK], [frame(opened)[:40], frame(opened)[40:] + OK]):
        frames = asyncio.run(read_all(chunks))
        assert summary(frames) == [("message", None), ("message", 9)], frames
        assert frames[0].value["params"]["text"] == text
