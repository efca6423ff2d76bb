"""Large document notifications, read but decoded after the messages behind them.

A client that opens a 5 MB file while the user types sends that didOpen ahead of the keystroke's
didChange and inline completion. Decoding it (JSON, then pygls' types) takes the event loop
10-15 ms and the engine's interpreter with it, and the keystroke waited behind it
(docs/lsp-bench.md, "A 5 MB file opened while typing"). A didOpen or full-text didChange of
another document changes nothing that request reads, so such a frame is held undecoded and
dispatched later, in order, at the first of:

- a message that may depend on it: one about the same document, or any message that is not a
  text-document message, a cancel or a response (a command, a workspace change, shutdown);
- the server being idle: no request running, checked every ``CHECK_S`` after it arrived;
- ``MAX_HOLD_S`` after it arrived, busy or not, and the end of the input.

The frame is recognised without decoding it: the document text is the one long string, so the
other keys lie in its first or last ``WINDOW`` bytes, and a key is found by a pattern whose
opening quote no backslash precedes (every quote inside a JSON string is escaped). Anything not
recognised with certainty (an ``"id"``, two ``"uri"`` keys, a body that does not end as an
object) is decoded at once, as every other frame is. At most ``MAX_HELD_BYTES`` are held.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lsp.framing import Message, Problem, decode

HOLD_BYTES = 256 << 10  # smaller frames decode in about a millisecond: never held
WINDOW = 4096  # bytes at each end of a held frame where its keys other than the text must lie
CHECK_S = 0.05  # how often a held frame checks whether the server is idle
MAX_HOLD_S = 1.0
MAX_HELD_BYTES = 64 << 20
HOLDABLE = frozenset({"textDocument/didOpen", "textDocument/didChange"})
GOES_AHEAD = frozenset({"$/cancelRequest", "$/setTrace"})  # touch no document

_METHOD = re.compile(rb'(?<!\\)"method"\s*:\s*"([^"\\]{1,200})"')
_URI = re.compile(rb'(?<!\\)"uri"\s*:\s*"((?:[^"\\]|\\.){1,8192})"')
_ID = re.compile(rb'(?<!\\)"id"\s*:')
_LAST_QUOTE = re.compile(rb'(?<!\\)"(?=[^"]*\Z)')
_CLOSING = re.compile(rb"\s*(?::\s*[-+.\w]+\s*)?[\s,}\]]*\}\s*\Z")  # after a string: a scalar, closers


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
    last_quote = _LAST_QUOTE.search(data, len(data) - WINDOW)
    if method not in HOLDABLE or last_quote is None or not _CLOSING.match(data, last_quote.end()):
        return None  # not a document notification, or a body that does not end as an object
    try:
        uri = json.loads(b'"' + uris[0] + b'"')
    except ValueError:
        return None
    return HeldNotification(method, uri, data)


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

    def _depends(self, value: Any) -> bool:
        if not isinstance(value, dict) or "method" not in value:
            return False  # a response to the server's own request
        method = value["method"]
        if method in GOES_AHEAD:
            return False
        if not isinstance(method, str) or not method.startswith("textDocument/"):
            return True
        return _frame_uri(value) in {held.uri for held in self._held}

    def _check(self) -> None:
        self._timer = None
        if not self._held:
            return
        if self._busy() and time.monotonic() - self._held[0].arrived < MAX_HOLD_S:
            self._timer = asyncio.get_running_loop().call_later(CHECK_S, self._check)
        else:
            self.release()
