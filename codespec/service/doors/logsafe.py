"""Logging that never quotes a client's input whole.

A message from the client can carry megabytes (a document, a URI, a command argument); quoting it
in a log line or an error message would copy it to stderr each time. ``clip`` shortens what is
quoted, and ``install`` puts a formatter on the process's stderr handler that cuts any record
(traceback included) to ``MAX_RECORD_CHARS``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from codespec.service.requests.schema import REQUEST_LOG

MAX_QUOTE_CHARS = 200  # what an error message or a log line quotes of a value
MAX_RECORD_CHARS = 4000  # one log record, traceback included


def clip(value: Any, limit: int = MAX_QUOTE_CHARS) -> str:
    """``value`` as text (``repr`` unless it is a str or bytes), at most ``limit`` characters, with
    how much was cut."""
    if isinstance(value, bytes):
        text = repr(value[: limit + 1])
        return text if len(value) <= limit else f"{text[:limit]}... ({len(value)} bytes)"
    text = value if isinstance(value, str) else _safe_repr(value, limit)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def _safe_repr(value: Any, limit: int) -> str:
    if isinstance(value, (list, tuple, dict)) and len(value) > limit:
        return f"<{type(value).__name__} of {len(value)} items>"
    try:
        return repr(value)
    except Exception as error:  # a repr that fails must not fail the log call
        return f"<{type(value).__name__}: repr failed: {type(error).__name__}>"


class TruncatingFormatter(logging.Formatter):
    """A formatter whose records are at most ``limit`` characters (the end says how many were cut)."""

    def __init__(self, fmt: str | None = "%(message)s", limit: int = MAX_RECORD_CHARS) -> None:
        super().__init__(fmt)
        self.limit = limit

    def format(self, record: logging.LogRecord) -> str:
        try:
            text = super().format(record)
        except Exception as error:  # bad %-arguments: say so rather than raise inside logging
            text = f"{record.name}: unformattable log record ({type(error).__name__}): {clip(record.msg)}"
        if len(text) <= self.limit:
            return text
        head = self.limit * 3 // 4
        tail = self.limit - head
        return f"{text[:head]}\n... [{len(text) - self.limit} characters cut] ...\n{text[-tail:]}"


def quiet_requests() -> None:
    """No per-request lines (`serve --quiet`); warnings and errors still go to stderr."""
    logging.getLogger(REQUEST_LOG).setLevel(logging.WARNING)


def install(limit: int = MAX_RECORD_CHARS) -> None:
    """Route warnings and errors to stderr through a truncating formatter, unless the process has
    configured logging itself (then its handlers are left alone), and the request log's lines
    (``REQUEST_LOG``, info) too unless ``quiet_requests`` ran. Idempotent."""
    requests = logging.getLogger(REQUEST_LOG)
    if requests.level == logging.NOTSET:
        requests.setLevel(logging.INFO)
    if not requests.handlers:
        line = logging.StreamHandler(sys.stderr)
        line.setFormatter(TruncatingFormatter("codespec: %(message)s", limit=limit))
        requests.addHandler(line)
        requests.propagate = False  # the root's handler would print the line a second time
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)  # what Python's last-resort handler prints without configuration
    handler.setFormatter(TruncatingFormatter(limit=limit))
    root.addHandler(handler)
