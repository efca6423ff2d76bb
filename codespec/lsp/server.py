"""The language server: thin pygls handlers over documents, the engine service and the index.

Handlers fetch the document, call plain functions (``service.inline``, ``service.edit``, ``service.positions``)
and convert to lsprotocol types. Requests are async handlers, so ``$/cancelRequest`` cancels the
awaiting task, which cancels the engine job (it stops at its next cycle) and the client gets
RequestCancelled. Custom methods:

- ``codespec/edit`` (request): rewrite a range; streams ``codespec/editDelta`` notifications.
- ``codespec/stats`` (request): engine and server statistics.
- ``textDocument/copilotInlineEdit`` (request, Copilot's shape): the next edit after the user's
  recent edits (``service.next_edit``); ``textDocument/didShowInlineEdit`` is accepted and noted.
- commands ``codespec.accepted`` (from inline items), ``codespec.reindex``, ``codespec.clearHistory``.

Handlers run on the event loop; generation and index updates on the engine thread; workspace
indexing on the index's own thread (threading model: ``service.indexing``), with work-done progress
the user may cancel.

Errors: stdio and TCP are read by ``lsp.framing`` (bad frames are answered and skipped) and every
message passes ``lsp.rpc.CodespecProtocol`` (envelope and params checked, every request answered)
before a handler runs; the table of error codes is in docs/protocol.md. Documents over
``maxDocumentBytes`` are kept for completions but not indexed (one log line).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.exceptions import FeatureRequestError, JsonRpcException, JsonRpcInvalidParams
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer

from codespec import __version__
from codespec.core.errors import CodespecError
from codespec.lsp.completions import ACCEPTED_COMMAND, accepted_command, complete_at
from codespec.lsp.documents import Debouncer, DocumentNotOpen, DocumentStore
from codespec.lsp.framing import FrameReader
from codespec.lsp.held import holdable
from codespec.lsp.next_edits import NextEdits
from codespec.lsp.rpc import SERVER_NOT_INITIALIZED, CodespecProtocol, attach_stop_event, serve_frames
from codespec.lsp.sources import BlockingSource
from codespec.lsp.workspace import add_to_index, cancel_warm, log_failure, note_too_large, run_indexing, schedule_warm
from codespec.service.doors import logsafe
from codespec.service.doors.logsafe import clip
from codespec.service.doors.predictions import DoorTokenizer
from codespec.service.engine import indexing
from codespec.service.engine.jobs import AsyncJob, NewestJobs
from codespec.service.engine.runtime import close_service, start_service
from codespec.service.engine.service import EngineService
from codespec.service.requests import edit as edit_logic
from codespec.service.requests.edit_history import EditHistory
from codespec.service.requests.inline import Suggestion
from codespec.service.requests.next_edit import rule_inputs
from codespec.service.requests.options import ServerOptions, parse_options
from codespec.service.requests.positions import LineIndex, PositionError

log = logging.getLogger(__name__)

EDIT_METHOD = "codespec/edit"
EDIT_DELTA = "codespec/editDelta"
STATS_METHOD = "codespec/stats"
NEXT_EDIT_METHOD = "textDocument/copilotInlineEdit"  # Copilot's name: its clients (copilot-lsp) ask it
NEXT_EDIT_SHOWN = "textDocument/didShowInlineEdit"
REINDEX_COMMAND = "codespec.reindex"
CLEAR_HISTORY_COMMAND = "codespec.clearHistory"
REQUEST_FAILED = -32803  # LSP 3.17 RequestFailed: valid request, the server could not serve it
MAX_ACCEPTED_CHARS = 1 << 16  # codespec.accepted text (a completion is a few hundred characters)


class CodespecServer(LanguageServer):
    def __init__(self, base_options: ServerOptions = ServerOptions()) -> None:
        super().__init__(
            "codespec", __version__ if isinstance(__version__, str) else "0", protocol_cls=CodespecProtocol
        )
        self.base_options = base_options
        self.options = base_options
        self.service: EngineService | None = None
        self.documents = DocumentStore()
        self.suggestions: dict[str, Suggestion] = {}
        self.inflight = NewestJobs()  # newest inline request per document
        self.edit_history = EditHistory()  # what the user just did, keystroke by keystroke
        self.next_edits = NextEdits(self.edit_history)  # copilotInlineEdit: in flight, speculated
        self.warm_timers: dict[str, asyncio.TimerHandle] = {}  # documents waiting for their prefill
        self.roots: list[Path] = []
        self.encoding = "utf-16"
        self.debouncer: Debouncer | None = None
        self.indexing: asyncio.Task | None = None
        self.indexed_files = 0
        self._lines: tuple[str, str, LineIndex] | None = None  # the last text's line index
        self._door_tokenizer: DoorTokenizer | None = None

    @property
    def engine(self) -> EngineService:
        """The engine service, for handlers: ``initialize`` starts it, and ``lsp.rpc`` refuses any
        other request before (ServerNotInitialized)."""
        if self.service is None:
            raise CodespecError("the engine is not started: initialize first")
        return self.service

    def door_tokenizer(self) -> DoorTokenizer:
        """The engine's tokenizer, copied for this door (prediction tokens are counted off the loop)."""
        if self._door_tokenizer is None or self._door_tokenizer.service is not self.engine:
            self._door_tokenizer = DoorTokenizer(self.engine)
        return self._door_tokenizer

    # ---- transport --------------------------------------------------------------------------
    def start_io(self, stdin=None, stdout=None) -> None:
        """Serve LSP over stdio until the input ends or the client says exit: pygls's loop, with
        ``lsp.framing`` reading the frames (a bad one is answered and skipped, never fatal)."""
        logsafe.install()
        stop_event = attach_stop_event(self)
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        reader = FrameReader(
            BlockingSource(stdin or sys.stdin.buffer),
            lambda: self.options.transport.max_message_bytes,
            hold=holdable,
        )
        protocol = self.protocol
        assert isinstance(protocol, CodespecProtocol)  # protocol_cls above
        try:
            asyncio.run(serve_frames(reader, protocol, stop_event))
        except BrokenPipeError:
            log.error("the connection to the client is lost; shutting down")
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.shutdown()

    def report_server_error(self, error: Exception, source) -> None:
        """A failed notification handler: the user sees it (clipped); failed requests are answered."""
        if source == FeatureRequestError:
            return
        self.window_show_message(
            types.ShowMessageParams(
                message=f"codespec: error in the server: {clip(str(error))}", type=types.MessageType.Error
            )
        )

    # ---- helpers ----------------------------------------------------------------------------
    def tell_user(self, message: str, kind: types.MessageType = types.MessageType.Warning) -> None:
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def offset_of(self, text: str, position: types.Position) -> int:
        lines = self._lines  # a megabyte document is not split into lines again for each request
        if lines is None or lines[0] is not text or lines[1] != self.encoding:
            lines = self._lines = (text, self.encoding, LineIndex(text, self.encoding))
        return lines[2].offset(position.line, position.character, clamp=True)

    def sync_index(self, uri: str) -> None:
        """Debounced: hand the index the one replacement covering the recent keystrokes."""
        service = self.service
        document = self.documents.documents.get(uri)
        if service is None or service.index is None or document is None:
            return
        if document.too_large(self.options.index.max_document_bytes):
            if document.indexed_text is not None:  # it grew past the limit: the index forgets it
                document.indexed_text = None
                index = service.index
                log_failure(
                    service.call(lambda: index.remove_document(uri), idle=True, document=uri), f"removing {clip(uri)}"
                )
            note_too_large(self, document)
            return
        if document.indexed_text is None:  # back under the limit
            add_to_index(self, document)
            return
        change = document.pending_index_change()
        if change is None:
            return
        start, end, new_text = change
        version = document.version
        document.indexed_text = document.text
        log_failure(
            service.call(
                lambda: service.index.update_document(uri, start, end, new_text, version), idle=True, document=uri
            ),
            f"index update of {uri}",
        )


def client_errors(handler):
    """Turn what the client got wrong into InvalidParams and engine refusals into RequestFailed,
    with the message (clipped: it may quote a megabyte URI); a request while the model is still
    loading is ServerNotInitialized; anything else stays an internal error (logged by lsp.rpc)."""
    signature = inspect.signature(handler)

    @functools.wraps(handler)
    async def wrapped(*args, **kwargs):
        if args and getattr(args[0], "service", True) is None:
            raise JsonRpcException("the server is still starting (loading the model)", code=SERVER_NOT_INITIALIZED)
        try:
            signature.bind(*args, **kwargs)
        except TypeError as error:  # a command's arguments: [uri, text] for codespec.accepted
            raise JsonRpcInvalidParams(f"wrong arguments for {handler.__name__}: {clip(str(error))}") from None
        try:
            return await handler(*args, **kwargs)
        except (PositionError, DocumentNotOpen, edit_logic.EditParamsError) as error:
            raise JsonRpcInvalidParams(clip(str(error).strip("'\""), 500)) from None
        except CodespecError as error:
            raise JsonRpcException(clip(str(error), 500), code=REQUEST_FAILED) from None

    return wrapped


# (method or command, options, handler, is_command): what build_server registers on each new server.
# Handlers are module-level functions, one per feature, as jedi-language-server's are; each takes the
# server first (pygls passes it), so a test can call one on a server it built.
FEATURES: list[tuple[str, Any, Callable, bool]] = []


def feature(method: str, options: Any = None) -> Callable[[Callable], Callable]:
    def register(handler: Callable) -> Callable:
        FEATURES.append((method, options, handler, False))
        return handler

    return register


def command(name: str) -> Callable[[Callable], Callable]:
    def register(handler: Callable) -> Callable:
        FEATURES.append((name, None, handler, True))
        return handler

    return register


@feature(types.INITIALIZE)
async def initialize(ls: CodespecServer, params: types.InitializeParams) -> None:
    ls.options, messages = parse_options(params.initialization_options, ls.base_options)
    for message in messages:
        ls.tell_user(message)
    encoding = getattr(ls.workspace, "position_encoding", None) or "utf-16"
    ls.encoding = str(getattr(encoding, "value", encoding)).lower()
    ls.roots = [
        path
        for path in (indexing.uri_to_path(folder.uri) for folder in params.workspace_folders or [])
        if path is not None
    ]
    if not ls.roots and params.root_uri and (root := indexing.uri_to_path(params.root_uri)) is not None:
        ls.roots = [root]
    ls.debouncer = Debouncer(ls.options.index.debounce_ms / 1000, ls.sync_index)
    ls.service = await asyncio.to_thread(start_service, ls.options)


@feature(types.INITIALIZED)
async def initialized(ls: CodespecServer, params: types.InitializedParams) -> None:
    if ls.options.index.enabled and ls.roots:
        db_path = Path(ls.options.index.path) if ls.options.index.path else indexing.default_index_path(ls.roots)
        index = await asyncio.to_thread(indexing.open_index, ls.service, db_path, ls.options.index.max_tokens)
        if index is not None:
            ls.indexing = asyncio.create_task(run_indexing(ls))
            for document in ls.documents.documents.values():  # opened before the index existed
                add_to_index(ls, document)


@feature(types.SHUTDOWN)
def shutdown(ls: CodespecServer, params: Any) -> None:
    for uri in list(ls.warm_timers):  # a prefill timer firing after this would find no engine
        cancel_warm(ls, uri)
    if ls.service is not None:
        close_service(ls.service)


@feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: CodespecServer, params: types.DidOpenTextDocumentParams) -> None:
    item = params.text_document
    document = ls.documents.open(item.uri, item.text, item.version, item.language_id)
    add_to_index(ls, document)
    schedule_warm(ls, document)


@feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: CodespecServer, params: types.DidChangeTextDocumentParams) -> None:
    document = ls.documents.documents.get(params.text_document.uri)
    if document is None:  # a client bug; nothing to apply the change to
        log.warning("didChange for %s, which is not open", clip(params.text_document.uri))
        return
    version = params.text_document.version
    for change in params.content_changes:
        try:
            if isinstance(change, types.TextDocumentContentChangePartial):
                rng = change.range
                start, end, inserted, before = document.apply_change(
                    (rng.start.line, rng.start.character),
                    (rng.end.line, rng.end.character),
                    change.text,
                    None,
                    ls.encoding,
                )
            else:
                start, end, inserted, before = document.apply_change(None, None, change.text, None)
            ls.edit_history.record(document.uri, before, start, end, inserted, version)
        except PositionError as error:  # out of sync with the client: say so, keep serving
            ls.tell_user(
                f"codespec: could not apply an edit to {clip(document.uri)} ({clip(str(error))}); "
                f"completions there may be off until the file is reopened"
            )
            break
    document.version = version
    ls.next_edits.changed(document.uri, document.text)
    if ls.debouncer is not None:
        ls.debouncer.touch(document.uri)


@feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: CodespecServer, params: types.DidSaveTextDocumentParams) -> None:
    if ls.debouncer is not None:
        ls.debouncer.flush(params.text_document.uri)


@feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: CodespecServer, params: types.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    if ls.debouncer is not None:
        ls.debouncer.flush(uri)
    ls.documents.close(uri)
    if ls.service is not None and ls.service.index is not None:
        index = ls.service.index
        log_failure(
            ls.service.call(lambda: index.close_document(uri), idle=True, document=uri),
            f"closing {uri} in the index",
        )
    ls.suggestions.pop(uri, None)
    cancel_warm(ls, uri)
    ls.inflight.cancel(uri)
    ls.next_edits.close(uri)


@feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
@client_errors
async def inline_completion(ls: CodespecServer, params: types.InlineCompletionParams):
    invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
    found = await complete_at(ls, params.text_document.uri, params.position, invoked)
    if found is None:
        return []
    text, position = found
    return [
        types.InlineCompletionItem(
            insert_text=text,
            range=types.Range(position, position),
            command=accepted_command(params.text_document.uri, text),
        )
    ]


@feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(resolve_provider=False))
@client_errors
async def completion(ls: CodespecServer, params: types.CompletionParams):
    if not ls.options.completion.completion_fallback:
        return None
    found = await complete_at(ls, params.text_document.uri, params.position, invoked=True)
    if found is None:
        return types.CompletionList(is_incomplete=True, items=[])
    text, position = found
    label = next((line.strip() for line in text.splitlines() if line.strip()), text)[:80]
    return types.CompletionList(
        is_incomplete=True,
        items=[
            types.CompletionItem(
                label=label,
                kind=types.CompletionItemKind.Text,
                detail="codespec",
                filter_text=label,
                text_edit=types.TextEdit(types.Range(position, position), text),
                command=accepted_command(params.text_document.uri, text),
            )
        ],
    )


@feature(EDIT_METHOD)
@client_errors
async def edit(ls: CodespecServer, params: Any) -> dict:
    raw = edit_logic.as_dict(params)
    uri = edit_logic.text_document_uri(raw)
    document = ls.documents.get(uri)
    plan = edit_logic.plan_edit(document.text, raw, ls.encoding, ls.options.completion.edit_tokens)
    edit_id = str(raw.get("editId") or uuid.uuid4())

    def on_delta(text: str) -> None:
        ls.protocol.notify(EDIT_DELTA, {"editId": edit_id, "uri": uri, "text": text})

    recent = rule_inputs(ls.edit_history.recent(uri))  # the rewrite drafts them repeated, too
    request = edit_logic.edit_request(
        plan, cache_key=f"edit:{uri}", uri=uri, cursor=plan.start, edits=recent, origin="lsp"
    )
    result = await AsyncJob(ls.engine, request, on_delta).result()
    prediction = raw.get("prediction")
    counts = (0, 0)  # as the HTTP and websocket doors count them: 0 without a prediction
    if isinstance(prediction, str):
        counts = await ls.door_tokenizer().prediction_counts(prediction, result.text)
    return edit_logic.edit_response(edit_id, raw["range"], result, counts)


@feature(NEXT_EDIT_METHOD)
@client_errors
async def next_edit(ls: CodespecServer, params: Any) -> dict:
    raw = edit_logic.as_dict(params)
    uri = edit_logic.text_document_uri(raw)
    return {"edits": await ls.next_edits.answer(ls, uri, raw)}


@feature(NEXT_EDIT_SHOWN)
def next_edit_shown(ls: CodespecServer, params: Any) -> None:
    log.debug("next edit shown: %s", clip(str(edit_logic.as_dict(params)), 200))


@feature(STATS_METHOD)
@client_errors
async def stats(ls: CodespecServer, params: Any) -> dict:
    service = ls.engine
    open_texts = {uri: document.text for uri, document in ls.documents.documents.items()}

    def collect() -> dict:  # on the engine thread: queued index updates have been applied
        snapshot = service.stats_snapshot()
        index = service.index
        snapshot["documents"] = [
            {"uri": uri, "indexed": index is not None and indexing.indexed_text(index, uri) == text}
            for uri, text in open_texts.items()
        ]
        snapshot["index_documents"] = len(index.documents()) if index is not None else 0
        snapshot["index_health"] = index.health() if index is not None else None
        # read where the engine appends to it
        snapshot["history"] = [{"kind": kind, "uri": uri, "text": text} for kind, uri, text in service.history.recent]
        return snapshot

    snapshot = await service.acall(collect)
    snapshot["documents_open"] = len(open_texts)
    protocol = ls.protocol
    snapshot["held_frames"] = protocol.held_frames if isinstance(protocol, CodespecProtocol) else 0
    snapshot["pending_index_updates"] = sorted(ls.debouncer.pending) if ls.debouncer else []
    snapshot["workspace_files_indexed"] = ls.indexed_files
    return snapshot


@command(ACCEPTED_COMMAND)
@client_errors
async def accepted(ls: CodespecServer, uri: str, text: str) -> None:
    if len(text) > MAX_ACCEPTED_CHARS:
        raise JsonRpcInvalidParams(
            f"codespec.accepted: the text is {len(text)} characters; an accepted "
            f"completion is at most {MAX_ACCEPTED_CHARS}"
        )
    await asyncio.wrap_future(ls.engine.record_history("accepted", text, uri))


@command(REINDEX_COMMAND)
@client_errors
async def reindex(ls: CodespecServer, *args: Any) -> None:
    if ls.engine.index is None:
        ls.tell_user("codespec: the workspace index is off or unavailable", types.MessageType.Info)
        return
    if ls.indexing is not None and not ls.indexing.done():
        await ls.indexing
        return
    ls.indexing = asyncio.create_task(run_indexing(ls))
    await ls.indexing


@command(CLEAR_HISTORY_COMMAND)
@client_errors
async def clear_history(ls: CodespecServer, *args: Any) -> None:
    ls.edit_history.clear()
    ls.next_edits.clear()
    await asyncio.wrap_future(ls.engine.clear_history())


def build_server(base_options: ServerOptions = ServerOptions()) -> CodespecServer:
    """A language server with every feature of this module registered (a fresh one per call)."""
    server = CodespecServer(base_options)
    for name, options, handler, is_command in FEATURES:
        if is_command:
            server.command(name)(handler)
        elif options is None:
            server.feature(name)(handler)
        else:
            server.feature(name, options)(handler)
    return server


__all__ = ["build_server", "close_service", "start_service", "CodespecServer", "PositionError"]
