"""Request bodies, read within two limits before any of them is decoded: each body's
(``--http-max-body-bytes``: 413, as soon as it is declared or read past) and all bodies' together
(``BODIES_IN_FLIGHT`` of the largest: 429 with ``Retry-After``), so what the server holds for
bodies is bounded whatever arrives, however many clients send at once. A body is read as a
stream, chunk by chunk, never whole and then checked; a large one's freed memory goes back to
the system when it is done (``service.memory``).
"""

from __future__ import annotations

import asyncio

from codespec.http_api.schema import ApiError, parse_json
from codespec.service.engine.memory import LARGE_FREE_BYTES, release_free_memory

BODIES_IN_FLIGHT = 8  # bodies of the largest size being read and decoded at once; more wait for a 429


class BodyBudget:
    """The body bytes all requests together may hold while they are read and decoded (one event
    loop: no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._released = 0  # large-body bytes let go since the last trim

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size
        self._released += size
        if self._released >= LARGE_FREE_BYTES and self.held == 0:  # nothing large left: hand its pages back
            self._released = 0
            asyncio.get_running_loop().run_in_executor(None, release_free_memory)


def too_large(size: int, limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is {size} bytes or more; the limit is {limit} (--http-max-body-bytes)",
        None,
        "request_too_large",
    )


def busy(limit: int) -> ApiError:
    return ApiError(
        429,
        f"the request bodies being read hold {limit} bytes, the most this server holds at once; retry shortly",
        None,
        "rate_limit_exceeded",
        kind="rate_limit_error",
        headers={"retry-after": "1"},
    )


async def read_json(request, max_body_bytes: int, budget: BodyBudget) -> dict:
    """The body of a Starlette ``request`` as a JSON object, read within both limits."""
    declared = request.headers.get("content-length")
    expected = int(declared) if declared is not None and declared.isdigit() and len(declared) < 20 else None
    if expected is not None and expected > max_body_bytes:
        raise too_large(expected, max_body_bytes)
    held = 0
    try:
        if expected is not None:  # the whole body's room, before reading a byte of it
            if not budget.take(expected):
                raise busy(budget.limit)
            held = expected
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise too_large(size, max_body_bytes)
            if size > held:  # a chunked body (or a short Content-Length): its room as it comes
                if not budget.take(size - held):
                    raise busy(budget.limit)
                held = size
            chunks.append(chunk)
        raw = b"".join(chunks)
        chunks.clear()
        return parse_json(raw)
    finally:
        budget.give(held)
