"""The LSP door's next edits: Copilot's ``textDocument/copilotInlineEdit`` answered from
``service.next_edit`` (docs/next-edit.md).

Per document: the request in flight (a newer one cancels it) and a *speculation*: when a
suggestion is answered, the request the user's next step will make if they accept it (the
document with the suggestion applied, that change added to the recent edits) is submitted at once.
When the next request comes for exactly that text, the speculation's answer is its reference draft,
so verifying it takes a forward or two; the output is still the target's own (lossless), and any
other change to the document drops the speculation.

The recent edits are the workspace's (a rename made in one file is repeated in the next). When
their rules find no site in the document asked about and the client said it can take an edit in
another document (``otherDocuments: true`` in the request, which codespec's own clients send;
Copilot's clients, such as copilot-lsp, draw an answer in the buffer that asked), the other open
documents are searched, then the files the workspace index holds: the answer then names that
document. An open one is answered with its version (the client jumps there and shows the edit); a
file the editor has not opened, read from disk, with version null: the client opens it and asks
there, and that request finds this answer ready (its window kept, the answer its draft), so it
costs a forward or two.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from lsprotocol import types

from codespec.lsp.completions import ACCEPTED_COMMAND
from codespec.lsp.documents import DocumentStore
from codespec.service.engine.indexing import read_file
from codespec.service.engine.jobs import AsyncJob, NewestJobs
from codespec.service.requests import edit as edit_logic
from codespec.service.requests.edit_history import EditHistory, RecordedEdit
from codespec.service.requests.next_edit import FINISHED, NextEditPlan, OtherDocument, next_edit_request, suggestion
from codespec.service.requests.options import ServerOptions
from codespec.service.requests.positions import LineIndex

log = logging.getLogger(__name__)


class Door(Protocol):
    """What next edits read of the language server (``lsp.server.CodespecServer``)."""

    documents: DocumentStore
    options: ServerOptions
    encoding: str

    @property
    def engine(self) -> Any: ...  # the service, started (service.engine.EngineService)

    def offset_of(self, text: str, position: types.Position) -> int: ...


@dataclass
class Speculation:
    text: str  # the document as it will read once the suggestion is accepted (or as it was read)
    window: str  # the window the speculated request rewrites
    job: AsyncJob | None  # the request asked ahead, or None when ``ready`` holds its answer
    ready: str | None = None  # an answer made already (for a file the client is about to open)
    start: int = -1  # where ``window`` starts in ``text`` (a ready answer's request keeps its window)


class NextEdits:
    def __init__(self, history: EditHistory) -> None:
        self.history = history
        self.inflight = NewestJobs()
        self.asked: dict[str, int] = {}  # requests per document so far: the newest one answers
        self._tasks: set[asyncio.Task] = set()
        self.speculations: dict[str, Speculation] = {}

    async def answer(self, ls: Door, uri: str, raw: dict) -> list[dict]:
        """``{edits: [...]}``'s list: the next edit, or none. A request for a version the server no
        longer has, or a document that changed while the suggestion was made, gets none (the client
        checks the version too)."""
        document = ls.documents.get(uri)
        asked = raw.get("textDocument", {}).get("version")
        if asked is not None and (isinstance(asked, bool) or not isinstance(asked, int)):
            raise edit_logic.EditParamsError("textDocument.version must be an integer")
        position = raw.get("position")
        if not isinstance(position, dict) or not all(
            isinstance(position.get(key), int) and not isinstance(position.get(key), bool)
            for key in ("line", "character")
        ):
            raise edit_logic.EditParamsError("copilotInlineEdit needs a position {line, character}")
        if asked is not None and asked != document.version:
            return []  # stale: the client will ask again for the current version
        if document.too_large(ls.options.index.max_document_bytes):
            return []  # rewriting windows of a megabyte file is not a suggestion anyone waits for
        text, version = document.text, document.version
        cursor = ls.offset_of(text, types.Position(position["line"], position["character"]))
        edits = self.history.recent()  # the workspace's: the edit may have been made in another file
        self.inflight.cancel(uri)  # a newer request supersedes the older one at once
        ticket = self.asked[uri] = self.asked.get(uri, 0) + 1
        others = self._elsewhere(ls, uri) if raw.get("otherDocuments") is True else None
        # asked inside the window of an answer made ready for this text: that window, so the answer
        # is the draft (the client asks where the edit starts, not where the window does)
        made = self.speculations.get(uri)
        fixed = None
        if made is not None and made.ready is not None and made.text == text:
            if made.start <= cursor <= made.start + len(made.window):
                fixed = (made.start, made.start + len(made.window))
        # window search and rules are pure Python over the documents: off the event loop
        request, plan = await asyncio.to_thread(self._request, ls, uri, text, cursor, edits, version, others, fixed)
        if not plan.window:
            return []  # the cursor's line alone is longer than a window (minified code)
        speculated = await self._speculated(plan.uri, plan.text, plan)
        if self.asked.get(uri) != ticket or ls.documents.documents.get(uri) is not document:
            return []  # superseded (or the document closed) while the window was chosen or waited on
        if speculated is not None:  # the answer for this state, asked ahead: the draft
            # drafted from it, with the budget of the window it rewrites: the answer is the one it would be without
            budget = request.reference if request.budget_text is None else request.budget_text
            request = dataclasses.replace(request, reference=speculated, budget_text=budget)
        result = await self.inflight.run(ls.engine, uri, request)  # a newer request supersedes this one
        found = suggestion(plan, result.text, result.reason)
        current = ls.documents.documents.get(uri) is document and document.text is text
        if found is None or not current or document.version != version or not self._unchanged(ls, plan):
            return []  # no finished answer, or a document moved on (or was closed and reopened)
        if plan.version is None:  # a file the client will open and ask about: this is that answer
            for ready in [u for u, held in self.speculations.items() if held.ready is not None]:
                del self.speculations[ready]  # only the newest is followed: memory stays bounded
            self._drop(plan.uri)
            self.speculations[plan.uri] = Speculation(plan.text, plan.window, None, result.text, plan.start)
        elif ls.options.completion.next_edit_speculate:
            task = asyncio.create_task(self._speculate(ls, plan.uri, plan.text, found, edits, plan.version))
            self._tasks.add(task)  # kept until done (the loop holds tasks weakly)
            task.add_done_callback(self._tasks.discard)
        target = ls.documents.documents.get(plan.uri)
        lines = target.line_index(ls.encoding) if target is not None else LineIndex(plan.text, ls.encoding)
        start, end = lines.position(found.start), lines.position(found.end)
        return [
            {
                "text": found.text,
                "range": {
                    "start": {"line": start.line, "character": start.character},
                    "end": {"line": end.line, "character": end.character},
                },
                "textDocument": {"uri": plan.uri, "version": plan.version},
                "command": {
                    "title": "codespec: accepted",
                    "command": ACCEPTED_COMMAND,
                    "arguments": [plan.uri, found.text],
                },
            }
        ]

    def changed(self, uri: str, text: str) -> None:
        """The document changed: a speculation for any other text is void."""
        speculation = self.speculations.get(uri)
        if speculation is not None and speculation.text != text:
            self._drop(uri)

    def close(self, uri: str) -> None:
        self.inflight.cancel(uri)
        self.asked.pop(uri, None)
        self._drop(uri)
        self.history.forget(uri)  # reopened, the file may read otherwise: its edits start over

    def clear(self) -> None:
        for uri in list(self.speculations):
            self._drop(uri)

    # -- helpers ------------------------------------------------------------------------------------
    @staticmethod
    def _elsewhere(ls: Door, uri: str) -> Iterator[OtherDocument]:
        """Where else the next site may be, nearest first: the other open documents (most recently
        opened first), then the index's files the editor has not opened (most recently used
        first; searched in the index's copy, read from disk only where the rules may apply). Open
        documents are listed now, on the event loop; the index is read when the search gets to it."""
        limit = ls.options.index.max_document_bytes
        opened = dict(ls.documents.documents)
        nearest = [d for d in reversed(opened.values()) if d.uri != uri and not d.too_large(limit)]
        index = ls.engine.index

        def documents() -> Iterator[OtherDocument]:
            yield from (OtherDocument(d.uri, d.text, d.version) for d in nearest)
            for other, text in index.texts() if index is not None else ():
                if other not in opened and other != uri and len(text) <= limit:
                    yield OtherDocument(other, text, None, read=functools.partial(read_file, other, limit))

        return documents()

    @staticmethod
    def _unchanged(ls: Door, plan: NextEditPlan) -> bool:
        """Whether the document the plan's window is in still reads as it did (an open one: the
        same version; a file on disk: the client opens it and asks again, which checks)."""
        if plan.version is None:
            return True
        target = ls.documents.documents.get(plan.uri)
        return target is not None and target.version == plan.version and target.text == plan.text

    @staticmethod
    def _request(
        ls: Door, uri: str, text: str, cursor: int, edits: list[RecordedEdit], version, elsewhere=None, window=None
    ):
        options = ls.options.completion
        prompt_format = options.next_edit_format
        if prompt_format == "auto":
            prompt_format = "zeta" if "zeta" in str(getattr(ls.engine.target, "name", "")).lower() else "rewrite"
        return next_edit_request(
            text,
            cursor,
            edits,
            uri=uri,
            version=version,
            prompt_format=prompt_format,
            budget=options.next_edit_tokens,
            origin="lsp",
            elsewhere=None if elsewhere is None else lambda: elsewhere,
            fixed_window=window,
        )

    async def _speculated(self, uri: str, text: str, plan: NextEditPlan) -> str | None:
        """The speculated answer for exactly this text and window, if it is ready: one still running
        is cancelled rather than waited for (it may be running to its budget; the request itself
        costs no more than what is left of it)."""
        speculation = self.speculations.pop(uri, None)
        if speculation is None:
            return None
        if speculation.text == text and speculation.window == plan.window and speculation.ready is not None:
            return speculation.ready
        if speculation.job is None or speculation.text != text or speculation.window != plan.window:
            self._cancel(speculation)
            return None
        if not speculation.job.job.future.done():
            speculation.job.cancel()
            return None
        result = await speculation.job.result()
        return result.text if result.reason in FINISHED and result.text else None

    async def _speculate(self, ls: Door, uri: str, text: str, found, edits: list[RecordedEdit], version) -> None:
        """Ask now what the next request will ask if this suggestion is accepted."""
        self._drop(uri)
        ticket = self.asked.get(uri)
        after = text[: found.start] + found.text + text[found.end :]
        accepted = self.history.edit_for(uri, text, found.start, found.end, found.text)
        cursor = found.start + len(found.text)
        next_version = None if version is None else version + 1
        request, plan = await asyncio.to_thread(self._request, ls, uri, after, cursor, [*edits, accepted], next_version)
        if self.asked.get(uri) != ticket or not plan.window:
            return  # the user asked again meanwhile, or closed the file: this is no longer the next step
        request = dataclasses.replace(request, ahead=True)  # nobody waits on it: it runs as background work
        try:
            job = AsyncJob(ls.engine, request)
        except Exception as error:  # a speculation is only a hint: never fail over it
            log.info("next-edit speculation not submitted: %s", error)
            return
        self.speculations[uri] = Speculation(after, plan.window, job)

    def _drop(self, uri: str) -> None:
        speculation = self.speculations.pop(uri, None)
        if speculation is not None:
            self._cancel(speculation)

    @staticmethod
    def _cancel(speculation: Speculation) -> None:
        if speculation.job is not None:
            speculation.job.cancel()


__all__ = ["Door", "NextEdits", "Speculation"]
