"""The language server's side of the workspace: opened documents prefilled in the background, kept
in the index, and the workspace folders indexed with work-done progress (docs/index.md).

Functions over the server (``Server``: what they read of ``lsp.server.CodespecServer``), called by
its handlers; generation stays in ``lsp.server``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Protocol

from lsprotocol import types

from codespec.lsp.documents import Document, DocumentStore
from codespec.service.doors.logsafe import clip
from codespec.service.engine import indexing
from codespec.service.requests.inline import completion_windows, warm_prompt
from codespec.service.requests.options import ServerOptions
from codespec.service.requests.schema import GenerationRequest, RequestKind

log = logging.getLogger(__name__)

WARM_DELAY_S = 0.15  # how long a document must stay open before its background prefill starts
PROGRESS_TOKEN_PREFIX = "codespec/indexing"


class Server(Protocol):
    """What these functions read and keep on the language server."""

    service: Any  # service.engine.EngineService, None before initialize
    options: ServerOptions
    documents: DocumentStore
    warm_timers: dict[str, asyncio.TimerHandle]
    indexed_files: int
    roots: list

    @property
    def client_capabilities(self) -> types.ClientCapabilities: ...

    @property
    def work_done_progress(self) -> Any: ...  # pygls's progress helper


def schedule_warm(ls: Server, document) -> None:
    """Prefill a just-opened document once the user has stayed on it for ``WARM_DELAY_S``: flipping
    through files costs nothing, and a completion asked at once is not slowed by a prefill of a
    window it may not use (it cancels the timer and prefills what it needs)."""
    cancel_warm(ls, document.uri)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on the server's event loop (a direct call): prefill now
        warm_document(ls, document)
        return

    def fire() -> None:
        ls.warm_timers.pop(document.uri, None)
        if ls.documents.documents.get(document.uri) is document:  # still open
            warm_document(ls, document)

    ls.warm_timers[document.uri] = loop.call_later(WARM_DELAY_S, fire)


def cancel_warm(ls: Server, uri: str) -> None:
    timer = ls.warm_timers.pop(uri, None)
    if timer is not None:
        timer.cancel()


def warm_document(ls: Server, document) -> None:
    """Prefill a just-opened document's KV cache with the prompt start its completions will share,
    so the first completion there prefills only the text near the cursor (in the background, a chunk
    per engine cycle; a completion arriving meanwhile takes over what is prefilled)."""
    if ls.service is None:
        return
    prefix_chars, _ = completion_windows(ls.service.target, ls.options)
    prompt = warm_prompt(document.text, prefix_chars, ls.service.prompts)
    if prompt is not None:
        ls.service.submit(
            GenerationRequest(
                prompt=prompt, max_tokens=1, kind=RequestKind.PREFILL, cache_key=document.uri, proposer="none"
            )
        )


def note_too_large(ls: Server, document: Document) -> None:
    """One log line per document over ``maxDocumentBytes`` (tokenizing it whole for the index
    would hold the engine for seconds and take a gigabyte: it is served without the index)."""
    if not document.size_noted:
        document.size_noted = True
        log.warning(
            "codespec: %s is over maxDocumentBytes (%d bytes): not indexed; completions there "
            "use the text around the cursor",
            clip(document.uri, 120),
            ls.options.index.max_document_bytes,
        )


def add_to_index(ls: Server, document) -> None:
    service = ls.service
    if service is None or service.index is None or document.indexed_text is not None:
        return
    if document.too_large(ls.options.index.max_document_bytes):
        note_too_large(ls, document)
        index, uri = service.index, document.uri  # a smaller version opened before: not kept stale
        log_failure(service.call(lambda: index.remove_document(uri), idle=True, document=uri), f"removing {clip(uri)}")
        return
    uri, text, version = document.uri, document.text, document.version
    document.indexed_text = text
    log_failure(service.index_document(uri, text, version), f"indexing {uri}")


def log_failure(future, what: str) -> None:
    """Fire-and-forget index work has no caller to raise to: log its error instead of losing it."""

    def check(done) -> None:
        error = None if done.cancelled() else done.exception()
        if error is not None:
            log.error("%s failed: %s", clip(what), clip(str(error)), exc_info=error)

    future.add_done_callback(check)


async def run_indexing(ls: Server) -> None:
    """Index the workspace folders on the indexing thread (completions keep running), reporting
    work-done progress when the client supports it; the user may cancel it from the progress."""
    from codespec.index.ingest import ScanCancelled  # only reached once an index is open

    loop = asyncio.get_running_loop()
    token = f"{PROGRESS_TOKEN_PREFIX}/{uuid.uuid4().hex[:8]}"
    capabilities = ls.client_capabilities
    use_progress = bool(capabilities.window and capabilities.window.work_done_progress)
    if use_progress:
        try:
            await ls.work_done_progress.create_async(token)
        except Exception as error:  # the client refused: index without a progress bar
            log.info("progress not created: %s", error)
            use_progress = False
    if use_progress:
        ls.work_done_progress.begin(
            token, types.WorkDoneProgressBegin(title="codespec: indexing workspace", cancellable=True, percentage=0)
        )

    def report(done: int, total: int) -> None:
        ls.indexed_files = done
        if use_progress:
            percentage = int(100 * done / total) if total else 100
            ls.work_done_progress.report(
                token, types.WorkDoneProgressReport(message=f"{done}/{total} files", percentage=percentage)
            )

    def progress(done: int, total: int) -> None:  # the indexing thread
        loop.call_soon_threadsafe(report, done, total)

    summary = "stopped"  # the awaiting task was cancelled (which stops the scan too)
    scan = indexing.index_workspace(
        ls.service, ls.roots, ls.options.index.exclude, ls.options.index.max_file_bytes, progress
    )
    cancelled_by_user = ls.work_done_progress.tokens.get(token) if use_progress else None
    if cancelled_by_user is not None:  # pygls cancels the token's future on window/workDoneProgress/cancel
        cancelled_by_user.add_done_callback(lambda _: scan.cancel())
    try:
        await asyncio.wrap_future(scan)
        summary = "done"
    except ScanCancelled:
        summary = "cancelled; run the codespec.reindex command to index again"
    except Exception as error:
        summary = f"failed: {error}"
        log.warning("workspace indexing failed: %s", error)
    finally:
        if use_progress:  # a stopped or failed scan installs nothing: no count of "indexed" files
            message = f"{ls.indexed_files} files indexed (done)" if summary == "done" else f"indexing {summary}"
            ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
