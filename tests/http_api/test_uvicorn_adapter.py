"""codespec.http_api.uvicorn_adapter leans on uvicorn's h11 protocol in four places; these fail
when uvicorn moves under it (an upgrade that renames or stops calling them), before a user sees
text/plain errors again. The behaviour itself is tested end to end in test_http_hostile.py."""

from __future__ import annotations

import inspect

import h11
from hosted import TOKEN
from uvicorn.protocols.http.h11_impl import H11Protocol

from bench.hostile_cases import http_request
from bench.hostile_input import HttpCase, exchange
from codespec.http_api.uvicorn_adapter import JsonErrorsH11Protocol


def test_uvicorn_answers_a_protocol_error_through_send_400_response():
    handle = inspect.getsource(H11Protocol.handle_events)
    assert "except h11.RemoteProtocolError" in handle and "self.send_400_response(" in handle
    assert list(inspect.signature(H11Protocol.send_400_response).parameters) == ["self", "msg"]


def test_uvicorn_reads_through_self_conn_made_in_init_and_ignores_eof():
    assert "self.conn = h11.Connection(" in inspect.getsource(H11Protocol.__init__)
    assert "self.conn.next_event()" in inspect.getsource(H11Protocol.handle_events)
    assert "self.conn.receive_data(data)" in inspect.getsource(H11Protocol.data_received)
    assert inspect.getsource(H11Protocol.eof_received).rstrip().endswith("pass")  # the adapter adds the 400
    assert {"our_state", "their_state", "trailing_data"} <= {name for name in dir(h11.Connection)}


def test_the_server_runs_the_adapter(shipped):
    config = shipped.server.server.config
    assert config.loaded and config.http_protocol_class is JsonErrorsH11Protocol


def test_a_head_over_h11s_limit_is_431_in_json(shipped):
    head = http_request("/v1/completions", b"{}", TOKEN).split(b"\r\n\r\n")[0]
    data = head + b"\r\nX-Big: " + b"a" * 70_000  # no end of head: h11 gives up at 16 KiB
    answer = exchange("127.0.0.1", shipped.server.port, HttpCase("big head", data, half_close=True))
    assert answer.status == 431 and answer.headers["content-type"] == "application/json", answer
    assert b'"code":"invalid_http"' in answer.body
