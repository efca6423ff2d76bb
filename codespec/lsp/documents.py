"""Open documents, kept current by incremental sync, and a per-document debounce for the index.

Every keystroke updates the document text at once (completions need it), but the index hears
about a burst of keystrokes once, after ``delay_s`` of quiet, as one replacement computed between
the text the index last saw and the current text. What that replacement removed is what the
index records as history (previous versions of edited text).

A document over the server's ``maxDocumentBytes`` (``Document.too_large``) is kept here for
completions near the cursor but not handed to the index: tokenizing it whole would hold the engine
thread for seconds and, inside the tokenizer, take ~200 bytes per token (a 5 MB file: 1.2 GB).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from codespec.service.requests.positions import LineIndex, PositionError, changed_span


@dataclass
class Document:
    uri: str
    text: str
    version: int
    language_id: str = ""
    indexed_text: str | None = None  # what the index last saw (None: not yet added)
    size_noted: bool = field(default=False, repr=False, compare=False)  # "too large" was logged
    _lines: tuple | None = field(default=None, repr=False, compare=False)  # (text, encoding, LineIndex)

    def line_index(self, encoding: str = "utf-16") -> LineIndex:
        """The current text's line index, kept until the text changes."""
        lines = self._lines
        if lines is None or lines[0] is not self.text or lines[1] != encoding:
            lines = self._lines = (self.text, encoding, LineIndex(self.text, encoding))
        return lines[2]

    def too_large(self, limit: int) -> bool:
        """Whether the text is over ``limit`` bytes of UTF-8 (counted only when it could be)."""
        count = len(self.text)
        if count > limit:
            return True
        if count * 4 <= limit or self.text.isascii():
            return False
        return len(self.text.encode("utf-8", "surrogatepass")) > limit

    def apply_change(
        self,
        start: tuple[int, int] | None,
        end: tuple[int, int] | None,
        new_text: str,
        version: int | None,
        encoding: str = "utf-16",
    ) -> tuple[int, int, str, str]:
        """Apply one content change; ``start``/``end`` None replaces the whole text. Returns it as
        the smallest replacement: (start, end) in code points of the text before it, the text put
        there, and the text before it (what the edit history records)."""
        before = self.text
        if start is None or end is None:
            start_offset, end_offset, new_text = changed_span(before, new_text)
            self.text = before[:start_offset] + new_text + before[end_offset:]
        else:
            index = self.line_index(encoding)
            start_offset = index.offset(*start, clamp=True)
            end_offset = index.offset(*end, clamp=True)
            if end_offset < start_offset:
                raise PositionError(f"change range end {end} comes before its start {start}")
            self.text = self.text[:start_offset] + new_text + self.text[end_offset:]
        if version is not None:
            self.version = version
        return start_offset, end_offset, new_text, before

    def pending_index_change(self) -> tuple[int, int, str] | None:
        """The one replacement that brings the index up to date, or None if it already is."""
        if self.indexed_text is None or self.indexed_text == self.text:
            return None
        return changed_span(self.indexed_text, self.text)


class DocumentNotOpen(KeyError):
    """A request named a document the client never opened (a client error, not a server bug)."""


class DocumentStore:
    def __init__(self) -> None:
        self.documents: dict[str, Document] = {}

    def open(self, uri: str, text: str, version: int, language_id: str = "") -> Document:
        document = Document(uri, text, version, language_id)
        self.documents[uri] = document
        return document

    def get(self, uri: str) -> Document:
        document = self.documents.get(uri)
        if document is None:
            raise DocumentNotOpen(f"document {uri} is not open (send textDocument/didOpen first)")
        return document

    def close(self, uri: str) -> Document | None:
        return self.documents.pop(uri, None)


class Debouncer:
    """Run ``callback(key)`` once ``delay_s`` after the last ``touch(key)``; ``flush`` runs it now."""

    def __init__(
        self, delay_s: float, callback: Callable[[str], None], loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.delay_s = delay_s
        self.callback = callback
        self.loop = loop
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def touch(self, key: str) -> None:
        loop = self.loop or asyncio.get_running_loop()
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_later(self.delay_s, self._fire, key)

    def flush(self, key: str) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
            self.callback(key)

    def cancel(self, key: str) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    @property
    def pending(self) -> set[str]:
        return set(self._timers)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.callback(key)
