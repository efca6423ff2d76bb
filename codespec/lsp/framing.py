"""The LSP base protocol's framing (``Content-Length: N\\r\\n\\r\\n`` + N bytes of JSON), read so that
no input makes the server deaf or dead. Shared by stdio (``CodespecServer.start_io``) and TCP.

What pygls's own reader does with bad input, and what this one does instead:

- header names are matched case-insensitively, ``\\n`` line ends are accepted as well as ``\\r\\n``,
  other headers (``Content-Type``) are ignored, blank lines between messages are skipped;
- a Content-Length over ``max_bytes`` (64 MiB unless configured) is refused with an error (the
  request's id when it can be read from the first 64 KiB), and its body is streamed past in
  64 KiB chunks: memory stays bounded, whatever the header claims;
- a bad header (no colon, a length that is not a byte count, no length at all, a line over 8 KiB)
  or bytes outside any frame (JSON sent without headers) produce one error, then the reader skips
  to the next ``Content-Length:`` header: resynchronisation;
- a body shorter than its Content-Length: the reader notices the next message's header inside the
  bytes it is reading (a header can never occur inside valid JSON: it would need a raw line break
  inside a string, or letters outside one), or, when nothing more arrives for ``stall_s``, that
  what it has is already a complete JSON value; it answers the short message and carries on with
  the next one rather than waiting for bytes that will never come;
- a body that is not JSON (or not UTF-8, or nested deeper than the decoder recurses) is a parse
  error, answered with the request's id when it can be read, and the reader keeps reading.

Each broken message is answered once: error frames (:class:`Problem`) carry a JSON-RPC code
(-32700 parse error, -32600 invalid request, -32602 invalid params for a message too deeply
nested to decode) and the id found in the bytes (None otherwise: JSON-RPC's ``"id": null``).
The envelope of a decoded message (method, id, params) is checked by ``lsp.rpc``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from codespec.service.doors.jsonpeek import ABSENT, FOUND, JSON_STRING_BYTES, UNKNOWN, id_of, peek_id
from codespec.service.doors.logsafe import clip
from codespec.service.requests import jsondecode

__all__ = ["ABSENT", "FOUND", "UNKNOWN", "id_of", "peek_id"]  # the LSP reader's id peek, shared with the websocket door

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
MAX_HEADER_LINE = 8192  # a longer "header line" is not a header
MAX_HEADER_LINES = 32
HEAD_BYTES = 64 << 10  # kept of a refused or broken message: where its id is looked for
DECODE_LIMIT = 1 << 20  # bytes outside any frame decoded to find a whole JSON message (and its id)
CHUNK = 64 << 10
TAIL = 256  # bytes kept back while skipping: a header may straddle two chunks
STALL_S = 0.5  # nothing more for this long while a message is incomplete: judge what arrived

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
HEADER_LINE = re.compile(rb"(" + _TOKEN + rb")[ \t]*:[ \t]*(.*?)[ \t]*\r?\n\Z", re.S)
# Where the next message starts: an LSP header line. It cannot occur inside valid JSON, so finding one
# inside a body means the body was shorter than its Content-Length. Its words can (a document quoting
# an HTTP header), and with the next message's header in the buffer "Content-Type: ...<rest of the
# body>Content-Length: 52\r\n" would read as one line: a header's value holds no quote, brace or
# bracket, which ends any match that starts inside a JSON string at the string's closing quote.
NEXT_HEADER = re.compile(rb"content-(?:length|type)[ \t]*:[^\r\n\"{}\[\]]*\r?\n", re.I)
GLUED_HEADER = re.compile(rb"content-(?:length|type)[ \t]*:", re.I)  # an LSP header after bytes without a line break


@dataclass(frozen=True)
class Message:
    """A decoded JSON value from one frame (its envelope is not checked yet)."""

    value: Any
    size: int


@dataclass(frozen=True)
class Problem:
    """A frame that could not be read as a message: answer ``code``/``message`` to ``request_id``
    (None: JSON-RPC's null id, the id could not be read)."""

    code: int
    message: str
    request_id: Any = None
    has_id: bool = False  # an id was found (it may still be of a type JSON-RPC does not allow)


@dataclass
class ReaderStats:
    messages: int = 0
    problems: int = 0
    resyncs: int = 0
    skipped_bytes: int = 0


@dataclass
class _Garbage:
    """Bytes outside any frame, up to the next header: one error for them (unless ``answered``)."""

    reason: str
    answered: bool = False
    head: bytearray = field(default_factory=bytearray)


@dataclass
class _Skip:
    """The rest of a refused (oversized) body, streamed past."""

    total: int
    seen: int = 0
    answered: bool = False
    head: bytearray = field(default_factory=bytearray)


_EOF = object()


def decode(data: bytes) -> Message | Problem:
    """One frame's body as JSON, or the error to answer."""
    try:  # the decoder every door shares; surrogates pass here, ``lsp.params`` replaces them
        return Message(jsondecode.loads(data, utf8_errors="surrogatepass"), len(data))
    except jsondecode.JsonTooDeep:
        state, request_id = peek_id(data)
        message = (
            "the message is nested too deeply to decode; LSP messages are never nested more than a few dozen levels"
        )
        if state == FOUND or (state == ABSENT and data.lstrip()[:1] == b"{"):  # a request / a notification
            return Problem(INVALID_PARAMS, message, request_id, state == FOUND)
        return Problem(PARSE_ERROR, message)  # not even an object: answered with "id": null
    except jsondecode.JsonInputError as error:  # not UTF-8, not JSON, a 5,000-digit number, NaN
        state, request_id = peek_id(data)
        return Problem(PARSE_ERROR, f"the message body is {clip(str(error))}", request_id, state == FOUND)


def ends_open(data: bytes) -> bool:
    """Whether JSON text stops inside a string or an unclosed object or array (it was cut short)."""
    flat = JSON_STRING_BYTES.sub(b'""', data)
    if flat.count(b'"') % 2:
        return True
    return flat.count(b"{") + flat.count(b"[") > flat.count(b"}") + flat.count(b"]")


def _complete_json(data: bytes) -> tuple[bool, Any, int]:
    """(whether ``data`` starts, after whitespace, with one whole JSON value, the value, the
    number of bytes it took including the whitespace before it)."""
    start = len(data) - len(data.lstrip())
    text = data[start:].decode("utf-8", "surrogateescape")
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except (ValueError, RecursionError):
        return False, None, 0
    return True, value, start + len(text[:end].encode("utf-8", "surrogateescape"))


class FrameReader:
    """Frames from a byte source: ``await next()`` is a :class:`Message`, a :class:`Problem` to
    answer, or None at the end of the input.

    ``fill``: an async callable returning the next bytes available (b"" at the end of input).
    ``max_bytes``: the Content-Length limit, an int or a callable read at each header (the server's
    option may change once the client's initializationOptions arrive).
    ``hold``: given a whole body, what to return instead of decoding it, or None to decode it
    (``lsp.held``: large document notifications are decoded after the messages behind them).
    """

    def __init__(
        self,
        fill: Callable[[], Awaitable[bytes]],
        max_bytes: int | Callable[[], int] = DEFAULT_MAX_MESSAGE_BYTES,
        initial: bytes = b"",
        stall_s: float = STALL_S,
        hold: Callable[[bytes], Any] | None = None,
    ) -> None:
        self._fill = fill
        self._hold = hold
        self._max_bytes = max_bytes
        self.buf = bytearray(initial)
        self.eof = False
        self.stall_s = stall_s
        self.stats = ReaderStats()
        self._pending: asyncio.Future | None = None
        self._garbage: _Garbage | None = None
        self._skip: _Skip | None = None
        self._quiet = False  # the bytes right after a broken body belong to it: already answered

    @property
    def max_bytes(self) -> int:
        value = self._max_bytes() if callable(self._max_bytes) else self._max_bytes
        return value if isinstance(value, int) and value > 0 else DEFAULT_MAX_MESSAGE_BYTES

    # ---- input ----------------------------------------------------------------------------
    async def _more(self, timeout: float | None = None) -> bool:
        """Append the next chunk: True; False at the end of input (``eof``) or when ``timeout``
        passes first (the read stays pending and its bytes arrive with the next call)."""
        if self.eof:
            return False
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._fill())
        if timeout is not None:
            done, _ = await asyncio.wait({self._pending}, timeout=timeout)
            if not done:
                return False
        try:
            data = await self._pending
        except (OSError, ValueError, EOFError, asyncio.IncompleteReadError):
            data = b""  # a closed or broken stream is the end of input
        finally:
            self._pending = None
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    async def _line(self) -> bytes | None:
        """One line (with its line end), b"" for a line over ``MAX_HEADER_LINE``, None at the end."""
        scanned = 0
        while True:
            end = self.buf.find(b"\n", scanned, MAX_HEADER_LINE + 1)
            if end != -1:
                line = bytes(self.buf[: end + 1])
                del self.buf[: end + 1]
                return line
            if len(self.buf) > MAX_HEADER_LINE:
                return b""
            scanned = len(self.buf)
            # JSON sent without a header may not end with a line break: after stall_s it is a "line"
            bare = self.buf.lstrip()[:1] in (b"{", b"[")
            if await self._more(timeout=self.stall_s if bare else None):
                continue
            if self.eof or bare:
                if self.buf:  # the input ended (or stopped) inside a line: that is the last "line"
                    line = bytes(self.buf)
                    self.buf.clear()
                    return line
                return None

    # ---- frames ---------------------------------------------------------------------------
    async def next(self) -> Message | Problem | None:
        """The next frame (or what ``hold`` made of it), None at the end of the input."""
        while True:
            if self._skip is not None:
                out = await self._skip_step(self._skip)
            elif self._garbage is not None:
                out = await self._garbage_step(self._garbage)
            else:
                out = await self._frame_step()
            if out is _EOF:
                return None
            if out is not None:
                if isinstance(out, Problem):
                    self.stats.problems += 1
                else:
                    self.stats.messages += 1
                return out

    def _start_garbage(self, reason: str) -> None:
        self.stats.resyncs += 1
        self._garbage = _Garbage(reason, answered=self._quiet)

    async def _frame_step(self):
        length = None
        header_lines = 0
        while True:
            line = await self._line()
            if line is None:
                return _EOF
            if line == b"":
                self._start_garbage(f"a header line longer than {MAX_HEADER_LINE} bytes")
                return None
            if not line.strip():
                if header_lines == 0:
                    continue  # blank lines between messages
                if length is None:
                    self._start_garbage("the header has no Content-Length")
                    return None
                break
            match = HEADER_LINE.match(line)
            if match is None:
                if self._unread_bad_line(line) and self._quiet and header_lines == 0:
                    # The rest of a body shorter than its Content-Length, then the next message's
                    # header on the same line: that body was answered; read on from the header.
                    self._quiet = False
                    return None
                what = (
                    "JSON without a Content-Length header"
                    if line.lstrip()[:1] in (b"{", b"[")
                    else f"not a header line: {clip(line.decode('utf-8', 'replace').rstrip(), 80)!r}"
                )
                self._start_garbage(what)
                self._quiet = False
                return None
            header_lines += 1
            self._quiet = False  # a header line: a new message starts, whatever is wrong with it
            if header_lines > MAX_HEADER_LINES:
                self._start_garbage(f"more than {MAX_HEADER_LINES} header lines")
                return None
            if match.group(1).lower() != b"content-length":
                continue  # Content-Type and anything else: ignored
            value = match.group(2)
            if not value.isdigit():
                self._start_garbage(
                    f"Content-Length {clip(value.decode('utf-8', 'replace'), 40)!r} is not a byte count"
                )
                return None
            number = int(value) if len(value) <= 30 else 1 << 100
            if length is not None and number != length:
                self._start_garbage("two different Content-Length headers")
                return None
            length = number
        self._quiet = False  # a well-formed header: what follows is a new message
        if length > self.max_bytes:
            self._skip = _Skip(length)
            return None
        return await self._body(length)

    def _unread_bad_line(self, line: bytes) -> bool:
        """Put back what of a bad header line may matter: JSON (answered with its id), or the LSP
        header glued to its end (the next message, after bytes that did not end with a line
        break); True when a glued header was put back (and what came before it dropped)."""
        if not self._quiet and line.lstrip()[:1] in (b"{", b"["):
            self.buf[:0] = line
            return False
        glued = None
        for match in GLUED_HEADER.finditer(line):
            glued = match  # the last one: the header is what ends the line
        if glued is not None and glued.start() > 0:
            self.buf[:0] = line[glued.start() :]
            return True
        if line.lstrip()[:1] in (b"{", b"["):
            self.buf[:0] = line
        return False

    def _header_inside(self, start: int, end: int) -> int | None:
        """Offset of a header starting in ``buf[start:end]`` (searched from ``start``). A header
        ends at a line end, so only the lines that end in the buffer are searched: a compact JSON
        body has none, and a 5 MB one is passed over by ``find`` instead of the case-insensitive
        pattern (about 25 ms of a 5 MB didOpen's 50 ms)."""
        line_start = max(0, start)
        line_end = self.buf.find(b"\n", line_start)
        while line_end != -1 and line_start < end:
            match = NEXT_HEADER.search(self.buf, line_start, line_end + 1)
            if match is not None:
                return match.start() if match.start() < end else None
            line_start = line_end + 1
            line_end = self.buf.find(b"\n", line_start)
        return None

    async def _body(self, length: int):
        scanned = 0
        judged = -1  # buffer length when a stall was last judged
        while True:
            have = min(len(self.buf), length)
            cut = self._header_inside(scanned - TAIL, have)
            if cut is not None:
                return self._short(bytes(self.buf[:cut]), length, cut)
            if len(self.buf) >= length:
                if len(self.buf) == length:  # the usual case for a large body: no copy
                    data, self.buf = bytes(self.buf), bytearray()
                else:
                    data = bytes(memoryview(self.buf)[:length])  # one copy, not two
                    del self.buf[:length]
                held = self._hold(data) if self._hold is not None else None
                if held is not None:
                    return held
                decoded = decode(data)
                if isinstance(decoded, Problem) and decoded.code == PARSE_ERROR and ends_open(data):
                    self._quiet = True  # a Content-Length too small left the rest of the body behind
                return decoded
            scanned = len(self.buf)
            stalled_wait = self.stall_s if self.buf and judged != len(self.buf) else None
            if await self._more(timeout=stalled_wait):
                continue
            # Nothing for stall_s (or the end of input): is what arrived a whole message already?
            judged = len(self.buf)
            complete, _, used = _complete_json(bytes(self.buf))
            if complete and not self.buf[used:].strip():
                return self._short(bytes(self.buf), length, len(self.buf))
            if self.eof:
                return _EOF

    def _short(self, data: bytes, claimed: int, used: int) -> Problem:
        del self.buf[:used]
        complete, value, _ = _complete_json(data)
        if complete:
            has_id, request_id = id_of(value)
        else:
            state, request_id = peek_id(data)
            has_id = state == FOUND
            self._quiet = ends_open(data)
        return Problem(
            PARSE_ERROR,
            f"the message ended after {len(data)} bytes, before its Content-Length of {claimed}",
            request_id,
            has_id,
        )

    async def _skip_step(self, skip: _Skip):
        limit = self.max_bytes
        while True:
            left = skip.total - skip.seen
            cut = self._header_inside(0, min(len(self.buf), left))
            ended = cut is not None
            take = (
                cut
                if cut is not None
                else min(left, len(self.buf) if len(self.buf) >= left else max(0, len(self.buf) - TAIL))
            )
            if len(skip.head) < HEAD_BYTES:
                skip.head += self.buf[: min(take, HEAD_BYTES - len(skip.head))]
            del self.buf[:take]
            skip.seen += take
            self.stats.skipped_bytes += take
            done = ended or skip.seen >= skip.total
            problem = None
            if not skip.answered:
                view = bytes(skip.head) + bytes(self.buf[: max(0, min(HEAD_BYTES - len(skip.head), left - take))])
                state, request_id = peek_id(view)
                if state != UNKNOWN or len(skip.head) >= HEAD_BYTES or done:
                    problem = self._refusal(skip, limit, request_id, state == FOUND)
            if done:
                self._skip = None
                return problem
            if problem is not None:
                return problem
            if not await self._more(timeout=None if skip.answered else self.stall_s):
                if self.eof:
                    self._skip = None
                    if skip.answered:
                        return _EOF
                left = skip.total - skip.seen  # stalled or ended: answer with what is known
                state, request_id = peek_id(bytes(skip.head) + bytes(self.buf[: max(0, min(HEAD_BYTES, left))]))
                return self._refusal(skip, limit, request_id, state == FOUND)

    def _refusal(self, skip: _Skip, limit: int, request_id: Any, has_id: bool) -> Problem:
        skip.answered = True
        return Problem(
            INVALID_REQUEST,
            f"the message is {skip.total} bytes; the limit is {limit} (initializationOptions.maxMessageBytes); skipped",
            request_id if has_id else None,
            has_id,
        )

    async def _garbage_step(self, garbage: _Garbage):
        judged = -1
        while True:
            match = NEXT_HEADER.search(self.buf)
            end = match.start() if match is not None else len(self.buf)
            final = match is not None or self.eof or judged == len(self.buf)
            if not garbage.answered:
                problem, used = self._judge(
                    garbage, bytes(self.buf[: min(end, DECODE_LIMIT)]), final or end >= DECODE_LIMIT
                )
                if problem is not None:
                    del self.buf[:used]
                    self.stats.skipped_bytes += used
                    garbage.answered = True
                    if used:  # a whole message sent without a header: what follows is read afresh
                        self._garbage = None
                    return problem
                if not final:
                    judged = len(self.buf) if not await self._more(timeout=self.stall_s) and not self.eof else -1
                    continue
            if match is not None:
                del self.buf[: match.start()]
                self.stats.skipped_bytes += match.start()
                self._garbage = None
                return None
            if self.eof:
                self._garbage = None
                return _EOF
            drop = max(0, len(self.buf) - TAIL)
            del self.buf[:drop]
            self.stats.skipped_bytes += drop
            await self._more()

    def _judge(self, garbage: _Garbage, region: bytes, final: bool) -> tuple[Problem | None, int]:
        """The error for bytes outside a frame, once it can be given: (problem, bytes it covers)."""
        stripped = region.lstrip()
        if not stripped:
            if final:  # a broken header and nothing after it
                return Problem(
                    PARSE_ERROR, f"invalid frame: {garbage.reason}; skipped to the next Content-Length header"
                ), len(region)
            return None, 0
        message = f"invalid frame: {garbage.reason}; skipped to the next Content-Length header"
        if stripped[:1] in (b"{", b"["):
            complete, value, used = _complete_json(region)
            if complete:
                has_id, request_id = id_of(value)
                return Problem(PARSE_ERROR, message, request_id, has_id), used
            if not final:
                return None, 0  # a message still arriving
        state, request_id = peek_id(region[:HEAD_BYTES])
        return Problem(PARSE_ERROR, message, request_id, state == FOUND), 0
