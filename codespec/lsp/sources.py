"""Where the frame reader's bytes come from (``fill`` for :class:`lsp.framing.FrameReader`): a
blocking stream read on a thread (stdin), or an asyncio stream (a TCP connection)."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable

from codespec.lsp.framing import CHUNK


class BlockingSource:
    """``fill`` for :class:`FrameReader` over a blocking binary stream (stdin): one read at a time
    on a daemon thread, so a pending read never keeps the process alive at exit."""

    def __init__(self, stream, chunk: int = CHUNK) -> None:
        self._read = getattr(stream, "read1", None) or stream.read
        self._chunk = chunk
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __call__(self) -> Awaitable[bytes]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._requests.put((loop, future))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="codespec-stdin", daemon=True)
            self._thread.start()
        return future

    def _run(self) -> None:
        while True:
            loop, future = self._requests.get()
            try:
                data = self._read(self._chunk)
            except (OSError, ValueError):
                data = b""
            try:
                loop.call_soon_threadsafe(_resolve, future, data or b"")
            except RuntimeError:  # the loop is closed: nobody reads any more
                return
            if not data:
                return


def _resolve(future: asyncio.Future, data: bytes) -> None:
    if not future.done():
        future.set_result(data)


def stream_source(reader: asyncio.StreamReader, chunk: int = CHUNK) -> Callable[[], Awaitable[bytes]]:
    """``fill`` over an asyncio stream (a TCP connection)."""

    async def fill() -> bytes:
        return await reader.read(chunk)

    return fill
