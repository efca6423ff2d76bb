"""JSON-RPC envelopes: every request gets exactly one answer, whatever it looks like.

This is the one module that touches pygls's private methods and attributes (it overrides how
``LanguageServerProtocol`` receives, dispatches and answers); tests/lsp/test_pygls_adapter.py
fails when pygls changes any of them, and tests/test_architecture.py keeps every other module to
pygls's public API.

``CodespecProtocol.receive`` takes what ``lsp.framing`` read and answers, before pygls sees it:

| what | answer |
|---|---|
| a frame that is not JSON (or a broken frame) | -32700 Parse error, with the id when it can be read |
| not an object, ``jsonrpc`` not "2.0", an id that is not an integer or a string, no ``method``, a ``method`` that is not a string, a notification method sent with an id | -32600 Invalid request |
| a request after ``shutdown`` | -32600 |
| a second ``initialize`` | -32600; a request before ``initialize`` (but ``shutdown``): -32002 ServerNotInitialized |
| a method the server does not implement | -32601 Method not found |
| params that do not fit the method's schema (lsprotocol types: a missing field, a wrong type, a position out of range), params nested deeper than ``lsp.params.MAX_DEPTH`` | -32602 Invalid params, naming the field |

Messages without an id (notifications) are never answered: a bad one is logged in one short line
and dropped. Strings in params are checked for lone surrogates (``"\\ud800"`` in JSON, text no
encoder accepts): each is replaced by U+FFFD, which keeps every position (one UTF-16 code unit,
one code point, for one) and lets the tokenizer encode the text.

pygls then dispatches the structured message; its request-failure logging is replaced by one
clipped line (client errors at info level, internal errors with their traceback, cut by
``service.logsafe``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import sys
import threading
import uuid
from concurrent.futures import Future
from functools import partial
from typing import Any

import attrs
from lsprotocol import types
from pygls.exceptions import (
    FeatureNotificationError,
    FeatureRequestError,
    JsonRpcException,
    JsonRpcInternalError,
    JsonRpcRequestCancelled,
)
from pygls.protocol import JsonRPCNotification, JsonRPCRequestMessage, JsonRPCResponseMessage, LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

from codespec.lsp.framing import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, FrameReader, Message, Problem, id_of
from codespec.lsp.held import HeldFrames, HeldNotification
from codespec.lsp.params import ParamsTooDeep, describe_structure_error, sanitize, strict_scalars
from codespec.service.doors.logsafe import clip

log = logging.getLogger(__name__)
_MISSING = object()

METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603
SERVER_NOT_INITIALIZED = -32002
CLIENT_ERROR_CODES = {
    PARSE_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    INVALID_PARAMS,
    SERVER_NOT_INITIALIZED,
    -32800,
    -32801,
    -32803,
}  # + RequestCancelled, ContentModified, RequestFailed


class RequestFutures(dict):
    """pygls's running requests by id, whose ``items()`` is a snapshot: at ``shutdown`` pygls cancels
    every running future while iterating this, and a cancelled future's done callback drops it from
    here (``_execute_handler``); iterating the live dict then raised "dictionary changed size
    during iteration" and the shutdown request failed."""

    def items(self):
        return list(super().items())


class CodespecProtocol(LanguageServerProtocol):
    """pygls's protocol behind a gate that answers every malformed request (see the module doc)."""

    def __init__(self, server, converter) -> None:
        strict_scalars(converter)
        super().__init__(server, converter)
        self._request_futures = RequestFutures()
        self.initialize_seen = False
        self.replaced_surrogates = 0  # strings whose lone surrogates were replaced (for tests, stats)
        self.held_frames = 0  # large document notifications decoded after later messages (lsp.held)

    def busy(self) -> bool:
        """Whether a request (or a notification's coroutine) is running."""
        return bool(self._request_futures)

    # ---- sending ----------------------------------------------------------------------------
    def reply_error(self, msg_id: Any, code: int, message: str) -> None:
        self._send_data({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}})

    def _send_data(self, data: Any) -> None:
        """pygls's, except that a response whose result cannot be serialized still answers (with
        an internal error) and Content-Length counts bytes."""
        if not data:
            return
        if self.writer is None:
            log.error("no transport to send a message on")
            return
        try:
            body = json.dumps(data, default=self._serialize_message)
        except Exception as error:
            msg_id = data.get("id") if isinstance(data, dict) else getattr(data, "id", None)
            is_response = (
                (isinstance(data, dict) and "method" not in data) or hasattr(data, "result") or hasattr(data, "error")
            )
            log.error("a message could not be serialized: %s", clip(f"{type(error).__name__}: {error}"))
            if not is_response:
                return
            body = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": msg_id,
                    "error": {
                        "code": INTERNAL_ERROR,
                        "message": f"internal error: the result could not be serialized "
                        f"({clip(f'{type(error).__name__}: {error}')})",
                    },
                }
            )
        payload = body.encode(self.CHARSET)
        if self._include_headers:
            payload = (
                f"Content-Length: {len(payload)}\r\nContent-Type: {self.CONTENT_TYPE}; charset={self.CHARSET}\r\n\r\n"
            ).encode("ascii") + payload
        try:
            result = self.writer.write(payload)
            if inspect.isawaitable(result):
                asyncio.ensure_future(result)
        except BrokenPipeError:
            raise
        except Exception as error:
            log.error("sending a message failed: %s", clip(f"{type(error).__name__}: {error}"))

    # ---- receiving --------------------------------------------------------------------------
    def receive(self, frame: Message | Problem) -> None:
        """Handle one frame from ``lsp.framing``; never raises (except to exit the process)."""
        try:
            if isinstance(frame, Problem):
                self._problem(frame)
            else:
                self._receive(frame.value)
        except (SystemExit, KeyboardInterrupt, BrokenPipeError):
            raise
        except Exception as error:  # a bug in this layer must not stop the read loop
            log.error("could not handle a message: %s", clip(f"{type(error).__name__}: {error}"), exc_info=True)
            has_id, msg_id = id_of(frame.value) if isinstance(frame, Message) else (False, None)
            if has_id and msg_id is not None:
                self.reply_error(msg_id, INTERNAL_ERROR, f"internal error: {clip(f'{type(error).__name__}: {error}')}")

    def _problem(self, problem: Problem) -> None:
        if problem.code == INVALID_PARAMS and not problem.has_id:  # a notification: nobody to answer
            log.warning("dropped a message: %s", problem.message)
            return
        log.info("answered a bad frame: %s", problem.message)
        self.reply_error(problem.request_id, problem.code, problem.message)

    def _receive(self, value: Any) -> None:
        if isinstance(value, list):
            self.reply_error(
                None, INVALID_REQUEST, "batch messages (JSON arrays) are not part of LSP: send one message per frame"
            )
            return
        if not isinstance(value, dict):
            self.reply_error(None, INVALID_REQUEST, f"a JSON-RPC message is an object, not {type(value).__name__}")
            return
        has_id, msg_id = id_of(value)
        if has_id and msg_id is None:
            self.reply_error(None, INVALID_REQUEST, f"id must be an integer or a string, not {clip(value['id'], 60)}")
            return

        def refuse(code: int, message: str) -> None:
            if has_id:
                self.reply_error(msg_id, code, message)
            else:
                log.warning("dropped a notification: %s", message)

        if value.get("jsonrpc") != "2.0":
            refuse(INVALID_REQUEST, f'jsonrpc must be "2.0", not {clip(value.get("jsonrpc"), 40)}')
            return
        method = value.get("method", _MISSING)
        if method is _MISSING:
            if has_id and ("result" in value or "error" in value):
                self._response(value)
            else:
                refuse(INVALID_REQUEST, "the message has no method")
            return
        if not isinstance(method, str):
            refuse(INVALID_REQUEST, f"method must be a string, not {clip(method, 60)}")
            return
        params = value.get("params")
        if params is not None and not isinstance(params, (dict, list)):
            refuse(
                INVALID_PARAMS,
                f"params of {clip(method, 80)} must be an object or an array, not {type(params).__name__}",
            )
            return
        if self._shutdown and method != types.EXIT:
            refuse(INVALID_REQUEST, f"the server has shut down: only exit is accepted, not {clip(method, 80)}")
            return
        try:
            params, replaced = sanitize(params)
        except ParamsTooDeep as error:
            refuse(INVALID_PARAMS, f"invalid params for {clip(method, 80)}: {error}")
            return
        if replaced:
            self.replaced_surrogates += replaced
            log.info("%s: replaced lone surrogates by U+FFFD in %d strings", clip(method, 80), replaced)
        if method == types.CANCEL_REQUEST:
            self._cancel(value, has_id)
            return
        kind = self._kind(method)
        if kind is None:
            if has_id:
                self.reply_error(msg_id, METHOD_NOT_FOUND, f"method not found: {clip(method, 120)}")
            elif not method.startswith("$/"):
                log.info("ignored a notification for an unknown method %s", clip(method, 120))
            return
        if has_id and kind == "notification":
            self.reply_error(msg_id, INVALID_REQUEST, f"{method} is a notification: send it without an id")
            return
        if not has_id and kind == "request":
            log.warning("dropped %s sent without an id (it is a request)", method)
            return
        if method == types.INITIALIZE:
            if self.initialize_seen:
                self.reply_error(msg_id, INVALID_REQUEST, "the server is already initialized")
                return
        elif not self.initialize_seen and method not in (types.EXIT, types.SHUTDOWN):  # those two end a session
            if has_id:
                self.reply_error(msg_id, SERVER_NOT_INITIALIZED, f"send initialize before {method}")
            return  # LSP: notifications before initialize are dropped
        if "params" in value:
            value["params"] = params
        message = self._structure(value, method, has_id)
        if message is None:
            return
        if method == types.INITIALIZE:
            self.initialize_seen = True
        self.handle_message(message)

    def _kind(self, method: str) -> str | None:
        """ "request", "notification", "either" (a custom method), or None: not implemented."""
        if method not in self.fm.features and method not in self.fm.builtin_features:
            return None
        message_type = self.get_message_type(method)
        if message_type is None or not attrs.has(message_type):
            return "either"
        return "request" if "id" in attrs.fields_dict(message_type) else "notification"

    def _structure(self, value: dict, method: str, has_id: bool):
        message_type = self.get_message_type(method)
        if message_type is None:  # a custom method: pygls's generic message, params as namedtuples
            message_type = JsonRPCRequestMessage if has_id else JsonRPCNotification
            value = {
                "jsonrpc": "2.0",
                "method": method,
                "params": value.get("params"),
                **({"id": value["id"]} if has_id else {}),
            }
        try:
            return self._converter.structure(value, message_type)
        except Exception as error:
            text = f"invalid params for {method}: {describe_structure_error(error)}"
            if has_id:
                self.reply_error(value["id"], INVALID_PARAMS, text)
            else:
                log.warning("dropped a notification: %s", text)
            return None

    def _response(self, value: dict) -> None:
        """A response to a request this server sent (a progress token, a message with actions)."""
        try:
            if "error" in value:
                message = self._converter.structure(value, types.ResponseErrorMessage)
            else:
                result_type = self._result_types.pop(value["id"], None) or JsonRPCResponseMessage
                message = self._converter.structure(value, result_type)
        except Exception as error:
            log.warning(
                "dropped a malformed response %s: %s", clip(value.get("id"), 60), describe_structure_error(error)
            )
            return
        self.handle_message(message)  # type: ignore[arg-type]  # an error response: pygls's RPCError in lsprotocol's type

    def _cancel(self, value: dict, has_id: bool) -> None:
        params = value.get("params")
        target = params.get("id") if isinstance(params, dict) else None
        if has_id:
            self.reply_error(value["id"], INVALID_REQUEST, "$/cancelRequest is a notification: send it without an id")
            return
        if isinstance(target, bool) or not isinstance(target, (int, str)):
            log.info("ignored $/cancelRequest without an integer or string id")
            return
        self._handle_cancel_notification(target)

    # ---- pygls internals whose logging quoted the whole message --------------------------------
    def _execute_handler(self, msg_id, handler, callback, args=None, kwargs=None) -> None:
        """pygls's, but the future it files under ``msg_id`` is dropped once done: pygls drops it
        only for requests, so every notification and command step run as a coroutine or a
        generator (didOpen, didChange, executeCommand) left one behind for good."""

        def done(future) -> None:
            if self._request_futures.get(msg_id) is future:
                del self._request_futures[msg_id]
            callback(future)

        super()._execute_handler(msg_id, handler, done, args, kwargs)

    def _handle_cancel_notification(self, msg_id) -> None:
        future = self._request_futures.pop(msg_id, None)
        if future is None:
            log.debug("cancel for %s, which is not running", clip(msg_id, 60))
            return
        future.cancel()

    def _handle_request(self, msg_id, method_name: str, params: Any) -> None:
        try:
            handler = self._get_handler(method_name)
            self._ctx_msg_id.set(msg_id)
            self._execute_handler(
                msg_id=msg_id,
                handler=handler,
                args=(params,),
                callback=partial(self._send_handler_result, msg_id=msg_id),
            )
        except JsonRpcException as error:
            log.info("request %s (%s) failed: %s", clip(msg_id, 60), method_name, clip(error.message))
            self._send_response(msg_id, None, error.to_response_error())
        except Exception as error:
            log.error("request %s (%s) failed", clip(msg_id, 60), method_name, exc_info=True)
            self._send_response(msg_id, None, JsonRpcInternalError.of(sys.exc_info()).to_response_error())
            self._server._report_server_error(error, FeatureRequestError)

    def _handle_notification(self, method_name: str, params: Any) -> None:
        try:
            handler = self._get_handler(method_name)
            self._execute_handler(
                msg_id=str(uuid.uuid4()), handler=handler, args=(params,), callback=self._check_handler_result
            )
        except Exception as error:
            log.error(
                "notification %s failed: %s", method_name, clip(f"{type(error).__name__}: {error}"), exc_info=True
            )
            self._server._report_server_error(error, FeatureNotificationError)

    def _send_handler_result(self, future: Future, *, msg_id) -> None:
        self._request_futures.pop(msg_id, None)
        try:
            if future.cancelled():
                self._send_response(
                    msg_id,
                    error=JsonRpcRequestCancelled(f"request {clip(msg_id, 60)} was cancelled").to_response_error(),
                )
                return
            result = future.result()
        except JsonRpcException as error:
            level = logging.INFO if error.code in CLIENT_ERROR_CODES else logging.ERROR
            log.log(level, "request %s failed: %s", clip(msg_id, 60), clip(error.message))
            self._send_response(msg_id, error=error.to_response_error())
            return
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            self._send_response(
                msg_id, error=JsonRpcRequestCancelled(f"request {clip(msg_id, 60)} was cancelled").to_response_error()
            )
            return
        except Exception as error:
            log.error(
                "request %s failed: %s", clip(msg_id, 60), clip(f"{type(error).__name__}: {error}"), exc_info=True
            )
            self._send_response(msg_id, error=JsonRpcInternalError.of(sys.exc_info()).to_response_error())
            self._server._report_server_error(error, FeatureRequestError)
            return
        self._send_response(msg_id, result=result)  # _send_data answers an unserializable result too

    # ---- documents: codespec keeps its own copies (lsp.documents) ------------------------------
    # pygls's built-in handlers would keep a second copy of every document in its workspace and
    # apply each change to it first (a change it cannot apply would then never reach codespec).
    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams):
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_OPEN)) is not None:
            yield user_handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield user_handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CLOSE)) is not None:
            yield user_handler, (params,), None


def attach_stop_event(server) -> threading.Event:
    """The event pygls's ``Server.shutdown`` sets (its private ``_stop_event``) on ``exit``: the
    frame loop (``serve_frames``) watches it, so the server stops as pygls's own loop would."""
    event = threading.Event()
    server._stop_event = event
    return event


async def serve_frames(reader: FrameReader, protocol: CodespecProtocol, stop_event: threading.Event) -> None:
    """The read loop of a connection: frames to the protocol until the input ends or the server stops.
    A reader built with ``hold=lsp.held.holdable`` hands over large didOpen notifications
    undecoded; they are dispatched after the messages behind them that do not depend on them."""
    held = HeldFrames(protocol.receive, protocol.busy)
    try:
        while not stop_event.is_set():
            frame = await reader.next()
            if frame is None:
                held.release()  # the end of the input: what was held is dispatched, in order
                break
            if isinstance(frame, HeldNotification):
                protocol.held_frames += 1
                held.hold(frame)
                continue
            held.before(frame)
            protocol.receive(frame)
    finally:
        held.close()  # stopped, or the loop failed: no timer fires into a server that is gone
