"""The LSP door's next edits: Copilot's ``textDocument/copilotInlineEdit`` answered from
``service.next_edit`` (docs/next-edit.md).

Per document: the request in flight (a newer one cancels it) and a *speculation*: when a
suggestion is answered, the request the user's next step will make if they accept it (the
document with the suggestion applied, that change added to the recent edits) is submitted at once.
When the next request comes for exactly that text, the speculation's answer is its reference draft,
so verifying it takes a forward or two; the output is still the target's own (lossless), and any
other change to the document drops the speculation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from lsprotocol import types

from lsp.documents import DocumentStore
from service import edit as edit_logic
from service.edit_history import EditHistory, RecordedEdit
from service.jobs import AsyncJob, NewestJobs
from service.next_edit import FINISHED, NextEditPlan, next_edit_request, suggestion
from service.options import ServerOptions

log = logging.getLogger(__name__)

ACCEPTED_COMMAND = "codespec.accepted"


class Door(Protocol):
    """What next edits read of the language server (``lsp.server.CodespecServer``)."""

    documents: DocumentStore
    options: ServerOptions
    service: Any  # service.engine.EngineService
    encoding: str

    def offset_of(self, text: str, position: types.Position) -> int: ...


@dataclass
class Speculation:
    text: str  # the document as it will read once the suggestion is accepted
    window: str  # the window the speculated request rewrites
    job: AsyncJob


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
        edits = self.history.recent(uri)
        self.inflight.cancel(uri)  # a newer request supersedes the older one at once
        ticket = self.asked[uri] = self.asked.get(uri, 0) + 1
        # window search and rules are pure Python over the document: off the event loop
        request, plan = await asyncio.to_thread(self._request, ls, uri, text, cursor, edits, version)
        if not plan.window:
            return []  # the cursor's line alone is longer than a window (minified code)
        speculated = await self._speculated(uri, text, plan)
        if self.asked.get(uri) != ticket or ls.documents.documents.get(uri) is not document:
            return []  # superseded (or the document closed) while the window was chosen or waited on
        if speculated is not None:  # the answer for this state, asked ahead: the draft
            request = dataclasses.replace(request, reference=speculated)
        result = await self.inflight.run(ls.service, uri, request)  # a newer request supersedes this one
        found = suggestion(plan, result.text, result.reason)
        current = ls.documents.documents.get(uri) is document and document.text is text
        if found is None or not current or document.version != version:
            return []  # no finished answer, or the document moved on (or was closed and reopened)
        if ls.options.completion.next_edit_speculate:
            task = asyncio.create_task(self._speculate(ls, uri, text, found, edits, version))
            self._tasks.add(task)  # kept until done (the loop holds tasks weakly)
            task.add_done_callback(self._tasks.discard)
        lines = document.line_index(ls.encoding)
        start, end = lines.position(found.start), lines.position(found.end)
        return [
            {
                "text": found.text,
                "range": {
                    "start": {"line": start.line, "character": start.character},
                    "end": {"line": end.line, "character": end.character},
                },
                "textDocument": {"uri": uri, "version": version},
                "command": {"title": "codespec: accepted", "command": ACCEPTED_COMMAND, "arguments": [uri, found.text]},
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
    def _request(ls: Door, uri: str, text: str, cursor: int, edits: list[RecordedEdit], version):
        options = ls.options.completion
        prompt_format = options.next_edit_format
        if prompt_format == "auto":
            prompt_format = "zeta" if "zeta" in str(getattr(ls.service.target, "name", "")).lower() else "rewrite"
        return next_edit_request(
            text,
            cursor,
            edits,
            uri=uri,
            version=version,
            prompt_format=prompt_format,
            budget=options.next_edit_tokens,
            origin="lsp",
        )

    async def _speculated(self, uri: str, text: str, plan: NextEditPlan) -> str | None:
        """The speculated answer for exactly this text and window, if it is ready: one still running
        is cancelled rather than waited for (it may be running to its budget; the request itself
        costs no more than what is left of it)."""
        speculation = self.speculations.pop(uri, None)
        if speculation is None:
            return None
        if speculation.text != text or speculation.window != plan.window or not speculation.job.job.future.done():
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
            job = AsyncJob(ls.service, request)
        except Exception as error:  # a speculation is only a hint: never fail over it
            log.info("next-edit speculation not submitted: %s", error)
            return
        self.speculations[uri] = Speculation(after, plan.window, job)

    def _drop(self, uri: str) -> None:
        speculation = self.speculations.pop(uri, None)
        if speculation is not None:
            speculation.job.cancel()


__all__ = ["Door", "NextEdits", "Speculation"]
