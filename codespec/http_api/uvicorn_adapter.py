"""uvicorn's h11 protocol with the door's JSON error body for requests that are not HTTP at all.

A request line, a header or a body's framing (Content-Length, chunked encoding) that h11 cannot
parse never reaches the app: uvicorn answers it itself, with ``text/plain`` "Invalid HTTP request
received.". :class:`JsonErrorsH11Protocol` answers with the shape every other error of this door
has (``{"error": {"message", "type", "param", "code"}}``, code ``invalid_http``), h11's own
reason as the message and h11's status hint (431 for headers over the size limit, else 400).

A client that ends its side in the middle of a request gets that answer too (uvicorn ignores
the end of input until the connection is lost, and then says nothing).

Every touch of uvicorn's internals is here, and tests/http_api/test_uvicorn_adapter.py fails if
uvicorn moves under it: the overrides are :meth:`H11Protocol.send_400_response` (called from
``handle_events`` on ``h11.RemoteProtocolError``) and ``eof_received`` (a no-op in uvicorn), and
the connection is ``self.conn``, made in ``__init__`` and read by ``handle_events``.
"""

from __future__ import annotations

import re
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from codespec.http_api.schema import error_body, json_text
from codespec.service.doors.logsafe import clip

DEFAULT_MAX_EVENT_BYTES = 16 * 1024  # h11's and uvicorn's default for a request head
_BYTES_REPR = re.compile(r"bytearray\((b'.*?'|b\".*?\")\)")  # h11 quotes the bad line as a bytearray


class _RememberingConnection(h11.Connection):
    """An h11 server connection that keeps the last protocol error it raised (uvicorn drops it)."""

    last_error: h11.RemoteProtocolError | None = None

    def next_event(self):
        try:
            return super().next_event()
        except h11.RemoteProtocolError as error:
            self.last_error = error
            raise


class JsonErrorsH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with JSON bodies for its own protocol-error responses."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        size = getattr(self.config, "h11_max_incomplete_event_size", None) or DEFAULT_MAX_EVENT_BYTES
        self.conn = _RememberingConnection(h11.SERVER, max_incomplete_event_size=size)

    def eof_received(self) -> None:
        """A client that ends its side in the middle of a request (a body short of its
        Content-Length, a head without its blank line) is told so; uvicorn closes without a word.
        After a whole request an end is a client gone, as uvicorn has it: its job is cancelled."""
        if self.conn.their_state is h11.SEND_BODY or (self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]):
            self.conn.receive_data(b"")
            self.handle_events()  # h11 raises RemoteProtocolError on the early end: send_400_response
        super().eof_received()

    def send_400_response(self, msg: str) -> None:
        error = self.conn.last_error if isinstance(self.conn, _RememberingConnection) else None
        status = error.error_status_hint if error is not None and 400 <= error.error_status_hint < 500 else 400
        reason = _BYTES_REPR.sub(r"\1", str(error)) if error is not None and str(error) else msg.rstrip(".")
        payload = json_text(
            error_body(
                f"the request is not valid HTTP/1.1: {clip(reason, 200)}", "invalid_request_error", None, "invalid_http"
            )
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"connection", b"close"),
        ]
        try:
            response = h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase.encode())
            self.transport.write(self.conn.send(response) or b"")
            self.transport.write(self.conn.send(h11.Data(data=payload)) or b"")
            self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:  # a response had already started: only closing is left
            pass
        self.transport.close()
