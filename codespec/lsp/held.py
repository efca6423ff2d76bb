"""Large didOpen notifications, read but decoded after the messages behind them.

A client that opens a 5 MB file while the user types sends that didOpen ahead of the keystroke's
didChange and inline completion. Decoding it (JSON, then pygls' types) takes the event loop
10-15 ms and the engine's interpreter with it, and the keystroke waited behind it
(docs/benchmarks.md, "lsp-large-open"). Opening another document changes nothing
a completion in this one reads (that document is not in the index until it is opened and its
indexing debounced), so such a frame is held undecoded and dispatched later, in order, at the
first of:

- any message but those that may go ahead of it (``GOES_AHEAD``: completions, and didOpen /
  didChange / didClose / didSave, of another document; cancels; responses). Everything else may
  read every open document or the workspace's edit history (a next edit, a command, a workspace
  change, shutdown) and waits for it; so does a message about the held document itself;
- the server being idle: no request running, checked every ``CHECK_S`` after it arrived;
- ``MAX_HOLD_S`` after it arrived, busy or not, and the end of the input.

Only didOpen is held: a didChange is an edit, and the edit history's order across documents is
what next edits read. A frame is recognised without decoding it: the document text is the one long
string, so the other keys lie in its first or last ``WINDOW`` bytes; a key is found by a pattern
whose opening quote no backslash precedes (every quote inside a JSON string is escaped), and the
structure around the text must open in the first window and close exactly at the body's end in
the last (a body cut short, as by a Content-Length counted in characters, is decoded at once and
answered as before). Anything not recognised with certainty is decoded at once, as every other
frame is. At most ``MAX_HELD_BYTES`` are held.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from codespec.lsp.framing import Message, Problem, decode
from codespec.service.doors.jsonpeek import JSON_STRING_BYTES

log = logging.getLogger(__name__)

HOLD_BYTES = 256 << 10  # smaller frames decode in about a millisecond: never held
WINDOW = 4096  # bytes at each end of a held frame where its keys other than the text must lie
CHECK_S = 0.05  # how often a held frame checks whether the server is idle
MAX_HOLD_S = 1.0
MAX_HELD_BYTES = 64 << 20
HOLDABLE = frozenset({"textDocument/didOpen"})
GOES_AHEAD = frozenset({"$/cancelRequest", "$/setTrace"})  # touch no document
GOES_AHEAD_OF_OTHERS = frozenset(  # about one document, and reading no other open one
    {
        "textDocument/inlineCompletion",
        "textDocument/completion",
        "textDocument/didOpen",
        "textDocument/didChange",
        "textDocument/didClose",
        "textDocument/didSave",
    }
)

_METHOD = re.compile(rb'(?<!\\)"method"\s*:\s*"([^"\\]{1,200})"')
_URI = re.compile(rb'(?<!\\)"uri"\s*:\s*"((?:[^"\\]|\\.){1,8192})"')
_ID = re.compile(rb'(?<!\\)"id"\s*:')
_UNESCAPED_QUOTE = re.compile(rb'(?<!\\)"')
_SCALAR = re.compile(rb'[^\s{}\[\],:"]+')


@dataclass(frozen=True)
class HeldNotification:
    """A didOpen / full-text didChange frame, not decoded yet."""

    method: str
    uri: str
    data: bytes
    arrived: float = field(default_factory=time.monotonic)


def holdable(data: bytes) -> HeldNotification | None:
    """``data`` as a held notification when it certainly is a large didOpen or didChange, else None."""
    if len(data) < max(HOLD_BYTES, 2 * WINDOW):
        return None
    ends = ((0, WINDOW), (len(data) - WINDOW, len(data)))
    if any(_ID.search(data, start, end) for start, end in ends):
        return None  # a request (or an id anywhere near the keys): answered in order
    methods = [found for start, end in ends for found in _METHOD.findall(data, start, end)]
    uris = [found for start, end in ends for found in _URI.findall(data, start, end)]
    if len(methods) != 1 or len(uris) != 1:
        return None
    method = methods[0].decode("ascii", "replace")
    if method not in HOLDABLE or not _whole(data):
        return None  # not a didOpen, or a body whose structure does not close at its end
    try:
        uri = json.loads(b'"' + uris[0] + b'"')
    except ValueError:
        return None
    return HeldNotification(method, uri, data)


def _walk(data: bytes, pos: int, end: int, depth: int) -> tuple[str, int, int]:
    """JSON structure from ``pos`` to ``end`` at ``depth`` (strings skipped whole): ("open", depth,
    pos) at a string that does not end before ``end``, ("closed", depth, pos) just after a closer
    that brings the depth to 0 or below, ("bad", ...) at what is not JSON, else ("end", depth, end)."""
    while pos < end:
        char = data[pos : pos + 1]
        if char in b" \t\r\n,:":
            pos += 1
        elif char in b"{[":
            depth, pos = depth + 1, pos + 1
        elif char in b"}]":
            depth, pos = depth - 1, pos + 1
            if depth <= 0:
                return "closed", depth, pos
        else:
            match = (JSON_STRING_BYTES if char == b'"' else _SCALAR).match(data, pos, end)
            if match is None:
                return ("open" if char == b'"' else "bad"), depth, pos
            pos = match.end()
    return "end", depth, pos


def _whole(data: bytes) -> bool:
    """Whether the long string (the text) starts inside the structure the first window opens, and
    what follows it closes that structure exactly at the body's end."""
    outcome, depth, _ = _walk(data, 0, WINDOW, 0)
    closing = _UNESCAPED_QUOTE.search(data, len(data) - WINDOW)  # the long string's closing quote
    if outcome != "open" or closing is None:
        return False
    outcome, depth, pos = _walk(data, closing.end(), len(data), depth)
    return outcome == "closed" and depth == 0 and not data[pos:].strip()


def _frame_uri(value: dict) -> Any:
    params = value.get("params")
    document = params.get("textDocument") if isinstance(params, dict) else None
    return document.get("uri") if isinstance(document, dict) else None


class HeldFrames:
    """The held frames of one connection, dispatched to ``receive`` in the order they came."""

    def __init__(self, receive: Callable[[Message | Problem], None], busy: Callable[[], bool]) -> None:
        self._receive = receive
        self._busy = busy
        self._held: list[HeldNotification] = []
        self._timer: asyncio.TimerHandle | None = None

    def hold(self, frame: HeldNotification) -> None:
        self._held.append(frame)
        if sum(len(held.data) for held in self._held) > MAX_HELD_BYTES:
            self.release()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(CHECK_S, self._check)

    def before(self, frame: Message | Problem) -> None:
        """Dispatch the held frames ``frame`` must follow (all of them: their order is kept)."""
        if self._held and isinstance(frame, Message) and self._depends(frame.value):
            self.release()

    def release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, self._held = self._held, []
        for frame in held:
            self._receive(decode(frame.data))

    def close(self) -> None:
        """The connection's read loop is over without reaching the end of its input (the server
        stops): nothing is dispatched any more, and no timer fires later."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held = []

    def _depends(self, value: Any) -> bool:
        if not isinstance(value, dict) or "method" not in value:
            return False  # a response to the server's own request
        method = value["method"]
        if method in GOES_AHEAD:
            return False
        if method not in GOES_AHEAD_OF_OTHERS:
            return True  # may read every open document or the edit history: the held ones first
        return _frame_uri(value) in {held.uri for held in self._held}

    def _check(self) -> None:
        self._timer = None
        if not self._held:
            return
        if self._busy() and time.monotonic() - self._held[0].arrived < MAX_HOLD_S:
            self._timer = asyncio.get_running_loop().call_later(CHECK_S, self._check)
            return
        try:
            self.release()
        except Exception:  # on a timer, nobody is above to take it: the read loop goes on
            log.exception("dispatching a held didOpen failed")
